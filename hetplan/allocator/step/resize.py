"""Stage 5 of a step, re-sizing: jobs on a node grow into its free cores and RAM up to what they want (`grow`);
and, for placement (TUNE), a job's allocation shrinks to its floor (`shrink`)."""

from __future__ import annotations

from dataclasses import replace

from hetplan.allocator.spec import Allocation, Share
from hetplan.allocator.step.state import StepState


def grow(s: StepState, node: str) -> None:
    """Jobs on `node` grow in priority order into its free cores and RAM, up to their hinted share."""
    free = s.cluster.free(node)
    if free.cpu_m == 0 and free.mem_mib == 0:
        return  # nothing to grow into
    allocs = s.movable_on(node)
    allocs.sort(key=lambda a: s.rank[s.base_id(a)])
    for a in allocs:
        want = s.want_of(a)
        free = s.cluster.free(node)
        cpu = max(a.cpu_m, min(want[0], a.cpu_m + free.cpu_m))
        mem = max(a.mem_mib, min(want[1], a.mem_mib + free.mem_mib))
        if (cpu, mem) != (a.cpu_m, a.mem_mib):
            resize(s, a, cpu, mem)


def grow_touched(s: StepState) -> None:
    """Every node touched since the last step (and by this one) re-sized (`grow`), in name order; a node whose
    re-sizing fails is left as it was."""
    for node in sorted(s.touched):
        if node in s.cluster:
            s.guarded(f"re-sizing node {node}", grow, s, node)


def shrink(s: StepState, a: Allocation) -> None:
    """An allocation cut down to its job's floor where it holds more."""
    floor = s.floor_of(a)
    if a.cpu_m > floor[0] or a.mem_mib > floor[1]:
        resize(s, a, min(a.cpu_m, floor[0]), min(a.mem_mib, floor[1]))


def resize(s: StepState, a: Allocation, cpu_m: int, mem_mib: int) -> None:
    """Give an allocation (or a gang's part) other cores and RAM on its node; its share labelled anew."""
    s.cluster.release(a.job_id)
    job = s.job_of(a)
    want = s.want_of(a)
    share: Share = a.share if a.share == "proportional" else ("hinted" if (cpu_m, mem_mib) == want else "reduced")
    new = replace(a, cpu_m=cpu_m, mem_mib=mem_mib, hint_version=s.hints.version, policy=s.policy.name, share=share)
    s.cluster.apply(new)
    s.touched.add(a.node)
    parts = s.placed.get(job.job_id)
    if parts is not None:
        s.set_placed(job.job_id, tuple(new if p.job_id == a.job_id else p for p in parts))
