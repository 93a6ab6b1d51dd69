"""Benchmark the simulator (issue 7 target: an ~80k-job Philly-format trace simulates in under 60 s).

There is no real 80,000-job Philly summary file here, so the trace is **SYNTHETIC**: a CSV in the Philly
summary format (`timestamp,duration,num_gpus`, what `import_philly` reads) named
`synthetic_philly_<jobs>_seed<seed>.csv`. Each row's (num_gpus, duration) pair is drawn jointly, with
replacement and a seeded RNG, from Gavel's Philly-derived trace `gavel_philly_0e4a51` (durations at the
reference allocation, as its importer computes them); arrivals are a Poisson process of `--rate` jobs/h.
The file is imported with `import_trace(path, "philly")` (timed), every job gets a truth model drawn at random
(`prepare_workload(..., "mix", seed)`), and the workload is replayed on `--nodes` AWS p3.16xlarge nodes
(8 V100, 64 vCPUs, 488 GB each, from the shipped catalog). Truth: hetplan's *derived* default profiles.

Runs: LAS, FIFO and SRTF with the `proportional` policy and LAS with the `hint` policy (knee hints read off the
fitted curve table of the default workspace, `.hetplan/runs/*/curves.parquet`, or fitted from the default
profiles when there is none). Medians of `--repeats` runs. A stress point (LAS, proportional, `--stress-nodes`
nodes: a smaller cluster, so more time with jobs waiting) runs once, and once more under cProfile with
`--profile`. Appends a dated section to bench/RESULTS.md unless `--no-record`.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from hetplan.allocator.spec import Node
from hetplan.hints import HintSet
from hetplan.reference import default_profiles
from hetplan.resources import upstream_path
from hetplan.sim.engine import SimConfig, SimResult, simulate
from hetplan.sim.metrics import summarize, utilisation
from hetplan.sim.setups import knee_hints
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import prepare_workload
from hetplan.traces import import_trace
from common import fitted_curves, machine, record, sim_fingerprint

SHAPE = ("aws:p3.16xlarge", "V100", 8, 64.0, 488.0, 24.48)  # name, GPU, GPUs, vCPUs, GB, $/h (shipped catalog)
RUNS = (("las", "proportional"), ("fifo", "proportional"), ("srtf", "proportional"), ("las", "hint"))


def synthetic_philly(path: Path, jobs: int, rate_per_h: float, seed: int) -> Path:
    """Write a SYNTHETIC Philly summary CSV: (num_gpus, duration) resampled from Gavel's Philly trace."""
    source = import_trace(upstream_path("traces", "gavel_philly_0e4a51.trace"), "gavel").trace
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(source), jobs)
    gaps = rng.exponential(3600.0 / rate_per_h, jobs)
    gaps[0] = 0.0
    frame = pd.DataFrame({"timestamp": np.round(np.cumsum(gaps), 1),
                          "duration": np.round(source["duration_s"].to_numpy(float)[picks], 1),
                          "num_gpus": source["num_gpus"].to_numpy(int)[picks]})
    frame.to_csv(path, index=False)
    return path








def nodes(n: int) -> list[Node]:
    name, gpu, gpus, cpus, mem, _ = SHAPE
    return [Node(f"p3-{i:04d}", gpu, gpus, cpus, mem, {"hetplan/shape": name}) for i in range(n)]


def metrics(result: SimResult, n_nodes: int) -> dict[str, float]:
    """summarize()'s metrics plus GPU utilisation while jobs still arrive (first to last arrival)."""
    row = summarize(result, SHAPE[5] * n_nodes)
    jobs = result.jobs
    row["gpu_util_arrivals"] = utilisation(result.timeline, result.capacity["gpus"], "gpus",
                                           float(jobs["arrival_s"].min()), float(jobs["arrival_s"].max()))
    return {**row, **{k: result.counts[k] for k in ("reschedules", "starts")}}


def timed_run(jobs: pd.DataFrame, n_nodes: int, truth: TruthCurves, scheduler: str, policy: str,
              hints: HintSet | None) -> tuple[float, dict[str, float]]:
    start = time.perf_counter()
    result = simulate(jobs, nodes(n_nodes), truth, policy, hints, SimConfig(scheduler))  # type: ignore[arg-type]
    return time.perf_counter() - start, metrics(result, n_nodes)


def row(label: str, n_nodes: int, times: list[float], m: dict[str, float]) -> str:
    spread = f"{min(times):.1f} – {max(times):.1f} s" if len(times) > 1 else "1 run"
    return (f"| {label} | {n_nodes} x 8 = {n_nodes * 8:,} | **{statistics.median(times):.1f} s** | {spread} | "
            f"{m['gpu_util']:.1%} | {m['gpu_util_arrivals']:.1%} | {m['cpu_util']:.1%} | {m['avg_jct_h']:.1f} h | "
            f"{m['avg_queue_h'] * 60:.1f} min | {m['reschedules']:,} | {m['starts']:,} |")


def profile(jobs: pd.DataFrame, n_nodes: int, truth: TruthCurves, top: int = 14) -> list[str]:
    """cProfile the stress point; hetplan's functions (and the heap) by cumulative time, with their own time."""
    profiler = cProfile.Profile()
    profiler.enable()
    simulate(jobs, nodes(n_nodes), truth, "proportional", None, SimConfig("las"))
    profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    ours = [(key, value) for key, value in stats.stats.items()  # type: ignore[attr-defined]
            if "hetplan" in key[0] or "heap" in key[2]]
    total = max(value[3] for _, value in ours)  # simulate()'s cumulative time
    lines = [f"cProfile of the stress point (LAS + proportional, {n_nodes} nodes): {total:.1f} s under the profiler "
             "(its overhead included); hetplan's functions and the heap, by cumulative time:", "",
             "| function | calls | cumulative | own time |", "|---|---:|---:|---:|"]
    for (file, line, func), (_, calls, own, cum, _) in sorted(ours, key=lambda kv: kv[1][3], reverse=True)[:top]:
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else "builtin"
        lines.append(f"| `{func}` ({where}) | {calls:,} | {cum:.1f} s ({cum / total:.0%}) | {own:.1f} s |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=80_000)
    parser.add_argument("--rate", type=float, default=20.0, help="Poisson arrivals, jobs/h")
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--stress-nodes", type=int, default=185, help="0: no stress point")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="cProfile the stress point")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}", flush=True)
    truth = TruthCurves.from_profiles(default_profiles())
    curves, curves_from = fitted_curves()
    with tempfile.TemporaryDirectory() as tmp:
        path = synthetic_philly(Path(tmp) / f"synthetic_philly_{args.jobs}_seed{args.seed}.csv", args.jobs,
                                args.rate, args.seed)
        size_mb = path.stat().st_size / 1e6
        import_s = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            trace = import_trace(path, "philly").trace
            import_s.append(time.perf_counter() - start)
    start = time.perf_counter()
    jobs = prepare_workload(trace, truth.models, "mix", args.seed).jobs
    prepare_s = time.perf_counter() - start
    ref_gpu_h = float((jobs["duration_s"] * jobs["num_gpus"]).sum()) / 3600
    span_h = float(jobs["arrival_s"].max() - jobs["arrival_s"].min()) / 3600
    print(f"import {statistics.median(import_s):.2f} s ({size_mb:.1f} MB), prepare {prepare_s:.2f} s; "
          f"{ref_gpu_h / span_h:,.0f} reference GPU-h offered per hour over {span_h:,.0f} h", flush=True)
    classes = jobs[["sim_model", "num_gpus"]].drop_duplicates().rename(columns={"sim_model": "model"})
    hints = knee_hints(curves, classes, [SHAPE[1]])
    table = ["| scheduler + policy | cluster (GPUs) | simulate (median) | min – max | GPU util (summarize) | "
             "GPU util, arrival window | CPU util | avg JCT | avg queue | reschedules | starts |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for scheduler, policy in RUNS:
        runs = [timed_run(jobs, args.nodes, truth, scheduler, policy, hints if policy == "hint" else None)
                for _ in range(args.repeats)]
        table.append(row(f"{scheduler.upper()} + {policy}", args.nodes, [t for t, _ in runs], runs[0][1]))
        print(table[-1], flush=True)
    profiled: list[str] = []
    if args.stress_nodes:
        seconds, m = timed_run(jobs, args.stress_nodes, truth, "las", "proportional", None)
        table.append(row("LAS + proportional (stress)", args.stress_nodes, [seconds], m))
        print(table[-1], flush=True)
        if args.profile:
            profiled = profile(jobs, args.stress_nodes, truth)
            print("\n".join(profiled), flush=True)
    if args.no_record:
        return
    text = [
        "\n## Simulator wall time (`bench/simulator.py`, issue 7)\n",
        f"Run: `.venv/bin/python bench/simulator.py --repeats {args.repeats}{' --profile' if args.profile else ''}` "
        f"on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}; hetplan/sim sha256 `{sim_fingerprint()}`. "
        "Target: an ~80k-job Philly-format trace simulates in under 60 s.\n",
        f"**The trace is synthetic** (`synthetic_philly_{args.jobs}_seed{args.seed}.csv`, {size_mb:.1f} MB, Philly "
        f"summary format `timestamp,duration,num_gpus`): {args.jobs:,} jobs whose (GPUs, duration) pairs are resampled "
        f"with replacement (seed {args.seed}) from Gavel's Philly-derived trace `gavel_philly_0e4a51` (1, 2, 4, 8 "
        f"GPUs; durations at the reference allocation, median 21.7 h), Poisson arrivals at {args.rate:g} jobs/h "
        f"({span_h:,.0f} h of arrivals, {ref_gpu_h / span_h:,.0f} reference GPU-h offered per hour). Every job runs "
        f"as a truth model drawn at random. Cluster: AWS p3.16xlarge nodes (8 V100, 64 vCPUs, 488 GB). Truth: the "
        f"**derived** default profiles; knee hints from the fitted curves ({curves_from}). Round 300 s.\n",
        f"Import (`import_trace(..., \"philly\")`, median of {args.repeats}): {statistics.median(import_s):.2f} s; "
        f"`prepare_workload`: {prepare_s:.2f} s.\n",
        *table,
        "",
        "GPU util (summarize) is over first arrival to last completion, so it includes the drain after the last "
        "arrival; the arrival-window column is the time-weighted GPU use between the first and the last arrival.\n",
    ]
    if profiled:
        text += [*profiled, ""]
    record(text)


if __name__ == "__main__":
    main()
