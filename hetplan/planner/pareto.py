"""Budget sweeps: the Pareto frontier of budget vs the objective, hetplan beside its baselines.

Each point is planned exactly as `hetplan plan --budget B` plans it (the same problem under that budget,
demand caps included), so a sweep's point and a single plan at the same budget agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from hetplan.planner.baselines import evaluate_baselines, evaluations_table
from hetplan.planner.model import Objective, build_model
from hetplan.planner.planner import MilpPlan, plan_cluster
from hetplan.planner.problem import PlanningProblem, with_budget
from hetplan.planner.solvers import SolveError, SolverName


@dataclass
class SweepPoint:
    budget: float
    result: MilpPlan | None
    evaluations: pd.DataFrame  # name, cost_per_hour, value, per_dollar, proportional, node_counts


def sweep(problem: PlanningProblem, budgets: list[float], solver: SolverName = "auto", time_limit: float = 60.0,
          gap: float = 1e-3, objective: Objective = "mix", fairness: float = 0.0, target: float | None = None,
          baselines: bool = True) -> list[SweepPoint]:
    """Plan at each budget (ascending); a budget that plans nothing yields `result=None`."""
    points = []
    for budget in sorted(budgets):
        at = with_budget(problem, budget)
        model = build_model(at, objective, fairness, target)
        try:
            result = plan_cluster(at, solver=solver, time_limit=time_limit, gap=gap, model=model)
        except SolveError:
            points.append(SweepPoint(budget, None, pd.DataFrame()))
            continue
        evaluations = evaluations_table(evaluate_baselines(at, result, model, solver, time_limit, fairness)) \
            if baselines and objective != "cost" else pd.DataFrame()
        points.append(SweepPoint(budget, result, evaluations))
    return points


def frontier_table(points: list[SweepPoint]) -> pd.DataFrame:
    """One row per (budget, way of planning) with cost and the objective's value."""
    frames = [p.evaluations.assign(budget=p.budget) for p in points if len(p.evaluations)]
    if not frames:
        frames = [pd.DataFrame({"name": ["hetplan"], "budget": [p.budget],
                                "cost_per_hour": [p.result.plan.cost_per_hour], "value": [p.result.plan.objective],
                                "per_dollar": [p.result.per_dollar]})
                  for p in points if p.result]
    return pd.concat(frames, ignore_index=True)[["budget", "name", "cost_per_hour", "value", "per_dollar"]]
