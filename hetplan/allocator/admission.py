"""Who runs: the one admission rule of a scheduling round, for the simulator's rounds and the allocator's steps.

Blox's first stage: given every job that wants to run, in priority order, and the GPUs there are, say which run
this round. The co-adaptive step (`hetplan.allocator.step`) and the simulator's rounds for placement-only policies
(`sim.engine`) both call `who_runs`; where the jobs then go is the placement stage's business.

`contenders` says which waiting jobs a round could start at all, so that a long queue need not be passed over
whole at every step (`sim.engine` keeps its queue indexed by `class_key` for it).
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from hetplan.allocator.spec import Job

ClassKey = tuple[str, int, "int | None", "int | None"]


def class_key(job: Job) -> ClassKey:
    """A job's class as placement sees it (model, GPUs, own cores and RAM): two jobs of one class find a place
    under the same conditions, so a step that found none for one does not try the next (its backfill)."""
    return (job.model, job.num_gpus, job.cpu_m, job.mem_mib)


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


def contender_limit(num_gpus: int, room: int) -> int:
    """How many waiting jobs of one class, the first in priority order, can matter to a step with at most `room`
    GPUs to give (`contenders`); unbounded for a job that takes no whole GPU."""
    return room // num_gpus if num_gpus > 0 else 1 << 62


def contenders(waiting: Iterable[Job], room: int) -> list[Job]:
    """The waiting jobs (priority order) that a step with at most `room` GPUs to give could start: of each class
    (`class_key`) with g GPUs, the first `room // g`. The step's answer is the same with the rest left out.

    Why, for a job J of g GPUs with `room // g` jobs of its class before it: `who_runs` admits a job only while
    its GPUs fit in a room that only shrinks, so if one of those was refused J is too, and if all were admitted
    they took `(room // g) * g` GPUs, leaving fewer than g. The backfill places J only if its class has not
    failed this step and g GPUs are free: each of those before it either holds g GPUs by then, or was skipped
    with fewer than g free (free GPUs only fall while backfilling), or failed, which marks the class."""
    seen: dict[ClassKey, int] = {}
    out = []
    for job in waiting:
        key = class_key(job)
        n = seen.get(key, 0)
        if n < contender_limit(job.num_gpus, room):
            seen[key] = n + 1
            out.append(job)
    return out
