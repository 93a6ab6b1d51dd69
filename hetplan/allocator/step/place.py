"""Stage 3 of a step, placement on one node: the hinted share where it fits (best fit), else the largest share
down to the job's floor, else a node whose peers shrink to their floors to make room (Synergy-TUNE, `tune`);
`put` gives a job given GPUs on given nodes (one, or a gang's), `restore` a running job its old place."""

from __future__ import annotations

from hetplan.allocator.actions import GANG_SEP
from hetplan.allocator.spec import Job, Share
from hetplan.allocator.step.resize import shrink
from hetplan.allocator.step.state import ClassView, StepState, scaled


def place_single(s: StepState, job: Job, view: ClassView, gpu_type: str) -> bool:
    """`job` on one node of `gpu_type`: best fit of what it wants, else the largest share down to its floor,
    else TUNE (`tune`); False, nothing changed, when no node will do."""
    g = job.num_gpus
    want = s.want(job, gpu_type)
    fit = s.cluster.best_fit(gpu_type, g, want)
    share: Share = "hinted" if gpu_type in view.entries else "proportional"
    if fit is None:
        fit = s.cluster.largest_share(gpu_type, g, want, s.floor(job, gpu_type))
        share = "reduced" if share == "hinted" else share
    if fit is None:
        node = tune(s, job, gpu_type)
        if node is None:
            return False
        return put(s, job, ((node, g),), gpu_type)
    s.commit(job, (s.allocation(job, job.job_id, fit.node, gpu_type, g, fit.cpu_m, fit.mem_mib, share),))
    return True


def tune(s: StepState, job: Job, gpu_type: str) -> str | None:
    """A node of `gpu_type` with the GPUs free whose peers, shrunk to their floors, leave `job` its floor (the
    peers shrunk); None, nothing changed, if none."""
    # only nodes where some job of this step runs: elsewhere nothing can shrink, and `largest_share` (tried
    # first) already found no free floor
    for name in s.cluster.with_free_gpus(gpu_type, job.num_gpus, among=s.movable_nodes):
        shape = s.cluster.shape(name)
        floor = s.floor(job, gpu_type)(shape)
        free = s.cluster.free(name)
        spare = [free.cpu_m, free.mem_mib]
        peers = s.movable_on(name)
        for a in peers:
            f = s.floor_of(a)
            spare[0] += a.cpu_m - min(f[0], a.cpu_m)
            spare[1] += a.mem_mib - min(f[1], a.mem_mib)
        if spare[0] >= floor[0] and spare[1] >= floor[1]:
            for a in peers:
                shrink(s, a)
            return name
    return None


def put(s: StepState, job: Job, pieces: tuple[tuple[str, int], ...], gpu_type: str, first: int = 0) -> bool:
    """Give `job` the given GPUs on each node with the largest share its free cores and RAM allow, at least
    its floor (peers shrunk if they must); False (nothing kept) when some node cannot give the floor. `first`: the
    number of the first piece's part (a gang grown by parts: `gangs.grow_fixed_gang`)."""
    mark = s.mark()
    parts = []
    hinted = s.hinted(job, gpu_type)
    gang = len(pieces) > 1 or job.num_gpus > s.type_largest[gpu_type] or job.part_gpus is not None
    for k, (name, gpus) in enumerate(pieces):
        shape = s.cluster.shape(name)
        want = scaled(s.want(job, gpu_type)(shape), gpus, job.num_gpus)
        floor = scaled(s.floor(job, gpu_type)(shape), gpus, job.num_gpus)
        free = s.cluster.free(name)
        if free.cpu_m < floor[0] or free.mem_mib < floor[1]:
            for a in s.movable_on(name):
                shrink(s, a)
            free = s.cluster.free(name)
        if free.gpus < gpus or free.cpu_m < floor[0] or free.mem_mib < floor[1]:
            s.undo_to(mark)  # the peers shrunk on earlier nodes too, in the cluster and in `placed`
            return False
        cpu, mem = min(want[0], free.cpu_m), min(want[1], free.mem_mib)
        share: Share = ("hinted" if (cpu, mem) == want else "reduced") if hinted else "proportional"
        part_id = f"{job.job_id}{GANG_SEP}{first + k}" if gang else job.job_id
        a = s.allocation(job, part_id, name, gpu_type, gpus, cpu, mem, share)
        s.cluster.apply(a)
        s.touched.add(name)
        parts.append(a)
    # an earlier part of a gang of fixed parts on the same node may have been shrunk for a later one's floor
    table = s.cluster.allocation_table()
    s.set_placed(job.job_id, tuple(table.get(a.job_id, a) for a in parts))
    return True


def restore(s: StepState, job: Job) -> bool:
    """A running job back exactly where and as it was when the step began; False, nothing changed, when some
    node of its no longer has room (or is gone)."""
    before = s.current.get(job.job_id, ())
    if not before:
        return False
    mark = s.mark()
    for a in before:
        free = s.cluster.free(a.node) if a.node in s.cluster else None
        if free is None or a.gpus > free.gpus or a.cpu_m > free.cpu_m or a.mem_mib > free.mem_mib:
            s.undo_to(mark)
            return False
        s.cluster.apply(a)
    s.set_placed(job.job_id, before)
    return True
