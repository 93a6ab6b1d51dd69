"""Issue 31, item 4: `hetplan evaluate --elastic` out of sample on a shipped Sia workload, fixed vs elastic counts.

Sia's Philly-derived workload 2 (160 jobs of 4-16 GPUs that may run on 1-24, shipped with hetplan), split by
arrival: the planner plans on the first half (objective: average JCT, its replays running the elastic scheduler
on the fitted scaling models), the four setups replay the second half twice, with the trace's fixed counts and with
the elastic scheduler (LAS; rounds of 300 s, `evaluate`'s default, and 60 s, Sia's), on the truth
`--truth-placements shipped` reads: Sia's measured
multi-GPU step times (the fitted models where none were measured; the RTX 2080 Ti / RTX 6000 shapes are derived).
Job work is DERIVED (Sia's epochs at a V100's measured 1-GPU rate, `hetplan.traces.sia`): every figure is a
simulation, compare setups within a row. Catalog: the shipped default, the shapes of GPU types the truth has.

    PYTHONPATH=.:bench python bench/evaluate_elastic.py [--budgets 40,80] [--rounds 300,60] [--no-record]
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import time
from pathlib import Path

import pandas as pd

from common import commit, fitted_curves, machine, record
from hetplan.catalog import load_default_catalog
from hetplan.evaluation import ElasticEvaluation, ProblemInputs, evaluate
from hetplan.evaluation.evaluate import MEASURED
from hetplan.scheduler.elastic import ElasticRule
from hetplan.sim.scaling_truth import shipped
from hetplan.traces.sia import import_sia

log = logging.getLogger("bench.evaluate_elastic")
WORKLOAD = Path(__file__).resolve().parents[1] / "hetplan/data/upstream/traces/sia_philly_workload-2.csv"


def halves() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The workload's first half by arrival (to plan on) and its second (to replay)."""
    trace = import_sia(WORKLOAD).trace.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    half = len(trace) // 2
    return trace.iloc[:half].reset_index(drop=True), trace.iloc[half:].reset_index(drop=True)


def run(budget: float, round_s: float, curves: pd.DataFrame) -> tuple[pd.DataFrame, str, float]:
    """One out-of-sample elastic evaluation at `budget` with rounds of `round_s`: its summary, hetplan's plan in
    words, and its seconds."""
    plan_trace, replay = halves()
    started = time.perf_counter()
    out = evaluate(replay, ProblemInputs(curves, load_default_catalog(), budget), None, plan_trace=plan_trace,
                   elastic=ElasticEvaluation(shipped(), MEASURED, ElasticRule(round_s=round_s)), round_s=round_s)
    wall = time.perf_counter() - started
    plans = "; ".join(f"{p.winner}: {dict(p.result.plan.node_counts)}" for p in out.plans.values()) or "steady"
    for w in out.warnings:
        log.info("budget %g: %s", budget, w)
    return out.summary, plans, wall


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="40,80")
    parser.add_argument("--rounds", default="300,60", help="round lengths (s), comma-separated")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    curves, where = fitted_curves()
    lines = [f"\n\n## Issue 31 item 4: `hetplan evaluate --elastic` out of sample, Sia workload 2 "
             f"({dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit()})\n",
             f"Machine: {machine()}. `PYTHONPATH=.:bench python bench/evaluate_elastic.py --budgets {args.budgets} "
             f"--rounds {args.rounds}`. "
             "ALL SIMULATED, job work DERIVED (Sia's epochs at a V100's 1-GPU rate); multi-GPU speeds from Sia's "
             "measured step times (`--truth-placements shipped`, label `measured`; fitted models where not "
             f"measured). Planner curves {where}. Plan on jobs 1-80 by arrival, replay 81-160 (traced arrivals), "
             "LAS; hetplan's planner weighs its candidates with the elastic scheduler. "
             "fixed/elastic = avg JCT fixed / elastic over the jobs both completed (above 1: elastic faster).\n",
             "| budget $/h | round s | setup | GPUs | $/h | avg JCT fixed h | avg JCT elastic h | fixed/elastic | "
             "restarts/job fixed / elastic | restart waste fixed / elastic | JCT speedup vs quo (fixed) |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---|---|---:|"]
    notes = []
    points = [(float(b), float(r)) for r in args.rounds.split(",") for b in args.budgets.split(",")]
    for budget, round_s in points:
        summary, plans, wall = run(budget, round_s, curves)
        for r in summary.itertuples():
            lines.append(f"| {budget:g} | {round_s:g} | {r.setup} | {r.gpus} | {r.cost_per_hour:.1f} | "
                         f"{r.avg_jct_h:.3f} | {r.elastic_avg_jct_h:.3f} | {r.elastic_jct_ratio:.2f}x | "
                         f"{r.restarts_per_job:.2f} / "
                         f"{r.elastic_restarts_per_job:.2f} | {r.restart_waste_share:.1%} / "
                         f"{r.elastic_restart_waste_share:.1%} | {r.jct_speedup:.2f}x |")
            log.info(lines[-1])
        notes.append(f"- {budget:g} $/h, {round_s:g} s rounds: hetplan's plan {plans}; evaluation {wall:.0f} s wall.")
    lines += ["", *notes, ""]
    print("\n".join(lines))
    if not args.no_record:
        record(lines)


if __name__ == "__main__":
    main()
