"""Plan for a workload in three stages: shortlist, replay runs, choice.

    workload (recent jobs) + curves + catalog + budget
        -> shortlist (hetplan.codesign.screen)           the MILP's candidates (hetplan.codesign.candidates),
                                                         overloaded ones pruned, the rest screened on a sample;
                                                         the status quo + the best few, with fastest-first twins
        -> replay runs (hetplan.codesign.replay)         (candidate, draw) -> summary, pure and independent, on
                                                         an engine (hetplan.codesign.engines: a local pool, Dask)
        -> choice (hetplan.codesign.objectives)          by avg JCT, p95 JCT, makespan, or cost for a JCT target

`plan_workload` runs the three in this process; the nightly DAG runs them as tasks (`shortlist_for`, one
mapped task per run, `chosen`). The winner's plan records the objective, every candidate's figures, what the
screen did and how sure the choice is (`Plan.planning`), so `plan.json` says what was weighed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pandas as pd

from hetplan.codesign.candidates import BUDGET_FRACTIONS, PROPORTIONAL, STATUS_QUO, Candidate, propose
from hetplan.codesign.engines import Engine, ProcessPool, Run, held_open
from hetplan.codesign.objectives import (
    FLOOR, HOST_SLACK, MARGIN, NOISE_Z, Decision, WorkloadObjective, decide, declined, workload_objective,
)
from hetplan.codesign.replay import Replayed, table
from hetplan.codesign.versus import versus
from hetplan.codesign.screen import (
    REPLAY_JOBS, SCREEN, SCREEN_JOBS, SCREENED_OUT, TWIN_SUFFIX, Shortlist, screened_metric, fastest_first, fluid_load,
    ranks_steer, shortlist,
)
from hetplan.codesign.workload import Workload, without_classes
from hetplan.contracts.table import ContractError, Problem
from hetplan.planner.baselines import GPU_ONLY, HETPLAN, Evaluation
from hetplan.planner.planner import MilpPlan, plan_id
from hetplan.planner.problem import PlanningProblem
from hetplan.planner.sizes import hosting_of
from hetplan.planner.solvers import SolverName
from hetplan.progress import Progress
from hetplan.scheduler.elastic import ElasticRule
from hetplan.sim.engine import SimConfig

COST_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
PRUNE_LOAD = 1.25
__all__ = ["Weighing", "chosen", "fastest_first", "fluid_load", "plan_workload", "ranks_steer", "shortlist_for"]


@dataclass
class Weighing:
    """A workload plan's weighing: every candidate replayed, the one chosen and why, and the workload they were
    weighed on (inside `hetplan.planning.PlanOutcome`)."""

    problem: PlanningProblem
    result: MilpPlan
    winner: str
    candidates: pd.DataFrame  # hetplan.codesign.replay.table plus `chosen`
    replayed: list[Replayed]
    workload: Workload
    objective: str
    warnings: list[str] = field(default_factory=list)
    decision: Decision | None = None  # why the winner won (and what it declined to host)

    def candidate(self, name: str) -> Candidate | None:
        return next((r.candidate for r in self.replayed if r.candidate.name == name), None)

    @property
    def screen(self) -> dict:
        """How the candidates were screened and sampled (`hetplan.codesign.screen`; plan.json's
        `planning.screen`): the samples, `overloaded` and the confidence."""
        return (self.result.plan.planning or {}).get("screen") or {}

    def row(self, name: str) -> pd.Series | None:
        rows = self.candidates[self.candidates["candidate"] == name]
        return rows.iloc[0] if len(rows) else None

    def baselines(self) -> list[Evaluation]:
        """The status quo, the GPU-only mix and hetplan's winner, valued by the mix they serve (as the
        steady-state planner values its baselines), for baselines.csv."""
        out = [Evaluation(name, dict(row["node_counts"]), float(row["cost_per_hour"]), float(row["mix_served"]),
                          row["policy"] == PROPORTIONAL)
               for name, row in ((n, self.row(n)) for n in (STATUS_QUO, GPU_ONLY)) if row is not None]
        plan = self.result.plan
        return [*out, Evaluation(HETPLAN, dict(plan.node_counts), plan.cost_per_hour, plan.objective, False)]

    def metrics(self) -> dict[str, float]:
        """Predicted (simulated with the planner's curves) JCTs and makespan of the winner and the status quo."""
        out = {}
        for prefix, row in (("predicted", self.row(self.winner)), ("status_quo", self.row(STATUS_QUO))):
            if row is not None:
                out.update({f"{prefix}.{m}": float(row[m]) for m in ("avg_jct_h", "p95_jct_h", "makespan_h")})
        return out

    def summary(self) -> str:
        """One line: what won, its predicted JCTs, and the gain over the status quo (simulated and steady-state)."""
        chosen, quo = self.row(self.winner), self.row(STATUS_QUO)
        line = (f"{self.winner} chosen for {self.objective} over {len(self.candidates)} candidates "
                f"({self.workload.summary['jobs']} jobs): predicted avg JCT {chosen['avg_jct_h']:.3g} h, "
                f"p95 {chosen['p95_jct_h']:.3g} h at {chosen['cost_per_hour']:.2f} $/h")
        if quo is not None:
            line += (f"; status quo {quo['avg_jct_h']:.3g} h / {quo['p95_jct_h']:.3g} h at {quo['cost_per_hour']:.2f} "
                     f"$/h: simulated gain on its jobs {self.speedup():.2f}x avg JCT, "
                     f"{quo['p95_jct_h'] / _core(chosen, 'p95_jct_h'):.2f}x p95; predicted mix served "
                     f"{chosen['mix_served'] / quo['mix_served']:.2f}x")
        if self.decision is not None:
            line += f"; {self.decision.reason}"
        return line + " (the planner's curves, simulated; not measured)"

    def with_winner(self, name: str, reason: str) -> Weighing:
        """This plan with candidate `name` as the winner instead, `reason` saying why (the held-back check
        overruling the replays' choice); the plan record and the table say so."""
        candidate = self.candidate(name)
        if candidate is None:
            raise ValueError(f"no candidate {name!r}")
        table = self.candidates.assign(chosen=self.candidates["candidate"] == name)
        index = int(table.index[table["chosen"]][0])
        decision = Decision(index, reason, declined(table[table["screen"] != SCREENED_OUT], index, self.objective))
        planning = {**(self.result.plan.planning or {}), "winner": name, "candidates": _records(table),
                    "screen": {**self.screen, "confidence": confidence(table, self.objective)},
                    "decision": {"reason": reason, "declined": decision.declined or None, "overruled": self.winner}}
        result = _stamped(candidate.result, dict(self.result.plan.inputs), planning)
        return replace(self, result=result, winner=name, candidates=table, decision=decision)

    def speedup(self) -> float:
        """The winner's simulated average-JCT speedup over the status quo on the status quo's jobs (NaN: no
        status quo among the candidates)."""
        chosen, quo = self.row(self.winner), self.row(STATUS_QUO)
        if quo is None or chosen is None:
            return float("nan")
        return float(quo["avg_jct_h"]) / _core(chosen, "avg_jct_h")


def _core(row: pd.Series, metric: str) -> float:
    """A candidate's figure on the status quo's jobs where the table has it, else on all it completed."""
    value = row.get(f"core_{metric}", float("nan"))
    return float(value) if value == value else float(row[metric])


def plan_workload(problem: PlanningProblem, workload: Workload, *, objective: WorkloadObjective = "jct",
                  max_avg_jct: float | None = None, scheduler: str = "las", round_s: float = 300.0,
                  elastic: ElasticRule | None = None,
                  solver: SolverName = "auto", time_limit: float = 60.0, inputs: dict[str, str] | None = None,
                  prune_load: float | None = PRUNE_LOAD, progress: Progress | None = None,
                  workers: int | None = None, screen: int | None = SCREEN, screen_jobs: int = SCREEN_JOBS,
                  replay_jobs: int | None = REPLAY_JOBS, engine: Engine | None = None) -> Weighing:
    """Choose the cluster and hints for `workload` under `problem`'s budget by `objective` (see the module).

    A candidate whose fluid load (the workload's offered work per hour over the mix the MILP says it serves)
    exceeds both `prune_load` and the status quo's is not simulated: its queue would grow without bound,
    faster than the status quo's (the status quo is always simulated; None simulates every candidate).
    The rest are screened on `screen_jobs` jobs of the trace's arrivals and the `screen` best (None: all) are
    replayed on every draw, on a sample of `replay_jobs` jobs each (None: every job) (`hetplan.codesign.screen`).
    Replays run on `engine` (default: a pool of `workers` processes, the CPUs this process may use); the plan
    is the same whatever runs them.
    """
    engine = engine or ProcessPool(workers)
    with held_open(engine, warm=True):  # a pool's workers get ready while the MILP proposes; they serve every run
        listed = shortlist_for(problem, workload, objective=objective, max_avg_jct=max_avg_jct, scheduler=scheduler,
                               round_s=round_s, elastic=elastic, solver=solver, time_limit=time_limit,
                               prune_load=prune_load,
                               progress=progress, screen=screen, screen_jobs=screen_jobs, replay_jobs=replay_jobs,
                               engine=engine)
        summaries = engine.summaries(listed.runs, listed.pending, progress)
    return chosen(problem, listed, summaries, objective=objective, max_avg_jct=max_avg_jct, inputs=inputs,
                  prune_load=prune_load)


def shortlist_for(problem: PlanningProblem, workload: Workload, *, objective: WorkloadObjective = "jct",
                  max_avg_jct: float | None = None, scheduler: str = "las", round_s: float = 300.0,
                  elastic: ElasticRule | None = None,
                  solver: SolverName = "auto", time_limit: float = 60.0, prune_load: float | None = PRUNE_LOAD,
                  progress: Progress | None = None, screen: int | None = SCREEN, screen_jobs: int = SCREEN_JOBS,
                  replay_jobs: int | None = REPLAY_JOBS, engine: Engine | None = None) -> Shortlist:
    """Stage 1: propose the candidates for `workload` and shortlist them (`hetplan.codesign.screen.shortlist`);
    with `elastic`, the replays run the elastic scheduler (`hetplan.codesign.replay`)."""
    # classes larger than every node stay in (the MILP plans them as gangs, the replays run them so); only classes
    # no GPU type the budget buys can host are left out
    workload = without_classes(workload, problem.unplannable, "no GPU type the budget buys has their GPUs (or no "
                               "option of theirs fits a node's cores and RAM): the replays leave them out")
    fractions = COST_FRACTIONS if objective == "cost" else BUDGET_FRACTIONS
    candidates = propose(problem, fractions=fractions, floors_at_every_fraction=objective == "cost", solver=solver,
                         time_limit=time_limit, progress=progress)
    if not candidates:
        raise ContractError([Problem("<catalog>", f"nothing could be planned: budget {problem.budget:g} $/h buys no "
                                     "useful node and there is no owned fleet")])
    config = SimConfig(scheduler, round_s, elastic=elastic)
    return shortlist(problem, candidates, workload, config, objective=objective, max_avg_jct=max_avg_jct,
                     prune_load=prune_load, screen=screen, screen_jobs=screen_jobs, replay_jobs=replay_jobs,
                     engine=engine, progress=progress)


def chosen(problem: PlanningProblem, listed: Shortlist, summaries: dict[Run, dict], *,
           objective: WorkloadObjective = "jct", max_avg_jct: float | None = None,
           inputs: dict[str, str] | None = None, prune_load: float | None = PRUNE_LOAD) -> Weighing:
    """Stage 3: the plan the objective chooses from the shortlist and its replay runs' summaries (`pending`)."""
    replayed = listed.replayed(summaries)
    host_gpus = problem.host.requested if problem.host is not None else None  # --max-job-gpus: insisted on
    weighed = weigh(problem, replayed).assign(screen=list(listed.stage), screen_score=list(listed.screen_scores),
                                              avg_jct_se_h=listed.standard_errors(summaries))
    decision = decide(weighed[weighed["screen"] != SCREENED_OUT], objective, max_avg_jct, host_gpus=host_gpus)
    weighed["chosen"] = weighed.index == decision.index
    winner = replayed[decision.index].candidate
    config = listed.runs.config
    planning = {
        "objective": str(objective), "metric": workload_objective(objective).metric,
        "judged_on": "the status quo's jobs (those it completes), paired job by job on the same draws",
        "max_avg_jct_h": max_avg_jct, "scheduler": config.scheduler, "round_s": config.round_s, "margin": MARGIN,
        "floor": FLOOR, "noise_z": NOISE_Z, "host_slack": HOST_SLACK, "host_gpus": host_gpus,
        "prune_load": prune_load, "workload": listed.workload.summary, "winner": winner.name,
        "decision": {"reason": decision.reason, "declined": decision.declined or None},
        "speeds": "the planner's curves (fitted, defaults for unprofiled models); simulated, not measured",
        **({"elastic": _elastic_record(config.elastic)} if config.elastic is not None else {}),
        "screen": {**listed.record, "confidence": confidence(weighed, objective)},
        "candidates": _records(weighed),
    }
    result = _stamped(winner.result, inputs or {}, planning)
    warnings = [*problem.warnings, *listed.workload.warnings, *listed.warnings]
    return Weighing(problem, result, winner.name, weighed, replayed, listed.workload, objective, warnings,
                        decision)


def weigh(problem: PlanningProblem, replayed: list[Replayed]) -> pd.DataFrame:
    """The candidate table (`hetplan.codesign.replay.table`) with each replayed candidate's figures on the status
    quo's jobs, paired with the status quo's runs (`hetplan.codesign.versus`), and the job size it hosts."""
    frame = table(replayed, problem)
    frame["hosts_up_to"] = [hosting_of(problem.shapes, r.candidate.counts).up_to for r in replayed]
    quo = next((r for r in replayed if r.candidate.name == STATUS_QUO and r.jct_by_job), None)
    rows = []
    for r in replayed:
        if quo is None or not r.jct_by_job:
            rows.append({})
            continue
        rows.append(versus(r.jct_by_job, quo.jct_by_job).to_dict())
    return pd.concat([frame, pd.DataFrame(rows, index=frame.index)], axis=1)


def confidence(weighed: pd.DataFrame, objective: str) -> dict:
    """How sure the choice is: the winner's lead over the best replayed candidate on another cluster (not the
    winner's own fastest-first twin or original) on the objective's figure, against the noise of the replays: the spread
    of the winner's average JCT between arrival draws and the batch-means standard errors of both."""
    metric = screened_metric(objective)
    win = weighed[weighed["chosen"]].iloc[0]
    def base(name: str) -> str:
        return name.removesuffix(TWIN_SUFFIX)

    other_clusters = weighed["candidate"].map(base) != base(str(win["candidate"]))  # not the winner's own twin
    others = weighed[(weighed["screen"] == "replayed") & other_clusters & (weighed["rejected"] == 0)]
    out: dict = {"winner": win["candidate"], "draws_spread_h": _finite(win["avg_jct_spread"]),
                 "avg_jct_se_h": _finite(win["avg_jct_se_h"])}
    if len(others):
        runner = others.loc[others[metric].idxmin()]
        lead = float(runner[metric] - win[metric])
        noise = math.hypot(float(win["avg_jct_se_h"]), float(runner["avg_jct_se_h"]))
        out.update({"runner_up": runner["candidate"], f"lead_{metric}": _finite(lead),
                    "lead_over_2se": _finite(lead / (2 * noise)) if noise > 0 else None})
    return out


def _elastic_record(rule: ElasticRule) -> dict:
    """What plan.json says of an elastic plan's replays: the rule, and what their speeds come from."""
    return {**{k: getattr(rule, k) for k in rule.__dataclass_fields__},
            "speeds": "the fitted multi-GPU scaling models (hetplan.scaling), GPU counts chosen every round; "
                      "simulated, not measured"}


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _stamped(result: MilpPlan, inputs: dict[str, str], planning: dict) -> MilpPlan:
    """The winner's plan with its own id, the inputs' fingerprints and the record of the choice."""
    plan = result.plan
    pid = plan_id(inputs, plan.budget_per_hour, plan.created_at)
    hints = result.hints.assign(plan_id=pid) if len(result.hints) else result.hints
    stamped = plan.model_copy(update={"plan_id": pid, "inputs": inputs, "planning": {**(plan.planning or {}),
                                                                                   **planning}})
    return MilpPlan(stamped, hints, result.allocation, result.nodes, result.solution, result.warnings)


def _records(frame: pd.DataFrame) -> list[dict]:
    """JSON-able rows (NaN as null)."""
    out = []
    for row in frame.to_dict("records"):
        out.append({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()})
    return out
