"""An elastic round's mechanism (`reconfigure`): each job to a chosen GPU type and GPU count, or stopped.

The policy (`hetplan.scheduler.elastic.choose`) says, per job, a configuration; this places it with the step's own
stages: a job whose type and count are unchanged keeps its place; the others are released and placed again,
largest first (so whole nodes are still free for the multi-node ones), one node where the count fits one
(`place.place_single`: the hinted cores/RAM where the node has them), else a gang over nodes of the type
(`gangs.place_gang`). A job that finds no room for its new configuration (the nodes' free GPUs are fragmented)
gets its old place back if it had one, else waits: the policy's choice is a target, never a promise. A running gang
of fixed parts only changes its count where it runs (`_rescale`), or keeps its place.
Then the touched nodes' jobs grow into what is left (`resize.grow_touched`)."""

from __future__ import annotations

from collections.abc import Sequence

from dataclasses import replace

from hetplan.allocator.actions import GANG_SEP, Target
from hetplan.allocator.spec import Allocation, Job
from hetplan.allocator.step import gangs, place
from hetplan.allocator.step.resize import grow_touched
from hetplan.allocator.step.state import StepState

Choice = tuple[Job, str | None]
"""A job asked for its chosen GPU count (`num_gpus`) and the GPU type to run on (None: it does not run)."""


def reconfigure(s: StepState, choices: Sequence[Choice]) -> tuple[Target, list[str]]:
    """The target after the choices (every job of `choices`: where it runs, absent if nowhere), and the jobs that
    did not get their chosen configuration (kept as they were, or waiting)."""
    moving: list[tuple[Job, str]] = []
    short: list[str] = []
    for job, gpu_type in choices:
        before = s.current.get(job.job_id, ())
        if before and gpu_type is not None and before[0].gpu_type == gpu_type \
                and sum(a.gpus for a in before) == job.num_gpus:
            s.set_placed(job.job_id, before)
            continue
        if before and gpu_type is not None and job.part_gpus is not None and before[0].part_gpus == job.part_gpus:
            # a running gang of fixed parts (a pod each) changes only its count, on its own type: the controller's
            # rescale keeps its pods where they run; it never moves them, so neither does a round
            if gpu_type != before[0].gpu_type or not s.guarded(f"rescaling job {job.job_id}", _rescale, s, job):
                s.set_placed(job.job_id, before)
                short.append(job.job_id)
            continue
        if before:
            s.release(job.job_id)
        if gpu_type is not None:
            moving.append((job, gpu_type))
    for job, gpu_type in sorted(moving, key=lambda c: (-c[0].num_gpus, s.rank[c[0].job_id])):
        if s.guarded(f"placing job {job.job_id}", _place, s, job, gpu_type):
            continue
        short.append(job.job_id)
        if job.job_id in s.current:
            s.guarded(f"keeping job {job.job_id} in place", place.restore, s, job)
    grow_touched(s)
    return dict(s.placed), short


def _rescale(s: StepState, job: Job) -> bool:
    """A running gang of fixed parts to `job.parts` parts on its own GPU type, as `Allocator.scale` does it: parts
    0..k-1 kept where and as they are, the highest-numbered dropped, new ones placed as `gangs.grow_fixed_gang`
    places them; False (nothing changed) where they do not fit."""
    before = sorted(s.current[job.job_id], key=_part)
    kept = tuple(replace(a, request_cpu_m=job.cpu_m, request_mem_mib=job.mem_mib) for a in before[:job.parts])
    mark = s.mark()
    s.release(job.job_id)
    s.commit(job, kept)
    if job.parts > len(before):
        if not gangs.grow_fixed_gang(s, job, before[0].gpu_type, len(before)):
            s.undo_to(mark)
            return False
        ids = {a.job_id for a in kept}
        added = sorted((a for a in s.placed[job.job_id] if a.job_id not in ids), key=_part)
        s.set_placed(job.job_id, kept + tuple(added))
    return True


def _part(a: Allocation) -> int:
    return int(a.job_id.rpartition(GANG_SEP)[2])


def _place(s: StepState, job: Job, gpu_type: str) -> bool:
    if s.type_gpus.get(gpu_type, 0) < job.num_gpus:
        return False
    if job.part_gpus is not None:  # a gang of fixed parts (one pod per part) stays one
        return gangs.place_fixed_gang(s, job, gpu_type)
    if job.num_gpus > s.type_largest[gpu_type]:
        return gangs.place_gang(s, job, gpu_type)
    return place.place_single(s, job, s.view(job), gpu_type)

