"""Solve a planning problem into a plan, its allocation and its hint table."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from hetplan.contracts import HINTS, ContractError, Plan, Problem
from hetplan.planner.hints import hints_from_allocation
from hetplan.planner.model import MilpModel, Objective, build_model
from hetplan.planner.problem import PlanningProblem
from hetplan.planner.sizes import host_record, hosting_of, restore_hosting
from hetplan.planner.solvers import SolverName, Solution, solve

EPSILON = 1e-6


@dataclass
class MilpPlan:
    """The MILP's plan of one cluster: the contract object, the hint table, and the tables behind them (what a
    candidate carries; the plan a user gets is `hetplan.planning.PlanOutcome`)."""

    plan: Plan
    hints: pd.DataFrame
    allocation: pd.DataFrame  # model, num_gpus, shape, gpu_type, cpus_per_gpu, mem_gb_per_gpu, gpus, throughput, value
    nodes: pd.DataFrame  # shape, gpu_type, added, owned, gpus, vcpus, mem_gb, price_per_hour
    solution: Solution
    warnings: list[str] = field(default_factory=list)
    counts_by_shape: dict[int, int] = field(default_factory=dict)  # added nodes by shape index (idle ones trimmed)

    @property
    def per_dollar(self) -> float:
        """The objective (reference GPUs of work per hour) per US$ per hour spent on added nodes."""
        return self.plan.objective / self.plan.cost_per_hour if self.plan.cost_per_hour > 0 else 0.0


def plan_id(inputs: dict[str, str], budget: float | None, created: datetime) -> str:
    digest = hashlib.sha256(json.dumps({"inputs": inputs, "budget": budget}, sort_keys=True).encode()).hexdigest()
    return f"plan-{created:%Y%m%dT%H%M%SZ}-{digest[:8]}"


def plan_cluster(problem: PlanningProblem, *, objective: Objective = "mix", target: float | None = None,
                 fairness: float = 0.0, solver: SolverName = "auto", time_limit: float = 60.0, gap: float = 1e-3,
                 inputs: dict[str, str] | None = None, model: MilpModel | None = None,
                 bound: bool = True) -> MilpPlan:
    """Build (or reuse) the MILP, solve it, and read the plan, allocation and hints off the solution."""
    if model is None:
        model = build_model(problem, objective, fairness, target)
    solution = solve(model, solver, time_limit, gap, bound=bound)
    return read_solution(problem, model, solution, inputs or {})


def read_solution(problem: PlanningProblem, model: MilpModel, solution: Solution, inputs: dict[str, str]) -> MilpPlan:
    shapes = problem.shapes
    budget = None if model.budget_row is None else float(model.row_upper[model.budget_row])
    x = solution.values[model.n_shapes : model.t_column]
    allocation = model.columns.assign(gpus=x)[x > EPSILON].reset_index(drop=True)
    counts = trim_idle_nodes(problem, model, solution.values, allocation)
    created = datetime.now(UTC).replace(microsecond=0)
    pid = plan_id(inputs, budget, created)
    served = float(solution.values[model.t_column])
    cost = float(sum(shapes.loc[s, "price_per_hour"] * n for s, n in counts.items()))
    # The contract's objective, bound and gap are reference GPUs of work per hour; a min-cost solve reports
    # the mix it serves (its own optimality is in cost_lp_bound and cost_gap).
    objective, bound = (solution.objective, solution.lp_bound) if model.maximize else (served, served)
    owned = {str(shapes.loc[s, "name"]): int(o) for s, o in enumerate(shapes["owned"]) if o > 0}
    added = {str(shapes.loc[s, "name"]): n for s, n in counts.items() if n > 0}
    used = shapes[shapes["name"].isin(set(owned) | set(added))]
    plan = Plan(
        plan_id=pid, created_at=created, budget_per_hour=budget, cost_per_hour=round(cost, 6),
        node_counts=added, objective=objective, lp_bound=max(bound, objective),
        gap=solution.gap if model.maximize else 0.0, solver=solution.solver,
        solve_seconds=round(solution.seconds, 4), inputs=inputs, objective_kind=model.objective,
        throughput_value=float((allocation["gpus"] * allocation["value"]).sum()), owned_nodes=owned,
        shapes={str(r.name): {"gpu_type": r.gpu_type, "gpus": int(r.gpus), "vcpus": float(r.vcpus),
                              "mem_gb": float(r.mem_gb), "price_per_hour": float(r.price_per_hour)}
                for r in used.itertuples()},
        mip_gap=solution.mip_gap, timed_out=solution.timed_out,
        cost_lp_bound=None if model.maximize else solution.lp_bound, cost_gap=None if model.maximize else solution.gap,
        model_size={"variables": model.num_vars, "constraints": model.num_rows},
        needs_profiling=list(problem.defaults.default_models), gpu_type_rules=dict(problem.defaults.gpu_types),
        unplanned=problem.unplannable.to_dict("records") if len(problem.unplannable) else [],
        planning={"host_sizes": host_record(problem.host, hosting_of(shapes, counts))}
        if problem.host is not None and problem.host.required else None,
    )
    # A plan that allocates nothing (a budget below every useful node) has no hints; callers report it.
    hints = (hints_from_allocation(problem, allocation, counts, pid) if len(allocation)
             else pd.DataFrame(columns=[c.name for c in HINTS.columns]))
    nodes = pd.DataFrame({
        "shape": shapes["name"], "gpu_type": shapes["gpu_type"], "added": [counts[s] for s in range(len(shapes))],
        "owned": shapes["owned"], "gpus": shapes["gpus"], "vcpus": shapes["vcpus"], "mem_gb": shapes["mem_gb"],
        "price_per_hour": shapes["price_per_hour"]})
    nodes = nodes[(nodes["added"] + nodes["owned"]) > 0].reset_index(drop=True)
    classes = problem.classes
    table = pd.DataFrame({
        "model": classes.loc[allocation["j"], "model"].to_numpy(),
        "num_gpus": classes.loc[allocation["j"], "num_gpus"].to_numpy(),
        "shape": shapes.loc[allocation["s"], "name"].to_numpy(), "gpu_type": allocation["gpu_type"],
        "cpus_per_gpu": allocation["cpus"], "mem_gb_per_gpu": allocation["mem_gb"], "gpus": allocation["gpus"],
        "throughput": allocation["throughput"] * allocation["gpus"], "value": allocation["value"] * allocation["gpus"]})
    return MilpPlan(plan, hints, table, nodes, solution, list(problem.warnings),
                      {s: n for s, n in counts.items() if n > 0})


def require_allocation(problem: PlanningProblem, result: MilpPlan, source: str) -> None:
    """Raise `ContractError` when a plan allocates nothing (a budget below every useful node): such a plan
    has no hints and must not be written or published."""
    if len(result.allocation) and result.plan.objective > EPSILON:
        return
    bought = problem.shapes[problem.shapes["owned"] == 0]
    cheapest = float(bought["price_per_hour"].min()) if len(bought) else float("nan")
    spend = f"budget {problem.budget:g} $/h" if problem.budget is not None else "the plan"
    raise ContractError([Problem(source, f"nothing could be planned: {spend} buys no useful node "
                                 f"(the cheapest usable node costs {cheapest:g} $/h)")])


def trim_idle_nodes(problem: PlanningProblem, model: MilpModel, values: np.ndarray,
                    allocation: pd.DataFrame) -> dict[int, int]:
    """Node counts without the nodes the allocation leaves idle.

    Node counts carry no weight in a throughput objective, so a solver may spend spare budget on nodes
    nothing runs on; keeping only as many as the allocation's GPUs, cores and RAM need (pinned counts stay)
    lowers the cost and changes nothing else. Where the model must host a job size, nodes are given back
    until one GPU type hosts it again (`hetplan.planner.sizes.restore_hosting`).
    """
    shapes = problem.shapes
    n = np.rint(values[: model.n_shapes]).astype(int)
    used = allocation.assign(cpu=allocation["gpus"] * allocation["cpus"], mem=allocation["gpus"] * allocation["mem_gb"])
    used = used.groupby("s")[["gpus", "cpu", "mem"]].sum().reindex(range(model.n_shapes), fill_value=0.0)
    need = np.maximum.reduce([used["gpus"].to_numpy() / shapes["gpus"].to_numpy(float),
                              used["cpu"].to_numpy() / shapes["vcpus"].to_numpy(float),
                              used["mem"].to_numpy() / shapes["mem_gb"].to_numpy(float)])
    needed = np.maximum(0, np.ceil(need - 1e-6).astype(int) - shapes["owned"].to_numpy(int))
    pinned = model.lower[: model.n_shapes] == model.upper[: model.n_shapes]
    lower = model.lower[: model.n_shapes].astype(int)
    trimmed = np.where(pinned, n, np.minimum(n, np.maximum(needed, lower)))
    if model.host_gpus:
        trimmed = restore_hosting(shapes, n, trimmed, model.host_gpus)
    return {s: int(c) for s, c in enumerate(trimmed)}


def total_gpus(result: MilpPlan) -> int:
    return int(np.sum(result.nodes["gpus"] * (result.nodes["added"] + result.nodes["owned"])))
