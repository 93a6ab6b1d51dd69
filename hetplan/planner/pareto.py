"""Budget sweeps: the Pareto frontier of budget vs normalised throughput, hetplan beside its baselines.

The model is built once, for the largest budget (so the demand, which defaults from the budget, is the
same at every point); each further budget changes only the budget row and the node-count bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd

from hetplan.planner.baselines import evaluate_baselines
from hetplan.planner.model import build_model
from hetplan.planner.planner import PlanResult, plan_cluster
from hetplan.planner.problem import PlanningProblem, with_budget
from hetplan.planner.solvers import InfeasibleError, SolverName


@dataclass
class SweepPoint:
    budget: float
    result: PlanResult | None
    evaluations: pd.DataFrame  # name, cost_per_hour, normalized_throughput, per_dollar


def sweep(problem: PlanningProblem, budgets: list[float], solver: SolverName = "auto", time_limit: float = 60.0,
          gap: float = 1e-3, fairness: float = 0.0, baselines: bool = True) -> list[SweepPoint]:
    """Plan at each budget (ascending), reusing one model; infeasible budgets yield `result=None`."""
    budgets = sorted(budgets)
    top = with_budget(problem, budgets[-1])
    base = build_model(top, fairness=fairness)
    points = []
    for budget in budgets:
        at = replace(top, budget=budget)
        try:
            result = plan_cluster(at, solver=solver, time_limit=time_limit, gap=gap, model=base.with_budget(budget))
        except InfeasibleError:
            points.append(SweepPoint(budget, None, pd.DataFrame()))
            continue
        rows = [(e.name, e.cost_per_hour, e.normalized_throughput, e.per_dollar)
                for e in (evaluate_baselines(at, result, solver, time_limit, fairness) if baselines else [])]
        evaluations = pd.DataFrame(rows, columns=["name", "cost_per_hour", "normalized_throughput", "per_dollar"])
        points.append(SweepPoint(budget, result, evaluations))
    return points


def frontier_table(points: list[SweepPoint]) -> pd.DataFrame:
    """One row per (budget, way of planning) with cost and normalised throughput."""
    frames = [p.evaluations.assign(budget=p.budget) for p in points if len(p.evaluations)]
    if not frames:
        frames = [pd.DataFrame({"name": ["hetplan"], "budget": [p.budget], "cost_per_hour": [p.result.plan.cost_per_hour],
                                "normalized_throughput": [p.result.plan.objective],
                                "per_dollar": [p.result.throughput_per_dollar]}) for p in points if p.result]
    return pd.concat(frames, ignore_index=True)[["budget", "name", "cost_per_hour", "normalized_throughput", "per_dollar"]]
