"""Benchmark the planner: solve time and gap as instances grow, and hetplan vs baselines on the defaults.

Scaling instances are **synthetic**, built from the derived reference curves: job class i is model
i mod 7 with its throughputs scaled by a random factor (lognormal, sigma 0.2) and a random GPU count per job
(1, 2, 4 or 8); shapes are drawn from the default catalog; 14 (cores, RAM) grid points per class and GPU type
before frontier pruning. The comparison uses the embedded defaults: the derived curves, the shipped catalog
and the demand mix of Synergy's 100-job trace. Appends a dated section to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time

import numpy as np
import pandas as pd

from hetplan.catalog import load_default_catalog
from hetplan.contracts import demand_from_trace
from hetplan.planner import build_model, build_problem, evaluate_baselines, plan_cluster, solve
from hetplan.reference import build_reference
from hetplan.resources import upstream_path
from hetplan.traces import import_trace
from common import machine, record

SIZES = ((10, 10), (25, 20), (50, 40), (100, 60))
CORES = (1, 2, 4, 6, 9, 12, 24)
MEMS = (62.5, 250.0)


def synthetic_instance(classes: int, shapes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    derived = build_reference().derived
    derived = derived[derived["cpus_per_gpu"].isin(CORES) & derived["mem_gb_per_gpu"].isin(MEMS)]
    models = sorted(derived["model"].unique())
    curves, demand = [], []
    for i in range(classes):
        base = derived[derived["model"] == models[i % len(models)]]
        name = f"class{i:03d}"
        curves.append(base.assign(model=name, throughput=base["throughput"] * rng.lognormal(0, 0.2)))
        demand.append((name, int(rng.choice([1, 1, 1, 2, 4, 8])), rng.random() + 0.1))
    catalog = load_default_catalog()
    catalog = catalog.iloc[rng.choice(len(catalog), size=min(shapes, len(catalog)), replace=False)]
    mix = pd.DataFrame(demand, columns=["model", "num_gpus", "share"])
    mix["share"] /= mix["share"].sum()
    return pd.concat(curves, ignore_index=True), catalog.reset_index(drop=True), mix




def scaling(repeats: int, budget: float) -> list[str]:
    rows = ["| classes x shapes | variables | constraints | solve (MILP + LP, median) | gap vs LP bound | MIP gap |",
            "|---|---:|---:|---:|---:|---:|"]
    for classes, shapes in SIZES:
        curves, catalog, demand = synthetic_instance(classes, shapes)
        problem = build_problem(curves, catalog, demand, budget)
        model = build_model(problem)
        times, solution = [], None
        for _ in range(repeats):
            start = time.perf_counter()
            solution = solve(model, "highs", time_limit=60, gap=0.01)
            times.append(time.perf_counter() - start)
        rows.append(f"| {classes} x {len(problem.shapes)} | {model.num_vars:,} | {model.num_rows:,} | "
                    f"{statistics.median(times):.2f} s | {solution.gap:.2%} | {solution.mip_gap:.2%} |")
        print(rows[-1])
    return rows


def comparison(budgets: list[float]) -> list[str]:
    curves = build_reference().derived
    catalog = load_default_catalog()
    demand = demand_from_trace(import_trace(upstream_path("traces", "synergy_static_100job.csv"), "synergy").trace)
    rows = ["| catalog | budget $/h | plan | $/h | normalised throughput | per $/h | vs status quo |",
            "|---|---:|---|---:|---:|---:|---:|"]
    for label, shapes in (("all clouds", catalog), ("AWS + GCP + Azure", catalog[catalog["cloud"] != "lambda"])):
        for budget in budgets:
            problem = build_problem(curves, shapes, demand, budget)
            result = plan_cluster(problem, gap=1e-3)
            evaluations = evaluate_baselines(problem, result)
            base = next(e for e in evaluations if e.name == "status quo").normalized_throughput
            for e in evaluations:
                rows.append(f"| {label} | {budget:g} | {e.name} | {e.cost_per_hour:.2f} | {e.normalized_throughput:.1f} | "
                            f"{e.per_dollar:.3f} | {e.normalized_throughput / base:.2f}x |")
                print(rows[-1])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    scale = scaling(args.repeats, budget=500.0)
    compare = comparison([100.0, 400.0])
    if args.no_record:
        return
    text = [
        "\n## GPU planner (`bench/planner.py`, issue 5)\n",
        f"Run: `.venv/bin/python bench/planner.py --repeats {args.repeats}` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} "
        f"UTC; {machine()}. HiGHS 1.16, one thread, relative MIP gap 1%, budget 500 $/h.\n",
        "**Solve time as the instance grows** (target: 100 classes x 60 shapes to 1% gap in under 10 s). Instances are "
        "**synthetic** (derived curves, scaled per class; see the script's docstring); shapes are those left after "
        "dropping dominated ones. The time covers the MILP and the LP relaxation that gives the reported bound.\n",
        *scale,
        "\n**Predicted performance, hetplan vs baselines, embedded defaults** (derived curves of 7 models on 17 GPU "
        "types, the shipped catalog, Synergy trace demand mix). \"Normalised throughput\" counts reference-GPU "
        "equivalents (a V100 with 3 cores and 62.5 GB); predictions come from the **derived** curves, not "
        "measurements.\n",
        *compare,
        "",
    ]
    record(text)


if __name__ == "__main__":
    main()
