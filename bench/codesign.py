"""How long planning for a workload takes (issue 13): 1,000 jobs in <= 60 s, 10,000 in <= 5 min on 2 cores.

Workloads are **synthetic**: jobs resampled with replacement (seed 0) from Gavel's Philly-derived trace
`gavel_philly_0e4a51` (model, GPUs, duration; unknown models relabelled as a truth model drawn per job), with
Poisson arrivals at the rate at which they ask for `--rho` of the status quo's GPU time at the budget. The
planner: curves fitted from the derived profiles, the shipped catalog (all clouds), average-JCT objective,
LAS, two arrival draws, replays in `--workers` processes (default: every usable CPU). Time = `plan_workload`
(propose candidates with the MILP + screen them on a 2,000-job sample + replay the shortlist on each draw,
`hetplan.codesign.screen`), split into propose and the rest. Candidates whose
fluid load (offered work over the mix they serve) exceeds 1.25 are pruned before simulation; for the smaller
workloads the bench also simulates every candidate, to check that pruning never removed the one the simulator
would pick. Appends a dated section to bench/RESULTS.md unless `--no-record`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

import numpy as np

from hetplan.catalog import load_default_catalog
from hetplan.codesign import plan_workload, propose, workload_from_trace
from hetplan.codesign.replay import usable_cpus
from hetplan.evaluation import load_points
from hetplan.planner import build_problem
from hetplan.planner.baselines import baseline
from hetplan.planner.entry import plan_with_baselines
from hetplan.reference import default_profiles
from hetplan.resources import upstream_path
from hetplan.sim.setups import nodes_from_counts
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import prepare_workload, with_load
from hetplan.traces import import_trace
from common import fitted_curves, machine, record


def synthetic(n: int, truth: TruthCurves, seed: int = 0):
    trace = import_trace(upstream_path("traces", "gavel_philly_0e4a51.trace"), "gavel").trace
    relabelled = prepare_workload(trace, truth.models, "mix", seed).jobs
    rng = np.random.default_rng(seed)
    picked = relabelled.iloc[rng.integers(0, len(relabelled), size=n)].reset_index(drop=True)
    return picked.assign(job_id=[f"s{i}" for i in range(n)], model=picked["sim_model"]).drop(columns="sim_model")


def problem_and_workload(n: int, curves, truth: TruthCurves, catalog, budget: float, rho: float):
    """The planning problem and workload of the bench: `n` synthetic jobs at `rho` of the status quo's GPU time."""
    jobs = synthetic(n, truth)
    problem = build_problem(curves, catalog, workload_from_trace(jobs).demand, budget)
    quo = baseline(plan_with_baselines(problem, baselines=True)[1], "status quo")
    nodes = nodes_from_counts(problem.shapes, quo.node_counts)
    rate = load_points(jobs, jobs.assign(sim_model=jobs["model"]), truth, nodes, (rho,), ())[0].plan_rate
    return problem, workload_from_trace(with_load(jobs, rate, 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--budget", type=float, default=400.0)
    parser.add_argument("--rho", type=float, default=0.8)
    parser.add_argument("--workers", type=int, default=None, help="replay processes (default: every usable CPU)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    curves, curves_from = fitted_curves()
    truth = TruthCurves.from_profiles(default_profiles(), fallback=curves)
    catalog = load_default_catalog()
    workers = usable_cpus() if args.workers is None else args.workers
    rows = [f"| jobs | candidates (pruned) | propose (MILP) | replay (2 draws each, {workers} process"
            f"{'es' if workers > 1 else ''}) | total | target | winner | predicted avg JCT vs status quo |",
            "|---:|---:|---:|---:|---:|---:|---|---:|"]
    checks = []
    for n in args.jobs:
        problem, workload = problem_and_workload(n, curves, truth, catalog, args.budget, args.rho)
        start = time.perf_counter()
        candidates = propose(problem)
        proposed = time.perf_counter() - start
        start = time.perf_counter()
        planned = plan_workload(problem, workload, workers=args.workers)
        total = time.perf_counter() - start
        chosen, status_quo = planned.row(planned.winner), planned.row("status quo")
        target = 60 if n <= 1000 else 300
        pruned = planned.candidates[planned.candidates["pruned"]]
        rows.append(f"| {n:,} | {len(candidates)} ({len(pruned)}) | {proposed:.1f} s | {total - proposed:.1f} s | "
                    f"**{total:.1f} s** | <= {target} s | {planned.winner} | "
                    f"{status_quo['avg_jct_h'] / chosen['avg_jct_h']:.2f}x |")
        print(rows[-1], flush=True)
        if n <= 1000 and len(pruned):
            every = plan_workload(problem, workload, prune_load=None, workers=args.workers)
            them = every.candidates[every.candidates["candidate"].isin(set(pruned["candidate"]))]
            names = ", ".join(f"{r.candidate} (fluid load {r.fluid_load:.2f})" for r in pruned.itertuples())
            checks.append(f"- {n:,} jobs: pruned {names}; simulated anyway, their average JCT is "
                          f"{them['avg_jct_h'].min():.3g}-{them['avg_jct_h'].max():.3g} h against the winner's "
                          f"{chosen['avg_jct_h']:.3g} h; with every candidate simulated the winner is {every.winner} "
                          f"({'the same' if every.winner == planned.winner else 'different'}).")
            print(checks[-1], flush=True)
    if args.no_record:
        return
    record(["\n## Planning for a workload: how long it takes (`bench/codesign.py`, issue 13)\n",
            f"Run: `.venv/bin/python bench/codesign.py` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}. "
            f"Budget {args.budget:g} $/h, all clouds, rho {args.rho:g} (of the status quo's GPU time), average-JCT "
            f"objective, LAS, 2 arrival draws. **Workloads are synthetic** (resampled from Gavel's Philly-derived "
            f"trace); curves {curves_from}. \"propose\" is timed alone and again inside the total (the total is one "
            f"`plan_workload` call; replay = total - propose).\n", *rows, "", "Pruning checked against the simulator:",
            *checks, ""])


if __name__ == "__main__":
    main()
