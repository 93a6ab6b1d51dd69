"""How long `hetplan serve` takes: `--help`, the import of its own module, and start-to-ready (first 200 from
/healthz), through the full `hetplan` command and through the serve module alone (what a lazy top-level CLI
gives). Run: `.venv/bin/python bench/serve_startup.py --repeats 5 [--restart-nodes 10000]`.

`--restart-nodes N` adds a restart: start to ready on a copy of a database that holds N nodes, with a published
hint table in the store (what a production restart reads: the state and the hints), through the full CLI.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

FULL_CLI = [sys.executable, "-c", "from hetplan.cli import main; main()", "serve"]
# hetplan/cli/serve.py loaded by path, without the hetplan.cli package (whose __init__ imports every command):
# what `hetplan serve` costs once the top-level CLI imports its commands lazily.
SERVE_ONLY = [sys.executable, "-c", "import importlib.util, typer; from hetplan.resources import data_path; "
              "spec = importlib.util.spec_from_file_location('serve_alone', data_path().parent / 'cli' / 'serve.py'); "
              "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); typer.run(m.serve)"]


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def ready(cmd: list[str], root: Path, db: Path | None = None, store: Path | None = None) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    proc = subprocess.Popen([*cmd, "--host", "127.0.0.1", "--port", str(port), "--db", str(db or root / f"{port}.db"),
                             "--store", str(store or root / "store")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - start < 120:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    return time.perf_counter() - start
            except httpx.HTTPError:
                time.sleep(0.01)
        raise RuntimeError("not ready in 120 s")
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)


def restart_state(root: Path, nodes: int) -> tuple[Path, Path]:
    """A database holding `nodes` nodes (V100, T4, A100 in turn) and a store with a published hint table."""
    from datetime import datetime, timezone

    import pandas as pd

    from hetplan.allocator import DurableAllocator, Node, NodeChanges
    from hetplan.contracts import Plan
    from hetplan.hints import HintStore

    store = root / "restart-store"
    plan = Plan(plan_id="restart", created_at=datetime.now(timezone.utc), budget_per_hour=None, cost_per_hour=0.0,
                node_counts={}, objective=0.0, lp_bound=0.0, gap=0.0, solver="none", solve_seconds=0.0)
    rows = [{"model": model, "num_gpus": gpus, "gpu_type": gpu_type, "rank": rank, "cpus_per_gpu": 6.0,
             "mem_gb_per_gpu": 40.0, "expected_throughput": 100.0 * gpus, "normalized_throughput": 1.0 / rank,
             "throughput_per_dollar": 50.0, "plan_id": "restart"}
            for model in ("resnet50", "bert", "transformer", "vgg19") for gpus in (1, 2, 4, 8)
            for rank, gpu_type in enumerate(("A100", "V100", "T4"), start=1)]
    HintStore(store).publish(plan, pd.DataFrame(rows))
    shapes = [("V100", 8, 64, 488), ("T4", 4, 48, 192), ("A100", 8, 96, 1152)]
    db = root / "restart.db"
    with DurableAllocator(db, "hint", None) as allocator:
        allocator.change_nodes(NodeChanges(upsert=[Node(f"node-{i:05d}", *shapes[i % 3]) for i in range(nodes)]))
    return db, store


def restarted(root: Path, state: tuple[Path, Path]) -> float:
    db, store = state
    copy = root / f"copy-{time.monotonic_ns()}.db"
    shutil.copyfile(db, copy)
    return ready(FULL_CLI, root, copy, store)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--restart-nodes", type=int, default=0, help="also time a restart with this many nodes")
    args = parser.parse_args()
    repeats = args.repeats
    rows = {
        "hetplan serve --help (full CLI)": lambda root: timed([*FULL_CLI, "--help"]),
        "serve --help (serve module alone)": lambda root: timed([*SERVE_ONLY, "--help"]),
        "imports of serve.py now (typer, nodes_io)": lambda root: timed(
            [sys.executable, "-c", "import typer, hetplan.allocator.nodes_io"]),
        "imports of serve.py before (typer, cli.common, hints)": lambda root: timed(
            [sys.executable, "-c", "import typer, pydantic, hetplan.cli.common, hetplan.hints"]),
        "service + uvicorn (imported when serving)": lambda root: timed(
            [sys.executable, "-c", "import hetplan.allocator.service, uvicorn"]),
        "start to ready (full CLI)": lambda root: ready(FULL_CLI, root),
        "start to ready (serve module alone)": lambda root: ready(SERVE_ONLY, root),
    }
    with tempfile.TemporaryDirectory() as tmp:
        if args.restart_nodes:
            state = restart_state(Path(tmp), args.restart_nodes)
            rows[f"restart to ready, {args.restart_nodes:,} nodes and a hint table (full CLI)"] = \
                lambda root: restarted(root, state)
        for name, run in rows.items():
            times = [run(Path(tmp)) for _ in range(repeats)]
            print(f"| {name} | {statistics.median(times):.2f} | {min(times):.2f} - {max(times):.2f} |")


if __name__ == "__main__":
    main()
