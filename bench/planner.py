"""Benchmark the planner (issue 12): time to plan with baselines as instances grow, per objective; and the
predicted gain over the status quo on the embedded defaults, checked against an independent valuation.

Scaling instances are **synthetic**, built from the derived reference curves: job class i is model i mod 7
with its throughputs scaled by a random factor (lognormal, sigma 0.2) and a random GPU count per job (1, 2,
4 or 8), on the full 45-point (cores, RAM) grid; shapes are drawn from the default catalog, and beyond its
119 shapes, copies of drawn shapes with prices scaled by U(0.8, 1.25) (synthetic too). The comparison uses the
embedded defaults: curves fitted from the derived profiles, the shipped catalog, a demand mix of the 7 models
at equal shares; each value is re-computed with the independent LP of `tests/valuation.py` (written from the
README's definition, not from the planner's code). Appends a dated section to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from hetplan.catalog import load_default_catalog
from hetplan.planner import build_problem
from hetplan.planner.model import build_model
from hetplan.planner.baselines import baseline
from hetplan.planner.entry import plan_with_baselines
from hetplan.reference import build_reference
from common import fitted_curves, machine, record

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from valuation import mix_served  # noqa: E402  (the test helper: an independent LP)

SIZES = ((10, 10), (50, 40), (100, 60), (200, 150))
OBJECTIVES = (("mix", 0.0), ("sum", 0.0), ("sum", 1.0))


def synthetic_instance(classes: int, shapes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    derived = build_reference().derived
    models = sorted(derived["model"].unique())
    curves, demand = [], []
    for i in range(classes):
        base = derived[derived["model"] == models[i % len(models)]]
        name = f"class{i:03d}"
        curves.append(base.assign(model=name, throughput=base["throughput"] * rng.lognormal(0, 0.2)))
        demand.append((name, int(rng.choice([1, 1, 1, 2, 4, 8])), rng.random() + 0.1))
    catalog = load_default_catalog()
    picked = catalog.iloc[rng.choice(len(catalog), size=min(shapes, len(catalog)), replace=False)]
    extra = max(0, shapes - len(catalog))
    copies = catalog.iloc[rng.choice(len(catalog), size=extra)].copy()
    copies["name"] = [f"{n}#copy{i}" for i, n in enumerate(copies["name"])]
    copies["price_per_hour"] = copies["price_per_hour"] * rng.uniform(0.8, 1.25, size=extra)
    mix = pd.DataFrame(demand, columns=["model", "num_gpus", "share"])
    mix["share"] /= mix["share"].sum()
    return pd.concat(curves, ignore_index=True), pd.concat([picked, copies], ignore_index=True), mix


def scaling(repeats: int, budget: float) -> list[str]:
    rows = ["| classes x shapes | objective | variables | constraints | nonzeros | build problem | plan + baselines "
            "(median) | of it: solve | gap vs LP bound |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for classes, shapes in SIZES:
        curves, catalog, demand = synthetic_instance(classes, shapes)
        for objective, fairness in OBJECTIVES:
            builds, totals, solves = [], [], []
            for _ in range(repeats):
                start = time.perf_counter()
                problem = build_problem(curves, catalog, demand, budget)
                built = time.perf_counter()
                result, _ = plan_with_baselines(problem, objective=objective, fairness=fairness, gap=0.01)
                builds.append(built - start)
                totals.append(time.perf_counter() - start)
                solves.append(result.plan.solve_seconds)
            model = build_model(problem, objective, fairness)
            name = objective + (f", fairness {fairness:g}" if fairness else "")
            rows.append(f"| {classes} x {len(catalog)} | {name} | {model.num_vars:,} | {model.num_rows:,} "
                        f"| {model.matrix.nnz:,} | {statistics.median(builds):.2f} s | "
                        f"**{statistics.median(totals):.2f} s** | {statistics.median(solves):.2f} s | "
                        f"{result.plan.gap:.2%} |")
            print(rows[-1], flush=True)
    return rows


def comparison(budgets: list[float]) -> list[str]:
    curves, _ = fitted_curves()
    catalog = load_default_catalog()
    catalog = catalog[catalog["gpu_type"].isin(set(curves["gpu_type"]))]
    models = sorted(curves["model"].unique())
    demand = pd.DataFrame({"model": models, "num_gpus": 1, "share": 1 / len(models)})
    rows = ["| catalog | budget $/h | plan | $/h | mix served (planner) | independent LP | per $/h | vs status quo "
            "(planner / independent) | per $ vs status quo |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for label, shapes in (("all clouds", catalog), ("AWS + GCP + Azure", catalog[catalog["cloud"] != "lambda"])):
        for budget in budgets:
            _, baselines = plan_with_baselines(build_problem(curves, shapes, demand, budget), gap=1e-4)
            quo = baseline(baselines, "status quo")
            independent = {b.name: mix_served(b.node_counts, shapes, curves, demand, b.proportional)
                           for b in baselines}
            for b in baselines:
                rows.append(f"| {label} | {budget:g} | {b.name} | {b.cost_per_hour:.2f} | {b.value:.1f} | "
                            f"{independent[b.name]:.1f} | {b.per_dollar:.3f} | {b.value / quo.value:.2f}x / "
                            f"{independent[b.name] / independent['status quo']:.2f}x | "
                            f"{b.per_dollar / quo.per_dollar:.2f}x |")
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    compare = comparison([100.0, 400.0])
    scale = scaling(args.repeats, budget=500.0)
    if args.no_record:
        return
    text = [
        "\n## GPU planner: the mix objective, checked independently, and its speed (`bench/planner.py`, issue 12)\n",
        f"Run: `.venv/bin/python bench/planner.py --repeats {args.repeats}` on "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} "
        f"UTC; {machine()}. HiGHS 1.16, one thread.\n",
        "**Predicted gain over the status quo, embedded defaults** (curves fitted from the **derived** profiles, 7 "
        "models at equal shares, 1 GPU each; the catalog's shapes of GPU types with curves). \"Mix served\" = "
        "reference GPUs' worth of the demand mix per hour (the planner's objective); the independent LP "
        "(`tests/valuation.py`, from the README's definition) values the same node counts (hetplan's allocation "
        "free, the status quo's at the GPU-proportional share). Predictions from derived curves, not measurements.\n",
        *compare,
        "\n**Time to plan with baselines** (target: 200 classes x 150 shapes in <= 20 s on 2 cores, any objective; "
        "relative MIP gap 1%, budget 500 $/h). Instances are **synthetic** (see the script's docstring). The time "
        "covers building the problem and the model, the MILP and its LP bound, and the three baselines.\n",
        *scale,
        "",
    ]
    record(text)


if __name__ == "__main__":
    main()
