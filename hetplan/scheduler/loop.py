"""The one scheduling loop: a queue in an order, work-conserving fills between rounds, preemptive rounds.

Blox's stages, one loop, driven alike by the simulator (which keeps time, speeds and truth) and by the service
(which keeps the clock of the world and a journal):

- `submit(job, now)`: the job joins the queue in the order's place (`orders`);
- `fill(now)`: waiting jobs start, in order, where they fit, nobody preempted (`Allocator.admit` for a co-adaptive
  policy: comparative advantage, peers shrunk to their floors where that makes room; else each where `allocate`
  puts it);
- `finish(job_id, now)`: a running job releases its resources (the caller fills after, once per instant);
- `round(now)`: at a round boundary, preemptive. With a placement-only policy (`hint-static`, `proportional`,
  `first-fit`) a waiting job that outranks a running one triggers a reschedule: the jobs that should run are
  picked in order while their GPUs fit (`admission.who_runs`); of the others only those whose room a job ahead
  of them takes stop (they keep their progress and attained service): planned on a trial, the left-out first
  trying their old place, and applied as the difference (`Scheduler._reschedule`). With a co-adaptive policy
  (`hint`) the allocator's `rebalance` decides jointly which jobs run, on which GPU type and node(s), with what
  cores and RAM, whenever jobs wait or something changed since the last round. With an elastic rule (`elastic`)
  every round gives every job a GPU type and a GPU count (`elastic.choose`), applied by `Allocator.reconfigure`,
  and nothing starts between rounds.

One job's fault never fails the others: an exception raised while placing one job (a policy raising for its
model, hints that make its need NaN) skips that job this time (it stays queued; a running job keeps its place),
logged once per job and fault with its id (`Scheduler.faults`), and the pass goes on. The co-adaptive step has
the same barrier inside (`hetplan.allocator.step`).

Every change reaches a `Listener` (the simulator's speeds and books; nothing for the service, whose journal is the
allocator's). A step reads only the head of the queue that could start (`Queue.head`).
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Literal, Protocol, TypeVar

from hetplan.allocator.actions import GANG_SEP, Action, diff
from hetplan.allocator.admission import ClassKey, class_key, who_runs
from hetplan.allocator.cluster import OvercommitError
from hetplan.allocator.core import Allocator
from hetplan.allocator.spec import Allocation, Job
from hetplan.hints import HintSet
from hetplan.scheduler.elastic import Config, Elastic, ElasticJob, TypeShape, choose, configs
from hetplan.scheduler.orders import ORDERS, Order
from hetplan.scheduler.queue import Queue
from hetplan.scheduler.state import JobState

log = logging.getLogger(__name__)

T = TypeVar("T")

StartKind = Literal["start", "migrate", "resize", "rescale"]
"""Why a job (re)starts on parts: placed from the queue, moved to other node(s), re-sized in place, or given
another GPU count (an elastic job: a restart)."""


class Listener(Protocol):
    """What a driver of the loop learns of each change, after the allocator applied it."""

    def started(self, job: JobState, parts: tuple[Allocation, ...], now: float, kind: StartKind) -> None: ...

    def halted(self, job: JobState, now: float) -> None: ...

    def note(self, now: float, what: str, before: tuple[Allocation, ...], after: tuple[Allocation, ...]) -> None: ...


class Quiet:
    """A listener that needs nothing (the service: the allocator's journal is its record)."""

    def started(self, job: JobState, parts: tuple[Allocation, ...], now: float, kind: StartKind) -> None:
        return None

    def halted(self, job: JobState, now: float) -> None:
        return None

    def note(self, now: float, what: str, before: tuple[Allocation, ...], after: tuple[Allocation, ...]) -> None:
        return None


COUNTS = ("starts", "kept", "preemptions", "migrations", "resizes", "rescales", "rounds", "reschedules")


class Scheduler:
    """The queue, the order and the rounds over one `Allocator` (see the module docstring). `jobs` maps each job's
    `idx` to its state: the simulator gives every job of its trace up front, the service adds them as they come."""

    def __init__(self, allocator: Allocator, order: Order = "las", round_s: float = 300.0,
                 listener: Listener | None = None, jobs: Mapping[int, JobState] | None = None,
                 elastic: Elastic | None = None) -> None:
        if order not in ORDERS:
            raise ValueError(f"unknown scheduling order {order!r}; one of {', '.join(ORDERS)}")
        if not round_s > 0:
            raise ValueError(f"round_s must be positive, got {round_s}")
        self.allocator = allocator
        self.order = order
        self.priority = ORDERS[order]
        self.round_s = round_s
        self.listener: Listener = listener or Quiet()
        self.jobs: dict[int, JobState] = dict(jobs or {})
        self.by_id = {job.job_id: job for job in self.jobs.values()}
        self.queue = Queue(self.jobs)
        self.running: dict[int, JobState] = {}
        self.co_adaptive = allocator.policy.rounds is not None
        self.elastic = elastic  # rounds choose every job's GPU type and count (`hetplan.scheduler.elastic`)
        self.last_round = -math.inf
        self.changed = False  # something started or stopped since the last round (co-adaptive rounds only)
        self.off_best = 0  # running jobs not on their fastest GPU type (co-adaptive rounds only)
        self.counts = dict.fromkeys(COUNTS, 0)
        self.faults: dict[str, str] = {}  # job id -> the fault that last skipped it (logged once), until it starts

    # ------------------------------------------------------------------ the stages

    def add(self, job: JobState) -> None:
        """Know `job` (not queued yet: `submit` queues it)."""
        if job.idx in self.jobs or job.job_id in self.by_id:
            raise ValueError(f"job {job.job_id} (#{job.idx}) is known already")
        self.jobs[job.idx] = job
        self.by_id[job.job_id] = job

    def submit(self, job: JobState, now: float) -> None:
        """`job` (known, or new) waits from now in the order's place."""
        if job.idx not in self.jobs:
            self.add(job)
        job.advance(now)
        self.queue.add((*self.priority(job, 0.0), job.idx))

    def forget(self, job_id: str) -> JobState | None:
        """Take a waiting job out of the queue and the books (its pod went away); None if it is not waiting."""
        job = self.by_id.get(job_id)
        if job is None or job.idx not in self.queue:
            return None
        self.queue.remove(job.idx)
        del self.jobs[job.idx], self.by_id[job_id]
        self.faults.pop(job_id, None)
        return job

    def finish(self, job_id: str, now: float) -> JobState:
        """A running job is done: its resources go back (every part of a gang); it leaves the books."""
        job = self.by_id[job_id]
        self._stop(job, now, final=True)
        del self.jobs[job.idx], self.by_id[job_id]
        self.faults.pop(job_id, None)
        return job

    def wants_round(self) -> bool:
        """Whether a round boundary has anything to do: jobs wait, or (co-adaptive) something changed."""
        if self.elastic is not None:
            return bool(self.queue or self.running)
        return bool(self.queue) or (self.changed and self.co_adaptive)

    def next_round(self, now: float) -> float:
        """The first round boundary at or after `now` that has not been processed."""
        r = self.round_s
        boundary = max(math.ceil(now / r) * r, now)  # never behind now by a rounding error
        return boundary if boundary > self.last_round else self.last_round + r

    def fill(self, now: float, previous: Mapping[int, tuple[Allocation, ...]] | None = None) -> None:
        """Place waiting jobs in priority order where they fit, without preempting; the rest wait on.

        A job in `previous` (preempted by this round) first gets its old allocation back if its node still has
        room, so that it keeps running where it ran unless a higher-priority job took its place. Jobs larger than
        any node then run as gangs where free GPUs allow (`Allocator.place_gangs`). With a co-adaptive policy the
        allocator's `admit` places them (no preemption, no moves, peers shrunk to their floors where that makes
        room)."""
        free = self.allocator.cluster.free_gpus_total()
        if not self.queue or free == 0 or self.elastic is not None:  # elastic: only rounds choose
            return
        head = self.queue.head(free)  # the rest could not start (`admission.contenders`)
        if self.co_adaptive:
            self.take(self.allocator.admit([self.jobs[entry[-1]].request for entry in head]), now)
            return
        previous = previous or {}
        if previous:  # a preempted job may get its old place back wherever it waits
            head = sorted(set(head).union(self.queue.of[idx] for idx in previous))
        largest = self.allocator.cluster.max_gpus()
        failed: set[ClassKey] = set()  # classes that did not fit: nothing is freed during a pass
        gangs: list[Job] = []
        for entry in head:
            job = self.jobs[entry[-1]]
            if job.gpus > largest or job.request.part_gpus is not None:
                gangs.append(job.request)
                continue
            if free == 0 or job.gpus > free:
                continue
            placed = self.guarded(job, "placing", self._place_one, job, previous.get(job.idx), failed)
            if placed is not None:  # booked outside the barrier: a listener's error is no job's fault
                parts, kept = placed
                self.queue.remove(job.idx)
                self._start(job, parts, now, "start")
                self.counts["kept"] += kept
                free -= job.gpus
        if gangs and free >= min(job.num_gpus for job in gangs):
            self.take(self.allocator.place_gangs(gangs), now)

    def _place_one(self, job: JobState, old: tuple[Allocation, ...] | None, failed: set[ClassKey]
                   ) -> tuple[tuple[Allocation, ...], bool] | None:
        """Where one waiting job of a placement-only `fill` starts, committed to the allocator (the caller books
        it): its old place back (`old`, when this round preempted it) if that node has room, else where `allocate`
        puts it unless its class found no place this pass (`failed`, which a failure adds to). (parts, whether it
        is its old place), or None."""
        if old is not None and len(old) == 1 and self.allocator.restore(old[0]):
            return old, True
        if class_key(job.request) in failed:
            return None
        decision = self.allocator.allocate(job.request)
        if not isinstance(decision, Allocation):
            failed.add(class_key(job.request))
            return None
        return (decision,), False

    def guarded(self, job: JobState, what: str, step: Callable[..., T], *args: object) -> T | None:
        """`step(*args)`, or None when it raises: the per-job barrier (the module docstring). The fault is logged
        once per job and fault (`faults`); the job is left as the step found it (a placement-only policy changes
        nothing before it commits, and the allocator's commit is all or nothing). `step` only decides and commits to
        the allocator: the books and the listener are the caller's, outside the barrier."""
        try:
            return step(*args)
        except Exception as exc:  # noqa: BLE001 - one job's fault must not fail the others
            said = f"{type(exc).__name__}: {exc}"
            if self.faults.get(job.job_id) != said:
                self.faults[job.job_id] = said
                log.warning("scheduler: %s job %s (%s, %d GPUs) failed; it is skipped this time: %s", what,
                            job.job_id, job.request.model, job.gpus, said)
            return None

    def round(self, now: float) -> None:
        """A round boundary: a co-adaptive step, or (placement-only policies) a reschedule when a waiting job
        outranks a running one, else a fill (the module docstring)."""
        self.last_round = now
        self.counts["rounds"] += 1
        if self.elastic is not None:
            self._elastic_round(now)
            return
        if self.co_adaptive:
            self._co_adaptive_round(now)
            return
        if not self.queue:
            return
        ranked = self._ranked(self.running.values(), now)
        if not ranked or self.queue.first() > ranked[-1]:
            self.fill(now)
            return
        gpus = self.capacity()
        # a waiting job whose placement faulted takes no room from the others (`fill` still tries it)
        contending = (self.jobs[entry[-1]].request for entry in heapq.merge(ranked, self.queue.head(gpus)))
        run, _ = who_runs((job for job in contending if job.job_id not in self.faults) if self.faults else contending,
                          gpus, gpus)
        chosen = {self.by_id[job.job_id].idx for job in run}
        before = {entry[-1]: self.jobs[entry[-1]].parts for entry in ranked if entry[-1] not in chosen}
        if not before:
            self.fill(now)
            return
        self._reschedule(before, now)

    def _reschedule(self, before: dict[int, tuple[Allocation, ...]], now: float) -> None:
        """A placement-only reschedule: the running jobs of `before` (left out by `who_runs`) give up their room
        only where a job of higher priority takes it. Planned on a trial of the cluster as `fill` would run after
        stopping them all (each of them its old place first, in priority order), then applied as the difference
        (`actions.diff`, journaled as preemptions): a job that gets its old place back is never stopped (`kept`),
        one placed elsewhere migrates, one placed nowhere stops and waits. Gangs are placed after, as `fill` does."""
        cluster = self.allocator.cluster
        hints = self.allocator.hints
        for idx in before:
            self.jobs[idx].advance(now)  # their priority as if stopped now
        victims = [(*self.priority(self.jobs[idx], 0.0), idx) for idx in before]
        with cluster.trial():
            for parts in before.values():
                for a in parts:
                    cluster.release(a.job_id)
            free = cluster.free_gpus_total()
            largest = cluster.max_gpus()
            failed: set[ClassKey] = set()
            gangs: list[Job] = []
            placed: dict[int, tuple[Allocation, ...]] = {}
            for entry in sorted(set(self.queue.head(free)).union(victims)):
                job = self.jobs[entry[-1]]
                if job.gpus > largest:  # a gang: its old place back, else placed after, as `fill` places gangs
                    if job.idx in before and job.gpus <= free and self._restore_on_trial(before[job.idx]):
                        placed[job.idx] = before[job.idx]
                        free -= job.gpus
                    else:
                        gangs.append(job.request)
                    continue
                if free == 0 or job.gpus > free:
                    continue
                parts = self.guarded(job, "placing", self._plan_one, job, before.get(job.idx), failed, hints)
                if parts:
                    placed[job.idx] = parts
                    free -= job.gpus
        current = {self.jobs[idx].job_id: parts for idx, parts in before.items()}
        actions = diff(current, {self.jobs[idx].job_id: parts for idx, parts in placed.items()})
        self.allocator.apply_actions(actions, clear_touched=False, preempting=True)
        self.counts["kept"] += len(before) - sum(a.job_id in current for a in actions)
        self.take(actions, now)
        if gangs and cluster.free_gpus_total() >= min(job.num_gpus for job in gangs):
            self.take(self.allocator.place_gangs(gangs), now)

    def _restore_on_trial(self, parts: tuple[Allocation, ...]) -> bool:
        """Apply a job's old parts to the reschedule's trial, all or nothing; whether they fit."""
        cluster = self.allocator.cluster
        mark = cluster.mark()
        try:
            for a in parts:
                cluster.apply(a)
        except OvercommitError:
            cluster.undo_to(mark)
            return False
        return True

    def _plan_one(self, job: JobState, old: tuple[Allocation, ...] | None, failed: set[ClassKey],
                  hints: HintSet) -> tuple[Allocation, ...] | None:
        """`_place_one` on the reschedule's trial: where the job would run (`old` itself when it gets its old place
        back: no change), applied to the trial; None where it would not run."""
        cluster = self.allocator.cluster
        if old is not None and len(old) == 1 and self._restore_on_trial(old):
            return old
        if class_key(job.request) in failed:
            return None
        decision = self.allocator.policy.place(job.request, cluster, hints)
        if not isinstance(decision, Allocation):
            failed.add(class_key(job.request))
            return None
        cluster.apply(decision)
        return (decision,)

    @property
    def gpu_type_names(self) -> list[str]:
        """The GPU types the cluster has now (the service's nodes come and go)."""
        return self.allocator.cluster.gpu_types()

    def capacity(self) -> int:
        """The GPUs of the open nodes: the most a round can give."""
        return sum(self.allocator.cluster.gpus_by_type()[0].values())

    def _ranked(self, jobs: Iterable[JobState], now: float) -> list[tuple]:
        """Running jobs' priorities as of now (their state is not brought up to date: only stopped jobs need it)."""
        return sorted((*self.priority(job, now - job.last), job.idx) for job in jobs)

    def _co_adaptive_round(self, now: float) -> None:
        """Every job that waits or runs, in priority order, to the allocator's rebalance; when nothing waits and
        every running job is on its fastest GPU type, only the jobs on nodes that changed (no move can help). A
        step that raises changes nothing (the allocator's step is all or nothing): the next round tries again."""
        cluster = self.allocator.cluster
        if self.queue or (self.off_best and len(self.gpu_type_names) > 1):
            ranked = self._ranked(self.running.values(), now)
            head = self.queue.head(self.capacity())  # the rest could not start (`admission.contenders`)
            order = [self.jobs[entry[-1]].request for entry in sorted(ranked + head)]  # merges two runs
        else:
            on = {self._job_id(a) for node in self.allocator.touched() if node in cluster
                  for a in cluster.jobs_on(node)}
            order = [self.jobs[entry[-1]].request for entry in self._ranked((self.by_id[j] for j in on), now)]
        actions = self.allocator.rebalance(order, preempt=True)
        self.changed = False
        self.take(actions, now)

    def _elastic_round(self, now: float) -> None:
        """Every running and waiting job, in priority order, gets a (GPU type, count) from the elastic policy
        (`elastic.choose`), applied by the allocator (`Allocator.reconfigure`)."""
        assert self.elastic is not None
        for job in self.running.values():
            job.advance(now)
        type_gpus, largest = self.allocator.cluster.gpus_by_type()
        types = {t: TypeShape(g, largest[t]) for t, g in type_gpus.items() if g > 0}
        ranked = sorted(self._ranked(self.running.values(), now) + list(self.queue.entries))
        jobs = [self.jobs[entry[-1]] for entry in ranked]
        asked = []
        for job in jobs:
            options = configs(types, job.min_gpus, job.max_gpus, job.request.part_gpus)
            current = Config(job.parts[0].gpu_type, job.gpus, len({p.node for p in job.parts})) if job.parts else None
            if current is not None and job.request.part_gpus is not None:  # its pods change count, never type
                options = [c for c in options if c.gpu_type == current.gpu_type]
            if current is not None and current not in options:
                options.append(current)
            age = 0.0 if math.isnan(job.start) else now - job.start
            asked.append(ElasticJob(job.job_id, self.elastic.rates(job, options), current, job.restart_s, age,
                                    job.attained, job.restarts,
                                    now - job.since if job.parts else 0.0))
        chosen = choose(asked, types, self.elastic.rule, self.elastic.stats)
        choices = []
        for job in jobs:
            c = chosen[job.job_id]
            choices.append((job.request, None) if c is None else (at_count(job.request, c.gpus), c.gpu_type))
        actions, short = self.allocator.reconfigure(choices)
        self.elastic.stats.short += len(short)
        self.take(actions, now)

    def _job_id(self, allocation_id: str) -> str:
        """The job an allocation belongs to (a gang part's id names its job before the separator)."""
        return allocation_id if allocation_id in self.by_id else allocation_id.rsplit(GANG_SEP, 1)[0]

    # ------------------------------------------------------------------ applying what the allocator did

    def take(self, actions: list[Action], now: float) -> None:
        """Bring the jobs in line with a co-adaptive step's actions (already applied to the cluster)."""
        stopped = []
        for action in actions:
            job = self.by_id[action.job_id]
            self.listener.note(now, f"{action.kind} {action.job_id}", action.before, action.after)
            if action.kind == "start":
                self._start(job, action.after, now, "start")
            elif action.kind == "stop":
                self.halt(job, now)
                job.preemptions += 1
                self.counts["preemptions"] += 1
                stopped.append(job)
            else:
                self.halt(job, now)
                kind: StartKind = "migrate" if action.kind == "migrate" else "resize"
                if sum(a.gpus for a in action.before) != sum(a.gpus for a in action.after):
                    kind = "rescale"
                self._start(job, action.after, now, kind)
                attribute = {"migrate": "migrations", "resize": "resizes", "rescale": "rescales"}[kind]
                setattr(job, attribute, getattr(job, attribute) + 1)
                self.counts[attribute] += 1
        for action in actions:
            if action.kind == "start":
                self.queue.remove(self.by_id[action.job_id].idx)
        for job in stopped:
            self.queue.add((*self.priority(job, 0.0), job.idx))
        self.counts["reschedules"] += bool(stopped)

    def resume(self, job: JobState, parts: tuple[Allocation, ...], since: float) -> None:
        """Know `job` as running on `parts` since `since` (a restart of the service finds it so): nothing is
        counted, nobody is told."""
        if job.idx not in self.jobs:
            self.add(job)
        job.parts, job.last, job.since = parts, since, since
        self._placed(job, parts)
        if math.isnan(job.start):
            job.start = since
        self.running[job.idx] = job
        self.changed = True

    def _start(self, job: JobState, parts: tuple[Allocation, ...], now: float, kind: StartKind) -> None:
        self.listener.started(job, parts, now, kind)
        job.parts, job.last, job.since = parts, now, now
        self._placed(job, parts)
        if math.isnan(job.start):
            job.start = now
        self.running[job.idx] = job
        self.counts["starts"] += 1
        self.changed = True
        self.faults.pop(job.job_id, None)

    def _placed(self, job: JobState, parts: tuple[Allocation, ...]) -> None:
        """Book where a job runs now: its GPU type and share, and whether that type is its fastest."""
        job.gpu_type, job.share = parts[0].gpu_type, parts[0].share
        job.gpus = sum(a.gpus for a in parts)
        if self.co_adaptive:
            rounds = self.allocator.policy.rounds
            speeds = rounds.speeds(job.request, self.allocator.hints, self.gpu_type_names)
            job.off_best = speeds.get(job.gpu_type, 0.0) < max(speeds.values(), default=0.0) - 1e-9
            self.off_best += job.off_best

    def halt(self, job: JobState, now: float) -> None:
        """Take a running job off the books (its resources are already back in the cluster)."""
        job.advance(now)
        if not job.parts:
            raise RuntimeError(f"{job.job_id} stopped while not running")
        self.listener.halted(job, now)
        self.off_best -= job.off_best
        job.off_best = False
        job.parts, job.speed, job.gpus = (), 0.0, job.request.num_gpus
        del self.running[job.idx]
        self.changed = True

    def _stop(self, job: JobState, now: float, final: bool) -> None:
        """Take a running job off the cluster: finished (`final`), or preempted (it waits to run again)."""
        released = self.allocator.release_parts(job.job_id, final=final)
        if sorted(released, key=lambda a: a.job_id) != sorted(job.parts, key=lambda a: a.job_id):
            raise RuntimeError(f"{job.job_id}: the allocator released {released}, expected {job.parts}")
        self.halt(job, now)


def at_count(job: Job, gpus: int) -> Job:
    """`job` asked for `gpus` GPUs (an elastic round's choice); a gang of fixed parts keeps its parts' size and each
    part's own cores and RAM (its total request scaled with its number of parts)."""
    if job.part_gpus is None or gpus == job.num_gpus:
        return replace(job, num_gpus=gpus)
    parts, old = gpus // job.part_gpus, job.parts
    return replace(job, num_gpus=gpus, cpu_m=None if job.cpu_m is None else job.cpu_m // old * parts,
                   mem_mib=None if job.mem_mib is None else job.mem_mib // old * parts)
