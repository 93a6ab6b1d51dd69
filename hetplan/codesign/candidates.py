"""Candidate clusters for a workload: what the MILP proposes before the simulator picks.

Every candidate is a node mix (added nodes per shape; the owned fleet is always there) with the hint table
the MILP reads off it, and the allocator policy it runs with:

- `milp <f>% budget`: the mix plan at fractions of the budget (cheaper plans, for a JCT target);
- `speed floor <s>`: the mix plan where every class runs only on options at least s times as fast per GPU
  as its fastest option anywhere (so no class is parked on slow GPUs to raise the total); with
  `floors_at_every_fraction` (the cost objective) also at every budget fraction (`speed floor <s>, <f>%`);
- `only <GPU type>`: the best plan with one GPU type (plus the owned fleet) for every class but the gangs
  (classes larger than every node), which run on whichever type hosts them;
- `GPU-only mix`: the mix a planner that ignores CPU and RAM would buy, run at the proportional share;
- `status quo`: the baseline itself, proportional policy; `status quo + hints`: its nodes with the MILP's hints.

Every candidate hosts the problem's job size (`hetplan.planner.sizes`: that many GPUs of one GPU type): the
MILP's mixes are built to, and a fixed cluster that does not (the status quo's single shape, at a budget too
small for it) is valued infeasible and left out. Where the status quo is a candidate, the one the simulator
picks is never worse in-sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from hetplan.planner.baselines import gpu_only_counts, status_quo_counts, value_of
from hetplan.planner.model import MilpModel, build_model
from hetplan.planner.planner import EPSILON, PlanResult, trim_idle_nodes
from hetplan.planner.problem import PlanningProblem, with_budget
from hetplan.planner.solvers import SolveError, SolverName, solve
from hetplan.progress import Progress

STATUS_QUO = "status quo"
HINT = "hint"
PROPORTIONAL = "proportional"
BUDGET_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
SPEED_FLOORS = (0.5, 0.75, 0.9)


@dataclass(frozen=True)
class Candidate:
    """A node mix, the allocator policy it runs with, and the MILP's plan on it (hints, cost, mix served)."""

    name: str
    counts: dict[int, int]  # added nodes by shape index
    policy: str  # HINT or PROPORTIONAL
    result: PlanResult

    @property
    def key(self) -> tuple:
        return (tuple(sorted((s, n) for s, n in self.counts.items() if n > 0)), self.policy)

    @property
    def cost_per_hour(self) -> float:
        return self.result.plan.cost_per_hour


def propose(problem: PlanningProblem, *, fractions: Sequence[float] = BUDGET_FRACTIONS,
            floors: Sequence[float] = SPEED_FLOORS, floors_at_every_fraction: bool = False, per_gpu_type: bool = True,
            solver: SolverName = "auto", time_limit: float = 60.0, gap: float = 1e-3,
            progress: Progress | None = None) -> list[Candidate]:
    """The candidates of `problem` (which must have a budget), duplicates (same nodes, same policy) removed;
    `progress` hears of each before its MILP solves."""
    if problem.budget is None:
        raise ValueError("candidates need a budget to spend")
    model = build_model(problem, "mix")
    found: list[Candidate] = []
    with_floors = len(fractions) if floors_at_every_fraction else sum(f >= 1 for f in fractions)
    steps = 3 + len(fractions) + with_floors * len(floors) + (len(problem.gpu_types) if per_gpu_type else 0)
    tried = 0

    def add(name: str, mix: Callable[[], dict[int, int] | None], policy: str = HINT) -> None:
        nonlocal tried
        if progress:
            progress(tried, steps, f"proposing {name}")
        tried += 1
        counts = mix()
        if counts is None:
            return
        result = value_of(problem, model, counts, policy == PROPORTIONAL, solver, time_limit)
        if result is None or result.plan.objective <= 0:
            return
        candidate = Candidate(name, {s: n for s, n in counts.items() if n > 0}, policy, result)
        if all(c.key != candidate.key for c in found):
            found.append(candidate)

    status_quo = status_quo_counts(problem, model)
    add(STATUS_QUO, lambda: status_quo, PROPORTIONAL)
    add(f"{STATUS_QUO} + hints", lambda: status_quo)
    for fraction in sorted(fractions, reverse=True):
        at = with_budget(problem, problem.budget * fraction)
        at_model = build_model(at, "mix")
        add(f"milp {fraction:.0%} budget", partial(_counts, at, at_model, solver, time_limit, gap))
        if fraction < 1 and not floors_at_every_fraction:
            continue
        for floor in floors:
            name = f"speed floor {floor:g}" + ("" if fraction == 1 else f", {fraction:.0%} budget")
            add(name, partial(_counts, at, at_model.restricted(_fast_columns(at_model, floor)), solver, time_limit,
                              gap))
    if per_gpu_type:
        gpu_of_column = model.columns["gpu_type"].to_numpy()
        gang = model.columns["gang"].to_numpy(bool)  # gangs run where the plan hosts them, as in every plan
        for gpu in problem.gpu_types:
            add(f"only {gpu}", partial(_counts, problem, model.restricted((gpu_of_column == gpu) | gang), solver,
                                       time_limit, gap))
    add("GPU-only mix", partial(gpu_only_counts, problem, model, solver, time_limit), PROPORTIONAL)
    if progress:
        progress(steps, steps, "proposed")
    return found


def _fast_columns(model: MilpModel, floor: float) -> np.ndarray:
    """Columns whose per-GPU value is at least `floor` times the best of their class."""
    value = model.columns["value"].to_numpy(float)
    best = model.columns.groupby("j")["value"].transform("max").to_numpy(float)
    return value >= floor * best - 1e-12


def _counts(problem: PlanningProblem, model: MilpModel, solver: SolverName, time_limit: float,
            gap: float) -> dict[int, int] | None:
    """The added nodes of the model's optimum, without the nodes its allocation leaves idle."""
    try:
        solution = solve(model, solver, time_limit, gap)
    except SolveError:
        return None
    x = solution.values[model.n_shapes : model.t_column]
    allocation = model.columns.assign(gpus=x)[x > EPSILON]
    return {s: n for s, n in trim_idle_nodes(problem, model, solution.values, allocation).items() if n > 0}

