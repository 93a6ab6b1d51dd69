"""Replay candidates on a workload in the simulator, with the planner's own view of job speeds.

The planner knows only the curves (fitted, plus its stated defaults), so that is the truth its replays
use; `hetplan evaluate` replays the chosen plan on the real truth and an unseen trace. Replays with an elastic
rule (`SimConfig.elastic`: jobs' GPU counts chosen every round) need speeds on every GPU count: they run by the
fitted multi-GPU scaling models (`ScalingTruth.fitted`, the elastic scheduler's own belief), never the measured
step times. Each candidate runs
on every arrival draw (`Workload.draws`) and is scored by the mean over draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from hetplan.codesign.candidates import Candidate
from hetplan.allocator.spec import Node
from hetplan.codesign.engines import START_METHOD, Engine, ProcessPool, usable_cpus
from hetplan.codesign.versus import batch_se
from hetplan.hints import HintSet
from hetplan.planner.problem import PlanningProblem
from hetplan.sim.setups import NodeMix
from hetplan.progress import Progress
from hetplan.sim.engine import SimConfig, SimResult, simulate
from hetplan.sim.metrics import summarize
from hetplan.sim.scaling_truth import ScalingTruth, as_scaling_jobs
from hetplan.sim.truth import TruthCurves

__all__ = ["START_METHOD", "Replayed", "Runs", "candidate_nodes", "planner_truth", "replay", "table", "usable_cpus"]

METRICS = ("avg_jct_h", "p95_jct_h", "makespan_h", "avg_queue_h", "gpu_util")
JCT_BY_JOB = "jct_h_by_job"
"""A run summary's per-job JCTs (hours, NaN: not completed) in the draw's job order: what pairs two candidates'
runs of the same draw job by job (`hetplan.codesign.versus`)."""


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
    jct_by_job: tuple[np.ndarray, ...] = ()  # per draw, each job's JCT in hours (NaN: not completed)

    @classmethod
    def skipped(cls, candidate: Candidate, fluid_load: float) -> Replayed:
        return cls(candidate, {m: float("nan") for m in METRICS}, (), 0, fluid_load, True)

    @classmethod
    def of(cls, candidate: Candidate, summaries: Sequence[dict], fluid_load: float = float("nan")) -> Replayed:
        """The figures of a candidate from its runs' summaries, one per draw in draw order."""
        frame = pd.DataFrame([{k: v for k, v in s.items() if k != JCT_BY_JOB} for s in summaries])
        return cls(candidate, {m: float(frame[m].mean()) for m in METRICS},
                   tuple(float(v) for v in frame["avg_jct_h"]), int(frame["rejected_too_big"].max()), fluid_load,
                   jct_by_job=tuple(np.asarray(s.get(JCT_BY_JOB, ()), dtype=float) for s in summaries))


def planner_truth(problem: PlanningProblem) -> TruthCurves:
    """The planner's view of job speeds: its curves, defaults included, with its reference throughputs."""
    references = dict(zip(problem.classes["model"], problem.classes["t_ref"]))
    return TruthCurves.from_curves(problem.defaults.curves, references)


def candidate_nodes(problem: PlanningProblem, candidate: Candidate) -> tuple[Node, ...]:
    """The nodes of a candidate: the owned fleet plus its added nodes (`hetplan.sim.setups.NodeMix`)."""
    return NodeMix.by_index(problem.shapes, candidate.counts).nodes(problem.shapes)


def replay(problem: PlanningProblem, candidates: Sequence[Candidate], draws: Sequence[pd.DataFrame],
           config: SimConfig, progress: Progress | None = None,
           fluid_loads: Sequence[float] | None = None, workers: int = 1,
           engine: Engine | None = None) -> list[Replayed]:
    """Simulate every candidate on every draw of the workload (jobs with `sim_model` = their model) on `engine`
    (default: a pool of `workers` processes, `hetplan.codesign.engines`)."""
    runs = Runs(problem, tuple(candidates), tuple(draws), config)
    summaries = (engine or ProcessPool(workers)).summaries(runs, runs.every(), progress)
    loads = list(fluid_loads) if fluid_loads is not None else [float("nan")] * len(candidates)
    return [Replayed.of(c, [summaries[(i, d)] for d in range(len(draws))], loads[i])
            for i, c in enumerate(candidates)]


@dataclass(frozen=True)
class Runs:
    """What every simulation of one batch reads: candidate i on draw d is run (i, d). Picklable; an engine
    (`hetplan.codesign.engines`) ships it to its workers once."""

    problem: PlanningProblem
    candidates: tuple[Candidate, ...]
    draws: tuple[pd.DataFrame, ...]
    config: SimConfig
    truth: TruthCurves | ScalingTruth = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # once, here: workers receive it with the runs
        truth = ScalingTruth.fitted() if self.config.elastic is not None else planner_truth(self.problem)
        object.__setattr__(self, "truth", truth)

    def simulated(self, run: tuple[int, int]) -> SimResult:
        """Simulate one run: candidate i's cluster and hints on draw d, with the planner's truth (elastic: the
        fitted scaling models)."""
        candidate, jobs = self.candidates[run[0]], self.draws[run[1]]
        if self.config.elastic is not None:
            jobs = as_scaling_jobs(jobs)
        hints = HintSet.from_frame(candidate.result.hints) if len(candidate.result.hints) else HintSet.empty()
        return simulate(jobs, candidate_nodes(self.problem, candidate), self.truth, candidate.policy, hints,
                        self.config)

    def summary(self, run: tuple[int, int]) -> dict:
        """Simulate one run and summarise it (`hetplan.sim.metrics.summarize`)."""
        result = self.simulated(run)
        return {**summarize(result, self.candidates[run[0]].cost_per_hour),
                "avg_jct_se_h": batch_means_se(result.jobs), JCT_BY_JOB: jct_by_job(result.jobs)}

    def label(self, run: tuple[int, int]) -> str:
        """What the progress line says of a run: `replaying <candidate>, draw <d>` (draws from 1)."""
        return f"replaying {self.candidates[run[0]].name}" + (f", draw {run[1] + 1}" if len(self.draws) > 1 else "")

    def every(self) -> list[tuple[int, int]]:
        return [(i, d) for i in range(len(self.candidates)) for d in range(len(self.draws))]


def jct_by_job(jobs: pd.DataFrame) -> list[float]:
    """Each job's JCT in hours in the run's job order (the draw's), NaN where it did not complete."""
    jct = jobs["jct_s"].to_numpy(float) / 3600.0
    return np.where(jobs["status"].to_numpy() == "completed", jct, np.nan).tolist()


def batch_means_se(jobs: pd.DataFrame) -> float:
    """The standard error of a run's average JCT (hours) by batch means over its completed jobs in arrival order
    (`hetplan.codesign.versus.batch_se`)."""
    done = jobs[jobs["status"] == "completed"].sort_values("arrival_s", kind="stable")
    return batch_se(done["jct_s"].to_numpy(float) / 3600.0) if len(done) else float("nan")


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
