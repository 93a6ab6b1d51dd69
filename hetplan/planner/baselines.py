"""The baselines every evaluation reports, valued by the same model, objective and solver as hetplan's plan.

1. status quo: the owned fleet plus the single node shape that serves the most of the mix at the
   GPU-proportional share with the whole budget (availability caps respected), among the shapes big
   enough for every job class; jobs get the GPU-proportional share of cores and RAM;
2. status quo + sensitivity-aware CPU/RAM: the same cluster, the allocation free (Synergy-like);
3. GPU-only mix: the node mix chosen by GPU throughput ignoring CPU and RAM (each class's best throughput on
   each GPU type, as if cores were free; Gavel-like), then run at the proportional share;
4. hetplan: node mix and CPU/RAM split chosen together.

Each baseline is the hetplan model with other bounds (`MilpModel.pinned` / `restricted`), so its value is
the same quantity as the plan's objective. Baselines are bought as they would be without the job size a plan
must host (`MilpModel.unhosted`): they are what they are, and a job they cannot host is theirs to reject (a
class that runs as a gang is valued only where the baseline has its GPUs on one type, else left out).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from hetplan.planner.model import MilpModel, build_model, proportional_mask
from hetplan.planner.planner import MilpPlan, read_solution
from hetplan.planner.problem import OptionSet, PlanningProblem
from hetplan.planner.solvers import InfeasibleError, SolveError, SolverName, solve

STATUS_QUO = "status quo"
SENSITIVITY_AWARE = "status quo + sensitivity-aware"
GPU_ONLY = "GPU-only mix"
HETPLAN = "hetplan"


@dataclass(frozen=True)
class Evaluation:
    """One way of buying and allocating, valued by the planner's objective (reference GPUs of work per hour)."""

    name: str
    node_counts: dict[str, int]  # added nodes by shape (owned nodes are in every evaluation)
    cost_per_hour: float
    value: float
    proportional: bool  # jobs get the GPU-proportional share (else the allocation is free)

    @property
    def per_dollar(self) -> float:
        return self.value / self.cost_per_hour if self.cost_per_hour > 0 else 0.0


def baseline(evaluations: list[Evaluation], name: str) -> Evaluation | None:
    """The evaluation named `name` (None: not valued, e.g. the budget cannot buy it)."""
    return next((e for e in evaluations if e.name == name), None)


def proportional_columns(problem: PlanningProblem, model: MilpModel) -> np.ndarray:
    """Per x column of `model`: True where it is the option a GPU-proportional allocator gives its (class,
    shape)."""
    return proportional_mask(model.columns, problem.shapes)


def status_quo_counts(problem: PlanningProblem, model: MilpModel) -> dict[int, int] | None:
    """The status quo's added nodes: as many of one shape as the budget (and its cap) allows, the shape
    chosen for the most of the mix served at the proportional share. With no budget, or no shape it can buy
    that runs every class, the owned fleet alone ({}); None when there is no owned fleet either."""
    shapes = problem.shapes
    owned_only = {} if (shapes["owned"] > 0).any() else None
    if problem.budget is None or not problem.budget > 0:
        return owned_only
    keep = proportional_columns(problem, model) & ~model.columns["gang"].to_numpy(bool)
    cols = model.columns[keep]  # gangs span nodes: no shape is too small for them (the valuation says if it hosts)
    whole = np.setdiff1d(np.arange(len(problem.classes)), model.columns.loc[model.columns["gang"], "j"].unique())
    share = problem.classes["share"].to_numpy(float)[whole]
    price = shapes["price_per_hour"].to_numpy(float)
    cap = shapes["available"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        count = np.floor(problem.budget / price + 1e-9)
    count = np.where(np.isnan(cap), count, np.minimum(count, cap))
    values = cols.pivot_table(index="s", columns="j", values="value", aggfunc="max").reindex(columns=whole)
    best, best_value = None, 0.0
    for s, per_class in values.iterrows():
        if shapes.loc[s, "owned"] > 0 or not price[s] > 0 or per_class.isna().any():
            continue  # owned, free, or some class cannot run on it at the proportional share
        per_node = shapes.loc[s, "gpus"] / float(np.sum(share / per_class.to_numpy(float)))  # mix served per node
        if count[s] * per_node > best_value * (1 + 1e-9):
            best, best_value = int(s), count[s] * per_node
    return owned_only if best is None or count[best] < 1 else {best: int(count[best])}


def gpu_only_counts(problem: PlanningProblem, model: MilpModel, solver: SolverName = "auto",
                    time_limit: float = 60.0, fairness: float = 0.0) -> dict[int, int] | None:
    """The node mix a planner that ignores CPU and RAM would buy (every GPU at its plateau on the least
    cores and RAM of its curve), without the nodes its own allocation leaves idle; None when it finds none."""
    blind = replace(problem, options={
        key: OptionSet(np.array([opts.cpus.min()]), np.array([opts.mem_gb.min()]), np.array([opts.throughput.max()]))
        for key, opts in problem.options.items()})
    blind_model = build_model(blind, model.objective if model.objective != "cost" else "mix", fairness)
    try:
        return read_solution(blind, blind_model, solve(blind_model, solver, time_limit), {}).counts_by_shape
    except SolveError:
        return None


def value_of(problem: PlanningProblem, model: MilpModel, counts: dict[int, int], proportional: bool,
             solver: SolverName = "auto", time_limit: float = 60.0) -> MilpPlan | None:
    """The plan on a fixed cluster (`counts` added nodes) with the proportional or the free allocation; None
    when the cluster cannot serve the objective's constraints."""
    fixed = model.pinned(counts)
    if proportional:
        fixed = fixed.restricted(proportional_columns(problem, model))
    try:
        return read_solution(problem, fixed, solve(fixed, solver, time_limit), {})
    except InfeasibleError:
        return None


def evaluate_baselines(problem: PlanningProblem, hetplan: MilpPlan, model: MilpModel, solver: SolverName = "auto",
                       time_limit: float = 60.0, fairness: float = 0.0) -> list[Evaluation]:
    """Value the three baselines and hetplan's plan with `model` (the one the plan was solved with), the
    baselines without its hosting rows."""
    problem, model = replace(problem, host=None), model.unhosted()
    results = []
    status_quo = status_quo_counts(problem, model)
    if status_quo is not None:
        results.append(_evaluation(STATUS_QUO, problem, model, status_quo, True, solver, time_limit))
        results.append(_evaluation(SENSITIVITY_AWARE, problem, model, status_quo, False, solver, time_limit))
    gpu_only = gpu_only_counts(problem, model, solver, time_limit, fairness)
    if gpu_only is not None:
        results.append(_evaluation(GPU_ONLY, problem, model, gpu_only, True, solver, time_limit))
    results.append(Evaluation(HETPLAN, dict(hetplan.plan.node_counts), hetplan.plan.cost_per_hour,
                              hetplan.plan.objective, False))
    return results


def _evaluation(name: str, problem: PlanningProblem, model: MilpModel, counts: dict[int, int], proportional: bool,
                solver: SolverName, time_limit: float) -> Evaluation:
    result = value_of(problem, model, counts, proportional, solver, time_limit)
    names = problem.shapes["name"]
    added = {str(names[s]): n for s, n in counts.items() if n > 0}
    cost = float(sum(problem.shapes.loc[s, "price_per_hour"] * n for s, n in counts.items()))
    return Evaluation(name, added, cost, result.plan.objective if result else 0.0, proportional)


def evaluations_table(evaluations: list[Evaluation]) -> pd.DataFrame:
    """One row per evaluation, node counts as JSON-able dicts."""
    return pd.DataFrame([{"name": e.name, "cost_per_hour": e.cost_per_hour, "value": e.value,
                          "per_dollar": e.per_dollar, "proportional": e.proportional, "node_counts": e.node_counts}
                         for e in evaluations])
