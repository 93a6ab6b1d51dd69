"""The shortlist: which candidates the full replays weigh, and the runs that weigh them.

    propose (MILP) -> prune          candidates whose fluid load exceeds the limit and the status quo's (the
                                     least loaded candidate's where the status quo is none: one always stays)
                   -> screen         the rest replayed co-adaptively on a sample of the trace's own arrivals
                   -> shortlist      the status quo + the `screen` best by the objective, each hinted one with
                                     its fastest-first twin (replayed where ranks steer, else its original's figures)
                   -> runs           (candidate, draw) pairs of the replay sample, for an engine to run

A sample of `n` jobs out of N is 1 job in m = ceil(N / n) in arrival order, arrival times divided by m: the
whole trace's mix at the same arrival rate, so the same load (a Poisson draw thinned and rescaled is again a
Poisson draw at that rate). When the screen and the replays thin draw 0 alike (the same m: both take every job,
or an overloaded workload's replays sample the screen's size), the screen's runs are the replays' runs of draw
0 and the replay stage reuses them. The screen is cheap (one draw, a few thousand jobs); the
shortlisted candidates are replayed on every draw, on a sample of `replay_jobs` for long workloads, and the
plan records how sure the choice is (`confidence`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from hetplan.codesign.candidates import PROPORTIONAL, STATUS_QUO, Candidate
from hetplan.codesign.engines import Engine, ProcessPool, Run
from hetplan.codesign.objectives import workload_objective
from hetplan.codesign.replay import JCT_BY_JOB, METRICS, Replayed, Runs
from hetplan.codesign.versus import versus
from hetplan.codesign.workload import Workload
from hetplan.planner.problem import PlanningProblem
from hetplan.progress import Progress, prefixed
from hetplan.sim.engine import SimConfig

SCREEN = 4  # candidates replayed in full besides the status quo
SCREEN_JOBS = 2_000  # jobs of the screen's sample of draw 0
REPLAY_JOBS = 5_000  # jobs a full replay samples from each draw of a longer workload (bench/plan_sizes.py)
COST_SLACK = 0.25  # the cost objective shortlists candidates whose screened JCT is within this of the target
OVERLOADED = 1.0  # a fluid load above this: the candidate's queue grows without bound
STRESS_THIN = 3  # a sampled replay's stressed draws sample this many times fewer jobs: heavier and more queued,
# they take 2-3x as long a job to replay (bench/plan_sizes.py)

TWIN_SUFFIX = ", fastest first"  # a twin's name: its original's and this
PRUNED, SCREENED_OUT, REPLAYED, TWIN = "pruned", "screened out", "replayed", "twin: the original's figures"
"""A candidate's stage in the table's `screen` column."""


def thinned(jobs: pd.DataFrame, every: int) -> pd.DataFrame:
    """1 job in `every` (in arrival order), arrival times divided by `every` from the first: same rate, same mix."""
    if every <= 1:
        return jobs
    out = jobs.sort_values("arrival_s", kind="stable").iloc[::every].reset_index(drop=True)
    first = float(out["arrival_s"].iloc[0]) if len(out) else 0.0
    return out.assign(arrival_s=first + (out["arrival_s"] - first) / every)


def sampled(draws: Sequence[pd.DataFrame], jobs: int | None, stressed: int = 0) -> tuple[tuple[pd.DataFrame, ...], int]:
    """The draws thinned to at most `jobs` jobs each (None: as they are), and the thinning factor; where they are
    thinned, the last `stressed` draws (a workload's stressed draws) `STRESS_THIN` times more."""
    every = 1 if jobs is None else max(1, math.ceil(max(len(d) for d in draws) / max(1, jobs)))
    first_stressed = len(draws) - stressed if every > 1 else len(draws)
    return tuple(thinned(d, every * (STRESS_THIN if k >= first_stressed else 1)) for k, d in enumerate(draws)), every


@dataclass(frozen=True)
class Shortlist:
    """Every candidate (proposed, then the twins), what the screen made of each, and the replay runs to do."""

    runs: Runs  # every candidate on the replay sample's draws
    workload: Workload
    loads: tuple[float, ...]
    stage: tuple[str, ...]  # PRUNED, SCREENED_OUT, REPLAYED or TWIN, per candidate
    twin_of: tuple[int | None, ...]  # a twin's original
    screen_scores: tuple[float, ...]  # the screen's figure for the objective (NaN: not screened)
    screen_rejected: tuple[int, ...]
    done: dict[Run, dict] = field(default_factory=dict)  # replay runs the screen already ran
    record: dict = field(default_factory=dict)  # the plan's `planning["screen"]`
    warnings: tuple[str, ...] = ()

    @property
    def pending(self) -> list[Run]:
        """The replay runs still to do, candidate by candidate."""
        draws = range(len(self.runs.draws))
        return [(i, d) for i, s in enumerate(self.stage) if s == REPLAYED for d in draws if (i, d) not in self.done]

    def replayed(self, summaries: dict[Run, dict]) -> list[Replayed]:
        """Every candidate's figures from the runs' summaries (`pending`'s, keyed by run)."""
        every = {**self.done, **summaries}
        draws = range(len(self.runs.draws))
        out: list[Replayed] = []
        for i, (candidate, stage) in enumerate(zip(self.runs.candidates, self.stage)):
            if stage == PRUNED:
                out.append(Replayed.skipped(candidate, self.loads[i]))
            elif stage == SCREENED_OUT:
                out.append(Replayed(candidate, {m: float("nan") for m in METRICS}, (), self.screen_rejected[i],
                                    self.loads[i]))
            elif stage == TWIN and (original := self.twin_of[i]) is not None:
                out.append(replace(out[original], candidate=candidate))
            else:
                out.append(Replayed.of(candidate, [every[(i, d)] for d in draws], self.loads[i]))
        return out

    def standard_errors(self, summaries: dict[Run, dict]) -> list[float]:
        """Each candidate's batch-means standard error of its average JCT over the draws (NaN: not replayed)."""
        every = {**self.done, **summaries}
        out = []
        for i, stage in enumerate(self.stage):
            source = self.twin_of[i] if stage == TWIN else i
            ses = [every[(source, d)].get("avg_jct_se_h", float("nan")) for d in range(len(self.runs.draws))
                   if source is not None and (source, d) in every]
            out.append(float(np.sqrt(np.sum(np.square(ses)))) / len(ses) if ses else float("nan"))
        return out


def shortlist(problem: PlanningProblem, candidates: Sequence[Candidate], workload: Workload, config: SimConfig, *,
              objective: str, max_avg_jct: float | None, prune_load: float | None, screen: int | None = SCREEN,
              screen_jobs: int = SCREEN_JOBS, replay_jobs: int | None = REPLAY_JOBS, engine: Engine | None = None,
              progress: Progress | None = None) -> Shortlist:
    """Prune, screen and shortlist `candidates` (see the module); `screen` None replays every unpruned one."""
    loads = [fluid_load(workload, c) for c in candidates]
    quo_load = next((load for c, load in zip(candidates, loads) if c.name == STATUS_QUO), float("nan"))
    if quo_load != quo_load:  # no status quo (it hosts no largest job): the least loaded candidate stands in
        quo_load = min((load for load in loads if load == load), default=float("nan"))
    limit = float("inf") if prune_load is None else max(prune_load, quo_load if quo_load == quo_load else 0.0)
    kept = [i for i, (c, load) in enumerate(zip(candidates, loads)) if c.name == STATUS_QUO or not load > limit]
    overload = _overload(workload, candidates, loads, kept)
    if overload and replay_jobs is not None:  # every queue grows: a longer replay only grows it further
        replay_jobs = min(replay_jobs, screen_jobs)
    stressed = int(workload.summary.get("stressed_draws", 0))
    draws, every = sampled(workload.draws, replay_jobs, stressed)
    scores, rejected = [float("nan")] * len(candidates), [0] * len(candidates)
    refused = [0] * len(candidates)  # the status quo's jobs a candidate's screen run did not complete
    done: dict[Run, dict] = {}
    record: dict = {"shortlist": screen, "replay_sample": _sample_record(workload.draws[0], draws[0], every),
                    "overloaded": overload or None}
    if stressed and every > 1:
        record["replay_sample"]["stressed_jobs"] = len(draws[-1])
    challengers = [i for i in kept if candidates[i].name != STATUS_QUO]
    if screen is None or len(challengers) <= screen:
        chosen = set(kept)
        record["screen_sample"] = None
    else:
        (screen_draw,), screen_every = sampled(workload.draws[:1], screen_jobs)
        runs = Runs(problem, tuple(candidates[i] for i in kept), (screen_draw,), config)
        summaries = (engine or ProcessPool()).summaries(runs, runs.every(), prefixed(progress, "screen"))
        quo = next((summaries[(k, 0)] for k, i in enumerate(kept) if candidates[i].name == STATUS_QUO), None)
        for k, i in enumerate(kept):
            scores[i], refused[i] = _screen_score(summaries[(k, 0)], quo, objective)
            rejected[i] = int(summaries[(k, 0)]["rejected_too_big"])
            if screen_every == every:  # the same sample of draw 0 (every draw itself when 1): not run again
                done[(i, 0)] = summaries[(k, 0)]
        chosen = {i for i in kept if candidates[i].name == STATUS_QUO}
        chosen |= set(_best(candidates, challengers, scores, refused, objective, max_avg_jct, screen))
        chosen |= set(_best_per_hosting(challengers, scores, refused, rejected))
        record["screen_sample"] = _sample_record(workload.draws[0], screen_draw, screen_every)
    done = {run: s for run, s in done.items() if run[0] in chosen}
    stage = [REPLAYED if i in chosen else PRUNED if i not in kept else SCREENED_OUT for i in range(len(candidates))]
    all_candidates: list[Candidate] = list(candidates)
    twin_of: list[int | None] = [None] * len(candidates)
    for i in sorted(chosen):
        if candidates[i].policy == PROPORTIONAL or rejected[i] > 0:
            continue
        twin = fastest_first(candidates[i])
        all_candidates.append(twin)
        twin_of.append(i)
        stage.append(REPLAYED if ranks_steer(twin, config) else TWIN)
        loads.append(loads[i])
        scores.append(float("nan"))
        rejected.append(rejected[i])
    record["replayed"] = [c.name for c, s in zip(all_candidates, stage) if s == REPLAYED]
    warnings = (_overload_warning(overload, len(draws[0])),) if overload else ()
    return Shortlist(Runs(problem, tuple(all_candidates), draws, config), workload, tuple(loads), tuple(stage),
                     tuple(twin_of), tuple(scores), tuple(rejected), done, record, warnings)


def _overload(workload: Workload, candidates: Sequence[Candidate], loads: Sequence[float],
              kept: Sequence[int]) -> dict | None:
    """When every candidate kept has a fluid load above `OVERLOADED` (the budget buys no cluster that keeps up
    with the workload): what the workload offers and what the least loaded candidate serves; else None."""
    finite = [(loads[i], i) for i in kept if loads[i] == loads[i]]
    if not finite or min(finite)[0] <= OVERLOADED:
        return None
    load, best = min(finite)
    span = float(workload.summary.get("span_h", 0.0))
    return {"least_fluid_load": round(load, 4), "candidate": candidates[best].name,
            "offered_reference_gpus": round(float(workload.summary["reference_gpu_hours"]) / span, 3),
            "served_reference_gpus": round(float(candidates[best].result.plan.objective), 3)}


def _overload_warning(overload: dict, jobs: int) -> str:
    return (f"every candidate is overloaded: the workload asks for {overload['offered_reference_gpus']:.1f} "
            f"reference GPUs per hour and the one that serves most ({overload['candidate']}) serves "
            f"{overload['served_reference_gpus']:.1f} (fluid load {overload['least_fluid_load']:.2f}); every queue "
            f"grows without bound, so the replays sample {jobs:,} jobs a draw and their JCTs and speedups grow "
            "with the workload's length: raise --budget for a plan that keeps up")


def screened_metric(objective: str) -> str:
    """The figure the screen ranks by: the objective's (the cost objective's JCT target is on average JCT)."""
    return "avg_jct_h" if objective == "cost" else workload_objective(objective).metric


def _screen_score(summary: dict, quo: dict | None, objective: str) -> tuple[float, int]:
    """A screened candidate's figure for the objective, on the status quo's jobs where it is a JCT (the choice's
    own figure, `hetplan.codesign.objectives`), and how many of the status quo's jobs it did not complete."""
    metric = screened_metric(objective)
    if quo is None or metric not in ("avg_jct_h", "p95_jct_h") or JCT_BY_JOB not in summary:
        return float(summary[metric]), 0
    paired = versus([summary[JCT_BY_JOB]], [quo[JCT_BY_JOB]])
    return float(paired.avg_jct_h if metric == "avg_jct_h" else paired.p95_jct_h), paired.refused


def _best_per_hosting(pool: Sequence[int], scores: Sequence[float], refused: Sequence[int],
                      rejected: Sequence[int]) -> list[int]:
    """The best screened candidate at each count of jobs refused (each hosting level: those that host the largest
    jobs and those that do not), among those that run every job the status quo runs: so the choice can weigh
    hosting a job size against what it costs the rest."""
    levels: dict[int, int] = {}
    for i in pool:
        if refused[i] == 0 and scores[i] == scores[i] and (
                rejected[i] not in levels or scores[i] < scores[levels[rejected[i]]]):
            levels[rejected[i]] = i
    return list(levels.values())


def _best(candidates: Sequence[Candidate], pool: Sequence[int], scores: Sequence[float], refused: Sequence[int],
          objective: str, max_avg_jct: float | None, k: int) -> list[int]:
    """The `k` candidates of `pool` the screen ranks best: by the objective's figure (those that run every job
    the status quo runs first), or for the cost objective the `k` cheapest within `COST_SLACK` of the JCT target
    plus the fastest."""
    def figure(i: int) -> tuple:
        return (refused[i] > 0, scores[i] if scores[i] == scores[i] else math.inf)

    ranked = sorted(pool, key=figure)
    if objective != "cost" or max_avg_jct is None:
        return ranked[:k]
    near = [i for i in pool if figure(i)[1] <= max_avg_jct * (1 + COST_SLACK)]
    cheapest = sorted(near, key=lambda i: (candidates[i].cost_per_hour, figure(i)))[:k]
    return [*cheapest, *ranked[:1]]


def _sample_record(full: pd.DataFrame, sample: pd.DataFrame, every: int) -> dict:
    return {"jobs": len(sample), "of_jobs": len(full), "every": every,
            "how": "every job" if every == 1 else f"1 job in {every} in arrival order, arrival times / {every}"}


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
    return replace(candidate, name=f"{candidate.name}{TWIN_SUFFIX}", result=replace(candidate.result, hints=hints))


def fluid_load(workload: Workload, candidate: Candidate) -> float:
    """The workload's offered work (reference GPU-hours per hour over its arrival span) over the mix the
    candidate serves per hour by the MILP: a lower bound on its utilisation, ignoring packing. A candidate
    planned without the largest classes (`declines_above`) is offered only the work of the jobs it plans for."""
    span = float(workload.summary.get("span_h", 0.0))
    served = candidate.result.plan.objective
    if not span > 0 or not served > 0:
        return float("nan")
    offered = float(workload.summary["reference_gpu_hours"])
    if candidate.declines_above is not None:
        jobs = workload.jobs[workload.jobs["num_gpus"] <= candidate.declines_above]
        offered = float((jobs["num_gpus"] * jobs["duration_s"]).sum()) / 3600.0
    return offered / span / served
