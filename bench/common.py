"""What the benchmark scripts share: the machine line, the results file, the curves and the simulator's hash."""

from __future__ import annotations

import hashlib
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name("RESULTS.md")
WORKSPACE_RUNS = REPO / ".hetplan" / "runs"


def machine() -> str:
    """CPU count and model, Python version and the load average, as RESULTS.md records them."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"`nproc` {os.cpu_count()}, CPU \"{cpu}\", Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}"


def commit() -> str:
    """The short hash of the checked-out commit (what a recorded run measured)."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=REPO).stdout.strip()


def record(lines: list[str]) -> None:
    """Append a section to bench/RESULTS.md."""
    with RESULTS.open("a") as handle:
        handle.write("\n".join(lines))


def fitted_curves() -> tuple[pd.DataFrame, str]:
    """The default workspace's fitted curve table (newest run), else a fresh fit of the default profiles."""
    from hetplan.contracts import CURVES
    from hetplan.reference import default_profiles
    from hetplan.sensitivity import fit_profiles

    runs = sorted(WORKSPACE_RUNS.glob("*/curves.parquet"))
    if runs:
        where = f"`.hetplan/runs/{runs[-1].parent.name}/curves.parquet`"
        return CURVES.load(runs[-1]), f"from {where} (fitted from the derived profiles)"
    return fit_profiles(default_profiles()).curves, "fitted from the derived default profiles (`fit_profiles`)"


def derived_setting():
    """Say when and where a simulation bench runs, and give its planner's curves (`fitted_curves`: the table and
    where it comes from) and the truth it replays on (the derived default profiles, the curves where they lack)."""
    import datetime as dt

    from hetplan.reference import default_profiles
    from hetplan.sim.truth import TruthCurves

    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}", flush=True)
    curves, curves_from = fitted_curves()
    return curves, curves_from, TruthCurves.from_profiles(default_profiles(), fallback=curves)


def sim_fingerprint() -> str:
    """First 10 hex digits of the SHA-256 of hetplan/sim/*.py (the simulator these figures come from)."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "hetplan" / "sim").glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """`hetplan serve` in a subprocess on 127.0.0.1 (stopped by its PID); `kill` + `start` for a crash test."""

    def __init__(self, args: list[str], log: Path, tree: Path | None = None) -> None:
        self.args, self.log, self.tree = args, log, tree
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> Served:
        import httpx

        port = free_port()
        cmd = [sys.executable, "-c", "from hetplan.cli import main; main()", "serve", "--host", "127.0.0.1",
               "--port", str(port), *self.args]
        env = None if self.tree is None else {**os.environ, "PYTHONPATH": str(self.tree)}  # another source tree
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.tree)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(self.log.read_text()[-2000:]) from None
                time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=30)
        self.proc = None


@contextmanager
def served(args: list[str], log: Path, tree: Path | None = None) -> Iterator[Served]:
    """`hetplan serve` with `args` while the block runs; `tree`: the source tree it imports hetplan from (a
    checkout of another commit, for a side-by-side run), else this one."""
    server = Served(args, log, tree).start()
    try:
        yield server
    finally:
        server.stop()
