"""The loop as the service runs it: submissions queue instead of being refused, and everything survives a restart.

`OnlineScheduler` wraps `Scheduler` over the service's allocator (a `DurableAllocator`): a submission is recorded
in the allocator's journal before it is placed, attained service and restarts are kept with each job's move history
(committed with every start, stop and change), so a service killed at any point resumes with the same queue in the same order. Changes
the scheduler did not make (a pod adopted, a node removed with its jobs, a peer's room taken back) are read from the
allocator's action log at the next call and booked (`_sync`): a stopped job waits again, an adopted one runs.

With an `Elastic` (`hetplan serve --scaling-models`) the rounds are the simulator's elastic rounds: every job gets
a GPU type and a count within its bounds (`Bounds`, journaled with its submission; a rigid job's are its request),
jobs start only at rounds, and a count change is a `resize` action whose parts differ in number (a gang of fixed
parts: the controller's rescale). Without one, bounds are kept but ignored (the job runs at its requested count).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Literal

from hetplan.allocator.core import Allocator, NotAGang, Scaled
from hetplan.allocator.journal import LoggedAction, TooOld
from hetplan.allocator.spec import Allocation, Job, Reason, Rejection
from hetplan.scheduler.elastic import Elastic
from hetplan.scheduler.inbox import Inbox
from hetplan.scheduler.loop import Scheduler
from hetplan.scheduler.orders import NEEDS_DURATION, Order
from hetplan.scheduler.state import JobState

log = logging.getLogger(__name__)

Why = Literal["no-room", "lower-priority", "gang-waiting", "busy"]
"""Why a job waits: no node has its GPUs (and floor) free; jobs ahead of it in the order take the room there is; it
needs a gang (more GPUs than any node) and not enough GPUs of one type are free at once; or the scheduler was busy
(a round) when it came: it is recorded (`hetplan.scheduler.inbox`) and takes its place when the round ends."""


@dataclass(frozen=True)
class Bounds:
    """An elastic job's GPU bounds (all parts together) and what a change of count costs it (seconds)."""

    min_gpus: int
    max_gpus: int
    restart_s: float = 30.0


class Conflict(ValueError):
    """A submission under a known job id with another request (the service answers 409)."""


@dataclass(frozen=True)
class Submitted:
    """What a submission got: `allocated` (its parts), `queued` (its place and why) or `rejected` (never runnable)."""

    status: Literal["allocated", "queued", "rejected"]
    job_id: str
    parts: tuple[Allocation, ...] = ()
    position: int | None = None
    why: Why | None = None
    rejection: Rejection | None = None
    replayed: bool = False  # the job id was known: the answer is its state, nothing changed

    @property
    def message(self) -> str:
        if self.rejection is not None:
            return self.rejection.message
        if self.why is None:
            return ""
        return {"no-room": "no node has its GPUs with its floor of cores and RAM free",
                "lower-priority": "jobs ahead of it in the order take the room there is",
                "gang-waiting": "it needs more GPUs than any node has, or is of several parts: it waits for enough "
                                "of one GPU type",
                "busy": "a scheduling round was running: the job is recorded and takes its place in the queue when "
                        "the round ends"}[self.why]


@dataclass(frozen=True)
class Waiting:
    """A queued job as `GET /v1/queue` lists it."""

    job_id: str
    model: str
    num_gpus: int
    position: int
    why: Why
    arrival: float
    attained_gpu_s: float


class OnlineScheduler:
    """The queue, the order and the rounds over a service's allocator (the module docstring). Every method holds
    the allocator's lock. `regrow`: after a release, the jobs on the freed nodes grow into what it left at once
    (else at the next round, as the simulator does)."""

    def __init__(self, allocator: Allocator, order: Order = "las", round_s: float = 300.0, regrow: bool = True,
                 clock: Callable[[], float] | None = None, elastic: Elastic | None = None,
                 inbox: Inbox | None = None) -> None:
        if order in NEEDS_DURATION:
            raise ValueError(f"the service cannot order by {order!r}: it is told no durations (use fifo or las)")
        self.allocator = allocator
        self.loop = Scheduler(allocator, order, round_s, elastic=elastic)
        self.regrow = regrow
        self.clock = clock or allocator.clock
        self.inbox = inbox
        self._draining = False
        self._handing = threading.Lock()  # guards the two below
        self._hand_over_thread: threading.Thread | None = None
        self._again = False
        self._largest = 0  # GPUs of the largest GPU type, as of the last look under the lock (`park` reads it)
        with allocator.lock:
            self._next = 0
            self._seen = allocator.log.latest
            self._resume()
            self._enter()

    # ------------------------------------------------------------------ the API

    def submit(self, job: Job, bounds: Bounds | None = None) -> Submitted:
        """Queue `job` and start what can start now; asking again for a known id answers its state (a 409
        `Conflict` if the request, or its elastic `bounds`, differ)."""
        with self.allocator.lock:
            self._enter()
            return self._submit(job, self.clock(), bounds)

    def park(self, job: Job, bounds: Bounds | None = None) -> Submitted | None:
        """Without the allocator's lock (the caller could not take it in time): record `job` in the inbox and
        answer `queued` (why `busy`); None where the inbox cannot take it (no inbox, a share or CPU-only job, a
        known job id, more GPUs than any type has, elastic `bounds`, which are checked against the cluster under
        the lock, or a job refused when it was handed over, which is judged anew): the caller then waits for the
        lock and `submit`s."""
        if (self.inbox is None or bounds is not None or not job.whole or job.num_gpus > self._largest
                or job.job_id in self.loop.by_id):
            return None
        parked = self.inbox.put(job, self.clock())
        if parked.rejected is not None:  # refused when it was handed over: asked again, it is judged anew, now
            self.inbox.forget(job.job_id)
            return None
        differences = _differences(parked.job, job)
        if differences:
            raise Conflict(f"job {job.job_id} waits to be queued for another request: {'; '.join(differences)}")
        self._hand_over_soon()
        return Submitted("queued", job.job_id, why="busy")

    def _hand_over_soon(self) -> None:
        """Make sure the inbox is handed over as soon as the lock is free, whether or not another call comes: one
        thread at a time waits for the lock (`_hand_over`); a park while it runs asks it for one more pass."""
        with self._handing:
            if self._hand_over_thread is not None:
                self._again = True
                return
            self._hand_over_thread = threading.Thread(target=self._hand_over, name="inbox-hand-over", daemon=True)
            self._hand_over_thread.start()

    def _hand_over(self) -> None:
        while True:
            try:
                with self.allocator.lock:
                    self._enter()
            except Exception:  # noqa: BLE001 - a fault barrier: the next call under the lock hands over again
                log.exception("handing the inbox over failed; the next call tries again")
            with self._handing:
                if not self._again:
                    self._hand_over_thread = None
                    return
                self._again = False

    def _submit(self, job: Job, arrival: float, bounds: Bounds | None = None) -> Submitted:
        """`submit` under the lock, of a job that came at `arrival` (now, or when it was parked)."""
        a = self.allocator
        if bounds is not None and bounds.min_gpus == bounds.max_gpus == job.num_gpus:
            bounds = None  # rigid
        known = self.loop.by_id.get(job.job_id)
        if known is not None and not known.parts:
            differences = _differences(known.request, job) + _bound_differences(known, bounds)
            if differences:
                raise Conflict(f"job {job.job_id} waits in the queue for another request: "
                               f"{'; '.join(differences)}")
            return self._answer(known, replayed=True)
        held = bool(a.running([job.job_id]))
        if not job.whole or held:  # shares and CPU-only jobs are placed, never queued
            decision = a.allocate(job)
            self._sync()
            return self._placed(job, decision, replayed=held)
        largest_type = max(a.cluster.gpus_by_type()[0].values(), default=0)
        if job.num_gpus > largest_type:
            return Submitted("rejected", job.job_id, rejection=Rejection(
                job.job_id, Reason.TOO_BIG, f"{job.num_gpus} GPUs: no GPU type has that many in open nodes",
                a.hints.version, a.policy.name))
        if bounds is not None and self.loop.elastic is None:
            log.warning("job %s asks for %d-%d GPUs (elastic) but the service has no scaling models "
                        "(--scaling-models): it runs at its requested %d", job.job_id, bounds.min_gpus,
                        bounds.max_gpus, job.num_gpus)
        state = JobState(self._next, job, arrival, bounds=None if bounds is None else
                         (bounds.min_gpus, bounds.max_gpus), restart_s=30.0 if bounds is None else bounds.restart_s)
        self._next += 1
        a.record_jobs({job.job_id: _body(state)})
        now = self.clock()
        self.loop.submit(state, now)
        self.loop.fill(now)
        self._seen = a.log.latest
        if not state.parts:
            never = self.loop.guarded(state, "judging", self._never, job)  # a fault: it waits, logged
            if never is not None:  # no node of any type could ever hold its floor: refused, not queued
                self.loop.forget(job.job_id)
                a.record_jobs({job.job_id: None})
                return Submitted("rejected", job.job_id, rejection=never)
        return self._answer(state)

    def release(self, job_id: str) -> tuple[tuple[Allocation, ...], bool]:
        """A job is done or gone: its resources go back (what it freed is given to the queue at once), or it leaves
        the queue. Returns (the parts it held, whether it was dequeued)."""
        a = self.allocator
        with a.lock:
            self._enter()
            now = self.clock()
            state = self.loop.by_id.get(job_id)
            if state is not None and state.idx in self.loop.queue:
                self.loop.forget(job_id)
                a.record_jobs({job_id: None})
                self._seen = a.log.latest
                return (), True
            if state is None:  # not the scheduler's (a share, a CPU-only job): released as it is
                parts = a.release_parts(job_id)
                self._seen = a.log.latest
                return parts, False
            parts = state.parts
            self.loop.finish(job_id, now)
            if self.regrow and self.loop.co_adaptive and self.loop.elastic is None:
                nodes = list(dict.fromkeys(p.node for p in parts))
                try:
                    self.loop.take(a.rebalance(a.jobs_on(nodes), preempt=False, move=False, nodes=nodes), now)
                except Exception:  # noqa: BLE001 - a fault barrier: the release is committed, the next round re-sizes
                    log.exception("re-sizing after releasing %s failed; the next round tries again", job_id)
            self.loop.fill(now)
            self._seen = a.log.latest
            return parts, False

    def scale(self, job_id: str, parts: int) -> Scaled:
        """A running gang of fixed parts to `parts` parts (`Allocator.scale`, all or nothing), its submission's
        request changed with it in the same journaled change, so that a restart or a preemption brings it back at
        its new count. Errors as `Allocator.scaled_job`; `NotAGang` also for a job that waits in the queue."""
        a = self.allocator
        with a.lock:
            self._enter()
            state = self.loop.by_id.get(job_id)
            if state is not None and not state.parts:
                raise NotAGang(f"job {job_id} waits in the queue: only a running gang's count can change")
            job = a.scaled_job(job_id, parts)
            # a count set by hand pins an elastic job there (its bounds go: rounds no longer change it)
            jobs = None if state is None else {job_id: {**_body(state), "job": asdict(job), "elastic": None}}
            scaled = a.scale(job_id, parts, jobs)
            if scaled.changed and state is not None:
                state.advance(self.clock())  # attained at the old count up to now
                state.request, state.min_gpus, state.max_gpus = job, job.num_gpus, job.num_gpus
            self._sync()  # books the parts (`_book`); then its count
            if scaled.changed and state is not None:
                state.gpus = job.num_gpus
            if scaled.changed:
                self.loop.fill(self.clock())  # a shrink freed room: the queue's head may start now
                self._seen = a.log.latest
            return scaled

    def round(self) -> None:
        """A round: preemptive where the order says so (`Scheduler.round`); nothing when nothing waits and nothing
        changed since the last one."""
        a = self.allocator
        with a.lock:
            self._enter()
            if self.loop.wants_round():
                self.loop.round(self.clock())
            self._seen = a.log.latest

    def queue(self) -> list[Waiting]:
        """The waiting jobs in the order they would start."""
        with self.allocator.lock:
            self._enter()
            room: dict[int, bool] = {}  # GPUs -> some node has them free (asked once per size, not once per job)
            return [self._waiting(self.loop.jobs[entry[-1]], k, room)
                    for k, entry in enumerate(self.loop.queue.entries, 1)]

    def state(self, job_id: str) -> JobState | None:
        with self.allocator.lock:
            self._enter()
            return self.loop.by_id.get(job_id)

    # ------------------------------------------------------------------ answers

    def _answer(self, state: JobState, replayed: bool = False) -> Submitted:
        if state.parts:
            return Submitted("allocated", state.job_id, state.parts, replayed=replayed)
        position = self.loop.queue.position(state.idx)
        return Submitted("queued", state.job_id, position=position, why=self._why(state, position), replayed=replayed)

    def _placed(self, job: Job, decision: object, replayed: bool) -> Submitted:
        if isinstance(decision, Allocation):
            parts = self.allocator.running([job.job_id]).get(job.job_id, (decision,))
            return Submitted("allocated", job.job_id, parts, replayed=replayed)
        assert isinstance(decision, Rejection)
        if decision.reason is Reason.CONFLICT:
            raise Conflict(decision.message)
        return Submitted("rejected", job.job_id, rejection=decision)

    def _never(self, job: Job) -> Rejection | None:
        """The policy's `too-big` answer for a job no node could ever hold (its own cores or RAM above every node's
        of the types it may use); None for one that only waits (a gang-sized job is not too big)."""
        rejection = self.allocator.why_not(job)
        return rejection if rejection.reason is Reason.TOO_BIG else None

    def _why(self, state: JobState, position: int, room: dict[int, bool] | None = None) -> Why:
        cluster = self.allocator.cluster
        if state.gpus > cluster.max_gpus() or state.request.part_gpus is not None:
            return "gang-waiting"
        room = {} if room is None else room
        if state.gpus not in room:
            room[state.gpus] = bool(cluster.with_free_gpus(None, state.gpus))
        return "lower-priority" if position > 1 and room[state.gpus] else "no-room"

    def _waiting(self, state: JobState, position: int, room: dict[int, bool]) -> Waiting:
        return Waiting(state.job_id, state.request.model, state.gpus, position, self._why(state, position, room),
                       state.arrival, state.attained)

    # ------------------------------------------------------------------ restart and changes made by others

    def _resume(self) -> None:
        """Rebuild the queue and the running jobs from the journal's submissions, histories and allocations."""
        a = self.allocator
        now = self.clock()
        running = a.running()
        for job_id, body in a.submissions.items():
            state = _state(body)
            self._next = max(self._next, state.idx + 1)
            h = a.history.get(job_id)
            if h is not None:
                state.attained = h.attained
                state.start = h.started_at
                state.restarts_before = h.restarts
            parts = running.pop(job_id, ())
            if parts:
                self.loop.resume(state, parts, h.since if h is not None and h.since is not None else now)
            else:
                self.loop.submit(state, now)  # a waiting job's place does not depend on when it is queued again
        for job_id, parts in running.items():  # holding resources, never submitted: adopted, or a share
            self._adopt(job_id, parts, now)
        if a.submissions:
            log.info("scheduler resumed: %d running, %d waiting (order %s)", len(self.loop.running),
                     len(self.loop.queue), self.loop.order)

    def _adopt(self, job_id: str, parts: tuple[Allocation, ...], now: float) -> None:
        job = parts[0].job(job_id, sum(p.gpus for p in parts))
        if not job.whole:
            return  # shares and CPU-only jobs stay the allocator's alone
        state = JobState(self._next, job, now)
        self._next += 1
        self.allocator.record_jobs({job_id: _body(state)})
        self.loop.resume(state, parts, now)

    def _enter(self) -> None:
        """What every call does first under the lock: book others' changes (`_sync`), then take over the
        submissions parked while the lock was busy (`_drain`)."""
        self._sync()
        self._drain()
        self._largest = max(self.allocator.cluster.gpus_by_type()[0].values(), default=0)

    def _drain(self) -> None:
        """Submit what waits in the inbox, first come first, each at the time it came; a refused one stays there
        with why (`Inbox.handed_over`). A fault on one is logged and refuses it, never the others."""
        if self.inbox is None or self._draining:
            return
        self._draining = True
        try:
            for parked in self.inbox.pending():
                try:
                    got = self._submit(parked.job, parked.arrival)
                    refused = got.rejection.message if got.rejection is not None else None
                except Conflict as exc:  # the id was submitted again, for another request, before this came in
                    refused = str(exc)
                except Exception as exc:  # noqa: BLE001 - a fault barrier: one submission, never the others
                    log.exception("submission %s parked while busy could not be queued", parked.job.job_id)
                    refused = f"hetplan could not queue it: {type(exc).__name__}: {exc}"
                self.inbox.handed_over(parked.seq, refused)
        finally:
            self._draining = False

    def _sync(self) -> None:
        """Book the changes others made since the scheduler last looked (the module docstring)."""
        a = self.allocator
        if a.log.latest == self._seen:
            return
        try:
            logged = a.log.since(self._seen)
        except TooOld:
            logged = None
        self._seen = a.log.latest
        if logged is None:
            self._resync()
            return
        for x in logged:
            self._book(x)

    def _book(self, x: LoggedAction) -> None:
        action, loop = x.action, self.loop
        state = loop.by_id.get(action.job_id)
        if x.note is not None:
            return  # a note (a checkpoint that timed out): nothing changed hands
        if action.kind == "start":
            if state is None:
                self._adopt(action.job_id, action.after, x.at)
            elif state.idx in loop.queue:
                loop.queue.remove(state.idx)
                loop.resume(state, action.after, x.at)
        elif state is None or state.idx not in loop.running:
            return
        elif action.kind == "stop":  # preempted, evicted with its node, or its room taken back: it waits again
            loop.halt(state, x.at)
            loop.queue.add((*loop.priority(state, 0.0), state.idx))
        else:
            state.parts = action.after

    def _resync(self) -> None:
        """The log no longer holds every change since the last look: compare the books with the allocations."""
        running = self.allocator.running()
        now = self.clock()
        for state in list(self.loop.running.values()):
            if state.job_id not in running:
                self.loop.halt(state, now)
                self.loop.queue.add((*self.loop.priority(state, 0.0), state.idx))
        for job_id, parts in running.items():
            state = self.loop.by_id.get(job_id)
            if state is None:
                self._adopt(job_id, parts, now)
            elif state.idx in self.loop.queue:
                self.loop.queue.remove(state.idx)
                self.loop.resume(state, parts, now)
            else:
                state.parts = parts


def _differences(known: Job, asked: Job) -> list[str]:
    return [f"{name} {getattr(known, name)!r}, asked {getattr(asked, name)!r}" for name in
            ("model", "num_gpus", "gpu_milli", "cpu_m", "mem_mib", "part_gpus") if getattr(known, name) != getattr(asked, name)]


def _bound_differences(known: JobState, bounds: Bounds | None) -> list[str]:
    had = _bounds(known)
    return [] if had == bounds else [f"elastic bounds {had}, asked {bounds}"]


def _bounds(state: JobState) -> Bounds | None:
    """A job's elastic bounds (None: rigid, its request's count)."""
    rigid = state.min_gpus == state.max_gpus == state.request.num_gpus
    return None if rigid else Bounds(state.min_gpus, state.max_gpus, state.restart_s)


def _body(state: JobState) -> dict:
    """What the journal keeps of a submission (`elastic`: only an elastic job's; journals without it load rigid)."""
    body = {"idx": state.idx, "arrival": state.arrival, "job": asdict(state.request)}
    bounds = _bounds(state)
    if bounds is not None:
        body["elastic"] = asdict(bounds)
    return body


def _state(body: Mapping) -> JobState:
    """A submission as the journal kept it (`_body`)."""
    elastic = body.get("elastic")  # absent (older journals, rigid jobs) or None (pinned by `scale`)
    bounds = None if elastic is None else Bounds(**elastic)
    return JobState(int(body["idx"]), Job(**body["job"]), float(body["arrival"]),
                    bounds=None if bounds is None else (bounds.min_gpus, bounds.max_gpus),
                    restart_s=30.0 if bounds is None else bounds.restart_s)
