"""`plan`: the one way to plan, for the CLI, the nightly pipeline and the evaluation, and its stages.

    plan(problem, request)            -> the steady-state MILP plan (`hetplan.planner`) and its baselines
    plan(problem, request, workload)  -> for a workload objective: shortlist, replay runs, finish, in this process
    shortlist(problem, request, workload)                  stage 1: the MILP proposes, the screen shortlists
    Shortlist.runs.summary(run)                            stage 2: one replay run (the nightly DAG maps them)
    finish(problem, request, workload, listed, summaries)  stage 3: the choice and its floor, the held-back check
                                                           (which can overrule it), the interval, the sweep

Every path returns one `PlanOutcome`. A sweep (`request.sweep`) plans again at each budget: the frontier. A budget
of the sweep that plans nothing is a gap in the frontier, named in `PlanOutcome.warnings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd

from hetplan.codesign import Weighing, plan_workload, shortlist_for, workload_from_trace
from hetplan.codesign.candidates import HINT, STATUS_QUO
from hetplan.codesign.engines import ProcessPool, Run, held_open
from hetplan.codesign.objectives import Objective, figure_column, passes_floor
from hetplan.codesign.plan import chosen
from hetplan.codesign.screen import REPLAY_JOBS, Shortlist
from hetplan.codesign.workload import Workload
from hetplan.contracts import ContractError
from hetplan.hints import HintSet
from hetplan.planner import frontier_table, sweep
from hetplan.planner.baselines import Evaluation, baseline
from hetplan.planner.entry import plan_with_baselines
from hetplan.planner.planner import MilpPlan
from hetplan.planner.problem import PlanningProblem, with_budget
from hetplan.planning.prediction import HeldBack, Prediction, held_back_check, mix_shift, predict, split
from hetplan.planning.request import PlanRequest
from hetplan.progress import prefixed
from hetplan.sim.engine import SimConfig
from hetplan.sim.setups import NodeMix, Setup

PREDICTION_SEED = 7  # the held-back plan's Poisson draws: other arrivals than the plan's own
CHECK_DRAWS = 2  # the held-back check's draws: the traced arrivals and one Poisson redraw


@dataclass
class PlanOutcome:
    """A plan as its users get it: the MILP plan of the chosen cluster (`result`: plan.json, hints), its
    baselines, its nodes and policy; for a workload also every candidate weighed (`weighing`), the frontier and
    the prediction with its interval."""

    objective: Objective
    result: MilpPlan
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
    weighing: Weighing | None = None  # a workload plan's candidates, replays and choice

    @property
    def winner(self) -> str:
        """The chosen candidate's name (`hetplan` for a steady plan)."""
        return self.weighing.winner if self.weighing is not None else "hetplan"

    def baseline(self, name: str) -> Evaluation | None:
        """The baseline named `name` (`hetplan.planner.baselines`), None where it was not valued."""
        return baseline(self.baselines, name)

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
    if workload is None or not request.replays(True):
        return _steady(problem, request, request.resolved(workload is not None), inputs or {}, source)
    engine = request.engine or ProcessPool(request.workers)
    with held_open(engine, warm=True):  # one pool of workers for every stage, the sweep and the held-back check
        request = replace(request, engine=engine)
        listed = shortlist(problem, request, workload)
        summaries = engine.summaries(listed.runs, listed.pending, request.progress)
        return finish(problem, request, workload, listed, summaries, inputs)


def shortlist(problem: PlanningProblem, request: PlanRequest, workload: Workload) -> Shortlist:
    """Stage 1 of a workload plan: the candidates proposed and screened, and the replay runs to do (`pending`)."""
    return shortlist_for(problem, workload, **_options(request))


def finish(problem: PlanningProblem, request: PlanRequest, workload: Workload, listed: Shortlist,
           summaries: dict[Run, dict], inputs: dict[str, str] | None = None) -> PlanOutcome:
    """Stage 3: the choice from the shortlist and its replay runs' summaries, the held-back check and its floor,
    the interval of the prediction and the sweep's frontier around it."""
    objective = request.resolved(True)
    weighed = chosen(problem, listed, summaries, objective=objective, max_avg_jct=request.max_avg_jct,
                     inputs=inputs)
    warnings = [w for w in weighed.warnings if w not in problem.warnings]  # the problem's: said where it is built
    plans = []
    for budget in request.sweep:
        try:
            plans.append(_plan_workload(with_budget(problem, budget), request, workload))
        except ContractError as exc:  # a budget of the sweep that plans nothing is a gap in the frontier
            warnings.append(f"--sweep {budget:g}: {'; '.join(p.message for p in exc.problems)}")
    weighed, prediction = _checked(problem, request, objective, workload, weighed)
    frontier = pd.concat([p.candidates.assign(budget=p.problem.budget) for p in [*plans, weighed]],
                         ignore_index=True)
    prediction = prediction.calibrate(request.calibration)
    warnings += prediction.warnings
    if weighed.decision is not None and weighed.decision.declined:
        warnings.append(f"{weighed.winner} {weighed.decision.declined}")
    plan_record = {**(weighed.result.plan.planning or {}), "prediction": prediction.to_dict()}
    result = replace(weighed.result, plan=weighed.result.plan.model_copy(update={"planning": plan_record}))
    winner = weighed.candidate(weighed.winner)
    mix = NodeMix.by_index(problem.shapes, winner.counts) if winner is not None else NodeMix.of_plan(result.plan)
    metrics = {**weighed.metrics(), "predicted.speedup": prediction.speedup.point,
               "predicted.speedup_low": prediction.speedup.low, "predicted.speedup_high": prediction.speedup.high}
    return PlanOutcome(objective, result, weighed.baselines(), "mix served", mix,
                       winner.policy if winner is not None else HINT, weighed.candidates, frontier, metrics,
                       weighed.summary(), warnings, prediction, weighed)


def _steady(problem: PlanningProblem, request: PlanRequest, objective: Objective, inputs: dict[str, str],
            source: str) -> PlanOutcome:
    kind = objective.milp
    if request.progress is not None:  # one step of unknown length: a spinner, or heartbeat lines
        request.progress(0, 0, "solving the MILP and valuing its baselines")
    result, baselines = plan_with_baselines(problem, objective=kind, target=request.target,
                                            fairness=request.fairness, solver=request.solver,
                                            time_limit=request.time_limit, gap=request.gap, inputs=inputs,
                                            source=source)
    frontier = frontier_table(sweep(problem, list(request.sweep), request.solver, request.time_limit, request.gap,
                                    kind, request.fairness, request.target)) if request.sweep else None
    quo = baseline(baselines, STATUS_QUO)
    unit = "normalised throughput" if kind == "sum" else "mix served"
    summary = f"{unit} {result.plan.objective:.1f} reference GPUs per hour at {result.plan.cost_per_hour:.2f} $/h"
    if quo is not None and quo.value > 0:
        summary += (f"; status quo {quo.value:.1f} at {quo.cost_per_hour:.2f} $/h: predicted "
                    f"{result.plan.objective / quo.value:.2f}x")
    return PlanOutcome(objective, result, baselines, unit, NodeMix.of_plan(result.plan), HINT,
                       frontier=frontier, summary=summary + " (the planner's curves; not measured)")


def _options(request: PlanRequest, label: str = "") -> dict:
    """`request` as `hetplan.codesign`'s stages take it."""
    return dict(objective=request.resolved(True).value, max_avg_jct=request.max_avg_jct,
                scheduler=request.scheduler, round_s=request.round_s, elastic=request.elastic, solver=request.solver,
                time_limit=request.time_limit, engine=request.engine,
                progress=prefixed(request.progress, label) if label else request.progress, **request.sizes.options())


def _plan_workload(problem: PlanningProblem, request: PlanRequest, workload: Workload,
                   label: str = "") -> Weighing:
    """A whole weighing in one call (the sweep's budgets, the held-back check's first part)."""
    return plan_workload(problem, workload, workers=request.workers, **_options(request, label))


def _checked(problem: PlanningProblem, request: PlanRequest, objective: Objective, workload: Workload,
             planned: Weighing) -> tuple[Weighing, Prediction]:
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
    floor = planned.decision is None or planned.decision.floor  # no floor (e.g. a size insisted on): none here
    against = held.verdict(planned.winner) if floor and objective is not Objective.cost else None
    if against is not None:
        planned = planned.with_winner(*_fallback(planned, held, against))
    return planned, predict(planned, held, request.holdout)


def _fallback(planned: Weighing, held: HeldBack, against: str) -> tuple[str, str]:
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
               planned: Weighing) -> HeldBack | str:
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
        first_plan = _plan_workload(problem, request, first_workload, "held-back check")
    except ContractError as exc:  # e.g. no candidate meets the JCT target on the first part alone
        return "the held-back check could not plan on the first part: " + "; ".join(p.message for p in exc.problems)
    also = [c for c in (planned.candidate(planned.winner), planned.candidate(f"{STATUS_QUO} + hints")) if c]
    return held_back_check(first_plan, checked, set(rest["job_id"].astype(str)),
                           SimConfig(request.scheduler, request.round_s, elastic=request.elastic), request.engine,
                           request.progress, also,
                           mix_shift(first, rest))


def _recent(jobs: pd.DataFrame, limit: int) -> pd.DataFrame:
    """The jobs the held-back check works on: the most recent `limit` by arrival (as many as one replay of the
    plan's sampled: all of a shorter workload), so that its plan and replays cost no more than one replay."""
    if len(jobs) <= limit:
        return jobs
    return jobs.sort_values("arrival_s", kind="stable").iloc[-limit:].reset_index(drop=True)
