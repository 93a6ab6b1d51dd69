"""Screen, then replay (issue 23): does the shortlist keep the winner that full replays choose?

For each case the plan for the workload is made twice: with full co-adaptive replays of every unpruned
candidate on every draw (`screen=None`, the planner before the screen) and with the default screen (every
candidate replayed on a sample of draw 0, the status quo and the best `SCREEN` replayed on every draw); and,
with `--sample-jobs`, a third time with the screen sampling that many jobs (so the shipped traces, shorter than
the default sample, are also screened on a true 1-in-m sample). Cases:

- `whole`: each shipped Philly-derived trace (Gavel's `gavel_philly_0e4a51`, `gavel_philly_2869ce`), its own
  arrivals, the shipped catalog (all clouds), 400 $/h;
- `oos`: the planning half of bench/evaluate.py's out-of-sample bench: each trace's first half, each catalog
  (all clouds; AWS + GCP + Azure), budgets 100 and 400 $/h, rho 0.5/0.8/1.0/1.3 (Poisson arrivals at the rate
  that asks for rho of the status quo's GPU time), unknown models relabelled as truth models (as there).

Everything is simulated with the planner's curves, fitted from DERIVED profiles. Reports the winners, the
screened plan's confidence record and the time of each.

With `--evaluate-jobs N` it instead times `hetplan.evaluation.evaluate` (what `hetplan evaluate --trace T
--budget 400 --rho R` runs: the workload plan, then the four setups replayed on the truth) on a SYNTHETIC
N-job Philly-format trace (bench/simulator.py's `synthetic_philly`: jobs resampled from Gavel's Philly-derived
trace, every job a truth model drawn at random), in-sample, the shipped catalog, 400 $/h, LAS.

Appends a dated section to bench/RESULTS.md unless `--no-record`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time

from hetplan.codesign import plan_workload, workload_from_trace
from hetplan.contracts import demand_from_trace
from hetplan.evaluation import ProblemInputs, load_points
from hetplan.planner.baselines import baseline
from hetplan.planner.entry import plan_with_baselines
from hetplan.reference import default_profiles
from hetplan.resources import upstream_path
from hetplan.sim.setups import nodes_from_counts
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import prepare_workload, with_load
from hetplan.traces import import_trace
from common import fitted_curves, machine, record
from evaluate import RHOS, TRACES, catalogs, halves
from workloads import short


def cases(args, curves, truth: TruthCurves):
    """(label, problem, workload) for every case asked for."""
    if "whole" in args.cases:
        (_, catalog), = catalogs(("all",))
        for file in args.traces:
            trace = import_trace(upstream_path("traces", file), "gavel").trace
            jobs = relabelled(trace, truth, args.seed)
            workload = workload_from_trace(jobs, seed=args.seed)
            yield f"{short(file)}, whole, all clouds, 400 $/h", ProblemInputs(curves, catalog, 400.0).problem(
                workload.demand), workload
    if "oos" in args.cases:
        for file in args.traces:
            jobs = relabelled(halves(file)[0], truth, args.seed + 1)
            for label, catalog in catalogs(args.catalogs):
                for budget in args.budgets:
                    problem = ProblemInputs(curves, catalog, budget).problem(demand_from_trace(jobs))
                    quo = baseline(plan_with_baselines(problem)[1], "status quo")
                    nodes = nodes_from_counts(problem.shapes, quo.node_counts)
                    points = load_points(jobs, jobs.assign(sim_model=jobs["model"]), truth, nodes, args.rhos, ())
                    for rho, point in zip(args.rhos, points):
                        workload = workload_from_trace(with_load(jobs, point.plan_rate, args.seed), seed=args.seed)
                        yield f"{short(file)}, first half, {label}, {budget:g} $/h, rho {rho:g}", problem, workload


def relabelled(trace, truth: TruthCurves, seed: int):
    jobs = prepare_workload(trace, truth.models, "mix", seed).jobs
    return jobs.assign(model=jobs["sim_model"]).drop(columns="sim_model")


def cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the replay pools): what a loaded, shared machine
    does not inflate, unlike wall time."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def timed(problem, workload, **kwargs):
    start = cpu_s()
    planned = plan_workload(problem, workload, **kwargs)
    return planned, cpu_s() - start


def regret(full, name: str) -> float:
    """How much worse (avg JCT, by the full replays) `name` is than the full replays' winner."""
    return float(full.row(name)["avg_jct_h"] / full.row(full.winner)["avg_jct_h"] - 1)


def evaluate_long(args, curves, truth: TruthCurves, curves_from: str) -> list[str]:
    """Time `evaluate` on a synthetic long trace; the RESULTS lines."""
    import tempfile
    from pathlib import Path

    from hetplan.catalog import load_default_catalog
    from hetplan.evaluation import evaluate
    from simulator import synthetic_philly

    with tempfile.TemporaryDirectory() as tmp:
        path = synthetic_philly(Path(tmp) / f"synthetic_philly_{args.evaluate_jobs}_seed0.csv", args.evaluate_jobs,
                                20.0, 0)
        trace = import_trace(path, "philly").trace
    start, cpu = time.perf_counter(), cpu_s()
    rhos = (args.rho,) if args.rho > 0 else ()  # 0: the trace's own arrivals
    result = evaluate(trace, ProblemInputs(curves, load_default_catalog(), 400.0), truth, rhos=rhos)
    total, cpu = time.perf_counter() - start, cpu_s() - cpu
    (plan,) = result.plans.values()
    screen = plan.weighing.screen
    rows = result.summary[["setup", "avg_jct_h", "jct_speedup"]].to_string(index=False)
    load = f"rho {args.rho:g}" if rhos else "the traced arrivals (20 jobs/h)"
    every = int(result.summary["replayed_one_in"].max())
    replayed = f"{len(trace):,}-job" if every == 1 else f"{int(result.summary['jobs'].max()):,}-job (1 in {every})"
    line = (f"- {args.evaluate_jobs:,} jobs (**synthetic**, `synthetic_philly_{args.evaluate_jobs}_seed0.csv`), "
            f"{load}, 400 $/h: **{total:.0f} s** wall, {cpu:.0f} CPU s in all (the plan and four "
            f"{replayed} truth replays); "
            f"winner {plan.winner}; screen sample {screen['screen_sample']}, replay sample {screen['replay_sample']}, "
            f"confidence {screen['confidence']}; overloaded: {screen.get('overloaded')}.")
    print(line, rows, sep="\n", flush=True)
    return [line, "", "```", rows, "```"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=["whole", "oos"], default=["whole", "oos"])
    parser.add_argument("--traces", nargs="+", default=list(TRACES))
    parser.add_argument("--catalogs", nargs="+", default=["all", "aws-gcp-azure"])
    parser.add_argument("--budgets", type=float, nargs="+", default=[100.0, 400.0])
    parser.add_argument("--rhos", type=float, nargs="+", default=list(RHOS))
    parser.add_argument("--sample-jobs", type=int, default=200,
                        help="a third plan screening on this many jobs (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--evaluate-jobs", type=int, default=0, help="time evaluate on a synthetic trace instead")
    parser.add_argument("--rho", type=float, default=0.8, help="--evaluate-jobs: the load (0: the traced arrivals)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    curves, curves_from = fitted_curves()
    truth = TruthCurves.from_profiles(default_profiles(), fallback=curves)
    if args.evaluate_jobs:
        lines = evaluate_long(args, curves, truth, curves_from)
        if not args.no_record:
            record([f"\n## `hetplan evaluate` on a long synthetic trace, screened (`bench/screening.py "
                    f"--evaluate-jobs {args.evaluate_jobs}`, issue 23)\n",
                    f"Run on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}; curves {curves_from} "
                    "(**derived data**).\n", *lines, ""])
        return
    rows = ["| case | jobs | full replays: winner | CPU s | screened (default): winner | CPU s | lead / 2 SE | "
            f"screened on {args.sample_jobs} jobs: winner | CPU s |", "|---|---:|---|---:|---|---:|---:|---|---:|"]
    same = differ = 0
    for label, problem, workload in cases(args, curves, truth):
        full, t_full = timed(problem, workload, screen=None)
        screened, t_screen = timed(problem, workload)
        small, t_small = timed(problem, workload, screen_jobs=args.sample_jobs) if args.sample_jobs else (None, 0.0)
        agree = full.winner == screened.winner == (small.winner if small else screened.winner)
        same, differ = same + agree, differ + (not agree)
        lead = screened.screen["confidence"].get("lead_over_2se")
        mark = "" if agree else f" **differs** (regret {regret(full, screened.winner):.1%})"
        rows.append(f"| {label} | {workload.summary['jobs']:,} | {full.winner} | {t_full:.1f} s | "
                    f"{screened.winner}{mark} | {t_screen:.1f} s | {'-' if lead is None else f'{lead:.2f}'} | "
                    f"{small.winner if small else '-'} | {t_small:.1f} s |")
        print(rows[-1], flush=True)
    verdict = f"Winners the same in {same} of {same + differ} cases."
    print(verdict, flush=True)
    if args.no_record:
        return
    record(["\n## Screen, then replay: winners against full replays (`bench/screening.py`, issue 23)\n",
            f"Run: `.venv/bin/python bench/screening.py{''.join(' ' + a for a in sys.argv[1:])}` on "
            f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}; {time.perf_counter() - started:.0f} s in "
            f"all. Simulated with the planner's curves {curves_from} (**derived data**); average-JCT objective, "
            "LAS, 2 arrival draws. \"full replays\": every unpruned candidate on every draw (`screen=None`); "
            "\"screened\": every candidate on draw 0 (sampled to 2,000 jobs, so whole here), the status quo and "
            f"the best 4 on every draw; \"on {args.sample_jobs} jobs\": the screen on a 1-in-m sample of draw 0. "
            "lead / 2 SE: the winner's lead over the runner-up over twice their batch-means standard error "
            "(above 1: decisive; `-`: no replayed runner-up). Times are CPU seconds (this process and its replay "
            "workers), as the shared machine's load makes wall time meaningless.\n",
            *rows, "", verdict, ""])


if __name__ == "__main__":
    main()
