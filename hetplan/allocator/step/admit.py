"""Stage 1 of a step, admission: who runs (`admit`), after the jobs whose class cannot be read are left out
(`drop_unreadable`)."""

from __future__ import annotations

from itertools import chain

from hetplan.allocator.admission import who_runs
from hetplan.allocator.spec import Job
from hetplan.allocator.step.state import StepState


def drop_unreadable(s: StepState) -> list[str]:
    """Jobs whose class cannot be read (its hints make no sense) sit this step out: as they are if running.
    Returns their ids."""
    faulty = []
    faults = s.policy.faults
    for job in s.order:
        try:
            s.view(job)
        except Exception as exc:  # noqa: BLE001 - one job's fault must not stop the step
            s.fault(f"reading job {job.job_id} ({job.model}, {job.num_gpus} GPUs)", exc, "left as it is this step")
            faulty.append(job.job_id)
        else:
            if faults:
                faults.pop(f"reading job {job.job_id} ({job.model}, {job.num_gpus} GPUs)", None)
    if faulty:
        s.leave_out(faulty)
    return faulty


def room(s: StepState) -> int:
    """The GPUs admission shares out: with `preempt` every GPU but those of jobs not asked about (a cordoned
    node's count only while held: they stay with who holds them); without it, the free ones."""
    if not s.preempt:
        return sum(s.cluster.free_gpus_by_type().values())
    closed_nodes = s.cluster.closed_nodes()
    closed = 0
    if closed_nodes:
        held = {a.job_id: a for parts in chain(s.current.values(), s.placed.values()) for a in parts}
        closed = sum(a.gpus for a in held.values() if a.node in closed_nodes)
    return sum(s.type_gpus.values()) + closed - sum(a.gpus for parts in s.placed.values() for a in parts)


def admit(s: StepState) -> tuple[list[Job], list[Job]]:
    """Who runs: in priority order while GPUs last (`room`); without `preempt` running jobs stay and waiting ones
    share the free GPUs. Returns (admitted, left out)."""
    return who_runs(s.order, room(s), s.largest_type, () if s.preempt else s.current, s.current)
