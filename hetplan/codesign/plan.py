"""Plan for a workload: the MILP proposes candidate clusters, the simulator replays each, the objective picks.

    workload (recent jobs) + curves + catalog + budget
        -> candidates (hetplan.codesign.candidates)      node mixes with their hints
        -> replays (hetplan.codesign.replay)             each on every arrival draw, the planner's speeds
                                                         (overloaded ones pruned; the best three again
                                                         with hints ranked fastest first, replayed where
                                                         the policy reads ranks)
        -> choice (hetplan.codesign.objectives)          by avg JCT, p95 JCT, makespan, or cost for a JCT target

The winner's plan records the objective, every candidate's simulated figures and why it won
(`Plan.planning`), so `plan.json` says what was weighed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pandas as pd

from hetplan.codesign.candidates import BUDGET_FRACTIONS, PROPORTIONAL, STATUS_QUO, Candidate, propose
from hetplan.codesign.objectives import MARGIN, WorkloadObjective, choose, workload_objective
from hetplan.codesign.replay import Replayed, replay, table, usable_cpus
from hetplan.codesign.workload import Workload, without_classes
from hetplan.contracts.table import ContractError, Problem
from hetplan.planner.baselines import GPU_ONLY, HETPLAN, Evaluation
from hetplan.planner.planner import PlanResult, plan_id
from hetplan.planner.problem import PlanningProblem
from hetplan.planner.solvers import SolverName
from hetplan.progress import Progress
from hetplan.sim.engine import SimConfig

COST_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
PRUNE_LOAD = 1.25
REFINE = 3  # the best candidates tried again with their hints ranked fastest first (`_refined`)


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
                  prune_load: float | None = PRUNE_LOAD, progress: Progress | None = None,
                  workers: int | None = None) -> WorkloadPlan:
    """Choose the cluster and hints for `workload` under `problem`'s budget by `objective` (see the module).

    A candidate whose fluid load (the workload's offered work per hour over the mix the MILP says it serves)
    exceeds both `prune_load` and the status quo's is not simulated: its queue would grow without bound,
    faster than the status quo's (the status quo is always simulated; None simulates every candidate).
    Replays run in `workers` processes (default: the CPUs this process may use); the plan is the same
    whatever their number.
    """
    workload = without_classes(workload, problem.unplannable, "no node shape runs them whole (the plan hosts the "
                               "largest as gangs: planning.host_sizes), and the replays leave them out")
    fractions = COST_FRACTIONS if objective == "cost" else BUDGET_FRACTIONS
    candidates = propose(problem, fractions=fractions, floors_at_every_fraction=objective == "cost", solver=solver,
                         time_limit=time_limit, progress=progress)
    if not candidates:
        raise ContractError([Problem("<catalog>", f"nothing could be planned: budget {problem.budget:g} $/h buys no "
                                     "useful node and there is no owned fleet")])
    config = SimConfig(scheduler, round_s)  # type: ignore[arg-type]
    workers = usable_cpus() if workers is None else workers
    replayed = _replay_unless_overloaded(problem, candidates, workload, config, prune_load, progress, workers)
    best = table(replayed, problem).sort_values(workload_objective(objective).metric if objective != "cost"
                                               else "avg_jct_h")
    replayed += _refined(problem, [r for r in (replayed[i] for i in best.index[:REFINE])
                                   if r.candidate.policy != PROPORTIONAL and not r.pruned and r.rejected == 0],
                         workload, config, progress, workers)
    weighed = table(replayed, problem)
    chosen = choose(weighed, objective, max_avg_jct)
    weighed["chosen"] = weighed.index == chosen
    winner = replayed[chosen].candidate
    planning = {
        "objective": str(objective), "metric": workload_objective(objective).metric, "max_avg_jct_h": max_avg_jct,
        "scheduler": scheduler,
        "round_s": round_s, "margin": MARGIN, "prune_load": prune_load, "workload": workload.summary,
        "winner": winner.name,
        "speeds": "the planner's curves (fitted, defaults for unprofiled models); simulated, not measured",
        "candidates": _records(weighed),
    }
    result = _stamped(winner.result, inputs or {}, planning)
    warnings = [*problem.warnings, *workload.warnings]
    return WorkloadPlan(problem, result, winner.name, weighed, replayed, workload, objective, warnings)


def _replay_unless_overloaded(problem: PlanningProblem, candidates: list[Candidate], workload: Workload,
                              config: SimConfig, prune_load: float | None, progress: Progress | None,
                              workers: int) -> list[Replayed]:
    """Replay every candidate but those whose fluid load exceeds `prune_load` and the status quo's."""
    loads = [fluid_load(workload, c) for c in candidates]
    quo_load = next((load for c, load in zip(candidates, loads) if c.name == STATUS_QUO), float("nan"))
    limit = float("inf") if prune_load is None else max(prune_load, quo_load if quo_load == quo_load else 0.0)
    kept = [i for i, (c, load) in enumerate(zip(candidates, loads)) if c.name == STATUS_QUO or not load > limit]
    simulated = dict(zip(kept, replay(problem, [candidates[i] for i in kept], workload.draws, config, progress,
                                      [loads[i] for i in kept], workers)))
    return [simulated[i] if i in simulated else Replayed.skipped(c, loads[i]) for i, c in enumerate(candidates)]


def _refined(problem: PlanningProblem, best: list[Replayed], workload: Workload, config: SimConfig,
             progress: Progress | None, workers: int) -> list[Replayed]:
    """The `best` candidates again with their hints ranked fastest first (`fastest_first`).

    A co-adaptive policy picks GPU types by hinted throughput, never by rank, so where every hinted class has
    a throughput the re-ranked twin replays exactly as the original did: it takes the original's figures
    instead of a second replay (`ranks_steer`)."""
    twins = [fastest_first(r.candidate) for r in best]
    again = [twin for twin in twins if ranks_steer(twin, config)]
    fresh = iter(replay(problem, again, workload.draws, config, progress, [fluid_load(workload, c) for c in again],
                        workers))
    return [next(fresh) if ranks_steer(twin, config) else replace(r, candidate=twin) for r, twin in zip(best, twins)]


def ranks_steer(candidate: Candidate, config: SimConfig) -> bool:
    """Whether the order of the candidate's hints can change its replay: always for a placement-only policy
    (it tries GPU types in rank order), for a co-adaptive one only where a hinted class has no positive
    throughput (its speeds then come from the ranks)."""
    if config.policy(candidate.policy).rounds is None:
        return True
    hints = candidate.result.hints
    best = hints.groupby(["model", "num_gpus"])["expected_throughput"].max() if len(hints) else pd.Series(dtype=float)
    return bool((~(best > 0)).any())


def fastest_first(candidate: Candidate) -> Candidate:
    """The candidate with each class's GPU types re-ranked by per-GPU throughput, fastest first (the MILP
    ranks them by the GPUs its steady-state allocation gives, which balances load but can queue a job for
    a slower type while a faster one is free); same nodes, same cores and RAM per type."""
    hints = candidate.result.hints
    if len(hints):
        hints = hints.sort_values(["model", "num_gpus", "normalized_throughput"], ascending=[True, True, False],
                                  kind="stable")
        hints = hints.assign(rank=hints.groupby(["model", "num_gpus"]).cumcount() + 1).reset_index(drop=True)
    return Candidate(f"{candidate.name}, fastest first", candidate.counts, candidate.policy,
                     replace(candidate.result, hints=hints))


def fluid_load(workload: Workload, candidate: Candidate) -> float:
    """The workload's offered work (reference GPU-hours per hour over its arrival span) over the mix the
    candidate serves per hour by the MILP: a lower bound on its utilisation, ignoring packing."""
    span = float(workload.summary.get("span_h", 0.0))
    served = candidate.result.plan.objective
    if not span > 0 or not served > 0:
        return float("nan")
    return float(workload.summary["reference_gpu_hours"]) / span / served


def _stamped(result: PlanResult, inputs: dict[str, str], planning: dict) -> PlanResult:
    """The winner's plan with its own id, the inputs' fingerprints and the record of the choice."""
    plan = result.plan
    pid = plan_id(inputs, plan.budget_per_hour, plan.created_at)
    hints = result.hints.assign(plan_id=pid) if len(result.hints) else result.hints
    stamped = plan.model_copy(update={"plan_id": pid, "inputs": inputs, "planning": {**(plan.planning or {}),
                                                                                   **planning}})
    return PlanResult(stamped, hints, result.allocation, result.nodes, result.solution, result.warnings)


def _records(frame: pd.DataFrame) -> list[dict]:
    """JSON-able rows (NaN as null)."""
    out = []
    for row in frame.to_dict("records"):
        out.append({k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()})
    return out
