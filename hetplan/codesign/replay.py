"""Replay candidates on a workload in the simulator, with the planner's own view of job speeds.

The planner knows only the curves (fitted, plus its stated defaults), so that is the truth its replays
use; `hetplan evaluate` replays the chosen plan on the real truth and an unseen trace. Each candidate runs
on every arrival draw (`Workload.draws`) and is scored by the mean over draws.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hetplan.codesign.candidates import Candidate
from hetplan.hints import HintSet
from hetplan.planner.problem import PlanningProblem
from hetplan.sim.engine import SimConfig, simulate
from hetplan.sim.metrics import summarize
from hetplan.sim.setups import nodes_from_counts
from hetplan.sim.truth import TruthCurves

Progress = Callable[[int, int, str], None]
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


def candidate_nodes(problem: PlanningProblem, candidate: Candidate):
    """The nodes of a candidate: the owned fleet plus its added nodes."""
    shapes = problem.shapes
    counts = {str(shapes.loc[s, "name"]): int(n) for s, n in enumerate(shapes["owned"]) if n > 0}
    for s, n in candidate.counts.items():
        name = str(shapes.loc[s, "name"])
        counts[name] = counts.get(name, 0) + n
    return nodes_from_counts(shapes, counts)


def replay(problem: PlanningProblem, candidates: Sequence[Candidate], draws: Sequence[pd.DataFrame],
           config: SimConfig, progress: Progress | None = None,
           fluid_loads: Sequence[float] | None = None) -> list[Replayed]:
    """Simulate every candidate on every draw of the workload (jobs with `sim_model` = their model)."""
    truth = planner_truth(problem)
    out = []
    total = len(candidates) * len(draws)
    for i, candidate in enumerate(candidates):
        hints = HintSet.from_frame(candidate.result.hints) if len(candidate.result.hints) else HintSet.empty()
        nodes = candidate_nodes(problem, candidate)
        rows = []
        for d, jobs in enumerate(draws):
            if progress:
                progress(i * len(draws) + d, total, candidate.name)
            result = simulate(jobs, nodes, truth, candidate.policy, hints, config)
            rows.append(summarize(result, candidate.cost_per_hour))
        frame = pd.DataFrame(rows)
        load = float(fluid_loads[i]) if fluid_loads is not None else float("nan")
        out.append(Replayed(candidate, {m: float(frame[m].mean()) for m in METRICS},
                            tuple(float(v) for v in frame["avg_jct_h"]), int(frame["rejected_too_big"].max()), load))
    return out


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
