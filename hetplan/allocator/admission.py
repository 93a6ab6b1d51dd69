"""Who runs: the one admission rule of a scheduling round, for the simulator's rounds and the allocator's steps.

Blox's first stage: given every job that wants to run, in priority order, and the GPUs there are, say which run
this round. The co-adaptive step (`rebalance._Step`) and the simulator's rounds for placement-only policies
(`sim.engine`) both call `who_runs`; where the jobs then go is the placement stage's business.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from hetplan.allocator.spec import Job


def who_runs(order: Iterable[Job], room: int, largest: int, staying: Container[str] = (),
             running: Container[str] = ()) -> tuple[list[Job], list[Job]]:
    """Split `order` (priority order) into (run, wait): a job runs while its GPUs fit in the `room` left and it
    could ever run (no more GPUs than `largest`, the most one GPU type has in open nodes, or it is `running`
    already: on cordoned nodes, say); jobs in `staying` run whatever the room (running jobs that may not be
    preempted) and take none of it. Counting GPUs, not packing them: a job admitted here may still find no node,
    and waits then."""
    run: list[Job] = []
    wait: list[Job] = []
    for job in order:
        if job.job_id in staying:
            run.append(job)
        elif job.num_gpus <= room and (job.num_gpus <= largest or job.job_id in running):
            run.append(job)
            room -= job.num_gpus
        else:
            wait.append(job)
    return run, wait
