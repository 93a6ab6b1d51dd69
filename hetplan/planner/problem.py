"""The planning problem as arrays: node shapes, job classes, CPU/RAM options and their throughputs.

Dicts and DataFrames come in at the edge (`build_problem`); everything after is indexed arrays, the way
Gavel flattens its policies. Throughputs are per GPU and normalised per job class by `t_ref`, the class's
throughput on the reference allocation, so one unit of objective is "one reference GPU's worth of
training" whichever model it trains.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from hetplan.contracts.table import ContractError, Problem

logger = logging.getLogger(__name__)

# The reference allocation: a V100 with Synergy's GPU-proportional share (24 cores, 500 GB, 8 GPUs).
REFERENCE = ("V100", 3.0, 62.5)


@dataclass(frozen=True)
class Option:
    """One way to run a job class on a GPU type: cores and RAM per GPU and the per-GPU throughput."""

    cpus: float
    mem_gb: float
    throughput: float


@dataclass
class PlanningProblem:
    """Everything the model builder needs, as plain arrays and small records."""

    shapes: pd.DataFrame  # catalog rows kept, index 0..S-1; columns of the catalog contract + owned
    classes: pd.DataFrame  # model, num_gpus, share, demand_gpus, t_ref; index 0..J-1
    options: dict[tuple[int, str], list[Option]]  # (class, gpu_type) -> frontier options
    budget: float | None
    warnings: list[str] = field(default_factory=list)
    demand_fixed: bool = False  # True when the total demand was given, not derived from the budget

    @property
    def gpu_types(self) -> list[str]:
        return sorted(self.shapes["gpu_type"].unique())


def frontier(options: list[Option]) -> list[Option]:
    """Options no other option beats: none with no more cores, no more RAM and at least the throughput."""
    kept = []
    for o in sorted(options, key=lambda o: (o.cpus, o.mem_gb, -o.throughput)):
        if not any(k.cpus <= o.cpus and k.mem_gb <= o.mem_gb and k.throughput >= o.throughput for k in kept):
            kept.append(o)
    return kept


def prune_dominated_shapes(shapes: pd.DataFrame) -> pd.DataFrame:
    """Drop a shape when another of the same GPU type and count, unlimited, is no dearer and no smaller."""
    keep = np.ones(len(shapes), dtype=bool)
    rows = shapes.reset_index(drop=True)
    for i, a in rows.iterrows():
        same = rows[(rows["gpu_type"] == a["gpu_type"]) & (rows["gpus"] == a["gpus"]) & (rows.index != i)
                    & rows["available"].isna() & (rows["owned"] == 0)]
        better = same[(same["price_per_hour"] <= a["price_per_hour"]) & (same["vcpus"] >= a["vcpus"])
                      & (same["mem_gb"] >= a["mem_gb"])]
        strictly = better[(better["price_per_hour"] < a["price_per_hour"]) | (better["vcpus"] > a["vcpus"])
                          | (better["mem_gb"] > a["mem_gb"]) | (better.index < i)]
        if a["owned"] == 0 and len(strictly):
            keep[i] = False
    return rows[keep].reset_index(drop=True)


def build_problem(curves: pd.DataFrame, catalog: pd.DataFrame, demand: pd.DataFrame, budget: float | None,
                  demand_gpus: float | None = None, owned: dict[str, int] | None = None) -> PlanningProblem:
    """Assemble a problem from validated curve, catalog and demand tables; raise `ContractError` if hopeless.

    `demand_gpus` is the total GPU demand split by the mix's shares; by default it is the most GPUs the
    budget could buy at the cheapest usable per-GPU price, so demand never binds in aggregate but each
    class is bounded by its share.
    """
    warnings: list[str] = []
    owned = owned or {}
    unknown_owned = sorted(set(owned) - set(catalog["name"]))
    if unknown_owned:
        raise ContractError([Problem("<owned fleet>", f"owned shapes not in the catalog: {', '.join(unknown_owned)}")])
    curve_gpus = set(curves["gpu_type"])
    missing = sorted(curve_gpus - set(catalog["gpu_type"]))
    if missing:
        warnings.append(f"curve table has GPU types the catalog lacks (skipped): {', '.join(missing)}")
    shapes = catalog[catalog["gpu_type"].isin(curve_gpus)].copy()
    no_curves = sorted(set(catalog["gpu_type"]) - curve_gpus)
    if no_curves:
        warnings.append(f"catalog GPU types without curves (their shapes skipped): {', '.join(no_curves)}")
    shapes["owned"] = shapes["name"].map(owned).fillna(0).astype(int)
    before = len(shapes)
    shapes = prune_dominated_shapes(shapes)
    logger.info("shapes: %d usable, %d after dropping dominated ones", before, len(shapes))

    models = set(curves["model"])
    unknown = sorted(set(demand["model"]) - models)
    if unknown:
        warnings.append(f"demand classes without curves (not planned): {', '.join(unknown)}")
    classes = demand[demand["model"].isin(models)].reset_index(drop=True).copy()
    if classes.empty:
        raise ContractError([Problem("<demand>", "no demand class has a curve: nothing to plan")])
    if shapes.empty:
        raise ContractError([Problem("<catalog>", "no catalog shape has a GPU type with curves: nothing to plan")])
    classes["share"] = classes["share"] / classes["share"].sum()

    fixed = demand_gpus is not None
    classes["demand_gpus"] = classes["share"] * (demand_gpus if fixed else default_demand_gpus(shapes, budget))

    options: dict[tuple[int, str], list[Option]] = {}
    t_ref = []
    for j, cls in classes.iterrows():
        model_curves = curves[curves["model"] == cls["model"]]
        t_ref.append(_reference_throughput(model_curves))
        for gpu, rows in model_curves.groupby("gpu_type"):
            options[(j, str(gpu))] = frontier([Option(float(r.cpus_per_gpu), float(r.mem_gb_per_gpu),
                                                      float(r.throughput)) for r in rows.itertuples()
                                               if r.throughput > 0])
    classes["t_ref"] = [value for value, _ in t_ref]
    fallback = [cls for cls, (_, exact) in zip(classes["model"], t_ref) if not exact]
    if fallback:
        warnings.append(f"no V100 curve at or below {REFERENCE[1]:g} cores and {REFERENCE[2]:g} GB for "
                        f"{', '.join(sorted(set(fallback)))}: normalised by their best throughput on any GPU instead")
    return PlanningProblem(shapes, classes, options, budget, warnings, fixed)


def default_demand_gpus(shapes: pd.DataFrame, budget: float | None) -> float:
    """Total GPU demand when none is given: owned GPUs plus what the budget buys at the cheapest GPU price;
    without a budget, unbounded (the cost objective or the owned fleet bounds the plan)."""
    if budget is None:
        return float("inf")
    per_gpu_price = shapes["price_per_hour"] / shapes["gpus"]
    cheapest = float(per_gpu_price[per_gpu_price > 0].min()) if (per_gpu_price > 0).any() else 1.0
    return float((shapes["owned"] * shapes["gpus"]).sum()) + budget / cheapest


def with_budget(problem: PlanningProblem, budget: float) -> PlanningProblem:
    """The problem under another budget; a demand derived from the old budget is derived again."""
    classes = problem.classes.copy()
    if not problem.demand_fixed:
        classes["demand_gpus"] = classes["share"] * default_demand_gpus(problem.shapes, budget)
    return replace(problem, budget=budget, classes=classes)


def _reference_throughput(model_curves: pd.DataFrame) -> tuple[float, bool]:
    """Throughput on the reference allocation (or the nearest below it), and whether that point exists;
    else the model's best throughput on any GPU type."""
    gpu, cpus, mem = REFERENCE
    ref = model_curves[(model_curves["gpu_type"] == gpu) & (model_curves["cpus_per_gpu"] <= cpus)
                       & (model_curves["mem_gb_per_gpu"] <= mem)]
    value = float(ref["throughput"].max()) if len(ref) else float("nan")
    if np.isfinite(value) and value > 0:
        return value, True
    return float(model_curves["throughput"].max()), False
