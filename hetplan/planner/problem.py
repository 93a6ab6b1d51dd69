"""The planning problem as arrays: node shapes, job classes, CPU/RAM options and their throughputs.

Dicts and DataFrames come in at the edge (`build_problem`); everything after is indexed arrays, the way
Gavel flattens its policies. Throughputs are per GPU and normalised per job class by `t_ref`, the class's
throughput on the reference allocation, so one unit is "one reference GPU's worth of training" whichever
model it trains.

Shapes are what can be bought (the catalog) plus what is owned (an owned fleet: price 0, nothing more to
add). Every shape's GPU type and every class's model gets curves: measured or fitted where they exist,
else the stated defaults of `hetplan.planner.defaults` (listed in `defaults`), so nothing is dropped
silently. A class larger than every node runs as a gang over nodes of one GPU type (`hetplan.gangs`; the
model's gang columns); only a class no shape can run at all (a gang no GPU type the budget buys can host, or
no option fitting a node's cores and RAM) is left out, and counted.

`host` is the job size every plan must host (`hetplan.planner.sizes`): the demand's largest job with a
margin, the owned fleet's history and the user's `max_job_gpus` taken in, checked against the budget.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from hetplan.contracts.table import ContractError, Problem
from hetplan.gpus import REFERENCE, GpuDeclaration
from hetplan.planner.defaults import Completion, complete_curves
from hetplan.planner.sizes import HostSizes, implied_sizes, settle

logger = logging.getLogger(__name__)

__all__ = ["REFERENCE", "OptionSet", "PlanningProblem", "Surface", "build_problem", "default_demand_gpus", "frontier",
           "hosting_at_most", "prune_dominated_shapes", "with_budget"]


@dataclass(frozen=True)
class Surface:
    """A curve on its (cores, RAM) grid, to value shares between grid points: bilinear inside, held flat
    above the grid, undefined (NaN) below its smallest point on either axis."""

    cpus: np.ndarray  # ascending
    mem_gb: np.ndarray  # ascending
    values: np.ndarray  # [mem, cpus]; NaN where the grid has no point

    def at(self, cpus: np.ndarray, mem_gb: np.ndarray) -> np.ndarray:
        cpus, mem_gb = np.asarray(cpus, dtype=float), np.asarray(mem_gb, dtype=float)
        below = (cpus < self.cpus[0] - 1e-9) | (mem_gb < self.mem_gb[0] - 1e-9)
        ci, fc = _cell(self.cpus, cpus)
        mi, fm = _cell(self.mem_gb, mem_gb)
        ci1, mi1 = np.minimum(ci + 1, len(self.cpus) - 1), np.minimum(mi + 1, len(self.mem_gb) - 1)
        v = self.values
        value = ((1 - fc) * (1 - fm) * v[mi, ci] + fc * (1 - fm) * v[mi, ci1] + (1 - fc) * fm * v[mi1, ci]
                 + fc * fm * v[mi1, ci1])
        return np.where(below, np.nan, value)


def _cell(axis: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the grid cell holding each x (clamped to the axis) and the fraction across it."""
    x = np.clip(x, axis[0], axis[-1])
    i = np.clip(np.searchsorted(axis, x, side="right") - 1, 0, len(axis) - 1)
    i1 = np.minimum(i + 1, len(axis) - 1)
    span = axis[i1] - axis[i]
    return i, np.where(span > 0, (x - axis[i]) / np.where(span > 0, span, 1.0), 0.0)


@dataclass(frozen=True)
class OptionSet:
    """The ways to run a job class on a GPU type: cores and RAM per GPU and the per-GPU throughput, one
    entry per option, none dominated by another (no more cores, no more RAM, at least the throughput); and
    the curve's surface, which values the GPU-proportional share of each node between grid points."""

    cpus: np.ndarray
    mem_gb: np.ndarray
    throughput: np.ndarray
    surface: Surface | None = None

    def __len__(self) -> int:
        return len(self.cpus)

    def best_within(self, cpus: float, mem_gb: float) -> int | None:
        """Index of the best option within `cpus` cores and `mem_gb` GB per GPU (fewest resources on ties)."""
        fits = np.flatnonzero((self.cpus <= cpus + 1e-9) & (self.mem_gb <= mem_gb + 1e-9))
        if not len(fits):
            return None
        order = np.lexsort((self.mem_gb[fits], self.cpus[fits], -self.throughput[fits]))
        return int(fits[order[0]])


def frontier(cpus: np.ndarray, mem_gb: np.ndarray, throughput: np.ndarray) -> OptionSet:
    """The options no other option beats (vectorised pairwise dominance, duplicates kept once)."""
    cpus, mem_gb, throughput = (np.asarray(a, dtype=float) for a in (cpus, mem_gb, throughput))
    keep = throughput > 0
    cpus, mem_gb, throughput = cpus[keep], mem_gb[keep], throughput[keep]
    order = np.lexsort((-throughput, mem_gb, cpus))
    cpus, mem_gb, throughput = cpus[order], mem_gb[order], throughput[order]
    no_more = (cpus[None, :] <= cpus[:, None]) & (mem_gb[None, :] <= mem_gb[:, None])
    at_least = throughput[None, :] >= throughput[:, None]
    strictly = ((cpus[None, :] < cpus[:, None]) | (mem_gb[None, :] < mem_gb[:, None])
                | (throughput[None, :] > throughput[:, None]))
    earlier = np.arange(len(cpus))[None, :] < np.arange(len(cpus))[:, None]
    dominated = (no_more & at_least & (strictly | earlier)).any(axis=1)
    return OptionSet(cpus[~dominated], mem_gb[~dominated], throughput[~dominated])


@dataclass
class PlanningProblem:
    """Everything the model builder needs, as plain arrays and small records."""

    shapes: pd.DataFrame  # name, gpu_type, gpus, vcpus, mem_gb, price_per_hour, available, owned; index 0..S-1
    classes: pd.DataFrame  # model, num_gpus, share, demand_gpus, t_ref, curve; index 0..J-1
    options: dict[tuple[int, str], OptionSet]  # (class, gpu_type) -> frontier
    budget: float | None
    warnings: list[str] = field(default_factory=list)
    demand_fixed: bool = False  # True when the total demand was given, not derived from the budget
    defaults: Completion = field(default_factory=Completion)
    unplannable: pd.DataFrame = field(default_factory=pd.DataFrame)  # classes no shape can run: model, num_gpus, share
    host: HostSizes | None = None  # the job size every plan hosts (None: no requirement)

    @property
    def gpu_types(self) -> list[str]:
        return sorted(self.shapes["gpu_type"].unique())


def prune_dominated_shapes(shapes: pd.DataFrame) -> pd.DataFrame:
    """Drop a bought shape when another of the same GPU type and count, unlimited, is no dearer and no smaller
    (the first of identical ones is kept). Owned shapes always stay; a capped shape stays unless an unlimited
    one dominates it."""
    rows = shapes.reset_index(drop=True)
    gpu, count = rows["gpu_type"].to_numpy(), rows["gpus"].to_numpy()
    price, vcpus, mem = (rows[c].to_numpy(float) for c in ("price_per_hour", "vcpus", "mem_gb"))
    unlimited = (rows["available"].isna() & (rows["owned"] == 0)).to_numpy()
    same = (gpu[:, None] == gpu[None, :]) & (count[:, None] == count[None, :]) & unlimited[None, :]
    better = (price[None, :] <= price[:, None]) & (vcpus[None, :] >= vcpus[:, None]) & (mem[None, :] >= mem[:, None])
    strictly = ((price[None, :] < price[:, None]) | (vcpus[None, :] > vcpus[:, None]) | (mem[None, :] > mem[:, None])
                | (np.arange(len(rows))[None, :] < np.arange(len(rows))[:, None]))
    np.fill_diagonal(same, False)
    dominated = (same & better & strictly).any(axis=1) & (rows["owned"] == 0).to_numpy()
    return rows[~dominated].reset_index(drop=True)


def build_problem(curves: pd.DataFrame, catalog: pd.DataFrame, demand: pd.DataFrame, budget: float | None,
                  demand_gpus: float | None = None, fleet: pd.DataFrame | None = None,
                  declarations: Mapping[str, GpuDeclaration] | None = None, *, max_job_gpus: int | None = None,
                  history_gpus: int | None = None) -> PlanningProblem:
    """Assemble a problem from validated curve, catalog and demand tables; raise `ContractError` if hopeless.

    `fleet` is the owned fleet (`name,gpu_type,gpus,vcpus,mem_gb,count`): free capacity the plan always
    includes. `declarations` say how GPU types without curves run (else the opaque default). `demand_gpus`
    is the total GPU demand behind the `sum` objective's per-class caps; by default what the budget could
    buy at the cheapest per-GPU price plus the owned GPUs, so it never binds in aggregate.

    Every plan of the problem hosts the demand's largest job with a margin (`hetplan.planner.sizes`), at least
    `history_gpus` (the owned fleet's largest job) and `max_job_gpus` (the user's); a budget that cannot buy
    the required size raises `ContractError`.
    """
    warnings: list[str] = []
    shapes = _shapes(catalog, fleet)
    if shapes.empty:
        raise ContractError([Problem("<catalog>", "no node shape to plan with: the catalog (after filters) and "
                                     "the owned fleet are both empty")])
    if demand.empty:
        raise ContractError([Problem("<demand>", "the demand mix is empty: nothing to plan")])
    completion = complete_curves(curves, sorted(set(demand["model"])), sorted(set(shapes["gpu_type"])),
                                 declarations or {})
    warnings += completion.warnings
    curves = completion.curves
    missing = sorted(set(curves["gpu_type"]) - set(shapes["gpu_type"]))
    if missing:
        warnings.append(f"curve table has GPU types the catalog lacks (skipped): {', '.join(missing)}")
    uncurved = sorted(set(shapes["gpu_type"]) - set(curves["gpu_type"]))
    if uncurved:
        warnings.append(f"GPU types no curve can be made for (their shapes skipped): {', '.join(uncurved)}")
        shapes = shapes[~shapes["gpu_type"].isin(uncurved)]
    before = len(shapes)
    shapes = prune_dominated_shapes(shapes)
    logger.info("shapes: %d usable, %d after dropping dominated ones", before, len(shapes))

    classes = demand.reset_index(drop=True)[["model", "num_gpus", "share"]].copy()
    classes["share"] = classes["share"] / classes["share"].sum()
    options, t_ref, exact = _options(curves, classes, shapes)
    classes["t_ref"] = t_ref
    classes["curve"] = ["default" if m in completion.default_models else "profiled" for m in classes["model"]]
    runnable = _runnable(PlanningProblem(shapes, classes, options, budget))
    unplannable = classes.loc[~runnable, ["model", "num_gpus", "share"]].reset_index(drop=True)
    if len(unplannable):
        warnings.append(f"{len(unplannable)} demand classes no shape can run (larger than every node and than "
                        f"every GPU type the budget buys, or no option fits a node's cores and RAM), "
                        f"{unplannable['share'].sum():.1%} of the demand, left out: "
                        + ", ".join(f"{r.model} x{r.num_gpus}" for r in unplannable.itertuples()))
    if not runnable.any():
        raise ContractError([Problem("<demand>", "no demand class can run on any shape: nothing to plan")])
    if not exact.all():
        fallback = sorted(set(classes.loc[~exact, "model"]))
        warnings.append(f"no V100 curve at or below {REFERENCE[1]:g} cores and {REFERENCE[2]:g} GB for "
                        f"{', '.join(fallback)}: normalised by their best throughput on any GPU instead")
    keep = np.flatnonzero(runnable)
    remap = {int(old): new for new, old in enumerate(keep)}
    options = {(remap[j], g): o for (j, g), o in options.items() if j in remap}
    classes = classes.iloc[keep].reset_index(drop=True)
    classes["share"] = classes["share"] / classes["share"].sum()

    fixed = demand_gpus is not None
    classes["demand_gpus"] = classes["share"] * (demand_gpus if fixed else default_demand_gpus(shapes, budget))
    host, short = settle(implied_sizes(demand["num_gpus"], history_gpus, max_job_gpus), shapes, budget)
    warnings += short
    return PlanningProblem(shapes, classes, options, budget, warnings, fixed, completion, unplannable, host)


def hosting_at_most(problem: PlanningProblem, gpus: int) -> PlanningProblem:
    """The problem for plans that host jobs of at most `gpus` GPUs: the classes larger than that are declined
    (left out of the plan, their shares dropped, the others' kept in proportion) and no larger size must be
    hosted. Declined is not unplannable: a workload's declined jobs are still offered to the cluster, which
    refuses them when it cannot host them (`hetplan.codesign.candidates`)."""
    keep = np.flatnonzero(problem.classes["num_gpus"].to_numpy(int) <= gpus)
    if len(keep) == len(problem.classes):
        return problem
    if not len(keep):
        raise ValueError(f"no class of at most {gpus} GPUs to plan for")
    remap = {int(old): new for new, old in enumerate(keep)}
    classes = problem.classes.iloc[keep].reset_index(drop=True)
    classes["share"] = classes["share"] / classes["share"].sum()
    options = {(remap[j], g): o for (j, g), o in problem.options.items() if j in remap}
    host = None if problem.host is None else replace(problem.host, gpus=min(problem.host.gpus, gpus))
    return replace(problem, classes=classes, options=options, host=host)


def default_demand_gpus(shapes: pd.DataFrame, budget: float | None) -> float:
    """Total GPU demand when none is given: owned GPUs plus what the budget buys at the cheapest GPU price;
    without a budget, unbounded (the cost objective or the owned fleet bounds the plan)."""
    owned = float((shapes["owned"] * shapes["gpus"]).sum())
    if budget is None:
        return float("inf")
    per_gpu_price = shapes["price_per_hour"] / shapes["gpus"]
    cheapest = float(per_gpu_price[per_gpu_price > 0].min()) if (per_gpu_price > 0).any() else 1.0
    return owned + budget / cheapest


def with_budget(problem: PlanningProblem, budget: float) -> PlanningProblem:
    """The problem under another budget; a demand derived from the old budget is derived again."""
    classes = problem.classes.copy()
    if not problem.demand_fixed:
        classes["demand_gpus"] = classes["share"] * default_demand_gpus(problem.shapes, budget)
    return replace(problem, budget=budget, classes=classes)


def _shapes(catalog: pd.DataFrame, fleet: pd.DataFrame | None) -> pd.DataFrame:
    """Bought shapes (owned 0) and owned ones (price 0, none more to add), in one table."""
    columns = ["name", "gpu_type", "gpus", "vcpus", "mem_gb", "price_per_hour", "available"]
    bought = catalog.assign(available=catalog.get("available", np.nan))[columns].assign(owned=0)
    frames = [bought]
    if fleet is not None and len(fleet):
        clash = sorted(set(fleet["name"]) & set(catalog["name"]))
        if clash:
            raise ContractError([Problem("<owned fleet>", f"owned shape names also name catalog shapes: "
                                         f"{', '.join(clash)}; name owned nodes apart (e.g. owned:{clash[0]})")])
        frames.append(fleet.assign(price_per_hour=0.0, available=0)[columns[:-1] + ["available"]]
                      .assign(owned=fleet["count"].astype(int)))
    shapes = pd.concat([f for f in frames if len(f)], ignore_index=True) if any(len(f) for f in frames) \
        else bought.iloc[:0]
    shapes["available"] = shapes["available"].astype(float)
    shapes["owned"] = shapes["owned"].astype(int)
    return shapes[(shapes["owned"] > 0) | ~(shapes["available"] == 0)].reset_index(drop=True)


def _runnable(problem: PlanningProblem) -> np.ndarray:
    """Per class: whether one job of it fits some shape with some option (GPUs, cores and RAM; a class on the
    unprofiled default only at its proportional share): the classes the model has columns for."""
    from hetplan.planner.model import x_columns  # the model module builds on this one

    return np.isin(np.arange(len(problem.classes)), x_columns(problem)["j"].to_numpy())


def _options(curves: pd.DataFrame, classes: pd.DataFrame,
             shapes: pd.DataFrame) -> tuple[dict[tuple[int, str], OptionSet], list[float], np.ndarray]:
    """Frontier options per (class, GPU type of some shape), and each class's reference throughput."""
    gpu_types = set(shapes["gpu_type"])
    frontiers: dict[tuple[str, str], OptionSet] = {}
    wanted = curves[curves["model"].isin(set(classes["model"])) & curves["gpu_type"].isin(gpu_types)]
    cpus_all, mem_all, tput_all = (wanted[c].to_numpy(float) for c in ("cpus_per_gpu", "mem_gb_per_gpu", "throughput"))
    for (model, gpu), idx in wanted.groupby(["model", "gpu_type"], sort=False).indices.items():
        cpus, mem, tput = cpus_all[idx], mem_all[idx], tput_all[idx]
        frontiers[(str(model), str(gpu))] = replace(frontier(cpus, mem, tput), surface=_surface(cpus, mem, tput))
    ref = _reference_throughputs(curves)
    options = {}
    t_ref, exact = [], []
    for j, model in enumerate(classes["model"]):
        value, is_exact = ref.get(model, (0.0, False))
        t_ref.append(value)
        exact.append(is_exact)
        for gpu in gpu_types:
            found = frontiers.get((model, gpu))
            if found is not None and len(found):
                options[(j, gpu)] = found
    return options, t_ref, np.array(exact, dtype=bool)


def _surface(cpus: np.ndarray, mem_gb: np.ndarray, throughput: np.ndarray) -> Surface:
    """The grid of a curve's points (the mean where a cell has several; NaN where it has none)."""
    c_axis, ci = np.unique(cpus, return_inverse=True)
    m_axis, mi = np.unique(mem_gb, return_inverse=True)
    cell = mi * len(c_axis) + ci
    total = np.bincount(cell, weights=throughput, minlength=len(c_axis) * len(m_axis))
    count = np.bincount(cell, minlength=len(c_axis) * len(m_axis))
    values = np.where(count > 0, total / np.maximum(count, 1), np.nan).reshape(len(m_axis), len(c_axis))
    return Surface(c_axis, m_axis, values)


def _reference_throughputs(curves: pd.DataFrame) -> dict[str, tuple[float, bool]]:
    """Per model: throughput on the reference allocation (or the nearest below it) and whether that point
    exists; else the model's best throughput on any GPU type."""
    gpu, cpus, mem = REFERENCE
    best = curves.groupby("model")["throughput"].max()
    at_ref = curves[(curves["gpu_type"] == gpu) & (curves["cpus_per_gpu"] <= cpus) & (curves["mem_gb_per_gpu"] <= mem)]
    ref = at_ref.groupby("model")["throughput"].max()
    out = {}
    for model, value in best.items():
        r = float(ref.get(model, np.nan))
        out[str(model)] = (r, True) if np.isfinite(r) and r > 0 else (float(value), False)
    return out
