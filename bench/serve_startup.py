"""How long `hetplan serve` takes: `--help`, the import of its own module, and start-to-ready (first 200 from
/healthz), through the full `hetplan` command and through the serve module alone (what a lazy top-level CLI
gives). Run: `.venv/bin/python bench/serve_startup.py --repeats 5`."""

from __future__ import annotations

import argparse
import os
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


def ready(cmd: list[str], root: Path) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    proc = subprocess.Popen([*cmd, "--host", "127.0.0.1", "--port", str(port), "--db", str(root / f"{port}.db"),
                             "--store", str(root / "store")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
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
        for name, run in rows.items():
            times = [run(Path(tmp)) for _ in range(repeats)]
            print(f"| {name} | {statistics.median(times):.2f} | {min(times):.2f} - {max(times):.2f} |")


if __name__ == "__main__":
    main()
