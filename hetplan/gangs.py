"""How fast a job spread over several nodes (a gang) runs: the one rule the simulator advances gangs by and
the planner values gang columns with.

A gang runs at its slowest part's per-GPU speed times `GANG_SCALING` (one part: no loss), its GPUs all
stepping together; the loss stands for the cross-node gradient exchange.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["GANG_SCALING", "gang_speed", "parts_needed"]

GANG_SCALING = 0.9
"""Default per-GPU speed of a job spread over several nodes relative to one node: a stated assumption (a 10 %
loss to cross-node gradient exchange)."""


def gang_speed(part_speeds: Sequence[float], scaling: float = GANG_SCALING) -> float:
    """The speed of a job whose parts (one per node) would each run at `part_speeds`: the slowest part's,
    times `scaling` when there is more than one part."""
    if not part_speeds:
        raise ValueError("a job runs on at least one part")
    return min(part_speeds) * (scaling if len(part_speeds) > 1 else 1.0)


def parts_needed(job_gpus: int, node_gpus: int) -> int:
    """The fewest nodes of `node_gpus` GPUs that hold a job of `job_gpus` GPUs."""
    return max(1, -(-int(job_gpus) // int(node_gpus)))
