"""One co-adaptive step (`Step.run`), stage by stage as `hetplan.allocator.rebalance` lists them: admission,
GPU types, placement (single node, TUNE, gangs), backfill, re-sizing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from typing import TYPE_CHECKING

from hetplan.allocator.actions import Target
from hetplan.allocator.admission import ClassKey, class_key
from hetplan.allocator.cluster import Cluster
from hetplan.allocator.spec import Allocation, Job
from hetplan.allocator.stability import MoveHistory
from hetplan.allocator.step import gangs, place
from hetplan.allocator.step.admit import admit, drop_unreadable
from hetplan.allocator.step.gpu_types import Rule, assign_types
from hetplan.allocator.step.resize import grow_touched
from hetplan.allocator.step.state import NO_HISTORY, StepState, log
from hetplan.hints.index import HintSet

if TYPE_CHECKING:
    from hetplan.allocator.rebalance import CoAdaptive


class Step:
    """One planning step on a trial cluster (undone by the caller): `run` returns the `Target`."""

    def __init__(self, policy: CoAdaptive, order: Sequence[Job], cluster: Cluster, hints: HintSet,
                 current: Mapping[str, tuple[Allocation, ...]], touched: set[str], preempt: bool, move: bool,
                 history: Mapping[str, MoveHistory] = NO_HISTORY, now: float = 0.0) -> None:
        self.s = StepState(policy, order, cluster, hints, current, touched, preempt, move, history, now)
        self.rule = Rule(self.s)

    def run(self) -> Target:
        """The step's target: every job of the step where it runs after it (absent: it does not run)."""
        if not self.s.current and len(self.s.order) == 1:
            return self.run_one()
        return self.run_all()

    def run_all(self) -> Target:
        s = self.s
        drop_unreadable(s)
        admitted, left_out = admit(s)  # 1. admission
        for job in left_out:
            if job.job_id in s.current:
                s.release(job.job_id)  # preempted
        assigned = assign_types(s, self.rule, admitted)  # 2. GPU types
        movers: list[Job] = []
        for job in admitted:  # 3. placement: jobs keeping their type keep their node(s)
            before = s.current.get(job.job_id, ())
            if before and before[0].gpu_type == assigned.get(job.job_id):
                s.set_placed(job.job_id, before)
            else:
                movers.append(job)
        self.move_and_start(movers, assigned)
        self.backfill(chain(admitted, left_out))  # 4. backfill
        grow_touched(s)  # 5. re-sizing
        self.keep_unchanged()
        return dict(s.placed)

    def run_one(self) -> Target:
        """`run` for one job that is not running yet (`Allocator.allocate`'s step): the same stages, less the
        bookkeeping only running jobs need (preempting, keeping or restoring places, undoing stranded moves)."""
        s = self.s
        drop_unreadable(s)
        admitted, left_out = admit(s)
        assigned = assign_types(s, self.rule, admitted)
        for job in admitted:
            s.guarded(f"placing job {job.job_id}", self.place, job, assigned.get(job.job_id))
        self.backfill(chain(admitted, left_out))
        grow_touched(s)
        return dict(s.placed)

    def move_and_start(self, movers: list[Job], assigned: dict[str, str]) -> None:
        """Running jobs change to the GPU type assigned to them, newcomers start, in priority order. A running job
        moves to its assigned type or not at all: when no node of that type takes it, it keeps its old place (a
        move the stability rule did not judge is never made, not even to another node of its own type). Without
        `preempt` a running job is never stopped: if one cannot get its old place back (another mover took it),
        every move of this step is undone and the jobs stay where they were."""
        s = self.s
        mark = s.mark()
        for job in movers:
            s.release(job.job_id)
        for job in movers:
            running = job.job_id in s.current
            what = f"moving job {job.job_id}" if running else f"placing job {job.job_id}"
            if s.guarded(what, self.place, job, assigned.get(job.job_id), running) or not running:
                continue
            s.guarded(f"keeping job {job.job_id} in place", place.restore, s, job)
        stranded = [job.job_id for job in movers if job.job_id in s.current and job.job_id not in s.placed]
        if stranded and not s.preempt:
            log.info("rebalance: %d running jobs would lose their place (first: %s); no job moves this step",
                     len(stranded), stranded[0])
            s.undo_to(mark)
            for job in movers:
                if job.job_id in s.current:
                    s.set_placed(job.job_id, s.current[job.job_id])
                else:
                    s.guarded(f"placing job {job.job_id}", self.place, job, assigned.get(job.job_id))

    def backfill(self, jobs: Iterable[Job]) -> None:
        """Jobs not placed yet, in priority order, take what is still free: a preempted or unplaced running job
        its old place first."""
        s = self.s
        failed: set[ClassKey] = set()  # classes that found no place: nothing is freed while backfilling
        free = s.cluster.free_gpus_total()
        for job in jobs:
            if free == 0:
                break  # nobody else can start or get their old place back
            if job.job_id in s.placed:
                continue
            # only a job that ran has a place to get back (`restore` of any other is False, changing nothing)
            if job.job_id in s.current and s.guarded(f"restoring job {job.job_id}", place.restore, s, job):
                free = s.cluster.free_gpus_total()
                continue
            key = class_key(job)
            if key in failed or job.num_gpus > free:
                continue
            if s.guarded(f"placing job {job.job_id}", self.place, job, None):
                free = s.cluster.free_gpus_total()
            else:
                failed.add(key)

    def place(self, job: Job, gpu_type: str | None, only: bool = False) -> bool:
        """Place `job` on `gpu_type` (then, failing that and unless `only`, on the other types by speed); False if
        nowhere. A job no node of a usable type could hold runs as a gang (`gangs.place_gang`); one that some
        node could hold waits for one instead. A job of fixed parts (`Job.part_gpus`) always runs as a gang of
        those parts (`gangs.place_fixed_gang`)."""
        s = self.s
        view = s.view(job)
        preference = view.preference
        if only and gpu_type is not None:
            preference = (gpu_type,)
        elif gpu_type is not None and preference[0] != gpu_type:
            preference = (gpu_type, *(t for t in preference if t != gpu_type))
        g = job.num_gpus
        strict = s.policy.strict
        if job.part_gpus is not None:  # a gang of fixed parts: a gang even where one node could hold it all
            for t in preference:
                if s.type_gpus[t] >= g and s.type_largest[t] >= job.part_gpus and not (
                        strict and view.speeds[t] <= 0) and (t == gpu_type or self.may_run_on(job, t)) \
                        and gangs.place_fixed_gang(s, job, t):
                    return True
            return False
        usable = [t for t in preference if s.type_gpus[t] >= g and not (strict and view.speeds[t] <= 0)]
        # a gang only when no node of a usable type could hold the job: a job that fits one node waits for one
        # (an 8-GPU pod is one pod on an 8-GPU node, never two 4-GPU parts while the 8-GPU nodes are busy)
        whole = any(g <= s.type_largest[t] for t in usable)
        for t in usable:
            if t != gpu_type and not self.may_run_on(job, t):
                continue
            if g > s.type_largest[t]:
                if not whole and gangs.place_gang(s, job, t):
                    return True
            elif (job.model, g, job.cpu_m, job.mem_mib, t) in s.full:
                continue
            elif place.place_single(s, job, view, t):
                return True
            else:
                s.full.add((job.model, g, job.cpu_m, job.mem_mib, t))
        return False

    def may_run_on(self, job: Job, gpu_type: str) -> bool:
        """Whether a job may be placed on `gpu_type` other than the one this step assigned it: always if it is
        not running or runs on that type; else (a move) only as far as the stability rule allows."""
        parts = self.s.current.get(job.job_id)
        if not parts or parts[0].gpu_type == gpu_type:
            return True
        return self.s.move and self.rule.pays(self.rule.change(job, parts[0].gpu_type, gpu_type))

    def keep_unchanged(self) -> None:
        """A running job placed again where and as it was (same nodes, GPUs, cores and RAM; only the hint version
        or the share's label new) keeps its allocations as they were: no action, and the cluster holds exactly
        what the target says (a journal that records actions only must agree with it)."""
        s = self.s
        for job_id, before in s.current.items():
            after = s.placed.get(job_id)
            if after is None or after is before or len(after) != len(before) or not all(
                    (a.job_id, a.node, a.gpus, a.cpu_m, a.mem_mib) == (b.job_id, b.node, b.gpus, b.cpu_m, b.mem_mib)
                    for a, b in zip(after, before)):
                continue
            for a in after:
                s.cluster.release(a.job_id)
            for b in before:
                s.cluster.apply(b)
            s.set_placed(job_id, before)
