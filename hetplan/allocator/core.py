"""The mechanism: ask the policy, apply its decision to the cluster; idempotent per job id; thread-safe.

`Allocator` is the one allocator: the simulator drives it in memory, the service with a SQLite journal
(`durable.DurableAllocator`, the same class with `durable.SqliteJournal`), so both run the same code.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from hetplan.allocator.admission import contenders
from hetplan.allocator.cluster import Cluster, Fit, OvercommitError, StateError
from hetplan.allocator.policies import Policy, get_policy
from hetplan.allocator.actions import NOTE_KINDS, Action, diff
from hetplan.allocator.rebalance import CoAdaptive
from hetplan.allocator.sources import HintSource, StaticHints
from hetplan.allocator.journal import (
    RETAIN, ActionLog, Change, Journal, LoggedAction, MemoryJournal, Note, Restored, Synchronous,
)
from hetplan.allocator.spec import (GANG_SEP, MAX_GPUS, Allocation, Decision, Job, Node, Reason, Rejection,
                                     check_job_id, mib_to_gib)
from hetplan.allocator.stability import MoveHistory, record
from hetplan.allocator.step.gangs import grow_fixed_gang
from hetplan.allocator.step.reconfigure import reconfigure
from hetplan.allocator.step.state import StepState
from hetplan.hints import HintSet


@dataclass(frozen=True)
class NodeChanges:
    """A batch of node changes, applied all or nothing: upserts (add or update) and removals."""

    upsert: Sequence[Node] = ()
    remove: Sequence[str] = ()
    force: bool = False  # removing a busy node releases its allocations instead of refusing


class UnknownJob(LookupError):
    """A change asked for a job that holds no resources."""


class NotAGang(StateError):
    """A change of part count asked for a job that is no running gang of fixed parts."""


@dataclass(frozen=True)
class Scaled:
    """What `Allocator.scale` did: the gang's parts now (in part order), and why not where its count did not change
    (`rejection`: nothing changed). `changed`: a `resize` action was logged."""

    parts: tuple[Allocation, ...]
    changed: bool
    rejection: Rejection | None = None


def rescaled(action: Action) -> Action:
    """A gang of fixed parts whose kept parts stay where and as they were, with parts added or dropped: a `resize`
    (the controller's rescale, as `Allocator.scale` logs it), not a `migrate` (`actions.diff` compares nodes)."""
    before, after = action.before, action.after
    if action.kind != "migrate" or len(before) == len(after) or before[0].part_gpus is None \
            or after[0].part_gpus != before[0].part_gpus:
        return action
    was, now = ({a.job_id: (a.node, a.gpus) for a in parts} for parts in (before, after))
    small, large = (was, now) if len(was) < len(now) else (now, was)
    same = all(large.get(part) == where for part, where in small.items())
    return Action("resize", action.job_id, before, after) if same else action


def part_number(a: Allocation) -> int:
    """A gang part's number (`<job id>#<k>`: k)."""
    return int(a.job_id.rpartition(GANG_SEP)[2])


class Allocator:
    """Cluster + policy + hints + journal. Every method holds one lock: decisions are serialised and never overcommit.

    Every change is applied at one point (`_commit`): in memory, then handed to the journal as one `Change` with
    its numbered actions (`log`); if the journal refuses it, it is undone in memory and the error raised.
    `journal` (default `MemoryJournal`: nothing kept) is loaded at start, so an allocator built on a journal that
    holds state continues exactly where the last one stopped. `clock` gives the time actions are stamped with
    (the simulator's clock in a simulation).
    """

    def __init__(self, cluster: Cluster | Iterable[Node] | None = None, policy: Policy | str = "hint",
                 hints: HintSet | HintSource | None = None, journal: Journal | None = None,
                 clock: Callable[[], float] = time.time, retain: int = RETAIN) -> None:
        self.cluster = cluster if isinstance(cluster, Cluster) else Cluster(cluster or ())
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        self.hint_source: HintSource = hints if not (hints is None or isinstance(hints, HintSet)) \
            else StaticHints(hints)
        self.lock = threading.RLock()
        self.journal: Journal = journal if journal is not None else MemoryJournal()
        self.clock = clock
        self.log = ActionLog(retain)
        self._gangs: dict[str, tuple[str, ...]] = {}  # job id -> the ids of its parts, for jobs running as gangs
        self._touched: set[str] = set()  # nodes whose allocations changed since the last rebalance
        self.history: dict[str, MoveHistory] = {}  # job id -> its moves, for the stability rule
        self.submissions: dict[str, dict] = {}  # job id -> what the scheduler keeps of it (`record_jobs`)
        self._restore(self.journal.load(retain))

    @property
    def synchronous(self) -> Synchronous:
        """How a change is made durable before it is answered (`AllocatorAPI.synchronous`)."""
        return self.journal.synchronous

    @property
    def hints(self) -> HintSet:
        return self.hint_source.current()

    def _restore(self, restored: Restored) -> None:
        """Rebuild the state a journal holds (nothing for a new one)."""
        self.submissions = dict(restored.jobs)
        if not (restored.nodes or restored.latest):
            return
        if len(self.cluster):
            raise StateError("an allocator restored from its journal starts with no nodes of its own")
        for node in restored.nodes:
            self.cluster.add_node(node)
        gangs: dict[str, list[str]] = {}
        for owner, a in restored.allocations:
            self.cluster.apply(a)  # refuses (OvercommitError) a journal that would overcommit
            if owner is not None:
                gangs.setdefault(owner, []).append(a.job_id)
        self._gangs = {job: tuple(parts) for job, parts in gangs.items()}
        self._touched = set(restored.touched)
        self.history = {job: MoveHistory.from_dict(h) for job, h in restored.history.items()}
        self.log = ActionLog(self.log.retain, restored.latest, restored.logged)

    # ------------------------------------------------------------------ decisions

    def allocate(self, job: Job) -> Decision:
        """Place `job`, or say why not. Asking again for an allocated job id returns its allocation unchanged (a
        gang: its first part). A job larger than any node runs as a gang over nodes of one GPU type, all or nothing.

        With a co-adaptive policy this is `admit([job])`: the step the simulator runs between rounds."""
        with self.lock:
            decision = self._existing(job)
            if decision is not None:
                return decision
            if self.policy.rounds is not None and job.whole:
                self.admit([job])
            elif job.part_gpus is not None:  # fixed parts: a gang even where one node could hold it all
                decision = None
                if self._gang_sized(job):
                    self.place_gangs([job])
            else:
                decision = self.policy.place(job, self.cluster, self.hint_source.current())
                if isinstance(decision, Allocation):
                    self._commit([Action("start", job.job_id, (), (decision,))], apply=True)
                    return decision
                if self._gang_sized(job):
                    self.place_gangs([job])
            parts = self.running([job.job_id]).get(job.job_id)
            return parts[0] if parts else self._rejection(job, decision)

    def adopt(self, job: Job, node: str, unbound: Collection[str] = ()) -> Decision:
        """Give `job`, whose pod already runs on `node` with its own request, an allocation there: that request (the
        floor), which the next re-sizing step grows toward its hinted share. For pods that took the default path
        (the allocator had no room when they were created, or could not be reached) and that Kubernetes placed
        since. Asking again for a job that holds resources answers as `allocate` does.

        `unbound`: jobs none of whose pods is bound to a node yet (the caller reads the cluster's pods). A pod that
        runs holds its room whatever the allocator thinks; an allocation whose pod is not bound holds nothing yet.
        So where `node` has no room for the running pod, the newest of those jobs' allocations there give theirs
        back (`_adopt_over`), never an overcommit."""
        with self.lock:
            decision = self._existing(job)
            if decision is not None:
                return decision
            hints = self.hint_source.current()
            if node not in self.cluster or not job.whole:
                why = f"unknown node {node!r}" if node not in self.cluster else "a GPU share is not adopted"
                return Rejection(job.job_id, Reason.TOO_BIG, why, hints.version, self.policy.name)
            fit = self._fit_floor(job, node)
            if fit is None:
                victims = self._victims(job, node, unbound)
                if victims is not None:
                    return self._adopt_over(job, node, victims, hints)
                return Rejection(job.job_id, Reason.NO_CAPACITY, f"node {node} has not {job.num_gpus} GPUs, "
                                 f"{job.cpu_m or 0}m cores and {job.mem_mib or 0} MiB free", hints.version,
                                 self.policy.name)
            a = self._adopted(job, fit, hints)
            self._commit([Action("start", job.job_id, (), (a,))], apply=True)
            return a

    def _fit_floor(self, job: Job, node: str) -> Fit | None:
        floor = (job.cpu_m or 0, job.mem_mib or 0)
        return self.cluster.fit_on(node, job.num_gpus, lambda shape: floor)

    def _adopted(self, job: Job, fit: Fit, hints: HintSet) -> Allocation:
        return Allocation(job.job_id, job.model, fit.node, fit.gpu_type, job.num_gpus, fit.cpu_m, fit.mem_mib,
                          hints.version, self.policy.name, "reduced", request_cpu_m=job.cpu_m,
                          request_mem_mib=job.mem_mib)

    def _victims(self, job: Job, node: str, unbound: Collection[str]) -> list[Allocation] | None:
        """The newest allocations on `node` of jobs in `unbound` (whole GPUs, not a gang's part), as few as hold
        `job`'s GPUs and floor with what is free there; None when all of them would not (or the node is closed)."""
        if not unbound or not self.cluster.node(node).open:
            return None
        parts = {p for gang in self._gangs.values() for p in gang}
        free = self.cluster.free(node)
        gpus, cpu_m, mem_mib = free.gpus, free.cpu_m, free.mem_mib
        taken: list[Allocation] = []
        for a in reversed(self.cluster.allocations()):
            if a.node != node or a.job_id not in unbound or a.job_id in parts or a.gpu_milli \
                    or a.job_id == job.job_id:
                continue
            taken.append(a)
            gpus, cpu_m, mem_mib = gpus + a.gpus, cpu_m + a.cpu_m, mem_mib + a.mem_mib
            if gpus >= job.num_gpus and cpu_m >= (job.cpu_m or 0) and mem_mib >= (job.mem_mib or 0):
                return taken
        return None

    def _adopt_over(self, job: Job, node: str, victims: Sequence[Allocation], hints: HintSet) -> Allocation:
        """Adopt `job` on `node` in the room of `victims` (`_victims`), as one change: each victim placed again
        where the policy puts it now (`migrate`), else stopped (its pod, not bound, waits to be placed again)."""
        self._apply([Action("stop", v.job_id, (v,), ()) for v in victims])
        applied: list[Allocation] = []
        try:
            fit = self._fit_floor(job, node)
            if fit is None:
                raise StateError(f"{job.job_id}: no room on {node} after taking back {len(victims)} allocation(s)")
            a = self._adopted(job, fit, hints)
            self.cluster.apply(a)
            applied.append(a)
            actions = [Action("start", job.job_id, (), (a,))]
            for v in victims:
                again = self.policy.place(v.job(), self.cluster, hints)
                if not isinstance(again, Allocation):
                    actions.append(Action("stop", v.job_id, (v,), ()))
                    continue
                self.cluster.apply(again)
                applied.append(again)
                actions.append(Action("migrate" if again.node != v.node else "resize", v.job_id, (v,), (again,)))
        except BaseException:
            self._undo(victims, applied)
            raise
        self._commit(actions)  # its victims were never bound: nothing to checkpoint, their pods wait Pending
        return a

    def decide(self, job: Job) -> Decision:
        """What a placement-only `allocate` would return, without applying it (the policy's own answer)."""
        with self.lock:
            return self._existing(job) or self.policy.place(job, self.cluster, self.hint_source.current())

    def _existing(self, job: Job) -> Decision | None:
        """For a job id that holds resources: its allocation (its first part), or a `conflict` rejection if asked
        for another class or another own request; None for a job id that holds none."""
        parts = self.running([job.job_id]).get(job.job_id)
        if not parts:
            return None
        first = parts[0]
        differences = replace(first, gpus=sum(a.gpus for a in parts)).differences(job)
        if not differences:
            return first
        return Rejection(job.job_id, Reason.CONFLICT, f"job id already allocated on {first.node} for another "
                         f"request: {'; '.join(differences)}", first.hint_version, self.policy.name)

    def _gang_sized(self, job: Job) -> bool:
        """Larger than any node (or of fixed parts no larger than some node), yet no larger than all the GPUs of
        some GPU type: a gang could hold it."""
        largest = self.cluster.max_gpus()
        bigger = job.num_gpus > largest if job.part_gpus is None else job.part_gpus <= largest
        return job.whole and bigger and job.num_gpus <= max(self.cluster.gpus_by_type()[0].values(), default=0)

    def why_not(self, job: Job) -> Rejection:
        """Why `job` cannot start now, as `allocate` would say it (`too-big`: never, on these nodes)."""
        with self.lock:
            return self._rejection(job, None)

    def _rejection(self, job: Job, decision: Decision | None) -> Rejection:
        """Why `job` did not start: the policy's reason, except that a gang-sized job is not too big."""
        hints = self.hint_source.current()
        if decision is None:
            decision = self.policy.place(job, self.cluster, hints)
        gang = self._gang_sized(job)
        if job.part_gpus is not None and gang and not self.cluster.could_hold(
                job.part_gpus, -(-(job.cpu_m or 0) // job.parts), -(-(job.mem_mib or 0) // job.parts)):
            return Rejection(job.job_id, Reason.TOO_BIG, f"asks {(job.cpu_m or 0) / 1000 / job.parts:g} cores and "
                             f"{mib_to_gib(job.mem_mib or 0) / job.parts:g} GiB with each part of {job.part_gpus} "
                             "GPUs; no node has that much", hints.version, self.policy.name)
        if isinstance(decision, Rejection) and not (gang and decision.reason is Reason.TOO_BIG):
            return decision
        if gang:
            message = f"no {job.num_gpus} free GPUs of one GPU type with at least its floor free (a gang)"
        else:
            message = "no node has the GPUs free with at least its floor of cores and RAM"
        return Rejection(job.job_id, Reason.NO_CAPACITY, message, hints.version, self.policy.name)

    def admit(self, waiting: Sequence[Job]) -> list[Action]:
        """Start waiting jobs (priority order) without stopping or moving running ones; returns what changed.

        The one admission rule between rounds, for the simulator and the service alike. A co-adaptive policy places
        them in one step (comparative advantage; gangs for jobs larger than a node); jobs that still wait where
        GPUs are free but cores are not get a second step in which the peers on those nodes may shrink to their
        floors (Synergy-TUNE). A placement-only policy places each where `allocate` would."""
        with self.lock:
            if self.policy.rounds is None:
                placed: list[Action] = []
                for job in waiting:
                    before = self.log.latest
                    if isinstance(self.allocate(job), Allocation):
                        placed += [x.action for x in self.log.since(before)]
                return placed
            waiting = contenders(waiting, self.cluster.free_gpus_total())  # the rest could not start: skipped
            actions = self.rebalance(waiting, preempt=False, move=False, nodes=())
            started = {x.job_id for x in actions if x.kind == "start"}
            left = [job for job in waiting if job.job_id not in started and job.whole]
            smallest = min((job.num_gpus for job in left), default=0)
            if left and smallest <= self.cluster.free_gpus_total():
                peers = self.jobs_on(self.cluster.with_free_gpus(None, smallest))
                if peers:
                    actions += self.rebalance(peers + left, preempt=False, move=False, nodes=())
            return actions

    def jobs_on(self, nodes: Iterable[str]) -> list[Job]:
        """The jobs holding resources on `nodes` (in that order, each once; a gang as one job, all its GPUs)."""
        with self.lock:
            owner = {p: job for job, parts in self._gangs.items() for p in parts} if self._gangs else {}
            ids = dict.fromkeys(owner.get(a, a) for node in nodes for a in self.cluster.jobs_on(node))
            return [self._job(job_id, parts) for job_id, parts in self.running(ids).items()]

    def restore(self, allocation: Allocation) -> bool:
        """Re-apply a released allocation if its node still has room for it (and the job holds none);
        preemptive schedulers use this to keep a job where it ran. False, and nothing changes, otherwise."""
        with self.lock:
            try:
                self._commit([Action("start", allocation.job_id, (), (allocation,))], apply=True)
            except OvercommitError:
                return False
            return True

    def running_jobs(self) -> list[Job]:
        """The jobs holding resources, in the order they got them: the service's priority order for rebalancing.
        A gang is one job (all its GPUs)."""
        with self.lock:
            return [self._job(job_id, parts) for job_id, parts in self.running().items()]

    @staticmethod
    def _job(job_id: str, parts: tuple[Allocation, ...]) -> Job:
        return parts[0].job(job_id, sum(a.gpus for a in parts))

    def touched(self) -> set[str]:
        """The nodes changed since the last applied step that re-sized them."""
        with self.lock:
            return set(self._touched)

    def release(self, job_id: str) -> Allocation | None:
        """Free a job's resources; None when the job holds none (releasing twice is harmless). For a gang,
        every part is released and the first returned (`release_parts` returns them all)."""
        parts = self.release_parts(job_id)
        return parts[0] if parts else None

    def release_parts(self, job_id: str, final: bool = True) -> tuple[Allocation, ...]:
        """Free a job's resources on every node it holds (one for most jobs, several for a gang). `final`: the job
        is done (its history and its submission go); else it is preempted and waits to run again. `ValueError` for
        no job id (`spec.check_job_id`: a gang's part is released with its gang, never alone)."""
        check_job_id(job_id)
        with self.lock:
            parts = self.running([job_id]).get(job_id, ())
            if parts:
                jobs = {job_id: None} if final and job_id in self.submissions else {}
                self._commit([Action("stop", job_id, parts, ())], apply=True, forget=final, jobs=jobs,
                             preempting=not final)
            return parts

    def record_jobs(self, jobs: dict[str, dict | None]) -> None:
        """Keep (or, with None, drop) what the scheduler needs of jobs to resume after a restart: journaled with
        the allocations, and given back in `submissions` by an allocator restored from the journal."""
        with self.lock:
            self._commit([], jobs=jobs)

    def running(self, job_ids: Iterable[str] | None = None) -> dict[str, tuple[Allocation, ...]]:
        """Jobs holding resources (all, or those of `job_ids`) -> their allocations (one per node; a gang's
        parts in order). A gang's part (`<job id>#<k>`) is no job: asked for one, it answers nothing."""
        with self.lock:
            if job_ids is not None:
                out = {}
                table, gangs = self.cluster.allocation_table(), self._gangs
                for job_id in job_ids:
                    gang = gangs.get(job_id)
                    if gang is None:
                        a = table.get(job_id)
                        if a is not None and GANG_SEP not in job_id:
                            out[job_id] = (a,)
                        continue
                    parts = tuple(a for a in map(table.get, gang) if a is not None)
                    if parts:
                        out[job_id] = parts
                return out
            parts_of = {p: job for job, parts in self._gangs.items() for p in parts}
            grouped: dict[str, list[Allocation]] = {}
            for a in self.cluster.allocations():
                grouped.setdefault(parts_of.get(a.job_id, a.job_id), []).append(a)
            return {job: tuple(sorted(parts, key=lambda a: a.job_id)) if job in self._gangs else tuple(parts)
                    for job, parts in grouped.items()}

    def place_gangs(self, jobs: Sequence[Job]) -> list[Action]:
        """Jobs larger than any node (priority order), each over nodes of one GPU type, all or nothing, the
        GPU-proportional share (or the hinted one) on each part; returns the starts, applied. Co-adaptive
        policies do this in `rebalance`; this gives placement-only policies and the baselines the same gangs.
        Running jobs are not touched."""
        with self.lock:
            rounds = self.policy.rounds or CoAdaptive(name=self.policy.name)
            target = rounds.target(jobs, self.cluster, self.hint_source.current(), {}, (), preempt=False, move=False)
            actions = diff({}, target)
            self.apply_actions(actions, clear_touched=False)
            return actions

    def reconfigure(self, choices: Sequence[tuple[Job, str | None]]) -> tuple[list[Action], list[str]]:
        """An elastic round's mechanism (`hetplan.allocator.step.reconfigure`): each job of `choices` on its chosen
        GPU type with its chosen count (`num_gpus`), or stopped (type None); applied, journaled as preemptions
        where jobs stop. Returns the actions and the jobs that did not get their choice (no room: kept or waiting).
        Jobs running but not in `choices` stay as they are."""
        with self.lock:
            rounds = self.policy.rounds or CoAdaptive(name=self.policy.name)
            order = [job for job, _ in choices]
            current = self.running(job.job_id for job in order)
            with self.cluster.trial():
                state = StepState(rounds, order, self.cluster, self.hint_source.current(), current, set(),
                                  preempt=True, move=True, history=self.history, now=self.clock())
                target, short = reconfigure(state, choices)
                self.cluster.keep_trial()
            actions = [rescaled(x) for x in diff(current, target)]
            self.cluster.settle([a.job_id for action in actions for a in action.before],
                                [a for action in actions for a in action.after])
            self._commit(actions, preempting=True)
            return actions, short

    def scaled_job(self, job_id: str, parts: int) -> Job:
        """The running gang of fixed parts `job_id` as a request of `parts` parts (each part's own request kept).
        `UnknownJob` if it holds nothing, `NotAGang` if it is no gang of fixed parts, `ValueError` naming `parts`
        for a count it can never have (below 2, more than `MAX_GPUS` GPUs in all)."""
        check_job_id(job_id)
        with self.lock:
            held = self.running([job_id]).get(job_id)
            if not held:
                raise UnknownJob(f"job {job_id} holds no resources")
            size = held[0].part_gpus
            if size is None:
                raise NotAGang(f"job {job_id} is no gang of fixed parts (it was allocated without `parts`)")
            if isinstance(parts, bool) or not isinstance(parts, int) or not 2 <= parts <= MAX_GPUS // size:
                raise ValueError(f"parts must be a whole number from 2 to {MAX_GPUS // size} (parts of {size} GPUs, "
                                 f"at most {MAX_GPUS} in all), got {parts!r}")
            first, old = held[0], len(held)
            cpu_m = None if first.request_cpu_m is None else first.request_cpu_m // old * parts
            mem_mib = None if first.request_mem_mib is None else first.request_mem_mib // old * parts
            return Job(job_id, first.model, size * parts, 0, cpu_m, mem_mib, size)

    def scale(self, job_id: str, parts: int, jobs: Mapping[str, dict | None] | None = None) -> Scaled:
        """Change a running gang of fixed parts to `parts` parts, all or nothing, as one `resize` action whose
        `after` holds every part: parts 0..parts-1 kept where and as they are (their job's request now the new
        count's), the new ones placed as the gang's were (nodes of its GPU type, each part whole on one node, the
        new count's share); a shrink drops the highest-numbered parts. Where the new parts do not fit, nothing
        changes and `rejection` says why. `jobs`: the scheduler's submissions to journal with it (`record_jobs`).
        Errors as `scaled_job`."""
        with self.lock:
            job = self.scaled_job(job_id, parts)
            held = tuple(sorted(self.running([job_id])[job_id], key=part_number))
            if len(held) == parts:
                return Scaled(held, False)
            kept = tuple(replace(a, request_cpu_m=job.cpu_m, request_mem_mib=job.mem_mib) for a in held[:parts])
            added: tuple[Allocation, ...] = ()
            if parts > len(held):
                hints = self.hint_source.current()
                rounds = self.policy.rounds or CoAdaptive(name=self.policy.name)
                with self.cluster.trial():  # planned on a trial, undone: applied below as one action
                    state = StepState(rounds, [], self.cluster, hints, {}, set(), preempt=False, move=False)
                    if grow_fixed_gang(state, job, held[0].gpu_type, len(held)):
                        added = tuple(sorted(state.placed[job_id], key=part_number))
                if not added:
                    return Scaled(held, False, Rejection(
                        job_id, Reason.NO_CAPACITY, f"no room for {parts - len(held)} more parts of "
                        f"{job.part_gpus} GPUs on {held[0].gpu_type} nodes with at least their floor free; the "
                        f"gang keeps its {len(held)} parts", hints.version, self.policy.name))
            after = kept + added
            self._commit([Action("resize", job_id, held, after)], apply=True, jobs=jobs)
            return Scaled(after, True)

    def note(self, kind: str, job_id: str, note: Note) -> tuple[LoggedAction, bool]:
        """Append the note `kind` (`actions.NOTE_KINDS`) about action `note.of` of `job_id` to the log, journaled;
        nothing changes hands. Idempotent: the same note (kind, job, action, pod) kept in the log already is
        answered again, not appended twice (a controller restarted after reporting reports again), as long as the
        log still keeps the action it is about (`HETPLAN_ALLOCATOR_ACTION_LOG`, 10,000 by default: the controller
        reports within seconds, so a repeat after more actions than that is not looked for). The note and
        whether it was appended now; `ValueError` naming the field for a kind that is no note or an action number
        the log has not reached."""
        check_job_id(job_id)
        if kind not in NOTE_KINDS:
            raise ValueError(f"kind must be one of {', '.join(NOTE_KINDS)}, got {kind!r}")
        with self.lock:
            if not 1 <= note.of <= self.log.latest:
                raise ValueError(f"of must be an action number from 1 to {self.log.latest}, got {note.of}")
            for x in reversed(self.log.entries()):
                if x.seq <= note.of:
                    break  # a note comes after the action it is about
                if x.note is not None and (x.action.kind, x.action.job_id, x.note.of, x.note.pod) == \
                        (kind, job_id, note.of, note.pod):
                    return x, False
            said = Action(kind, job_id, (), ())  # type: ignore[arg-type] - a kind of NOTE_KINDS
            x = LoggedAction(self.log.latest + 1, self.clock(), said, note=note)
            if type(self.journal) is not MemoryJournal:
                self.journal.commit(Change(logged=(x,)), self.log.retain)
            self.log.extend((x,))
            return x, True

    def tick(self) -> list[Action]:
        """The periodic step of a running service: every running job, in the order it got its resources, may be
        re-sized or moved to a faster GPU type (no preemption: the service never stops a job)."""
        with self.lock:
            return self.rebalance(self.running_jobs(), preempt=False, move=True)

    def plan_rebalance(self, order: Sequence[Job], preempt: bool = True, move: bool = True,
                       nodes: Iterable[str] | None = None) -> list[Action]:
        """The actions of one co-adaptive step (`hetplan.allocator.rebalance`) for the jobs in `order` (priority
        order, running and waiting), without applying them. Jobs running but not in `order` stay as they are.
        `nodes`: the nodes to re-size (default: every node changed since the last applied step).
        A policy without rounds (`hint-static`, the baselines) plans nothing."""
        return self._step(order, preempt, move, nodes, apply=False)

    def rebalance(self, order: Sequence[Job], preempt: bool = True, move: bool = True,
                  nodes: Iterable[str] | None = None) -> list[Action]:
        """Plan one co-adaptive step and apply it; returns what changed.

        The cluster ends as `plan_rebalance` then `apply_actions` would leave it, allocations in the same
        order, but the step's trial is kept instead of undone and redone."""
        return self._step(order, preempt, move, nodes, apply=True)

    def _step(self, order: Sequence[Job], preempt: bool, move: bool, nodes: Iterable[str] | None,
              apply: bool) -> list[Action]:
        with self.lock:
            rounds = self.policy.rounds
            if rounds is None:
                return []
            current = self.running(job.job_id for job in order)
            touched = self._touched if nodes is None else set(nodes)
            target = rounds.target(order, self.cluster, self.hint_source.current(), current, touched, preempt, move,
                                   keep=apply, history=self.history, now=self.clock())
            actions = diff(current, target)
            if apply:
                self.cluster.settle([a.job_id for action in actions for a in action.before],
                                    [a for action in actions for a in action.after])
                self._commit(actions, clear_touched=nodes is None, preempting=True)
            return actions

    def apply_actions(self, actions: Sequence[Action], clear_touched: bool = True, preempting: bool = False) -> None:
        """Release everything the actions take away, then apply what they give; all or nothing. `preempting`: their
        stops are preemptions (the jobs wait to run again), as the action log says."""
        with self.lock:
            self._commit(actions, clear_touched, apply=True, preempting=preempting)

    # ------------------------------------------------------------------ the one apply point

    def _commit(self, actions: Sequence[Action], clear_touched: bool = False, apply: bool = False,
                forget: bool = False, upsert: Sequence[Node] = (), remove: Sequence[str] = (),
                jobs: Mapping[str, dict | None] | None = None, preempting: bool = False) -> None:
        """Apply `actions` in memory (`apply`; else the caller already did), journal them with the node changes
        (applied after the journal took them: `check_node_changes` said they cannot fail), then book them: gangs,
        the nodes to re-size next, move histories (`stability.record`; `forget`: stopped jobs are gone for good,
        their histories dropped), the scheduler's submissions (`jobs`) and the log (`preempting`: its stops are
        preemptions, the jobs wait to run again). All or nothing: if applying or journaling fails, memory is as
        before and the error raised."""
        if apply:
            self._apply(actions)
        now = self.clock()
        logged = self.log.number(actions, now, self.history, not preempting) if actions else ()
        history = {a.job_id: self.history[a.job_id] for a in actions if a.job_id in self.history}
        record(history, actions, now)
        histories: dict[str, MoveHistory | None] = {a.job_id: history.get(a.job_id) for a in actions}
        if forget:
            histories.update((a.job_id, None) for a in actions if a.kind == "stop")
        gangs: dict[str, tuple[str, ...] | None] = {}
        for action in actions:
            gang = len(action.after) > 1 or (action.after and action.after[0].job_id != action.job_id)
            gangs[action.job_id] = tuple(a.job_id for a in action.after) if gang else None
        touched = frozenset(a.node for action in actions for a in action.before + action.after
                            if a.node not in remove) if not clear_touched else frozenset()
        if type(self.journal) is not MemoryJournal:  # it keeps nothing and never refuses: no change to write
            change = Change(taken=tuple(a.job_id for action in actions for a in action.before),
                            given=tuple((action.job_id if gangs[action.job_id] else None, a)
                                        for action in actions for a in action.after),
                            upsert=tuple(upsert), remove=tuple(remove), touched_clear=clear_touched,
                            touched_add=touched, logged=logged,
                            history={job: None if h is None else h.to_dict() for job, h in histories.items()},
                            jobs=dict(jobs or {}))
            try:
                self.journal.commit(change, self.log.retain)
            except BaseException:
                self._unapply(actions)
                raise
        for name in remove:
            self.cluster.remove_node(name, force=True)
            self._touched.discard(name)
        for node in upsert:
            self.cluster.upsert_node(node)
        for job_id, gang in gangs.items():
            if gang:
                self._gangs[job_id] = gang
            else:
                self._gangs.pop(job_id, None)
        if clear_touched:
            self._touched.clear()
        self._touched |= touched
        for job_id, h in histories.items():
            if h is None:
                self.history.pop(job_id, None)
            else:
                self.history[job_id] = h
        self.log.extend(logged)
        for job_id, body in (jobs or {}).items():
            if body is None:
                self.submissions.pop(job_id, None)
            else:
                self.submissions[job_id] = body

    def _apply(self, actions: Sequence[Action]) -> None:
        """Release what the actions take, then apply what they give; on an error undo what was done and raise."""
        released: list[Allocation] = []
        applied: list[Allocation] = []
        try:
            for action in actions:
                for a in action.before:
                    if self.cluster.release(a.job_id) is None:
                        raise OvercommitError(f"{action.job_id}: {a.job_id} is not allocated")
                    released.append(a)
            for action in actions:
                for a in action.after:
                    self.cluster.apply(a)
                    applied.append(a)
        except StateError:
            self._undo(released, applied)
            raise

    def _unapply(self, actions: Sequence[Action]) -> None:
        """Undo applied actions in memory (the journal refused them)."""
        self._undo([a for action in actions for a in action.before], [a for action in actions for a in action.after])

    def _undo(self, released: Sequence[Allocation], applied: Sequence[Allocation]) -> None:
        for a in reversed(applied):
            self.cluster.release(a.job_id)
        for a in released:
            self.cluster.apply(a)

    def change_nodes(self, changes: NodeChanges) -> list[Allocation]:
        """Apply a batch of node changes atomically; return the allocations evicted by forced removals (a gang
        with a part on a removed node is released whole).

        Raises `StateError` (and changes nothing) if any change would be refused.
        """
        with self.lock:
            self.check_node_changes(changes)
            parts_of = {p: job for job, parts in self._gangs.items() for p in parts}
            evicted = self.running(dict.fromkeys(parts_of.get(a, a) for name in changes.remove
                                                 for a in self.cluster.jobs_on(name)))
            actions = [Action("stop", job, parts, ()) for job, parts in evicted.items()]
            self._commit(actions, apply=True, forget=True, upsert=changes.upsert, remove=changes.remove)
            return [a for parts in evicted.values() for a in parts]

    def check_node_changes(self, changes: NodeChanges) -> None:
        counts = Counter([n.name for n in changes.upsert] + list(changes.remove))
        repeated = sorted(n for n, c in counts.items() if c > 1)
        if repeated:
            raise StateError(f"node named more than once in one change: {', '.join(repeated)}")
        for name in changes.remove:
            self.cluster.check_remove(name, changes.force)
        for node in changes.upsert:
            if node.name in self.cluster:
                self.cluster.check_update(node)

    def upsert_node(self, node: Node) -> None:
        self.change_nodes(NodeChanges(upsert=[node]))

    def remove_node(self, name: str, force: bool = False) -> list[Allocation]:
        return self.change_nodes(NodeChanges(remove=[name], force=force))

    def reload_hints(self) -> HintSet:
        return self.hint_source.reload()

    def close(self) -> None:
        """Close the journal (nothing to do for one in memory)."""
        with self.lock:
            self.journal.close()

    def __enter__(self) -> Allocator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

