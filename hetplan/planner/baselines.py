"""The baselines every evaluation reports, computed by the same model and solver as hetplan's plan.

1. status quo: the single node shape with the best GPU throughput per dollar at the GPU-proportional share
   among those big enough for every job class, bought with the whole budget, jobs given the GPU-proportional
   share of cores and RAM;
2. status quo + sensitivity-aware CPU/RAM: the same cluster, the allocation free (Synergy-like);
3. GPU-only mix: the node mix chosen by GPU throughput per dollar ignoring CPU and RAM (each class's best
   throughput on each GPU type, as if cores were free; Gavel-like), then run at the proportional share;
4. hetplan: node mix and CPU/RAM split chosen together.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from hetplan.planner.hints import proportional_option
from hetplan.planner.planner import PlanResult, nodes_of, plan_cluster
from hetplan.planner.problem import Option, PlanningProblem
from hetplan.planner.solvers import InfeasibleError, SolverName


STATUS_QUO = "status quo"
SENSITIVITY_AWARE = "status quo + sensitivity-aware"
GPU_ONLY = "GPU-only mix"
HETPLAN = "hetplan"


@dataclass(frozen=True)
class Evaluation:
    """One way of buying and allocating, scored by the planner's objective."""

    name: str
    node_counts: dict[str, int]
    cost_per_hour: float
    normalized_throughput: float

    @property
    def per_dollar(self) -> float:
        return self.normalized_throughput / self.cost_per_hour if self.cost_per_hour > 0 else 0.0


def proportional_options(problem: PlanningProblem) -> dict[tuple[int, int], tuple[float, float]]:
    """Per (class, shape): the option a GPU-proportional allocator gives."""
    chosen = {}
    for j in problem.classes.index:
        for s, shape in problem.shapes.iterrows():
            option = proportional_option(problem.options.get((j, shape["gpu_type"]), []), shape)
            if option is not None:
                chosen[(j, s)] = (option.cpus, option.mem_gb)
    return chosen


def best_value_shape(problem: PlanningProblem, only: dict[tuple[int, int], tuple[float, float]]) -> int | None:
    """The shape with the most demand-weighted normalised throughput per dollar at the proportional share,
    among those the budget can buy at least one of, that are available, and whose nodes can run the largest job
    any of those can run (a homogeneous cluster must run every job it can)."""
    shapes = problem.shapes
    affordable = shapes["price_per_hour"] <= problem.budget if problem.budget is not None else True
    candidates = shapes[(shapes["price_per_hour"] > 0) & affordable
                        & ~(shapes["available"].notna() & (shapes["available"] == 0))]
    if candidates.empty:
        return None
    runnable = problem.classes["num_gpus"][problem.classes["num_gpus"] <= candidates["gpus"].max()]
    largest_job = int(runnable.max()) if len(runnable) else 1
    best, best_value = None, 0.0
    for s, shape in candidates[candidates["gpus"] >= largest_job].iterrows():
        per_gpu = 0.0
        for j, cls in problem.classes.iterrows():
            if (j, s) in only and shape["gpus"] >= cls["num_gpus"]:
                option = next(o for o in problem.options[(j, shape["gpu_type"])] if (o.cpus, o.mem_gb) == only[(j, s)])
                per_gpu += cls["share"] * option.throughput / cls["t_ref"]
        value = per_gpu * shape["gpus"] / shape["price_per_hour"]
        if value > best_value:
            best, best_value = s, value
    return best


def evaluate_baselines(problem: PlanningProblem, hetplan: PlanResult, solver: SolverName = "auto",
                       time_limit: float = 60.0, fairness: float = 0.0) -> list[Evaluation]:
    """Score the three baselines and hetplan's plan on the same problem, budget and fairness floor."""
    only = proportional_options(problem)
    results = []
    shape = best_value_shape(problem, only)
    if shape is not None and problem.budget is not None:
        cap = problem.shapes.loc[shape, "available"]
        count = int(np.floor(problem.budget / problem.shapes.loc[shape, "price_per_hour"] + 1e-9))
        count = count if pd.isna(cap) else min(count, int(cap))
        fixed = {shape: count}
        results.append(_evaluate(STATUS_QUO, problem, fixed, only, solver, time_limit, fairness))
        results.append(_evaluate(SENSITIVITY_AWARE, problem, fixed, None, solver, time_limit, fairness))
    # As if every GPU reached its plateau on the least cores and RAM of the grid: CPU and RAM ignored.
    gpu_only = replace(problem, options={
        key: [Option(min(o.cpus for o in opts), min(o.mem_gb for o in opts), max(o.throughput for o in opts))]
        for key, opts in problem.options.items() if opts})
    try:
        mix = plan_cluster(gpu_only, solver=solver, time_limit=time_limit, fairness=fairness)
        results.append(_evaluate(GPU_ONLY, problem, nodes_of(mix, gpu_only), only, solver, time_limit, fairness))
    except InfeasibleError:
        pass
    results.append(Evaluation(HETPLAN, dict(hetplan.plan.node_counts), hetplan.plan.cost_per_hour,
                              hetplan.plan.objective))
    return results


def _evaluate(name: str, problem: PlanningProblem, fixed: dict[int, int],
              only: dict[tuple[int, int], tuple[float, float]] | None, solver: SolverName,
              time_limit: float, fairness: float) -> Evaluation:
    fixed = {s: fixed.get(s, 0) for s in range(len(problem.shapes))}
    try:
        result = plan_cluster(problem, fixed_nodes=fixed, only_options=only, solver=solver, time_limit=time_limit,
                              fairness=fairness)
    except InfeasibleError:  # e.g. a fairness floor this cluster cannot meet
        return Evaluation(name, {}, 0.0, 0.0)
    return Evaluation(name, dict(result.plan.node_counts), result.plan.cost_per_hour, result.plan.objective)
