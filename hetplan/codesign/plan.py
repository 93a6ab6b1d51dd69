"""Plan for a workload: the MILP proposes candidate clusters, the simulator replays each, the objective picks.

    workload (recent jobs) + curves + catalog + budget
        -> candidates (hetplan.codesign.candidates)      node mixes with their hints
        -> replays (hetplan.codesign.replay)             each on every arrival draw, the planner's speeds
        -> choice (hetplan.codesign.objectives)          by avg JCT, p95 JCT, makespan, or cost for a JCT target

The winner's plan records the objective, every candidate's simulated figures and why it won
(`Plan.planning`), so `plan.json` says what was weighed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from hetplan.codesign.candidates import BUDGET_FRACTIONS, PROPORTIONAL, STATUS_QUO, Candidate, propose
from hetplan.codesign.objectives import MARGIN, METRIC, WorkloadObjective, choose
from hetplan.codesign.replay import Replayed, replay, table
from hetplan.codesign.workload import Workload, without_classes
from hetplan.planner.baselines import GPU_ONLY, HETPLAN, Evaluation
from hetplan.planner.planner import PlanResult, plan_id
from hetplan.planner.problem import PlanningProblem
from hetplan.planner.solvers import SolverName
from hetplan.sim.engine import SimConfig

COST_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
Progress = Callable[[int, int, str], None]


@dataclass
class WorkloadPlan:
    """The chosen plan, every candidate weighed, and the workload they were weighed on."""

    problem: PlanningProblem
    result: PlanResult
    winner: str
    candidates: pd.DataFrame  # hetplan.codesign.replay.table plus `chosen`
    replayed: list[Replayed]
    workload: Workload
    objective: str
    warnings: list[str] = field(default_factory=list)

    def candidate(self, name: str) -> Candidate | None:
        return next((r.candidate for r in self.replayed if r.candidate.name == name), None)

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
                     f"$/h: simulated gain {quo['avg_jct_h'] / chosen['avg_jct_h']:.2f}x avg JCT, "
                     f"{quo['p95_jct_h'] / chosen['p95_jct_h']:.2f}x p95; predicted mix served "
                     f"{chosen['mix_served'] / quo['mix_served']:.2f}x")
        return line + " (the planner's curves, simulated; not measured)"


def plan_workload(problem: PlanningProblem, workload: Workload, *, objective: WorkloadObjective = "jct",
                  max_avg_jct: float | None = None, scheduler: str = "las", round_s: float = 300.0,
                  solver: SolverName = "auto", time_limit: float = 60.0, inputs: dict[str, str] | None = None,
                  progress: Progress | None = None) -> WorkloadPlan:
    """Choose the cluster and hints for `workload` under `problem`'s budget by `objective` (see the module)."""
    workload = without_classes(workload, problem.unplannable, "larger than every node shape (no plan can run them)")
    fractions = COST_FRACTIONS if objective == "cost" else BUDGET_FRACTIONS
    if progress:
        progress(0, 1, "proposing candidates")
    candidates = propose(problem, fractions=fractions, solver=solver, time_limit=time_limit)
    replayed = replay(problem, candidates, workload.draws, SimConfig(scheduler, round_s), progress)  # type: ignore[arg-type]
    weighed = table(replayed, problem)
    chosen = choose(weighed, objective, max_avg_jct)
    weighed["chosen"] = weighed.index == chosen
    winner = replayed[chosen].candidate
    planning = {
        "objective": objective, "metric": METRIC[objective], "max_avg_jct_h": max_avg_jct, "scheduler": scheduler,
        "round_s": round_s, "margin": MARGIN, "workload": workload.summary, "winner": winner.name,
        "speeds": "the planner's curves (fitted, defaults for unprofiled models); simulated, not measured",
        "candidates": _records(weighed),
    }
    result = _stamped(winner.result, inputs or {}, planning)
    warnings = [*problem.warnings, *workload.warnings]
    return WorkloadPlan(problem, result, winner.name, weighed, replayed, workload, objective, warnings)


def _stamped(result: PlanResult, inputs: dict[str, str], planning: dict) -> PlanResult:
    """The winner's plan with its own id, the inputs' fingerprints and the record of the choice."""
    plan = result.plan
    pid = plan_id(inputs, plan.budget_per_hour, plan.created_at)
    hints = result.hints.assign(plan_id=pid) if len(result.hints) else result.hints
    stamped = plan.model_copy(update={"plan_id": pid, "inputs": inputs, "planning": planning})
    return PlanResult(stamped, hints, result.allocation, result.nodes, result.solution, result.warnings)


def _records(frame: pd.DataFrame) -> list[dict]:
    """JSON-able rows (NaN as null)."""
    out = []
    for row in frame.to_dict("records"):
        out.append({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()})
    return out
