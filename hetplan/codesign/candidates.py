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
- `status quo`: the baseline itself, proportional policy; `status quo + hints`: its nodes with the MILP's hints;
- `..., up to <N> GPUs`: job sizes are a decision, not a constraint. For each size class above a node (a gang),
  the budget plan and the speed floors again without the classes larger than N (`hosting_at_most`): clusters
  that decline the largest jobs, so the choice can weigh hosting them against what it costs the rest.

The MILP's default mixes host the problem's job size (`hetplan.planner.sizes`); the status quo is what it is
(valued without that requirement, as a baseline is), so it is always a candidate: a job it cannot host is its
to refuse, and the choice judges every candidate on the jobs the status quo runs
(`hetplan.codesign.objectives`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from hetplan.planner.baselines import gpu_only_counts, status_quo_counts, value_of
from hetplan.planner.model import MilpModel, build_model
from hetplan.planner.planner import EPSILON, MilpPlan, trim_idle_nodes
from hetplan.planner.problem import PlanningProblem, hosting_at_most, with_budget
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
    result: MilpPlan
    declines_above: int | None = None  # planned without the classes larger than this many GPUs (None: all kept)

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
    levels = declining_levels(problem)
    steps = (3 + len(fractions) + with_floors * len(floors) + (len(problem.gpu_types) if per_gpu_type else 0)
             + len(levels) * (1 + len(floors)))
    tried = 0

    def add(name: str, mix: Callable[[], dict[int, int] | None], policy: str = HINT,
            valued: tuple[PlanningProblem, MilpModel] = (problem, model), declines: int | None = None) -> None:
        nonlocal tried
        if progress:
            progress(tried, steps, f"proposing {name}")
        tried += 1
        counts = mix()
        if counts is None:
            return
        result = value_of(*valued, counts, policy == PROPORTIONAL, solver, time_limit)
        if result is None or result.plan.objective <= 0:
            return
        candidate = Candidate(name, {s: n for s, n in counts.items() if n > 0}, policy, result, declines)
        if all(c.key != candidate.key for c in found):
            found.append(candidate)

    status_quo = status_quo_counts(problem, model)
    as_is = (replace(problem, host=None), model.unhosted())  # a baseline is what it is: it hosts what it can
    add(STATUS_QUO, lambda: status_quo, PROPORTIONAL, as_is)
    add(f"{STATUS_QUO} + hints", lambda: status_quo, HINT, as_is)
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
    for level in levels:
        declining = hosting_at_most(problem, level)
        at_model = build_model(declining, "mix")
        suffix = f", up to {level} GPUs"
        add(f"milp 100% budget{suffix}", partial(_counts, declining, at_model, solver, time_limit, gap), HINT,
            (declining, at_model), level)
        for floor in floors:
            add(f"speed floor {floor:g}{suffix}", partial(_counts, declining, at_model.restricted(
                _fast_columns(at_model, floor)), solver, time_limit, gap), HINT, (declining, at_model), level)
    if progress:
        progress(steps, steps, "proposed")
    return found


def declining_levels(problem: PlanningProblem) -> list[int]:
    """The job sizes a plan may stop at instead of hosting every class: below each size class larger than every
    node (a gang), the next smaller size of the demand (the largest node's size at least), largest first."""
    sizes = sorted({int(n) for n in problem.classes["num_gpus"]})
    largest_node = int(problem.shapes["gpus"].max()) if len(problem.shapes) else 0
    giants = [n for n in sizes if n > largest_node]
    levels = {max([m for m in sizes if m < n] + [largest_node]) for n in giants}
    return sorted(levels, reverse=True)


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

