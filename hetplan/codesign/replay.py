"""Replay candidates on a workload in the simulator, with the planner's own view of job speeds.

The planner knows only the curves (fitted, plus its stated defaults), so that is the truth its replays
use; `hetplan evaluate` replays the chosen plan on the real truth and an unseen trace. Each candidate runs
on every arrival draw (`Workload.draws`) and is scored by the mean over draws.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from hetplan.codesign.candidates import Candidate
from hetplan.allocator.spec import Node
from hetplan.hints import HintSet
from hetplan.planner.problem import PlanningProblem
from hetplan.planning.mix import NodeMix
from hetplan.progress import Progress
from hetplan.sim.engine import SimConfig, simulate
from hetplan.sim.metrics import summarize
from hetplan.sim.truth import TruthCurves


def usable_cpus() -> int:
    """The CPUs this process may run on: the default number of replay workers."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

METRICS = ("avg_jct_h", "p95_jct_h", "makespan_h", "avg_queue_h", "gpu_util")


@dataclass(frozen=True)
class Replayed:
    """A candidate's simulated figures: the mean over arrival draws, and each draw's average JCT. A candidate
    pruned before simulation (`pruned`) has NaN figures and is never chosen."""

    candidate: Candidate
    metrics: dict[str, float]
    avg_jct_by_draw: tuple[float, ...]
    rejected: int  # jobs larger than every node of this candidate
    fluid_load: float = float("nan")  # offered work / the mix it serves: above 1 its queue grows without bound
    pruned: bool = False

    @classmethod
    def skipped(cls, candidate: Candidate, fluid_load: float) -> Replayed:
        return cls(candidate, {m: float("nan") for m in METRICS}, (), 0, fluid_load, True)


def planner_truth(problem: PlanningProblem) -> TruthCurves:
    """The planner's view of job speeds: its curves, defaults included, with its reference throughputs."""
    references = dict(zip(problem.classes["model"], problem.classes["t_ref"]))
    return TruthCurves.from_curves(problem.defaults.curves, references)


def candidate_nodes(problem: PlanningProblem, candidate: Candidate) -> tuple[Node, ...]:
    """The nodes of a candidate: the owned fleet plus its added nodes (`hetplan.planning.NodeMix`)."""
    return NodeMix.by_index(problem.shapes, candidate.counts).nodes(problem.shapes)


def replay(problem: PlanningProblem, candidates: Sequence[Candidate], draws: Sequence[pd.DataFrame],
           config: SimConfig, progress: Progress | None = None,
           fluid_loads: Sequence[float] | None = None, workers: int = 1) -> list[Replayed]:
    """Simulate every candidate on every draw of the workload (jobs with `sim_model` = their model), in up to
    `workers` processes (`simulations`)."""
    runs = [(i, d) for i in range(len(candidates)) for d in range(len(draws))]
    summaries = simulations(_Runs(problem, tuple(candidates), tuple(draws), config), runs, workers, progress)
    out = []
    for i, candidate in enumerate(candidates):
        frame = pd.DataFrame([summaries[(i, d)] for d in range(len(draws))])
        load = float(fluid_loads[i]) if fluid_loads is not None else float("nan")
        out.append(Replayed(candidate, {m: float(frame[m].mean()) for m in METRICS},
                            tuple(float(v) for v in frame["avg_jct_h"]), int(frame["rejected_too_big"].max()), load))
    return out


@dataclass(frozen=True)
class _Runs:
    """What every simulation of one `replay` call reads: candidate i on draw d is run (i, d)."""

    problem: PlanningProblem
    candidates: tuple[Candidate, ...]
    draws: tuple[pd.DataFrame, ...]
    config: SimConfig

    def summary(self, run: tuple[int, int]) -> dict:
        """Simulate one run with the planner's truth and summarise it (`hetplan.sim.metrics.summarize`)."""
        candidate, jobs = self.candidates[run[0]], self.draws[run[1]]
        hints = HintSet.from_frame(candidate.result.hints) if len(candidate.result.hints) else HintSet.empty()
        result = simulate(jobs, candidate_nodes(self.problem, candidate), self.truth, candidate.policy, hints,
                          self.config)
        return summarize(result, candidate.cost_per_hour)

    @cached_property
    def truth(self) -> TruthCurves:
        return planner_truth(self.problem)


START_METHOD = "spawn"
"""How replay workers start. Not "fork": replays run inside Airflow tasks, whose runner holds threads (its
supervisor's comms, logging, heartbeats) that a forked child inherits mid-state and can deadlock on. A spawned
worker is a fresh interpreter that imports hetplan and receives the runs pickled once (`_adopt`)."""


def simulations(runs: _Runs, which: Sequence[tuple[int, int]], workers: int,
                progress: Progress | None) -> dict[tuple[int, int], dict]:
    """Each run's summary. With `workers` > 1 (and more than one run) they run in that many spawned processes
    (`START_METHOD`), each given `runs` once when it starts; only the summaries come back. Each simulation is a
    function of its inputs alone, so the summaries are the same as one after the other, only sooner on several
    cores."""
    names = [f"replaying {runs.candidates[i].name}" + (f", draw {d + 1}" if len(runs.draws) > 1 else "")
             for i, d in which]
    workers = min(workers, len(which))
    runs.truth  # noqa: B018 (once, here: the workers receive it with the runs)
    if workers <= 1:
        out = {}
        for k, run in enumerate(which):
            if progress:
                progress(k, len(which), names[k])
            out[run] = runs.summary(run)
        return out
    with ProcessPoolExecutor(workers, mp_context=mp.get_context(START_METHOD), initializer=_adopt,
                             initargs=(runs,)) as pool:
        futures = {pool.submit(_summary, run): k for k, run in enumerate(which)}
        for done, future in enumerate(as_completed(futures)):
            if progress:
                progress(done + 1, len(which), names[futures[future]])
        return {which[k]: future.result() for future, k in futures.items()}


_INHERITED: _Runs | None = None
"""A worker process's runs, set once when it starts (`_adopt`)."""


def _adopt(runs: _Runs) -> None:
    global _INHERITED
    _INHERITED = runs


def _summary(run: tuple[int, int]) -> dict:
    if _INHERITED is None:
        raise RuntimeError("a replay worker started without its runs")
    return _INHERITED.summary(run)


def table(replayed: Sequence[Replayed], problem: PlanningProblem) -> pd.DataFrame:
    """One row per candidate: what it buys, what it costs, what the MILP and the simulator say of it."""
    rows = []
    for r in replayed:
        c = r.candidate
        gpus = int(sum(problem.shapes.loc[s, "gpus"] * n for s, n in c.counts.items()))
        owned = int((problem.shapes["gpus"] * problem.shapes["owned"]).sum())
        rows.append({"candidate": c.name, "policy": c.policy, "cost_per_hour": c.cost_per_hour,
                     "gpus": gpus + owned, "mix_served": c.result.plan.objective,
                     **{m: r.metrics[m] for m in METRICS},
                     "avg_jct_spread": float(np.ptp(r.avg_jct_by_draw)) if r.avg_jct_by_draw else float("nan"),
                     "rejected": r.rejected, "fluid_load": r.fluid_load, "pruned": r.pruned,
                     "node_counts": {str(problem.shapes.loc[s, "name"]): n for s, n in sorted(c.counts.items())}})
    return pd.DataFrame(rows)
