"""Co-adaptive rounds: decide jointly which jobs run, on which GPU type and node(s), with what cores and RAM.

Gavel's comparative advantage, Synergy-TUNE's re-sizing and multi-node gangs as one policy step. The split
stays: `CoAdaptive.target` (the policy) plans on `Cluster.trial()`, a scratch pad undone on exit, and returns
a `Target`; `diff` says what changes (start, stop, migrate, resize); `Allocator.rebalance` applies it.

One step, given every job that wants to run (running and waiting) in priority order:

1. **Admission** (only with `preempt`): jobs in priority order while their GPUs fit the cluster's; running
   jobs left out are preempted. Without `preempt`, running jobs stay and waiting ones fill free GPUs.
   Running jobs change GPU type (steps 2 and 3) only with `move`.
2. **GPU types by comparative advantage**: a job's normalised speed on a type is its class's hinted expected
   throughput there over its best type's (1 everywhere for a class without hints; 0 for a type its hints do
   not list, usable only as a last resort). Jobs with the most to lose from their second choice pick first
   (greedy regret), each its best type with GPUs left. Then (with `move`) running jobs move into free GPUs of
   a faster type and pairs of jobs swap types only as the stability rule allows (`hetplan.allocator.stability`:
   the speed gained over the expected remaining time pays for the moves with a margin; a budget of moves per
   job; no quick return to a type a job left).
3. **Placement**: jobs keeping their type keep their node(s). The others, in priority order, take their
   hinted share (best fit), else the largest share down to their floor; else the peers on a node with the
   GPUs free shrink to their floors to make room (Synergy-TUNE); else another type. A job larger than any
   node of every usable type (its hints', or any with `strict` off) runs as a gang over several nodes of one
   type, all or nothing; a job one node of some usable type could hold waits for such a node instead.
4. **Backfill**: jobs left out, in priority order, take what is still free (a preempted job its old place
   first).
5. **Re-sizing**: on every node touched since the last step, jobs grow in priority order into free cores and
   RAM up to their hinted share.

A job's **floor** is its own request where it stated one (`Job.cpu_m`/`mem_mib`), else min(hinted share,
GPU-proportional share): nobody gets less than the proportional share unless its own hinted share is smaller
(then it has its plateau anyway). What a job **wants** is its hinted share raised to its request.

GPU shares and CPU-only jobs (`not Job.whole`) are left out of rounds: they stay where `place` put them.

Cost: a step reads each job class's hints once (`ClassView`, cached per hint version and GPU types), and
remembers which (class, own request, GPU type) found no node: after the first placement try of a step nothing
is released, so such a job finds none again in that step. Both are exact: the step decides as without them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate, chain
from types import MappingProxyType

from hetplan.allocator.actions import GANG_SEP, Target
from hetplan.allocator.admission import ClassKey, class_key, who_runs
from hetplan.allocator.cluster import Cluster, Need, floor_need, hinted_need, proportional_need
from hetplan.allocator.spec import Allocation, Job, Share
from hetplan.allocator.stability import MoveHistory, Stability, remaining_s, saved_s
from hetplan.hints.index import HintEntry, HintSet

log = logging.getLogger(__name__)

EPS = 1e-9
"""Speed differences at or below this are ties (no move, no swap)."""


@dataclass(slots=True)
class ClassView:
    """What a step reads of one job class (model, GPUs) under one hint set and set of GPU types, worked out
    once per class (`CoAdaptive.view`) instead of once per job and step. Read-only for its users."""

    speeds: dict[str, float]  # normalised speed per GPU type (see the module docstring)
    preference: tuple[str, ...]  # GPU types fastest first, ties by name
    regret: float  # second-best speed minus the best (<= 0): the most to lose picks a type first
    entries: dict[str, HintEntry]  # the best-ranked hint entry per hinted GPU type
    wants: dict[str, Need]  # per GPU type: the hinted cores and RAM, else the GPU-proportional share
    floors: dict[str, Need]  # per GPU type: the floor rule (`cluster.floor_need`) for a job stating no request
    best: float  # the highest of `speeds`
    values: dict[str | None, dict[str, float]] = field(default_factory=dict)  # by the type it runs on now
    gains: dict[tuple[str | None, str], tuple[tuple[float, str], ...]] = field(default_factory=dict)


_NO_HISTORY: Mapping[str, MoveHistory] = MappingProxyType({})
_Candidate = tuple[Job, dict[str, float], MoveHistory | None, int]
"""A job as a swap reads it: the job, its class's speeds, its history, its rank."""
_Ranked = tuple[int, float, int, float, Job]
"""A swap candidate in the rule's order: its `Stability.swap_key` (two parts), its rank, its speed gain, the job."""


@dataclass
class CoAdaptive:
    """The round policy of the `hint` policy (see the module docstring). `migration_s` is what a move costs
    (checkpoint and restart); `horizon_s` (the round length) is the least remaining time a running job is
    expected to have; `stability` says when a running job may change GPU type (`hetplan.allocator.stability`)."""

    migration_s: float = 30.0
    horizon_s: float = 300.0
    name: str = "hint"
    strict: bool = False  # only the GPU types a class's hints list (classes without hints: any)
    stability: Stability = Stability()
    _views: dict[tuple[str, int, str | None, tuple[str, ...]], ClassView] = field(default_factory=dict, repr=False)
    _step_views: tuple[object, dict[tuple[str, int], ClassView], dict[str, tuple[Job, ClassView]]] | None = \
        field(default=None, repr=False)

    def target(self, order: Sequence[Job], cluster: Cluster, hints: HintSet,
               current: Mapping[str, tuple[Allocation, ...]], touched: Iterable[str] = (),
               preempt: bool = True, move: bool = True, keep: bool = False,
               history: Mapping[str, MoveHistory] = _NO_HISTORY, now: float = 0.0) -> Target:
        """Where every job of `order` (priority order) should run after this step; `current` says where the
        running ones are, `touched` which nodes changed since the last step (they get re-sized). `preempt`:
        running jobs may be stopped for higher-priority ones; `move`: they may change GPU type (as `stability`
        allows, reading the jobs' `history` at clock time `now`). `keep`: leave the cluster holding the target
        (the trial kept), for a mechanism that applies it in place."""
        order = [job for job in order if job.whole]  # the others, if running, stay as they are
        with cluster.trial():
            target = _Step(self, order, cluster, hints, current, set(touched), preempt, move, history, now).run()
            if keep:
                cluster.keep_trial()
            return target

    def speeds(self, job: Job, hints: HintSet, gpu_types: Sequence[str]) -> dict[str, float]:
        """The job's normalised speed per GPU type (see the module docstring), cached per class, hint version
        and GPU types."""
        return self.view(job, hints, gpu_types).speeds

    def view(self, job: Job, hints: HintSet, gpu_types: Sequence[str]) -> ClassView:
        """The job's class as a step reads it (`ClassView`), cached per class, hint version and GPU types."""
        key = (job.model, job.num_gpus, hints.version, tuple(gpu_types))
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 100_000:
                self._views.clear()
            view = self._views[key] = _class_view(hints.lookup(job.model, job.num_gpus), job.num_gpus, key[3])
        return view

    def step_views(self, hints: HintSet, gpu_types: tuple[str, ...]
                   ) -> tuple[dict[tuple[str, int], ClassView], dict[str, tuple[Job, ClassView]]]:
        """Where a step looks up class views: by (model, GPUs), and by job id (with the job, so that only the same
        job object hits). Kept from step to step under one hint version and set of GPU types (what `view` keys
        on), so a job's class is found once, not once per step."""
        context = (hints.version, gpu_types)
        if self._step_views is None or self._step_views[0] != context or len(self._step_views[2]) > 100_000:
            self._step_views = (context, {}, {})
        return self._step_views[1], self._step_views[2]

    def values(self, view: ClassView, running_on: str | None) -> dict[str, float]:
        """A class's normalised speed per type, less the migration cost over the horizon on every type but the
        one it runs on now (`running_on`; None: not running, nothing to discount)."""
        values = view.values.get(running_on)
        if values is None:
            if running_on is None:
                values = view.speeds
            else:
                horizon = self.horizon_s
                keep = 1.0 - min(self.migration_s / horizon, 1.0) if horizon > 0 else 0.0
                values = {t: v if t == running_on else v * keep for t, v in view.speeds.items()}
            view.values[running_on] = values
        return values

    def gains(self, view: ClassView, running_on: str | None, assigned: str) -> tuple[tuple[float, str], ...]:
        """The types worth more than `assigned` to a job of the class (`values`), as (value lost by staying,
        type), in the order of the view's types."""
        key = (running_on, assigned)
        gains = view.gains.get(key)
        if gains is None:
            v = self.values(view, running_on)
            gains = view.gains[key] = tuple((v[assigned] - v[t], t) for t in v
                                            if t != assigned and v[t] - v[assigned] > EPS)
        return gains


def _class_view(entries: tuple[HintEntry, ...], gpus: int, gpu_types: tuple[str, ...]) -> ClassView:
    """A class's `ClassView` from its hint entries (best rank first)."""
    thr = {e.gpu_type: max(e.expected_throughput, 0.0) for e in entries}
    best = max(thr.values(), default=0.0)
    if not entries:
        speeds = {t: 1.0 for t in gpu_types}
    elif best > 0:
        speeds = {t: thr.get(t, 0.0) / best for t in gpu_types}
    else:  # hints without throughputs: their rank order
        ranks = {e.gpu_type: e.rank for e in entries}
        speeds = {t: 1.0 / ranks[t] if t in ranks else 0.0 for t in gpu_types}
    ranked = sorted(speeds.values(), reverse=True) + [0.0, 0.0]
    first: dict[str, HintEntry] = {}
    for e in entries:
        first.setdefault(e.gpu_type, e)
    wants = {t: hinted_need(first[t], gpus) if t in first else proportional_need(gpus) for t in gpu_types}
    unasked = Job("class", "class", gpus)  # a job of the class that states no request of its own
    floors = {t: floor_need(unasked, wants[t]) for t in gpu_types}
    return ClassView(speeds, tuple(sorted(speeds, key=lambda t: (-speeds[t], t))), ranked[1] - ranked[0], first,
                     wants, floors, max(speeds.values(), default=0.0))


class _Step:
    """One planning step on a trial cluster (undone by the caller)."""

    exhaustive = False
    """Judge every move and swap candidate up front, the plain reading of the rule (tests compare it with the
    default, which judges only the candidates that can change a decision: the same decisions)."""

    def __init__(self, policy: CoAdaptive, order: Sequence[Job], cluster: Cluster, hints: HintSet,
                 current: Mapping[str, tuple[Allocation, ...]], touched: set[str], preempt: bool, move: bool,
                 history: Mapping[str, MoveHistory] = _NO_HISTORY, now: float = 0.0) -> None:
        self.policy, self.order, self.cluster, self.hints = policy, order, cluster, hints
        self.current, self.touched, self.preempt, self.move = current, touched, preempt, move
        self.history, self.now = history, now
        self.rank = {job.job_id: i for i, job in enumerate(order)}
        # jobs running but not asked about stay exactly as they are (pinned)
        self.placed: Target = {j: parts for j, parts in current.items() if j not in self.rank}
        # every type a job of the step can be on: the open nodes' and those of running jobs on closed nodes
        # (cordoned: they hold their jobs but take no new ones, and count for no GPUs here)
        self.types = tuple(sorted({*cluster.gpu_types(), *(a.gpu_type for parts in current.values() for a in parts)}))
        self.type_gpus, self.type_largest = cluster.gpus_by_type()
        for t in self.types:
            self.type_gpus.setdefault(t, 0)
            self.type_largest.setdefault(t, 0)
        self.largest_type = max(self.type_gpus.values(), default=0)
        # (model, GPUs, own request, GPU type) that found no single node this step: only placements happen after the first
        # try (no release), and each leaves every node's free-plus-shrinkable share no larger, so they would
        # find none again
        self.full: set[tuple[str, int, int | None, int | None, str]] = set()
        self.views, self._job_views = policy.step_views(hints, self.types)
        self._moving: dict[str, tuple[dict[str, float], str | None, float, MoveHistory | None, ClassView]] = {}
        self._changes: dict[tuple[str, str, str], tuple[float, float, float] | None] = {}  # `_change`, remembered
        self.movable_nodes = {a.node for job_id, parts in current.items() if job_id in self.rank for a in parts}
        """Nodes where a job of this step runs (or ran when it began): the only ones where peers can shrink."""
        self._placed_log: list[tuple[str, tuple[Allocation, ...] | None]] = []  # (job, what it had): undo

    def _view(self, job: Job) -> ClassView:
        got = self._job_views.get(job.job_id)
        if got is not None and got[0] is job:
            return got[1]
        view = self.views.get((job.model, job.num_gpus))
        if view is None:
            view = self.views[(job.model, job.num_gpus)] = self.policy.view(job, self.hints, self.types)
        self._job_views[job.job_id] = (job, view)
        return view

    # ------------------------------------------------------------------ the step

    def run(self) -> Target:
        self._drop_faulty_classes()
        admitted, left_out = self._admit()
        for job in left_out:
            if job.job_id in self.current:
                self._release(job.job_id)
        assigned = self._assign_types(admitted)
        movers: list[Job] = []
        for job in admitted:
            before = self.current.get(job.job_id, ())
            if before and before[0].gpu_type == assigned.get(job.job_id):
                self._set_placed(job.job_id, before)
            else:
                movers.append(job)
        self._move_and_start(movers, assigned)
        failed: set[ClassKey] = set()  # classes that found no place: nothing is freed while backfilling
        free = self.cluster.free_gpus_total()
        for job in chain(admitted, left_out):  # backfill, a preempted or unplaced job its old place first
            if free == 0:
                break  # nobody else can start or get their old place back
            if job.job_id in self.placed:
                continue
            # only a job that ran has a place to get back (`_restore` of any other is False, changing nothing)
            if job.job_id in self.current and self._guarded(f"restoring job {job.job_id}", self._restore, job):
                free = self.cluster.free_gpus_total()
                continue
            key = class_key(job)
            if key in failed or job.num_gpus > free:
                continue
            if self._guarded(f"placing job {job.job_id}", self._place, job, None):
                free = self.cluster.free_gpus_total()
            else:
                failed.add(key)
        for node in sorted(self.touched):
            if node in self.cluster:
                self._guarded(f"re-sizing node {node}", self._grow, node)
        self._keep_unchanged()
        return dict(self.placed)

    def _move_and_start(self, movers: list[Job], assigned: dict[str, str]) -> None:
        """Running jobs change to the GPU type assigned to them, newcomers start, in priority order. A running job
        moves to its assigned type or not at all: when no node of that type takes it, it keeps its old place (a
        move the stability rule did not judge is never made, not even to another node of its own type). Without
        `preempt` a running job is never stopped: if one cannot get its old place back (another mover took it),
        every move of this step is undone and the jobs stay where they were."""
        mark = self._mark()
        for job in movers:
            self._release(job.job_id)
        for job in movers:
            running = job.job_id in self.current
            what = f"moving job {job.job_id}" if running else f"placing job {job.job_id}"
            if self._guarded(what, self._place, job, assigned.get(job.job_id), running) or not running:
                continue
            self._guarded(f"keeping job {job.job_id} in place", self._restore, job)
        stranded = [job.job_id for job in movers if job.job_id in self.current and job.job_id not in self.placed]
        if stranded and not self.preempt:
            log.info("rebalance: %d running jobs would lose their place (first: %s); no job moves this step",
                     len(stranded), stranded[0])
            self._undo_to(mark)
            for job in movers:
                if job.job_id in self.current:
                    self._set_placed(job.job_id, self.current[job.job_id])
                else:
                    self._guarded(f"placing job {job.job_id}", self._place, job, assigned.get(job.job_id))

    def _keep_unchanged(self) -> None:
        """A running job placed again where and as it was (same nodes, GPUs, cores and RAM; only the hint version
        or the share's label new) keeps its allocations as they were: no action, and the cluster holds exactly
        what the target says (a journal that records actions only must agree with it)."""
        for job_id, before in self.current.items():
            after = self.placed.get(job_id)
            if after is None or after is before or len(after) != len(before) or not all(
                    (a.job_id, a.node, a.gpus, a.cpu_m, a.mem_mib) == (b.job_id, b.node, b.gpus, b.cpu_m, b.mem_mib)
                    for a, b in zip(after, before)):
                continue
            for a in after:
                self.cluster.release(a.job_id)
            for b in before:
                self.cluster.apply(b)
            self._set_placed(job_id, before)

    # ------------------------------------------------------------------ fault barriers

    def _drop_faulty_classes(self) -> None:
        """Jobs whose class cannot be read (its hints make no sense) sit this step out: as they are if running."""
        faulty = []
        for job in self.order:
            try:
                self._view(job)
            except Exception as exc:  # noqa: BLE001 - one job's fault must not stop the step
                log.warning("rebalance: job %s (%s, %d GPUs) left as it is this step: %s: %s", job.job_id,
                            job.model, job.num_gpus, type(exc).__name__, exc)
                faulty.append(job.job_id)
        if faulty:
            drop = set(faulty)
            self.order = [job for job in self.order if job.job_id not in drop]
            self.rank = {job.job_id: i for i, job in enumerate(self.order)}
            self.placed.update((j, self.current[j]) for j in faulty if j in self.current)  # pinned

    def _guarded(self, what: str, step: Callable[..., object], *args: object) -> object:
        """`step(*args)`, or, when it raises, its part of the trial undone (cluster and `placed`), one line
        logged, and None: a job's placement or a node's re-sizing never fails the whole step."""
        mark = self._mark()
        try:
            return step(*args)
        except Exception as exc:  # noqa: BLE001 - the barrier
            self._undo_to(mark)
            log.warning("rebalance: %s failed, left out of this step: %s: %s", what, type(exc).__name__, exc)
            return None

    def _mark(self) -> tuple[int, int]:
        """A point to undo back to: the trial's and `placed`'s (`_undo_to`)."""
        return self.cluster.mark(), len(self._placed_log)

    def _undo_to(self, mark: tuple[int, int]) -> None:
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

    def _set_placed(self, job_id: str, parts: tuple[Allocation, ...] | None) -> None:
        """Record where a job ends up in this step (None: nowhere), undoably."""
        self._placed_log.append((job_id, self.placed.get(job_id)))
        if parts is None:
            self.placed.pop(job_id, None)
        else:
            self.placed[job_id] = parts
            if job_id in self.rank:
                for a in parts:
                    self.movable_nodes.add(a.node)

    def _admit(self) -> tuple[list[Job], list[Job]]:
        """Who runs: in priority order while GPUs last (with `preempt` every GPU but those of jobs not asked
        about; without it, running jobs stay and waiting ones share the free GPUs)."""
        if self.preempt:  # a cordoned node's GPUs count only while held: they stay with who holds them
            closed_nodes = self.cluster.closed_nodes()
            closed = 0
            if closed_nodes:
                held = {a.job_id: a for parts in chain(self.current.values(), self.placed.values()) for a in parts}
                closed = sum(a.gpus for a in held.values() if a.node in closed_nodes)
            room = sum(self.type_gpus.values()) + closed - sum(a.gpus for parts in self.placed.values() for a in parts)
        else:
            room = sum(self.cluster.free_gpus_by_type().values())
        return who_runs(self.order, room, self.largest_type, () if self.preempt else self.current, self.current)

    def _assign_types(self, admitted: list[Job]) -> dict[str, str]:
        """Comparative advantage: each admitted job's GPU type (absent: none had GPUs left).

        Running jobs start on their type; newcomers pick by greedy regret in what is left; then (with
        `move`) running jobs move up into free GPUs and pairs swap types, each only as the stability rule
        allows: a job changes type at most `Stability.budget` times and does not return quickly to a type it
        left, so it cannot ping-pong between types (before issue 21 it could: a job moved up into free GPUs
        for its own gain and was swapped back down for a pair's, 86 times on Gavel's setting).
        """
        room = dict.fromkeys(self.types, 0) | self.cluster.free_gpus_by_type()  # after the left-out were released
        assigned: dict[str, str] = {}
        newcomers = []
        for job in admitted:
            parts = self.current.get(job.job_id, ())
            if parts:
                assigned[job.job_id] = parts[0].gpu_type
            else:
                newcomers.append(job)
        if len(self.types) == 1:
            assigned.update((job.job_id, self.types[0]) for job in newcomers)
            return assigned
        scored = []
        for job in newcomers:
            view = self._view(job)
            scored.append((view.regret, self.rank[job.job_id], job, view.preference))
        scored.sort(key=lambda s: s[:2])
        for _, _, job, preference in scored:
            for t in preference:
                if room[t] >= job.num_gpus:
                    assigned[job.job_id] = t
                    room[t] -= job.num_gpus
                    break
        if self.move and len(self.types) > 1:
            self._improve([j for j in admitted if j.job_id in assigned], assigned, room)
        return assigned

    def _improve(self, jobs: list[Job], assigned: dict[str, str], room: dict[str, int]) -> None:
        """Moves into free GPUs, then pairwise swaps of equal-sized jobs, each only as the stability rule allows
        (`hetplan.allocator.stability`: the speed gained over the expected remaining time pays for the moves
        with a margin, within each job's budget, no quick return to a type it left)."""
        self._move(jobs, assigned, room)
        self._swap(jobs, assigned)

    def _mover(self, job: Job) -> tuple[dict[str, float], str | None, float, MoveHistory | None, ClassView]:
        """What the rule reads of a job: its class's speeds, the type it runs on (None: not running), its
        expected remaining time, its history and its class."""
        got = self._moving.get(job.job_id)
        if got is None:
            parts = self.current.get(job.job_id)
            view = self._view(job)
            if parts:
                h = self.history.get(job.job_id)
                got = (view.speeds, parts[0].gpu_type, remaining_s(h, self.now, self.policy.horizon_s), h, view)
            else:
                got = (view.speeds, None, self.policy.horizon_s, None, view)
            self._moving[job.job_id] = got
        return got

    def _change(self, job: Job, frm: str, to: str) -> tuple[float, float, float] | None:
        """(speed gained, expected remaining s, speed of the moves it adds) when `job` goes from the type it is
        assigned (`frm`) to `to`; None when its own part of the rule (budget, no quick return) forbids it. A job
        not running yet moves for free; one sent back to the type it runs on saves the move it had. Remembered for
        the step (everything it reads is fixed for the step)."""
        key = (job.job_id, frm, to)
        if key in self._changes:
            return self._changes[key]
        change = self._changes[key] = self._judge(job, frm, to)
        return change

    def _judge(self, job: Job, frm: str, to: str) -> tuple[float, float, float] | None:
        speeds, r, remaining, h, view = self._mover(job)
        cost = 0.0
        if r is not None:
            if to != r:
                stability = self.policy.stability
                to_best = view.preference[0] == to or speeds[to] >= view.best - EPS  # its fastest type
                # `admits` alone decides; its cheap parts first spare the saving where they do
                if not stability.within_budget(h, to_best) or stability.returning(h, to, self.now) and not \
                        stability.admits(h, to, saved_s(remaining, speeds[r], speeds[to]), self.now,
                                         self.policy.migration_s, to_best):
                    return None
                cost = speeds[to] if frm == r else 0.0
            elif frm != r:
                cost = -speeds[frm]
        return speeds[to] - speeds[frm], remaining, cost

    def _pays(self, change: tuple[float, float, float] | None) -> bool:
        return change is not None and self.policy.stability.pays(*change, self.policy.migration_s)

    def _move(self, jobs: list[Job], assigned: dict[str, str], room: dict[str, int]) -> None:
        """Jobs move into free GPUs of a faster type where the rule allows, the largest gain first."""
        smallest = min((job.num_gpus for job in jobs), default=0)
        open_types = {t for t, free in room.items() if free >= smallest and self.type_gpus.get(t, 0) > 0}
        gains = self.policy.gains
        # the first move needs room where some job gains, and every later one follows a first: without one (a full
        # cluster, the usual case near capacity), nothing moves and nobody needs judging
        if not self.exhaustive and (not open_types or not any(
                t in open_types and self._pays(self._change(job, assigned[job.job_id], t))
                for job in jobs for _, t in gains(self._view(job), None, assigned[job.job_id]))):
            return
        moves: list[tuple[float, int, Job, str]] = []
        first = False
        for job in jobs:
            frm = assigned[job.job_id]
            for loss, t in gains(self._view(job), None, frm):
                if self._pays(self._change(job, frm, t)):
                    moves.append((loss, self.rank[job.job_id], job, t))
                    first = first or t in open_types
        if not first:
            return
        for _, _, job, t in sorted(moves, key=lambda m: m[:2]):
            now = assigned[job.job_id]
            if room[t] < job.num_gpus or self.type_gpus.get(t, 0) == 0 or not self._pays(self._change(job, now, t)):
                continue
            assigned[job.job_id] = t
            room[t] -= job.num_gpus
            room[now] += job.num_gpus

    def _swap(self, jobs: list[Job], assigned: dict[str, str]) -> None:
        """Pairs of equal-sized jobs on two types trade places when each is allowed to (its budget, no quick
        return) and the pair's speed gained over the shorter expected remaining time pays for both moves, in the
        rule's order (`_swappers`: who goes down, the fewest moves so far first; a pair that does not pay drops its
        member with less time left). The order reads no judgement, so a candidate is judged (`_change`) only when
        the walk reaches it."""
        by_type: dict[tuple[str, int], list[_Candidate]] = {}
        kinds: dict[tuple[str, int], dict[int, dict[str, float]]] = {}  # the distinct classes' speeds on each side
        rank, current, history = self.rank, self.current, self.history
        for job in jobs:
            job_id = job.job_id
            speeds = self._view(job).speeds
            h = history.get(job_id) if current.get(job_id) else None  # as `_mover` reads it
            key = (assigned[job_id], job.num_gpus)
            by_type.setdefault(key, []).append((job, speeds, h, rank[job_id]))
            kinds.setdefault(key, {})[id(speeds)] = speeds
        types = [t for t in self.types if self.type_gpus.get(t, 0) > 0]  # a closed type takes nobody
        stability, migration = self.policy.stability, self.policy.migration_s
        for x in types:
            for y in types:
                if x >= y:
                    continue
                for g in sorted({g for (t, g) in by_type if t == x} & {g for (t, g) in by_type if t == y}):
                    # a pair gains at most the best gain of a class on each side: when that is none, no pair does
                    if max(v[y] - v[x] for v in kinds[(x, g)].values()) + \
                            max(v[x] - v[y] for v in kinds[(y, g)].values()) <= EPS:
                        continue
                    on_x = self._swappers(by_type[(x, g)], x, y, assigned)
                    on_y = self._swappers(by_type[(y, g)], y, x, assigned) if on_x else []
                    # the best gain from each place on: over the candidates not judged yet too, so an upper bound
                    # (the walk may go on further than it needs to, but no pair it adds gains)
                    best_x, best_y = self._best_after(on_x), self._best_after(on_y)
                    a, b = self._allowed(on_x, 0, x, y), self._allowed(on_y, 0, y, x)
                    while a < len(on_x) and b < len(on_y):
                        if best_x[a] + best_y[b] <= EPS:
                            break  # no later pair gains
                        i, j = on_x[a][4], on_y[b][4]
                        up, down = self._change(i, x, y), self._change(j, y, x)
                        assert up is not None and down is not None  # `_allowed` passed over the others
                        (gi, ri, ci), (gj, rj, cj) = up, down
                        if stability.pays(gi + gj, min(ri, rj), ci + cj, migration):
                            assigned[i.job_id], assigned[j.job_id] = y, x
                            a, b = self._allowed(on_x, a + 1, x, y), self._allowed(on_y, b + 1, y, x)
                        elif ri <= rj:
                            a = self._allowed(on_x, a + 1, x, y)
                        else:
                            b = self._allowed(on_y, b + 1, y, x)

    def _allowed(self, side: list[_Ranked], k: int, frm: str, to: str) -> int:
        """The first place from `k` on of a job of `side` its own part of the rule lets go from `frm` to `to`
        (judged now, remembered for the step); len(side) if none."""
        while k < len(side) and self._change(side[k][4], frm, to) is None:
            k += 1
        return k

    @staticmethod
    def _best_after(side: list[_Ranked]) -> list[float]:
        """The largest speed gain from each candidate of one side of a swap on (the order is the rule's, not by
        gain): the pair walk stops where no later pair can gain."""
        return list(accumulate(reversed([c[3] for c in side]), max, initial=float("-inf")))[:0:-1]

    def _swappers(self, side: list[_Candidate], frm: str, to: str, assigned: dict[str, str]) -> list[_Ranked]:
        """The jobs of `side` still assigned `frm` in the stability rule's order for going to `to`
        (`Stability.swap_key`: those sent down with the fewest moves so far first, then the largest speed gain;
        then priority), each as (its key's two parts, its rank, its speed gain, the job): sorted as they stand, since
        no two ranks are equal. Not judged yet (`_allowed` does, as the walk reaches them), unless `exhaustive`:
        then only those the rule allows."""
        key = self.policy.stability.swap_key
        out = [(*key(h, gain := speeds[to] - speeds[frm]), r, gain, job) for job, speeds, h, r in side
               if assigned[job.job_id] == frm]
        if self.exhaustive:
            out = [c for c in out if self._change(c[4], frm, to) is not None]
        out.sort()
        return out

    # ------------------------------------------------------------------ placing one job

    def _place(self, job: Job, gpu_type: str | None, only: bool = False) -> bool:
        """Place `job` on `gpu_type` (then, failing that and unless `only`, on the other types by speed); False if
        nowhere."""
        view = self._view(job)
        preference = view.preference
        if only and gpu_type is not None:
            preference = (gpu_type,)
        elif gpu_type is not None and preference[0] != gpu_type:
            preference = (gpu_type, *(t for t in preference if t != gpu_type))
        g = job.num_gpus
        usable = [t for t in preference if self.type_gpus[t] >= g and not (self.policy.strict and view.speeds[t] <= 0)]
        # a gang only when no node of a usable type could hold the job: a job that fits one node waits for one
        # (an 8-GPU pod is one pod on an 8-GPU node, never two 4-GPU parts while the 8-GPU nodes are busy)
        whole = any(g <= self.type_largest[t] for t in usable)
        for t in usable:
            if t != gpu_type and not self._may_run_on(job, t):
                continue
            if g > self.type_largest[t]:
                if not whole and self._place_gang(job, t):
                    return True
            elif (job.model, g, job.cpu_m, job.mem_mib, t) in self.full:
                continue
            elif self._place_single(job, view, t):
                return True
            else:
                self.full.add((job.model, g, job.cpu_m, job.mem_mib, t))
        return False

    def _may_run_on(self, job: Job, gpu_type: str) -> bool:
        """Whether a job may be placed on `gpu_type` other than the one this step assigned it: always if it is
        not running or runs on that type; else (a move) only as far as the stability rule allows."""
        parts = self.current.get(job.job_id)
        if not parts or parts[0].gpu_type == gpu_type:
            return True
        return self.move and self._pays(self._change(job, parts[0].gpu_type, gpu_type))

    def _place_single(self, job: Job, view: ClassView, gpu_type: str) -> bool:
        g = job.num_gpus
        want = self._want(job, gpu_type)
        fit = self.cluster.best_fit(gpu_type, g, want)
        share: Share = "hinted" if gpu_type in view.entries else "proportional"
        if fit is None:
            fit = self.cluster.largest_share(gpu_type, g, want, self._floor(job, gpu_type))
            share = "reduced" if share == "hinted" else share
        if fit is None:
            node = self._tune(job, gpu_type)
            if node is None:
                return False
            return self._put(job, ((node, g),), gpu_type)
        self._commit(job, (self._allocation(job, job.job_id, fit.node, gpu_type, g, fit.cpu_m, fit.mem_mib, share),))
        return True

    def _tune(self, job: Job, gpu_type: str) -> str | None:
        """A node of `gpu_type` with the GPUs free whose peers, shrunk to their floors, leave `job` its floor."""
        # only nodes where some job of this step runs: elsewhere nothing can shrink, and `largest_share` (tried
        # first) already found no free floor
        for name in self.cluster.with_free_gpus(gpu_type, job.num_gpus, among=self.movable_nodes):
            shape = self.cluster.shape(name)
            floor = self._floor(job, gpu_type)(shape)
            free = self.cluster.free(name)
            spare = [free.cpu_m, free.mem_mib]
            peers = self._movable_on(name)
            for a in peers:
                f = self._floor_of(a)
                spare[0] += a.cpu_m - min(f[0], a.cpu_m)
                spare[1] += a.mem_mib - min(f[1], a.mem_mib)
            if spare[0] >= floor[0] and spare[1] >= floor[1]:
                for a in peers:
                    self._shrink(a)
                return name
        return None

    def _place_gang(self, job: Job, gpu_type: str) -> bool:
        """All or nothing: nodes of `gpu_type` with the most free GPUs first, each part at least its floor."""
        if self.cluster.free_gpus_total(gpu_type) < job.num_gpus:
            return False  # the walk below would come up short
        mark = self._mark()
        left = job.num_gpus
        pieces: list[tuple[str, int]] = []
        for name in sorted(self.cluster.with_free_gpus(gpu_type, 1),
                           key=lambda n: (-self.cluster.free(n).gpus, n)):
            take = min(self.cluster.free(name).gpus, left)
            pieces.append((name, take))
            left -= take
            if left == 0:
                break
        if left > 0 or not self._put(job, tuple(pieces), gpu_type):
            self._undo_to(mark)
            return False
        return True

    def _put(self, job: Job, pieces: tuple[tuple[str, int], ...], gpu_type: str) -> bool:
        """Give `job` the given GPUs on each node with the largest share its free cores and RAM allow, at least
        its floor (peers shrunk if they must); False (nothing kept) when some node cannot give the floor."""
        mark = self._mark()
        parts = []
        hinted = self._hinted(job, gpu_type)
        gang = len(pieces) > 1 or job.num_gpus > self.type_largest[gpu_type]
        for k, (name, gpus) in enumerate(pieces):
            shape = self.cluster.shape(name)
            want = self._scaled(self._want(job, gpu_type)(shape), gpus, job.num_gpus)
            floor = self._scaled(self._floor(job, gpu_type)(shape), gpus, job.num_gpus)
            free = self.cluster.free(name)
            if free.cpu_m < floor[0] or free.mem_mib < floor[1]:
                for a in self._movable_on(name):
                    self._shrink(a)
                free = self.cluster.free(name)
            if free.gpus < gpus or free.cpu_m < floor[0] or free.mem_mib < floor[1]:
                self._undo_to(mark)  # the peers shrunk on earlier nodes too, in the cluster and in `placed`
                return False
            cpu, mem = min(want[0], free.cpu_m), min(want[1], free.mem_mib)
            share: Share = ("hinted" if (cpu, mem) == want else "reduced") if hinted else "proportional"
            part_id = f"{job.job_id}{GANG_SEP}{k}" if gang else job.job_id
            a = self._allocation(job, part_id, name, gpu_type, gpus, cpu, mem, share)
            self.cluster.apply(a)
            self.touched.add(name)
            parts.append(a)
        self._set_placed(job.job_id, tuple(parts))
        return True

    def _restore(self, job: Job) -> bool:
        before = self.current.get(job.job_id, ())
        if not before:
            return False
        mark = self._mark()
        for a in before:
            free = self.cluster.free(a.node) if a.node in self.cluster else None
            if free is None or a.gpus > free.gpus or a.cpu_m > free.cpu_m or a.mem_mib > free.mem_mib:
                self._undo_to(mark)
                return False
            self.cluster.apply(a)
        self._set_placed(job.job_id, before)
        return True

    # ------------------------------------------------------------------ shares

    def _hinted(self, job: Job, gpu_type: str) -> bool:
        return gpu_type in self._view(job).entries

    def _want(self, job: Job, gpu_type: str) -> Need:
        """The class's hinted share on `gpu_type` raised to the job's own request; without a hint there, the
        request where stated, else the GPU-proportional share."""
        view = self._view(job)
        want = view.wants[gpu_type]
        if job.cpu_m is None and job.mem_mib is None:
            return want
        own = job.want if gpu_type in view.entries else job.floor
        return lambda shape: own(*want(shape))

    def _floor(self, job: Job, gpu_type: str) -> Need:
        """The floor rule (`cluster.floor_need`) with the class's hinted share on `gpu_type`."""
        view = self._view(job)
        if job.cpu_m is None and job.mem_mib is None:
            return view.floors[gpu_type]  # the class's, remembered across steps
        return floor_need(job, view.wants[gpu_type])

    def _floor_of(self, a: Allocation) -> tuple[int, int]:
        job = self._job_of(a)
        shape = self.cluster.shape(a.node)
        return self._scaled(self._floor(job, a.gpu_type)(shape), a.gpus, job.num_gpus)

    def _want_of(self, a: Allocation) -> tuple[int, int]:
        job = self._job_of(a)
        shape = self.cluster.shape(a.node)
        return self._scaled(self._want(job, a.gpu_type)(shape), a.gpus, job.num_gpus)

    def _movable_on(self, node: str) -> list[Allocation]:
        """The allocations on `node` of jobs this step may re-size (those it was asked about)."""
        table = self.cluster.allocation_table()
        allocs = (table.get(j) for j in self.cluster.jobs_on(node))
        return [a for a in allocs if a is not None and self._base_id(a) in self.rank]

    def _base_id(self, a: Allocation) -> str:
        return a.job_id if a.job_id in self.rank else a.job_id.rsplit(GANG_SEP, 1)[0]

    def _job_of(self, a: Allocation) -> Job:
        """The job (of `order`: only those are re-sized) an allocation or a gang part belongs to."""
        return self.order[self.rank[self._base_id(a)]]

    @staticmethod
    def _scaled(share: tuple[int, int], gpus: int, of: int) -> tuple[int, int]:
        """A whole job's share cut to `gpus` of its `of` GPUs (a gang part's share)."""
        if gpus == of:
            return share
        return -(-share[0] * gpus // of), -(-share[1] * gpus // of)

    def _shrink(self, a: Allocation) -> None:
        floor = self._floor_of(a)
        if a.cpu_m > floor[0] or a.mem_mib > floor[1]:
            self._resize(a, min(a.cpu_m, floor[0]), min(a.mem_mib, floor[1]))

    def _grow(self, node: str) -> None:
        """Jobs on `node` grow in priority order into its free cores and RAM, up to their hinted share."""
        free = self.cluster.free(node)
        if free.cpu_m == 0 and free.mem_mib == 0:
            return  # nothing to grow into
        allocs = self._movable_on(node)
        allocs.sort(key=lambda a: self.rank[self._base_id(a)])
        for a in allocs:
            want = self._want_of(a)
            free = self.cluster.free(node)
            cpu = max(a.cpu_m, min(want[0], a.cpu_m + free.cpu_m))
            mem = max(a.mem_mib, min(want[1], a.mem_mib + free.mem_mib))
            if (cpu, mem) != (a.cpu_m, a.mem_mib):
                self._resize(a, cpu, mem)

    def _resize(self, a: Allocation, cpu_m: int, mem_mib: int) -> None:
        self.cluster.release(a.job_id)
        job = self._job_of(a)
        want = self._want_of(a)
        share: Share = a.share if a.share == "proportional" else ("hinted" if (cpu_m, mem_mib) == want else "reduced")
        new = replace(a, cpu_m=cpu_m, mem_mib=mem_mib, hint_version=self.hints.version, policy=self.policy.name,
                      share=share)
        self.cluster.apply(new)
        self.touched.add(a.node)
        parts = self.placed.get(job.job_id)
        if parts is not None:
            self._set_placed(job.job_id, tuple(new if p.job_id == a.job_id else p for p in parts))

    # ------------------------------------------------------------------ bookkeeping

    def _allocation(self, job: Job, part_id: str, node: str, gpu_type: str, gpus: int, cpu_m: int, mem_mib: int,
                    share: Share) -> Allocation:
        entry = self._view(job).entries.get(gpu_type)
        rank = entry.rank if entry is not None else None
        return Allocation(part_id, job.model, node, gpu_type, gpus, cpu_m, mem_mib, self.hints.version,
                          self.policy.name, share, rank, request_cpu_m=job.cpu_m, request_mem_mib=job.mem_mib)

    def _commit(self, job: Job, parts: tuple[Allocation, ...]) -> None:
        for a in parts:
            self.cluster.apply(a)
            self.touched.add(a.node)
        self._set_placed(job.job_id, parts)

    def _release(self, job_id: str) -> None:
        for a in self.current.get(job_id, ()):
            if self.cluster.allocation(a.job_id) is not None:
                self.cluster.release(a.job_id)
                self.touched.add(a.node)
        self._set_placed(job_id, None)

