"""Longest silence of `hetplan fit`, `plan --workload` and `evaluate` (issue 23): target < 15 s.

Each command runs twice: with its output in a pipe (not a terminal, as with `> file 2>&1` or an Airflow task
log) and under `script -q -c` (a pseudo-terminal). Every chunk of output is timestamped as it arrives; the
longest gap between two chunks (or from the start to the first, or the last to the exit) is the longest
silence. Inputs are **synthetic** and built in a temporary directory:

- fit: bench/fit.py's profile set of `--models` x `--gpus` from the **derived** reference profiles (models beyond
  its seven are renamed copies), logged to MLflow on SQLite;
- plan: bench/codesign.py's synthetic workload of `--jobs` jobs resampled from Gavel's Philly-derived trace,
  Poisson arrivals at rho 0.8 of the status quo, `--budget` $/h, the shipped catalog, curves fitted from the
  derived default profiles;
- evaluate: that workload (in-sample), truth = the derived profiles, rho 0.8, LAS.

Appends a dated section to bench/RESULTS.md unless `--no-record`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import REPO, machine, record

HETPLAN = [sys.executable, "-c", "from hetplan.cli import main; main()"]
TARGET_S = 15.0


@dataclass
class Silence:
    wall_s: float
    longest_s: float
    after: str  # the last output line before the longest silence
    lines: int
    rc: int


def watch(argv: list[str], terminal: bool, env: dict[str, str]) -> Silence:
    """Run `argv` (under `script` when `terminal`) and time the gaps between its chunks of output."""
    command = ["script", "-q", "-e", "-c", subprocess.list2cmdline(argv), "/dev/null"] if terminal else argv
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                               stdin=subprocess.DEVNULL)
    assert process.stdout is not None
    last, longest, after, text = start, 0.0, "(start)", b""
    while chunk := os.read(process.stdout.fileno(), 65536):
        now = time.monotonic()
        if now - last > longest:
            longest, after = now - last, _last_line(text)
        last, text = now, text + chunk
    rc = process.wait()
    if rc:
        print(text.decode(errors="replace")[-2000:], file=sys.stderr)
    end = time.monotonic()
    if end - last > longest:
        longest, after = end - last, _last_line(text) + " (then exit)"
    lines = text.replace(b"\r", b"\n").decode(errors="replace").splitlines()
    return Silence(end - start, longest, after, sum(1 for line in lines if line.strip()), rc)


def _last_line(text: bytes) -> str:
    lines = [line for line in text.replace(b"\r", b"\n").decode(errors="replace").splitlines() if line.strip()]
    plain = lines[-1] if lines else "(start)"
    for code in ("\x1b[?25l", "\x1b[?25h", "\x1b[2K", "\x1b[1A"):
        plain = plain.replace(code, "")
    return plain.strip()[:110]


def inputs(tmp: Path, models: int, gpus: int, jobs: int, budget: float) -> dict[str, Path]:
    """Profiles, trace, truth and catalog files (synthetic, see the module)."""
    sys.path.insert(0, str(REPO / "bench"))
    from codesign import synthetic
    from fit import profiles_for

    from hetplan.catalog import load_default_catalog
    from hetplan.contracts import CURVES
    from hetplan.codesign import workload_from_trace
    from hetplan.evaluation import load_points
    from hetplan.planner import build_problem
    from hetplan.planner.baselines import baseline
    from hetplan.planner.entry import plan_with_baselines
    from hetplan.reference import build_reference, default_profiles
    from hetplan.sensitivity import fit_profiles
    from hetplan.sim.setups import nodes_from_counts
    from hetplan.sim.truth import TruthCurves
    from hetplan.sim.workload import with_load

    files = {name: tmp / f"{name}.csv" for name in ("profiles", "truth", "trace", "catalog")}
    files["curves"] = tmp / "curves.parquet"
    profiles_for(models, gpus, build_reference().derived).to_csv(files["profiles"], index=False)
    default_profiles().to_csv(files["truth"], index=False)
    catalog = load_default_catalog()
    catalog.to_csv(files["catalog"], index=False)
    curves = fit_profiles(default_profiles()).curves
    CURVES.write(curves, files["curves"])
    truth = TruthCurves.from_profiles(default_profiles(), fallback=curves)
    picked = synthetic(jobs, truth)
    problem = build_problem(curves, catalog, workload_from_trace(picked).demand, budget)
    quo = baseline(plan_with_baselines(problem, baselines=True)[1], "status quo")
    nodes = nodes_from_counts(problem.shapes, quo.node_counts)
    rate = load_points(picked, picked.assign(sim_model=picked["model"]), truth, nodes, (0.8,), ())[0].plan_rate
    with_load(picked, rate, 0).to_csv(files["trace"], index=False)
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--budget", type=float, default=400.0)
    parser.add_argument("--commands", nargs="+", default=["fit", "plan", "evaluate"],
                        choices=["fit", "plan", "evaluate"])
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    host = machine()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        files = inputs(tmp, args.models, args.gpus, args.jobs, args.budget)
        env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "140"}
        curves = files["curves"]
        commands = {
            "fit": [*HETPLAN, "fit", "--profiles", str(files["profiles"]), "--out", str(tmp / "fitted.parquet")],
            "plan --workload": [*HETPLAN, "plan", "--workload", str(files["trace"]), "--curves", str(curves),
                                "--catalog", str(files["catalog"]), "--budget", f"{args.budget:g}",
                                "--out-dir", str(tmp / "plan"), "--no-mlflow"],
            "evaluate": [*HETPLAN, "evaluate", "--trace", str(files["trace"]), "--curves", str(curves),
                         "--truth", str(files["truth"]), "--catalog", str(files["catalog"]),
                         "--budget", f"{args.budget:g}", "--rho", "0.8", "--out-dir", str(tmp / "evaluation"),
                         "--no-mlflow"],
        }
        rows = []
        for name, argv in commands.items():
            if name.split()[0] not in args.commands:
                continue
            for terminal in (False, True):
                # a fresh MLflow store each time: the second fit registers every pair again, as the first did
                mlflow = f"sqlite:///{tmp}/mlflow-{len(rows)}.db"
                seen = watch(argv, terminal, {**env, "MLFLOW_TRACKING_URI": mlflow})
                where = "pseudo-terminal (`script -q -c`)" if terminal else "pipe (as a file)"
                met = "met" if seen.longest_s < TARGET_S and seen.rc == 0 else "**missed**"
                rows.append(f"| `hetplan {name}` | {where} | {seen.rc} | {seen.wall_s:.0f} s | {seen.lines} | "
                            f"**{seen.longest_s:.1f} s** | {met} | {seen.after.replace('|', '/')} |")
                print(rows[-1], flush=True)
    section = [
        "", f"## Longest silence of fit, plan and evaluate (`bench/silence.py`, issue 23), {when}", "",
        f"Run: `.venv/bin/python bench/silence.py --models {args.models} --gpus {args.gpus} --jobs {args.jobs} "
        f"--budget {args.budget:g} --commands {' '.join(args.commands)}`; {host} (before the runs). Inputs **synthetic** (see the script): fit = "
        f"{args.models} models x {args.gpus} GPU types of the derived reference profiles with MLflow on SQLite; "
        f"plan and evaluate = {args.jobs:,} jobs resampled from Gavel's Philly-derived trace at rho 0.8, "
        f"{args.budget:g} $/h, the shipped catalog. Silence = the longest time without a byte of output "
        f"(from the start, between chunks, to the exit). Target < {TARGET_S:g} s.", "",
        "| command | output to | rc | wall | non-empty lines | longest silence | target | last line before it |",
        "|---|---|---:|---:|---:|---:|---|---|", *rows, "",
    ]
    print("\n".join(section))
    if not args.no_record:
        record(section)


if __name__ == "__main__":
    main()
