"""What the stages of one co-adaptive step share (`StepState`): the step's inputs, where each job ends up so far
(`placed`, undone together with the trial cluster), the jobs' class views and the shares they read (what a job
wants on a GPU type, its floor), and the bookkeeping every stage uses to change the trial (commit, release,
undo marks, the fault barrier)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from hetplan.allocator.actions import GANG_SEP, Target
from hetplan.allocator.cluster import Cluster, Need, floor_need
from hetplan.allocator.spec import Allocation, Job, Share
from hetplan.allocator.stability import MoveHistory
from hetplan.hints.index import HintEntry, HintSet

if TYPE_CHECKING:
    from hetplan.allocator.rebalance import CoAdaptive

log = logging.getLogger("hetplan.allocator.rebalance")  # one logger for the step, wherever its stages live

EPS = 1e-9
"""Speed differences at or below this are ties (no move, no swap)."""

NO_HISTORY: Mapping[str, MoveHistory] = MappingProxyType({})


@dataclass(slots=True)
class ClassView:
    """What a step reads of one job class (model, GPUs) under one hint set and set of GPU types, worked out
    once per class (`CoAdaptive.view`) instead of once per job and step. Read-only for its users."""

    speeds: dict[str, float]  # normalised speed per GPU type (see `hetplan.allocator.rebalance`)
    preference: tuple[str, ...]  # GPU types fastest first, ties by name
    regret: float  # second-best speed minus the best (<= 0): the most to lose picks a type first
    entries: dict[str, HintEntry]  # the best-ranked hint entry per hinted GPU type
    wants: dict[str, Need]  # per GPU type: the hinted cores and RAM, else the GPU-proportional share
    floors: dict[str, Need]  # per GPU type: the floor rule (`cluster.floor_need`) for a job stating no request
    best: float  # the highest of `speeds`
    values: dict[str | None, dict[str, float]] = field(default_factory=dict)  # by the type it runs on now
    gains: dict[tuple[str | None, str], tuple[tuple[float, str], ...]] = field(default_factory=dict)


Mark = tuple[int, int]
"""A point to undo back to: the trial cluster's and `placed`'s (`StepState.mark`)."""


class StepState:
    """One planning step on a trial cluster (undone by the caller): its inputs and what it decided so far."""

    def __init__(self, policy: CoAdaptive, order: Sequence[Job], cluster: Cluster, hints: HintSet,
                 current: Mapping[str, tuple[Allocation, ...]], touched: set[str], preempt: bool, move: bool,
                 history: Mapping[str, MoveHistory] = NO_HISTORY, now: float = 0.0) -> None:
        self.policy, self.order, self.cluster, self.hints = policy, order, cluster, hints
        self.current, self.touched, self.preempt, self.move = current, touched, preempt, move
        self.history, self.now = history, now
        self.rank = {job.job_id: i for i, job in enumerate(order)}
        # jobs running but not asked about stay exactly as they are (pinned)
        self.placed: Target = {j: parts for j, parts in current.items() if j not in self.rank} if current else {}
        # every type a job of the step can be on: the open nodes' and those of running jobs on closed nodes
        # (cordoned: they hold their jobs but take no new ones, and count for no GPUs here)
        self.type_gpus, self.type_largest = cluster.gpus_by_type()
        if current:
            self.types = tuple(sorted({*cluster.gpu_types(),
                                       *(a.gpu_type for parts in current.values() for a in parts)}))
            for t in self.types:
                self.type_gpus.setdefault(t, 0)
                self.type_largest.setdefault(t, 0)
        else:  # the open nodes' types (sorted), each with its GPUs already
            self.types = tuple(cluster.gpu_types())
        self.largest_type = max(self.type_gpus.values(), default=0)
        # (model, GPUs, own request, GPU type) that found no single node this step: only placements happen after
        # the first try (no release), and each leaves every node's free-plus-shrinkable share no larger, so they
        # would find none again
        self.full: set[tuple[str, int, int | None, int | None, str]] = set()
        self.views, self._job_views = policy.step_views(hints, self.types)
        self.movable_nodes = {a.node for job_id, parts in current.items() if job_id in self.rank for a in parts} \
            if current else set()
        """Nodes where a job of this step runs (or ran when it began): the only ones where peers can shrink."""
        self._placed_log: list[tuple[str, tuple[Allocation, ...] | None]] = []  # (job, what it had): undo

    def view(self, job: Job) -> ClassView:
        """The job's class view (`CoAdaptive.view`), looked up by job, then by class, then worked out."""
        got = self._job_views.get(job.job_id)
        if got is not None and got[0] is job:
            return got[1]
        view = self.views.get((job.model, job.num_gpus))
        if view is None:
            view = self.views[(job.model, job.num_gpus)] = self.policy.view(job, self.hints, self.types)
        self._job_views[job.job_id] = (job, view)
        return view

    def leave_out(self, job_ids: Sequence[str]) -> None:
        """Take jobs out of the step: as they are if running (pinned), not placed otherwise."""
        drop = set(job_ids)
        self.order = [job for job in self.order if job.job_id not in drop]
        self.rank = {job.job_id: i for i, job in enumerate(self.order)}
        self.placed.update((j, self.current[j]) for j in job_ids if j in self.current)

    # ------------------------------------------------------------------ undo and the fault barrier

    def guarded(self, what: str, step: Callable[..., object], *args: object) -> object:
        """`step(*args)`, or, when it raises, its part of the trial undone (cluster and `placed`), one line
        logged (`fault`), and None: a job's placement or a node's re-sizing never fails the whole step."""
        mark = self.mark()
        try:
            result = step(*args)
        except Exception as exc:  # noqa: BLE001 - the barrier
            self.undo_to(mark)
            self.fault(what, exc, "left out of this step")
            return None
        if self.policy.faults:
            self.policy.faults.pop(what, None)  # it works again: a new fault is news
        return result

    def fault(self, what: str, exc: Exception, then: str) -> None:
        """Log one fault: a warning the first time `what` fails so, a debug line while it goes on failing so in
        later steps (`CoAdaptive.faults`: once per job or node and fault, not once per step)."""
        said = f"{type(exc).__name__}: {exc}"
        faults = self.policy.faults
        level = logging.DEBUG if faults.get(what) == said else logging.WARNING
        if len(faults) > 10_000:
            faults.clear()
        faults[what] = said
        log.log(level, "rebalance: %s failed, %s: %s", what, then, said)

    def mark(self) -> Mark:
        """A point to undo back to: the trial's and `placed`'s (`undo_to`)."""
        return self.cluster.mark(), len(self._placed_log)

    def undo_to(self, mark: Mark) -> None:
        """Undo the cluster's changes and `placed`'s since `mark` together: undoing the cluster alone leaves a
        peer shrunk in `placed` but not in the cluster, and a kept trial then books an allocation the cluster
        does not hold (issue 21: memory held by nobody, out of step with the free counters)."""
        self.cluster.undo_to(mark[0])
        while len(self._placed_log) > mark[1]:
            job_id, had = self._placed_log.pop()
            if had is None:
                self.placed.pop(job_id, None)
            else:
                self.placed[job_id] = had

    def set_placed(self, job_id: str, parts: tuple[Allocation, ...] | None) -> None:
        """Record where a job ends up in this step (None: nowhere), undoably."""
        self._placed_log.append((job_id, self.placed.get(job_id)))
        if parts is None:
            self.placed.pop(job_id, None)
        else:
            self.placed[job_id] = parts
            if job_id in self.rank:
                for a in parts:
                    self.movable_nodes.add(a.node)

    # ------------------------------------------------------------------ shares

    def hinted(self, job: Job, gpu_type: str) -> bool:
        return gpu_type in self.view(job).entries

    def want(self, job: Job, gpu_type: str) -> Need:
        """The class's hinted share on `gpu_type` raised to the job's own request; without a hint there, the
        request where stated, else the GPU-proportional share."""
        view = self.view(job)
        want = view.wants[gpu_type]
        if job.cpu_m is None and job.mem_mib is None:
            return want
        own = job.want if gpu_type in view.entries else job.floor
        return lambda shape: own(*want(shape))

    def floor(self, job: Job, gpu_type: str) -> Need:
        """The floor rule (`cluster.floor_need`) with the class's hinted share on `gpu_type`."""
        view = self.view(job)
        if job.cpu_m is None and job.mem_mib is None:
            return view.floors[gpu_type]  # the class's, remembered across steps
        return floor_need(job, view.wants[gpu_type])

    def floor_of(self, a: Allocation) -> tuple[int, int]:
        """The floor of the job an allocation (or gang part) serves, on its node, cut to its GPUs."""
        job = self.job_of(a)
        shape = self.cluster.shape(a.node)
        return scaled(self.floor(job, a.gpu_type)(shape), a.gpus, job.num_gpus)

    def want_of(self, a: Allocation) -> tuple[int, int]:
        """What the job an allocation (or gang part) serves wants on its node, cut to its GPUs."""
        job = self.job_of(a)
        shape = self.cluster.shape(a.node)
        return scaled(self.want(job, a.gpu_type)(shape), a.gpus, job.num_gpus)

    def movable_on(self, node: str) -> list[Allocation]:
        """The allocations on `node` of jobs this step may re-size (those it was asked about)."""
        table = self.cluster.allocation_table()
        allocs = (table.get(j) for j in self.cluster.jobs_on(node))
        return [a for a in allocs if a is not None and self.base_id(a) in self.rank]

    def base_id(self, a: Allocation) -> str:
        """The job id an allocation or a gang part belongs to."""
        return a.job_id if a.job_id in self.rank else a.job_id.rsplit(GANG_SEP, 1)[0]

    def job_of(self, a: Allocation) -> Job:
        """The job (of `order`: only those are re-sized) an allocation or a gang part belongs to."""
        return self.order[self.rank[self.base_id(a)]]

    # ------------------------------------------------------------------ changing the trial

    def allocation(self, job: Job, part_id: str, node: str, gpu_type: str, gpus: int, cpu_m: int, mem_mib: int,
                   share: Share) -> Allocation:
        entry = self.view(job).entries.get(gpu_type)
        rank = entry.rank if entry is not None else None
        return Allocation(part_id, job.model, node, gpu_type, gpus, cpu_m, mem_mib, self.hints.version,
                          self.policy.name, share, rank, request_cpu_m=job.cpu_m, request_mem_mib=job.mem_mib,
                          part_gpus=job.part_gpus)

    def commit(self, job: Job, parts: tuple[Allocation, ...]) -> None:
        """Apply a job's allocations to the trial and record them as where it ends up."""
        for a in parts:
            self.cluster.apply(a)
            self.touched.add(a.node)
        self.set_placed(job.job_id, parts)

    def release(self, job_id: str) -> None:
        """Free what a running job holds (as it began the step) and record that it runs nowhere."""
        for a in self.current.get(job_id, ()):
            if self.cluster.allocation(a.job_id) is not None:
                self.cluster.release(a.job_id)
                self.touched.add(a.node)
        self.set_placed(job_id, None)


def scaled(share: tuple[int, int], gpus: int, of: int) -> tuple[int, int]:
    """A whole job's share cut to `gpus` of its `of` GPUs (a gang part's share)."""
    if gpus == of:
        return share
    return -(-share[0] * gpus // of), -(-share[1] * gpus // of)
