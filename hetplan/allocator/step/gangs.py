"""Stage 3 of a step for a job larger than any node of its GPU type: a gang over several nodes of that type,
all or nothing (`place_gang`); and for a job of fixed parts (`Job.part_gpus`, a multi-pod job), each part on one
node of one type, all or nothing (`place_fixed_gang`); and the parts a running gang of fixed parts gains when its
count grows (`grow_fixed_gang`)."""

from __future__ import annotations

from hetplan.allocator.spec import Job
from hetplan.allocator.step.place import put
from hetplan.allocator.step.state import StepState


def place_gang(s: StepState, job: Job, gpu_type: str) -> bool:
    """All or nothing: nodes of `gpu_type` with the most free GPUs first, each part at least its floor."""
    if s.cluster.free_gpus_total(gpu_type) < job.num_gpus:
        return False  # the walk below would come up short
    mark = s.mark()
    left = job.num_gpus
    pieces: list[tuple[str, int]] = []
    for name in sorted(s.cluster.with_free_gpus(gpu_type, 1), key=lambda n: (-s.cluster.free(n).gpus, n)):
        take = min(s.cluster.free(name).gpus, left)
        pieces.append((name, take))
        left -= take
        if left == 0:
            break
    if left > 0 or not put(s, job, tuple(pieces), gpu_type):
        s.undo_to(mark)
        return False
    return True


def place_fixed_gang(s: StepState, job: Job, gpu_type: str) -> bool:
    """All or nothing: `job.parts` parts of exactly `job.part_gpus` GPUs, each on one node of `gpu_type` (nodes
    with the most free GPUs first, as many parts on each as its free GPUs hold), each part at least its floor."""
    return grow_fixed_gang(s, job, gpu_type, 0)


def grow_fixed_gang(s: StepState, job: Job, gpu_type: str, first: int) -> bool:
    """All or nothing: parts `first` to `job.parts - 1` of `job` (its parts below `first` hold their room
    already), placed as `place_fixed_gang` places a whole gang; each part's share is the job's (its new count's)
    cut to the part's GPUs."""
    size = job.part_gpus
    assert size is not None
    if gpu_type not in s.type_largest or s.cluster.free_gpus_total(gpu_type) < size * (job.parts - first):
        return False
    mark = s.mark()
    left = job.parts - first
    pieces: list[tuple[str, int]] = []
    for name in sorted(s.cluster.with_free_gpus(gpu_type, size), key=lambda n: (-s.cluster.free(n).gpus, n)):
        take = min(s.cluster.free(name).gpus // size, left)
        pieces += [(name, size)] * take
        left -= take
        if left == 0:
            break
    if left > 0 or not put(s, job, tuple(pieces), gpu_type, first):
        s.undo_to(mark)
        return False
    return True
