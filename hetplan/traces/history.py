"""A trace of the jobs the cluster ran, from the allocator's job history (`hetplan.allocator.history`).

Each done job that held whole GPUs becomes one row of the trace contract, `job_id,model,num_gpus,arrival_s,
duration_s`, plus three columns that say where the numbers come from:

- `arrival_s`: when the allocator first placed it, in seconds after the first exported job's first placement
  (the time a job waited before it asked the allocator is not in the journal);
- `run_s`: the seconds it held GPUs (the sum of its spans: start to stop, re-sizes and moves included);
- `duration_s` (**derived**): its run time at the reference allocation (V100, 3 cores and 62.5 GiB per GPU), the
  sum over its spans of the span's length times its speed there relative to the reference: the curves'
  throughput at the span's GPU type, cores and RAM per GPU over the model's V100 throughput at the reference
  share; a gang's slowest part times the gang loss (`hetplan.gangs`), the simulator's own rule. A span whose
  model or GPU type has no curve counts at speed 1 (its run time as is), and `duration_from` says so.
  Checkpoint-and-restart pauses count as running: the journal cannot tell them apart.

Jobs still running, CPU-only jobs and shares of one GPU are left out and counted in the warnings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd

from hetplan.allocator.history import Histories, JobHistory, Span
from hetplan.contracts import CURVES, TRACE
from hetplan.gangs import gang_speed
from hetplan.gpus import REFERENCE

CURVES_SPEED = "curves"
RUN_TIME = "run time (no curve)"
COLUMNS = ("job_id", "model", "num_gpus", "arrival_s", "duration_s", "run_s", "gpu_type", "duration_from")


class Speeds(Protocol):
    """Reference seconds per second of a model's part on a GPU type with these cores and RAM (`KeyError`: no
    curve); `hetplan.sim.truth.TruthCurves` is one."""

    def speed(self, model: str, gpu_type: str, gpus: int, cpu_m: int, mem_mib: int) -> float: ...


@dataclass
class HistoryTrace:
    """The exported trace and what was left out or counted at speed 1, in words."""

    trace: pd.DataFrame
    warnings: list[str] = field(default_factory=list)


def workspace_speeds(curves: str | Path | None, profiles: pd.DataFrame | None = None) -> tuple[Speeds | None, str]:
    """The speeds a history is converted with, and which: a curve table (`hetplan fit`'s; the planner's view, so
    its replays run each job for its run time again), else a profile table (e.g. a fresh workspace's derived
    profiles), else none. Only models with a reference-GPU (V100) curve or profile get speeds."""
    from hetplan.sim.truth import TruthCurves

    if curves is not None and Path(curves).is_file():
        table = _with_reference(CURVES.load(curves))
        if len(table):
            return TruthCurves.from_curves(table), f"durations at the reference allocation from the curves {curves}"
    if profiles is not None:
        table = _with_reference(profiles[profiles["num_gpus"] == 1])
        if len(table):
            return TruthCurves.from_profiles(table), "durations at the reference allocation from the profiles"
    return None, ""


def _with_reference(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["model"].isin(set(table.loc[table["gpu_type"] == REFERENCE[0], "model"]))]


def trace_from_history(histories: Histories, speeds: Speeds | None) -> HistoryTrace:
    """The trace of `histories`' done jobs on whole GPUs (see the module); no row when there is none."""
    warnings: list[str] = []
    jobs = [j for j in histories.jobs if j.done and j.num_gpus >= 1]
    running = sum(1 for j in histories.jobs if not j.done)
    shares = sum(1 for j in histories.jobs if j.done and j.num_gpus < 1)
    if running:
        warnings.append(f"{running} jobs still running are left out (their run time is not known yet)")
    if shares:
        warnings.append(f"{shares} CPU-only or GPU-share jobs are left out (a trace's jobs hold whole GPUs)")
    if histories.partial:
        warnings.append(f"{histories.partial} jobs whose first start is older than the action log keeps are left "
                        "out (raise `hetplan serve --action-log` or HETPLAN_ALLOCATOR_ACTION_LOG to keep more)")
    origin = min((j.first_start for j in jobs), default=0.0)
    rows, uncurved = [], set()
    for job in jobs:
        duration, missing = _reference_seconds(job, speeds)
        uncurved |= missing
        rows.append((job.job_id, job.model, job.num_gpus, job.first_start - origin, duration, job.run_s,
                     "+".join(dict.fromkeys(p.gpu_type for s in job.spans for p in s.parts)),
                     f"{RUN_TIME}: {', '.join(sorted(missing))}" if missing else CURVES_SPEED))
    if uncurved:
        warnings.append(f"no curve for {', '.join(sorted(uncurved))}: those spans count at speed 1 (run time as "
                        "the duration at the reference allocation)")
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame = frame[frame["duration_s"] > 0].reset_index(drop=True)
    return HistoryTrace(TRACE.validate(frame, "<allocator job history>") if len(frame) else frame, warnings)


def _reference_seconds(job: JobHistory, speeds: Speeds | None) -> tuple[float, set[str]]:
    """The job's run time at the reference allocation, and the (model on GPU type) pairs that had no curve."""
    total, missing = 0.0, set()
    for span in job.spans:
        speed = _span_speed(job.model, span, speeds)
        if speed is None:
            missing |= {f"{job.model} on {p.gpu_type}" for p in span.parts}
            speed = 1.0
        total += span.seconds * speed
    return total, missing


def _span_speed(model: str, span: Span, speeds: Speeds | None) -> float | None:
    if speeds is None:
        return None
    try:
        return gang_speed([speeds.speed(model, p.gpu_type, p.gpus, p.cpu_m, p.mem_mib) for p in span.parts])
    except KeyError:
        return None
