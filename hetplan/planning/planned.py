"""`plan`: the one way to plan, for the CLI, the nightly pipeline and the evaluation.

    plan(problem, request)            -> the steady-state MILP plan (`hetplan.planner`) and its baselines
    plan(problem, request, workload)  -> for a workload objective, candidates replayed (`hetplan.codesign`),
                                         the winner, and the interval of its prediction (`prediction`)

A sweep (`request.sweep`) plans again at each budget: the frontier. A budget of the sweep that plans nothing
is a gap in the frontier, named in `PlanOutcome.warnings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd

from hetplan.codesign import WorkloadPlan, plan_workload, workload_from_trace
from hetplan.codesign.candidates import HINT, STATUS_QUO
from hetplan.codesign.engines import ProcessPool, held_open
from hetplan.codesign.screen import REPLAY_JOBS
from hetplan.codesign.workload import Workload
from hetplan.contracts import ContractError
from hetplan.hints import HintSet
from hetplan.planner import frontier_table, sweep
from hetplan.planner.baselines import STATUS_QUO, Evaluation
from hetplan.planner.entry import Planned, plan_with_baselines
from hetplan.planner.planner import PlanResult
from hetplan.planner.problem import PlanningProblem, with_budget
from hetplan.planning.mix import NodeMix
from hetplan.planning.objective import Objective
from hetplan.codesign.objectives import figure_column, passes_floor
from hetplan.planning.prediction import HeldBack, Prediction, held_back_check, mix_shift, predict, split
from hetplan.planning.request import PlanRequest
from hetplan.progress import prefixed
from hetplan.sim.engine import SimConfig
from hetplan.sim.setups import Setup

PREDICTION_SEED = 7  # the held-back plan's Poisson draws: other arrivals than the plan's own
CHECK_DRAWS = 2  # the held-back check's draws: the traced arrivals and one Poisson redraw


@dataclass
class PlanOutcome:
    """What planning produced: the plan, its baselines, for a workload its candidates, frontier and prediction."""

    objective: Objective
    result: PlanResult
    baselines: list[Evaluation]
    unit: str  # what `result.plan.objective` counts: "mix served" or "normalised throughput"
    mix: NodeMix  # the plan's nodes, added and owned
    policy: str  # how the plan's cluster allocates (the winner's policy; `hint` for a steady plan)
    candidates: pd.DataFrame | None = None
    frontier: pd.DataFrame | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    summary: str = ""
    warnings: list[str] = field(default_factory=list)
    prediction: Prediction | None = None
    workload_plan: WorkloadPlan | None = None
    steady: Planned | None = None

    def setup(self, name: str, shapes: pd.DataFrame) -> Setup:
        """The plan as a simulator setup named `name` (`shapes`: the problem's, for the nodes)."""
        hints = HintSet.from_frame(self.result.hints) if len(self.result.hints) else HintSet.empty()
        return Setup(name, self.mix.nodes(shapes), self.policy, hints, self.result.plan.cost_per_hour,
                     self.result.plan.objective)


def plan(problem: PlanningProblem, request: PlanRequest, workload: Workload | None = None, *,
         inputs: dict[str, str] | None = None, source: str = "<catalog>") -> PlanOutcome:
    """Plan `problem` as `request` asks, for `workload` when its objective is a workload one (see the module).

    Raises `RequestError` for options that do not go together, `ContractError` when nothing can be planned."""
    owned = bool((problem.shapes["owned"] > 0).any())
    request.check(workload=workload is not None, budget=problem.budget, owned=owned)
    if workload is not None and request.replays(True):
        return _for_workload(problem, request, workload, inputs or {})
    return _steady(problem, request, request.resolved(workload is not None), inputs or {}, source)


def _steady(problem: PlanningProblem, request: PlanRequest, objective: Objective, inputs: dict[str, str],
            source: str) -> PlanOutcome:
    kind = objective.milp
    if request.progress is not None:  # one step of unknown length: a spinner, or heartbeat lines
        request.progress(0, 0, "solving the MILP and valuing its baselines")
    planned = plan_with_baselines(problem, objective=kind, target=request.target, fairness=request.fairness,
                                  solver=request.solver, time_limit=request.time_limit, gap=request.gap,
                                  inputs=inputs, source=source)
    frontier = frontier_table(sweep(problem, list(request.sweep), request.solver, request.time_limit, request.gap,
                                    kind, request.fairness, request.target)) if request.sweep else None
    result = planned.result
    quo = planned.baseline(STATUS_QUO)
    unit = "normalised throughput" if kind == "sum" else "mix served"
    summary = f"{unit} {result.plan.objective:.1f} reference GPUs per hour at {result.plan.cost_per_hour:.2f} $/h"
    if quo is not None and quo.value > 0:
        summary += (f"; status quo {quo.value:.1f} at {quo.cost_per_hour:.2f} $/h: predicted "
                    f"{result.plan.objective / quo.value:.2f}x")
    return PlanOutcome(objective, result, planned.baselines, unit, NodeMix.of_plan(result.plan), HINT,
                       frontier=frontier, summary=summary + " (the planner's curves; not measured)", steady=planned)


def _for_workload(problem: PlanningProblem, request: PlanRequest, workload: Workload,
                  inputs: dict[str, str]) -> PlanOutcome:
    engine = request.engine or ProcessPool(request.workers)
    with held_open(engine, warm=True):  # one pool of workers for the plan, its sweep and its held-back check
        request = replace(request, engine=engine)
        planned = _plan_workload(problem, request, request.resolved(True), workload, inputs)
        return outcome_of(problem, request, workload, planned)


def outcome_of(problem: PlanningProblem, request: PlanRequest, workload: Workload,
               planned: WorkloadPlan) -> PlanOutcome:
    """The outcome of `planned`, the workload plan `request` asked for (made in one call, or by the nightly
    DAG's stages): the sweep's frontier around it and the interval of its prediction."""
    objective = request.resolved(True)
    warnings = [w for w in planned.warnings if w not in problem.warnings]  # the problem's: said where it is built
    plans = []
    for budget in request.sweep:
        try:
            plans.append(_plan_workload(with_budget(problem, budget), request, objective, workload, None))
        except ContractError as exc:  # a budget of the sweep that plans nothing is a gap in the frontier
            warnings.append(f"--sweep {budget:g}: {'; '.join(p.message for p in exc.problems)}")
    frontier = pd.concat([p.candidates.assign(budget=p.problem.budget) for p in [*plans, planned]],
                         ignore_index=True)
    planned, prediction = _checked(problem, request, objective, workload, planned)
    prediction = prediction.calibrate(request.calibration)
    warnings += prediction.warnings
    if planned.decision is not None and planned.decision.declined:
        warnings.append(f"{planned.winner} {planned.decision.declined}")
    plan_record = {**(planned.result.plan.planning or {}), "prediction": prediction.to_dict()}
    result = replace(planned.result, plan=planned.result.plan.model_copy(update={"planning": plan_record}))
    winner = planned.candidate(planned.winner)
    mix = NodeMix.by_index(problem.shapes, winner.counts) if winner is not None else NodeMix.of_plan(result.plan)
    metrics = {**planned.metrics(), "predicted.speedup": prediction.speedup.point,
               "predicted.speedup_low": prediction.speedup.low, "predicted.speedup_high": prediction.speedup.high}
    return PlanOutcome(objective, result, planned.baselines(), "mix served", mix,
                       winner.policy if winner is not None else HINT, planned.candidates, frontier, metrics,
                       planned.summary(), warnings, prediction, planned)


def _plan_workload(problem: PlanningProblem, request: PlanRequest, objective: Objective, workload: Workload,
                   inputs: dict[str, str] | None, label: str = "") -> WorkloadPlan:
    progress = prefixed(request.progress, label) if label else request.progress
    return plan_workload(problem, workload, objective=objective.value, max_avg_jct=request.max_avg_jct,
                         scheduler=request.scheduler, round_s=request.round_s, solver=request.solver,
                         time_limit=request.time_limit, inputs=inputs, progress=progress,
                         workers=request.workers, engine=request.engine, **request.sizes.options())


def _checked(problem: PlanningProblem, request: PlanRequest, objective: Objective, workload: Workload,
             planned: WorkloadPlan) -> tuple[WorkloadPlan, Prediction]:
    """`planned` after the held-back check, and the interval of its prediction.

    The check plans again on the first part of the workload and replays that plan's winner, the status quo, the
    whole plan's winner and the status quo with hints on the whole workload, judged on the held-back jobs. The
    floor holds there too: a winner that does not beat the status quo on the held-back jobs by more than the
    margin and their noise (`HeldBack.verdict`) is overruled by the status quo with hints where that wins on
    both the replays and the held-back jobs, else by the status quo, and the plan says why."""
    held = _held_back(problem, request, objective, workload, planned)
    if isinstance(held, str):  # the check could not run: the interval without it, and why
        out = predict(planned, None, request.holdout)
        return planned, replace(out, warnings=[*out.warnings, held]) if held else out
    against = held.verdict(planned.winner) if objective is not Objective.cost else None
    if against is not None:
        planned = planned.with_winner(*_fallback(planned, held, against))
    return planned, predict(planned, held, request.holdout)


def _fallback(planned: WorkloadPlan, held: HeldBack, against: str) -> tuple[str, str]:
    """The candidate that stands in for an overruled winner, and the reason the plan records."""
    hinted = f"{STATUS_QUO} + hints"
    row = planned.row(hinted)
    quo = planned.row(STATUS_QUO)
    if row is not None and quo is not None and hinted != planned.winner and held.verdict(hinted) is None \
            and passes_floor(row, quo, figure_column(planned.candidates, Objective.parse(planned.objective))):
        return hinted, f"{hinted}: {planned.winner} was overruled by the held-back check ({against})"
    return STATUS_QUO, (f"the status quo: {planned.winner} was overruled by the held-back check ({against}), and "
                        f"the status quo with hints does not beat it on both the replays and the held-back jobs")


def _held_back(problem: PlanningProblem, request: PlanRequest, objective: Objective, workload: Workload,
               planned: WorkloadPlan) -> HeldBack | str:
    """The held-back check of `planned` (see `_checked`), or why it could not run ("": the workload is too
    small to hold any back, which the interval's own warning says)."""
    replay_sample = planned.screen.get("replay_sample") or {}
    recent = _recent(planned.workload.jobs, int(replay_sample.get("jobs", REPLAY_JOBS)))
    parts = split(recent, request.holdout)
    if parts is None:
        return ""
    first, rest = parts
    first_workload = workload_from_trace(first, draws=CHECK_DRAWS, seed=PREDICTION_SEED, source="<held-back check>")
    # the replays judged on the held-back jobs: those jobs themselves, never a bootstrap of them
    checked = workload_from_trace(recent, draws=CHECK_DRAWS, seed=PREDICTION_SEED, source="<held-back check>",
                                  stress=0)
    try:
        first_plan = _plan_workload(problem, request, objective, first_workload, None, "held-back check")
    except ContractError as exc:  # e.g. no candidate meets the JCT target on the first part alone
        return "the held-back check could not plan on the first part: " + "; ".join(p.message for p in exc.problems)
    also = [c for c in (planned.candidate(planned.winner), planned.candidate(f"{STATUS_QUO} + hints")) if c]
    return held_back_check(first_plan, checked, set(rest["job_id"].astype(str)),
                           SimConfig(request.scheduler, request.round_s), request.engine, request.progress, also,
                           mix_shift(first, rest))


def _recent(jobs: pd.DataFrame, limit: int) -> pd.DataFrame:
    """The jobs the held-back check works on: the most recent `limit` by arrival (as many as one replay of the
    plan's sampled: all of a shorter workload), so that its plan and replays cost no more than one replay."""
    if len(jobs) <= limit:
        return jobs
    return jobs.sort_values("arrival_s", kind="stable").iloc[-limit:].reset_index(drop=True)
