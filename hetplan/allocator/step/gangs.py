"""Stage 3 of a step for a job larger than any node of its GPU type: a gang over several nodes of that type,
all or nothing (`place_gang`)."""

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
