"""Anchor: Synergy's homogeneous setup, sensitivity-aware allocation vs GPU-proportional (issue 7).

Synergy (OSDI 22) reports that "workload-aware CPU and memory allocations can improve average JCT up to 3.4x
when compared to traditional GPU-proportional scheduling". This replays that comparison in hetplan's simulator:

- cluster: Synergy's 128 V100 GPUs as 16 servers of 8 GPUs, 24 cores and 500 GB each;
- truth: Synergy's **published** V100 CPU/RAM sensitivity table (`published_v100_profiles()`; measured by
  Synergy's authors, not derived), so a job's speed is read off that table (bilinear between its grid points);
- jobs: `--jobs` per load; (num_gpus, duration) pairs resampled jointly with replacement from Gavel's
  Philly-derived trace `gavel_philly_0e4a51` (durations at the reference allocation = 3 cores, 62.5 GB per GPU
  on a V100, which is exactly the GPU-proportional share of these servers); models drawn uniformly from
  Synergy's 7; Poisson arrivals at each load (all seeded);
- policies: `proportional` (GPU-proportional share: every job runs at speed 1 by construction) vs `hint`
  with knee hints (`knee_hints`) read off curves fitted (`fit_profiles`) on the same published table;
- schedulers FIFO, SRTF, LAS (round 300 s).

Loads are given as ρ, the GPU load offered to the proportional cluster (mean reference GPU-hours per job x
jobs/h / 128); ρ >= 1 saturates it. JCTs are averaged over a steady-state window of jobs (by arrival order,
the first and last `--trim` of the jobs excluded: warm-up and drain) and over all jobs. Appends a dated
section to bench/RESULTS.md unless `--no-record`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

import numpy as np
import pandas as pd

from hetplan.allocator.spec import Node
from hetplan.reference.synergy import published_v100_profiles
from hetplan.resources import upstream_path
from hetplan.sensitivity import fit_profiles
from hetplan.sim.engine import SimConfig, simulate
from hetplan.sim.metrics import summarize
from hetplan.sim.setups import knee_hints
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import prepare_workload
from hetplan.traces import import_trace
from common import machine, record, sim_fingerprint

RHOS = (0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2)
SCHEDULERS = ("fifo", "srtf", "las")
NODES = [Node(f"v100-{i}", "V100", 8, 24, 500) for i in range(16)]






def synthetic_jobs(n: int, models: list[str], seed: int) -> pd.DataFrame:
    """n jobs: (num_gpus, duration) resampled from Gavel's Philly trace, a uniform model each (arrivals later)."""
    source = import_trace(upstream_path("traces", "gavel_philly_0e4a51.trace"), "gavel").trace
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(source), n)
    return pd.DataFrame({"job_id": [f"j{i:05d}" for i in range(n)], "model": rng.choice(models, n),
                         "num_gpus": source["num_gpus"].to_numpy(int)[picks],
                         "arrival_s": np.zeros(n), "duration_s": source["duration_s"].to_numpy(float)[picks]})


def windowed_jct_h(jobs: pd.DataFrame, trim: float) -> float:
    """Average JCT (h) of the jobs between the `trim` and `1 - trim` quantiles of arrival order."""
    order = jobs.sort_values(["arrival_s", "job_id"]).reset_index(drop=True)
    lo, hi = int(len(order) * trim), int(len(order) * (1 - trim))
    return float(order["jct_s"].iloc[lo:hi].mean()) / 3600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--rho", type=float, nargs="+", default=list(RHOS))
    parser.add_argument("--trim", type=float, default=0.25, help="fraction of jobs left out at each end")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}", flush=True)
    published = published_v100_profiles()
    truth = TruthCurves.from_profiles(published)
    curves = fit_profiles(published).curves
    base = synthetic_jobs(args.jobs, sorted(truth.models), args.seed)
    gpus = sum(n.gpus for n in NODES)
    per_job_gpu_h = float((base["num_gpus"] * base["duration_s"]).mean()) / 3600
    hints = knee_hints(curves, base[["model", "num_gpus"]].drop_duplicates(), ["V100"])
    knees = curves.drop_duplicates("model").set_index("model")[["knee_cpus", "knee_mem_gb"]]
    rows = []
    for rho in args.rho:
        load = rho * gpus / per_job_gpu_h
        jobs = prepare_workload(base, truth.models, "mix", args.seed, load).jobs
        for scheduler in SCHEDULERS:
            result = {}
            for policy in ("proportional", "hint"):
                run = simulate(jobs, NODES, truth, policy, hints if policy == "hint" else None,
                               SimConfig(scheduler))  # type: ignore[arg-type]
                done = run.jobs[run.jobs["status"] == "completed"]
                result[policy] = {**summarize(run, 0.0), "window_jct_h": windowed_jct_h(done, args.trim),
                                  "hinted": float((done["share"] == "hinted").mean())}
            p, h = result["proportional"], result["hint"]
            rows.append({"rho": rho, "load": load, "scheduler": scheduler, "p": p, "h": h,
                         "ratio_window": p["window_jct_h"] / h["window_jct_h"],
                         "ratio_all": p["avg_jct_h"] / h["avg_jct_h"]})
            print(f"rho {rho:.2f} ({load:.3f} jobs/h) {scheduler}: window JCT {p['window_jct_h']:.1f} h / "
                  f"{h['window_jct_h']:.1f} h = {rows[-1]['ratio_window']:.2f}x, all jobs {rows[-1]['ratio_all']:.2f}x",
                  flush=True)
    total = time.perf_counter() - started
    print(f"total {total:.0f} s", flush=True)
    if args.no_record:
        return
    best = max(rows, key=lambda r: r["ratio_window"])
    table = ["| ρ | load jobs/h | scheduler | avg JCT, proportional (window) | avg JCT, sensitivity-aware (window) | "
             "**ratio (window)** | ratio (all jobs) | GPU util prop / aware | CPU util prop / aware | "
             "aware jobs with the full knee share |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        p, h = r["p"], r["h"]
        table.append(f"| {r['rho']:.2f} | {r['load']:.3f} | {r['scheduler'].upper()} | {p['window_jct_h']:.1f} h | "
                     f"{h['window_jct_h']:.1f} h | **{r['ratio_window']:.2f}x** | {r['ratio_all']:.2f}x | "
                     f"{p['gpu_util']:.0%} / {h['gpu_util']:.0%} | {p['cpu_util']:.0%} / {h['cpu_util']:.0%} | "
                     f"{h['hinted']:.0%} |")
    text = [
        "\n## Anchor: Synergy's homogeneous cluster, sensitivity-aware vs GPU-proportional (`bench/synergy_anchor.py`, "
        "issue 7)\n",
        f"Run: `.venv/bin/python bench/synergy_anchor.py` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; "
        f"{machine()}; {total:.0f} s in all; hetplan/sim sha256 `{sim_fingerprint()}`.\n",
        "Setup: 16 servers x (8 V100, 24 cores, 500 GB) = 128 GPUs, as Synergy's. **Truth = Synergy's published V100 "
        "table** (measured by its authors; not derived). Jobs: "
        f"{args.jobs:,} per load, (GPUs, duration) resampled from Gavel's Philly-derived trace (seed {args.seed}; "
        f"{per_job_gpu_h:.1f} reference GPU-h per job on average), models uniform over Synergy's 7, Poisson arrivals. "
        "The proportional policy gives every job 3 cores and 62.5 GB per GPU, the reference allocation, so it runs "
        "every job at speed 1 and ρ is exactly its offered GPU load. The sensitivity-aware side is the `hint` policy "
        "with knee hints (" + ", ".join(f"{m} {k.knee_cpus:g} c / {k.knee_mem_gb:g} GB" for m, k in knees.iterrows())
        + " per GPU, from curves fitted on the same table). Window = jobs "
        f"{int(args.jobs * args.trim):,}–{int(args.jobs * (1 - args.trim)):,} by arrival order (warm-up and drain left "
        "out); GPU/CPU utilisation over the whole run (summarize). Ratio = proportional avg JCT / sensitivity-aware "
        "avg JCT (above 1: sensitivity-aware is faster).\n",
        *table,
        "",
        f"Largest ratio here: **{best['ratio_window']:.2f}x** ({best['scheduler'].upper()}, ρ = {best['rho']:.2f}); "
        "Synergy's abstract: \"up to 3.4x\".\n",
    ]
    record(text)


if __name__ == "__main__":
    main()
