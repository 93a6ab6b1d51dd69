"""The GPU planner: which node shapes to buy and how to split their cores and RAM among job classes.

One MILP (`build_model`) over integer node counts and per-(class, shape, CPU/RAM option) GPU allocations,
solved by HiGHS or Gurobi (`solve`), read back into a plan, an allocation and a hint table
(`plan_cluster`); baselines, speed floors and budget sweeps are the same model with other bounds.
"""

from __future__ import annotations

from hetplan.planner.artifacts import write_plan_artifacts
from hetplan.planner.baselines import Evaluation, evaluate_baselines
from hetplan.planner.kueue import kueue_manifests, kueue_yaml
from hetplan.planner.model import OBJECTIVES, MilpModel, build_model
from hetplan.planner.pareto import SweepPoint, frontier_table, sweep
from hetplan.planner.planner import MilpPlan, plan_cluster, require_allocation
from hetplan.planner.problem import PlanningProblem, build_problem
from hetplan.planner.solvers import (
    SOLVERS, InfeasibleError, LicenceError, Solution, SolveError, SolveTimeout, solve,
)

__all__ = [
    "OBJECTIVES", "SOLVERS", "Evaluation", "InfeasibleError", "LicenceError", "MilpModel", "MilpPlan",
    "PlanningProblem", "Solution", "SolveError", "SolveTimeout", "SweepPoint", "build_model", "build_problem",
    "evaluate_baselines", "frontier_table", "kueue_manifests", "kueue_yaml", "plan_cluster", "require_allocation",
    "solve", "sweep", "write_plan_artifacts",
]
