"""The discrete-event simulator: a workload replayed on a cluster, placed by the allocator core itself.

One readable main loop over three kinds of event, earliest first: job completions, job arrivals and round
boundaries. Between rounds the scheduler is work-conserving: on every arrival or completion it places
waiting jobs in priority order wherever they fit, never preempting. At a round boundary (every `round_s`,
as Gavel and Synergy do):

- with a placement-only policy (`hint-static`, `proportional`, `first-fit`), a waiting job that outranks a
  running one triggers a reschedule: the jobs that should run are picked in priority order while their GPUs
  fit, running jobs not picked are preempted (they keep their progress), and waiting jobs are placed in
  priority order, a preempted job first trying its old place;
- with a co-adaptive policy (`hint`), the allocator's `rebalance` decides jointly which jobs run, on which
  GPU type and node(s), with what cores and RAM (`hetplan.allocator.rebalance`), whenever jobs wait or
  something changed since the last round; the simulator applies the actions it returns.

Either way a step reads only the head of the queue that could start (`admission.contenders`: of each class, the
first `room // GPUs` waiting jobs), so a replay on an overloaded cluster does not pass over its whole queue at
every event; the answer is the one the whole queue gets (tests/test_contenders.py).

Priorities: `fifo` arrival time; `srtf` remaining work in reference seconds (the trace duration is known, as
in Gavel's SRTF); `las` attained service in GPU-seconds (Tiresias-style least attained service).

Placement is `hetplan.allocator.Allocator` with a named policy and hint set: the simulator never decides
where a job goes or what share it gets. A job's speed is read off the truth curves for the allocation it got;
a gang (a job over several nodes) runs at its slowest part's per-GPU speed times `gang_scaling`
(`hetplan.gangs.gang_speed`, the rule the planner values gangs with).
Costs (stated assumptions, `SimConfig`): a job that resumes after a preemption or moves to another node makes
no progress for `migration_s` (checkpoint and restart); an in-place re-size pauses it for `resize_s`. It holds
its resources meanwhile. The first start is free.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hetplan.allocator import Allocator
from hetplan.allocator.admission import ClassKey, class_key, contender_limit, who_runs
from hetplan.allocator.policies import Policy, get_policy
from hetplan.allocator.actions import GANG_SEP, Action
from hetplan.allocator.spec import MIB_PER_GIB, Allocation, Job, Node, mib_to_gib
from hetplan.allocator.stability import Stability
from hetplan.gangs import GANG_SCALING, gang_speed
from hetplan.hints import HintSet
from hetplan.sim.truth import TruthCurves

Scheduler = str
"""A registered scheduling order (`SCHEDULERS`): fifo, srtf, las, or one added with `register_scheduler`."""
EPS = 1e-9


class SimulationError(RuntimeError):
    """A simulation cannot go on: the inputs make a job unable to finish (e.g. a truth with no throughput at
    the share it got), or an invariant broke (`InvariantError`)."""


class InvariantError(SimulationError):
    """The cluster's or the simulator's books broke an invariant: a bug in hetplan, never an input error. The
    message names the node(s), the jobs on them and the last actions (`Simulator.recent`)."""


RECENT = 24
"""How many recent allocation changes the simulator keeps to explain an invariant failure."""


MIGRATION_S = 30.0
"""Default checkpoint-and-restart cost: a stated assumption (a PyTorch job saving its state and reloading it on
another node, order of tens of seconds for the models here); Gavel's and Synergy's published simulations charge
nothing, so hetplan's figures pay a cost the anchors' do not."""
RESIZE_S = 5.0
"""Default in-place re-size cost: a stated assumption (cgroup limits change at once; data-loader workers are
re-spawned at the next iterator)."""


@dataclass(frozen=True)
class SimConfig:
    scheduler: Scheduler = "las"
    round_s: float = 300.0
    migration_s: float = MIGRATION_S
    resize_s: float = RESIZE_S
    gang_scaling: float = GANG_SCALING
    seed: int = 0
    """Seeds the random node draws of the `proportional` baseline."""
    check_every: int = 0
    """Check the cluster's invariants every N events (0: at the end only); tests use 1."""
    stability: Stability = Stability()
    """When a running job may change GPU type under `hint` (`hetplan.allocator.stability`)."""

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {self.scheduler!r}; one of {', '.join(SCHEDULERS)}")
        if not self.round_s > 0:
            raise ValueError(f"round_s must be positive, got {self.round_s}")
        for name in ("migration_s", "resize_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.gang_scaling <= 1:
            raise ValueError(f"gang_scaling must be in (0, 1], got {self.gang_scaling}")

    def policy(self, name: str) -> Policy:
        """The named allocator policy with this configuration's costs, round length and seed."""
        options = {"hint": {"migration_s": self.migration_s, "horizon_s": self.round_s,
                            "stability": self.stability},
                   "proportional": {"seed": self.seed}}.get(name, {})
        return get_policy(name, **options)


class _Job:
    """A job's simulation state. Work and remaining are in reference seconds."""

    __slots__ = ("idx", "request", "model", "truth_model", "gpus", "arrival", "work", "remaining", "attained", "last",
                 "speed", "parts", "paused_until", "start", "finish", "run_s", "preemptions", "migrations", "resizes",
                 "version", "gpu_type", "gpu_types", "share", "off_best")

    def __init__(self, idx: int, request: Job, truth_model: str, arrival: float, work: float) -> None:
        self.idx = idx
        self.request = request
        self.model = request.model  # what the allocator is asked for (the trace's model)
        self.truth_model = truth_model  # what the job's speed is read as
        self.gpus = request.num_gpus
        self.arrival = arrival
        self.work = work
        self.remaining = work
        self.attained = 0.0  # GPU-seconds
        self.last = arrival
        self.speed = 0.0
        self.parts: tuple[Allocation, ...] = ()  # one allocation per node it runs on; empty while not running
        self.paused_until = -math.inf  # restarting (no progress) until then
        self.start = math.nan
        self.finish = math.nan
        self.run_s = 0.0
        self.preemptions = 0
        self.migrations = 0
        self.resizes = 0
        self.version = 0
        self.gpu_type = ""
        self.gpu_types: list[str] = []  # every GPU type it ran on, in order
        self.share = ""
        self.off_best = False  # running on a GPU type its hints rank below another the cluster has


Priority = Callable[[_Job, float], tuple]
"""(a job's state, seconds it has run since that state was brought up to date) -> sort key, smallest first.
The state has `arrival`, `remaining` (reference seconds), `attained` (GPU-seconds), `speed`, `gpus`, `idx`."""

SCHEDULERS: dict[str, Priority] = {
    "fifo": lambda j, dt: (j.arrival, j.idx),
    "srtf": lambda j, dt: (j.remaining - j.speed * dt, j.arrival, j.idx),
    "las": lambda j, dt: (j.attained + j.gpus * dt, j.arrival, j.idx),
}
"""The scheduling orders by name, as allocator policies are registered (`register_scheduler` adds one)."""


def register_scheduler(name: str, priority: Priority) -> None:
    """Make a scheduling order available to `SimConfig` (and so to `simulate`, `evaluate`, `plan --workload`)."""
    if name in SCHEDULERS:
        raise ValueError(f"scheduler {name!r} is already registered")
    SCHEDULERS[name] = priority


class _Queue:
    """The waiting jobs as sorted entries (priority..., idx), also indexed by class (`admission.class_key`): a
    step is given only the `head` that could start (`admission.contenders`' rule), never a pass over a long
    queue (an overloaded cluster's grows with the trace)."""

    whole = False
    """Give every step the whole queue instead (tests compare: the same replay)."""

    def __init__(self, jobs: list[_Job]) -> None:
        self.jobs = jobs
        self.entries: list[tuple] = []
        self.of: dict[int, tuple] = {}  # idx -> its entry
        self.by_class: dict[ClassKey, list[tuple]] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def first(self) -> tuple:
        return self.entries[0]

    def add(self, entry: tuple) -> None:
        bisect.insort(self.entries, entry)
        self.of[entry[-1]] = entry
        bisect.insort(self.by_class.setdefault(class_key(self.jobs[entry[-1]].request), []), entry)

    def remove(self, idx: int) -> None:
        entry = self.of.pop(idx)
        del self.entries[bisect.bisect_left(self.entries, entry)]
        same = self.by_class[class_key(self.jobs[idx].request)]
        del same[bisect.bisect_left(same, entry)]

    def head(self, room: int) -> list[tuple]:
        """The entries a step with at most `room` GPUs to give could start, in priority order: of each class
        with g GPUs, the first `room // g`."""
        cut = [(same, contender_limit(self.jobs[same[0][-1]].gpus, room)) for same in self.by_class.values() if same]
        if self.whole or all(len(same) <= n for same, n in cut):
            return list(self.entries)
        return sorted(entry for same, n in cut for entry in same[:n])


@dataclass
class SimResult:
    """Per-job outcomes, the resource-use timeline, the cluster's capacity and event counts."""

    jobs: pd.DataFrame
    timeline: pd.DataFrame  # time_s, gpus, cpus, mem_gb in use and jobs waiting from that time on
    capacity: dict[str, float]  # gpus, cpus, mem_gb
    counts: dict[str, int]


class Simulator:
    """Replays `jobs` (a prepared workload: job_id, model, sim_model, num_gpus, arrival_s, duration_s) on an
    allocator (see `hetplan.sim.workload.prepare_workload`). The allocator is asked for each job's `model`
    (as the trace names it, so hints keyed by it apply); its speed is read off the truth as `sim_model`."""

    def __init__(self, jobs: pd.DataFrame, allocator: Allocator, truth: TruthCurves, config: SimConfig) -> None:
        self.allocator = allocator
        allocator.clock = lambda: self.now  # ages (the stability rule) and actions in simulated time
        self.truth = truth
        self.config = config
        self.priority = SCHEDULERS[config.scheduler]
        self.co_adaptive = allocator.policy.rounds is not None
        self.frame = jobs.reset_index(drop=True)
        self.jobs = [
            _Job(i, Job(str(job_id), str(model), int(gpus)), str(truth_model), float(arrival), float(duration))
            for i, (job_id, model, truth_model, gpus, arrival, duration) in enumerate(zip(
                self.frame["job_id"], self.frame["model"], self.frame["sim_model"], self.frame["num_gpus"],
                self.frame["arrival_s"], self.frame["duration_s"]))
        ]
        self.by_id = {job.request.job_id: job for job in self.jobs}
        totals = allocator.cluster.totals()
        self.capacity = {"gpus": totals["gpus"], "cpus": totals["cpu_m"] / 1000,
                         "mem_gb": mib_to_gib(totals["mem_mib"])}
        self.free_gpus = totals["free_gpus"]
        self.largest = allocator.cluster.max_gpus()
        self.used = [0, 0, 0]  # GPUs, millicores, MB
        self.running: dict[int, _Job] = {}
        self.queue = _Queue(self.jobs)  # a waiting job's priority does not change while it waits
        self.finishes: list[tuple[float, int, int]] = []  # heap of (time, version, idx)
        self.timeline: list[tuple[float, int, int, int, int]] = []
        self.last_round = -math.inf
        self.changed = False  # something started or stopped since the last round (co-adaptive rounds only)
        self.off_best = 0  # running jobs not on their fastest GPU type (co-adaptive rounds only)
        self.gpu_type_names = allocator.cluster.gpu_types()
        self.now = 0.0
        self.counts = {"jobs": len(self.jobs), "completed": 0, "rejected_too_big": 0, "starts": 0,
                       "kept": 0, "preemptions": 0, "migrations": 0, "resizes": 0, "gangs": 0, "rounds": 0,
                       "reschedules": 0, "events": 0}
        self.status = ["pending"] * len(self.jobs)
        # the last allocation changes (time, what, before, after), to explain a failed check
        self.recent: deque[tuple[float, str, tuple[Allocation, ...], tuple[Allocation, ...]]] = deque(maxlen=RECENT)

    # ------------------------------------------------------------------ the main loop

    def run(self) -> SimResult:
        arrivals = sorted((j for j in self.jobs), key=lambda j: (j.arrival, j.idx))
        limit = max(self.allocator.cluster.gpus_by_type()[0].values(), default=0)  # one GPU type's GPUs (gangs)
        too_big = [j for j in arrivals if j.gpus > limit]
        for job in too_big:
            self.status[job.idx] = "rejected_too_big"
        self.counts["rejected_too_big"] = len(too_big)
        arrivals = [j for j in arrivals if j.gpus <= limit]
        self.truth.require({j.truth_model for j in arrivals}, self.allocator.cluster.gpu_types())
        self._record(arrivals[0].arrival if arrivals else 0.0)
        nxt = 0
        while nxt < len(arrivals) or self.running or self.queue:
            t_arrival = arrivals[nxt].arrival if nxt < len(arrivals) else math.inf
            t_finish = self._next_finish()
            t_round = self._next_round() if self.queue or (self.changed and self.co_adaptive) else math.inf
            now = self.now = min(t_arrival, t_finish, t_round)
            while self.finishes and self.finishes[0][0] <= now + EPS:
                _, version, idx = heapq.heappop(self.finishes)
                job = self.jobs[idx]
                if version == job.version and job.parts:
                    self._complete(job, now)
            while nxt < len(arrivals) and arrivals[nxt].arrival <= now:
                self._enqueue(arrivals[nxt])
                nxt += 1
            if now >= t_round - EPS:
                self._round(now)
            else:
                self._fill(now)
            if self.queue and not self.running and nxt == len(arrivals) and not self.changed:
                raise SimulationError(f"{len(self.queue)} jobs wait on an idle cluster that cannot place them")
            self._record(now)
            self.counts["events"] += 1
            if self.config.check_every and self.counts["events"] % self.config.check_every == 0:
                self._check()
        self._check(final=True)
        return SimResult(self._job_frame(), self._timeline_frame(), self.capacity, dict(self.counts))

    def _next_finish(self) -> float:
        while self.finishes:
            time, version, idx = self.finishes[0]
            if version == self.jobs[idx].version:
                return time
            heapq.heappop(self.finishes)  # stale: the job was preempted or moved since
        return math.inf

    def _next_round(self) -> float:
        """The first round boundary at or after now that has not been processed (asked while jobs wait)."""
        r = self.config.round_s
        boundary = max(math.ceil(self.now / r) * r, self.now)  # never behind now by a rounding error
        return boundary if boundary > self.last_round else self.last_round + r

    # ------------------------------------------------------------------ scheduling

    def _enqueue(self, job: _Job) -> None:
        self.status[job.idx] = "waiting"
        self.queue.add((*self.priority(job, 0.0), job.idx))

    def _fill(self, now: float, previous: dict[int, tuple[Allocation, ...]] | None = None) -> None:
        """Place waiting jobs in priority order where they fit, without preempting; the rest wait on.

        A job in `previous` (preempted by this reschedule) first gets its old allocation back if its node
        still has room, so that it keeps running where it ran unless a higher-priority job took its place.
        Jobs larger than any node then run as gangs where free GPUs allow (`Allocator.place_gangs`).
        With a co-adaptive policy the allocator's `rebalance` places them (no preemption, no moves, peers
        shrunk to their floors where that makes room).
        """
        if not self.queue or self.free_gpus == 0:
            return
        head = self.queue.head(self.free_gpus)  # the rest could not start (`admission.contenders`)
        if self.co_adaptive:  # the service's admission: comparative advantage, peers shrunk where that makes room
            self._take(self.allocator.admit([self.jobs[entry[-1]].request for entry in head]), now)
            return
        previous = previous or {}
        if previous:  # a preempted job may get its old place back wherever it waits
            head = sorted(set(head).union(self.queue.of[idx] for idx in previous))
        failed: set[ClassKey] = set()  # classes that did not fit: nothing is freed during a pass
        gangs: list[Job] = []
        for entry in head:
            job = self.jobs[entry[-1]]
            if job.gpus > self.largest:
                gangs.append(job.request)
                continue
            if self.free_gpus == 0 or job.gpus > self.free_gpus:
                continue
            old = previous.get(job.idx)
            if old is not None and len(old) == 1 and self.allocator.restore(old[0]):
                self.queue.remove(job.idx)
                self._start(job, old, now)
                self.counts["kept"] += 1
                continue
            if class_key(job.request) in failed:
                continue
            decision = self.allocator.allocate(job.request)
            if isinstance(decision, Allocation):
                self.queue.remove(job.idx)
                self._start(job, (decision,), now)
            else:
                failed.add(class_key(job.request))
        if gangs and self.free_gpus >= min(job.num_gpus for job in gangs):
            self._take(self.allocator.place_gangs(gangs), now)

    def _round(self, now: float) -> None:
        """A round boundary: a co-adaptive step, or (placement-only policies) a reschedule when a waiting job
        outranks a running one, else a fill.

        A reschedule picks the jobs that should run, in priority order while their GPUs fit in the cluster's
        (counting GPUs, not packing), preempts the running jobs not picked, then fills: waiting jobs in
        priority order, a preempted job first trying its old place. Jobs picked and running are untouched.
        """
        self.last_round = now
        self.counts["rounds"] += 1
        if self.co_adaptive:
            self._co_adaptive_round(now)
            return
        if not self.queue:
            return
        ranked = self._ranked(self.running.values(), now)
        if not ranked or self.queue.first() > ranked[-1]:
            self._fill(now)
            return
        gpus = int(self.capacity["gpus"])
        run, _ = who_runs((self.jobs[entry[-1]].request for entry in heapq.merge(ranked, self.queue.head(gpus))),
                          gpus, gpus)
        chosen = {self.by_id[job.job_id].idx for job in run}
        before = {entry[-1]: self.jobs[entry[-1]].parts for entry in ranked if entry[-1] not in chosen}
        if not before:
            self._fill(now)
            return
        for idx in before:
            self._stop(self.jobs[idx], now)
            self.queue.add((*self.priority(self.jobs[idx], 0.0), idx))
        self._fill(now, previous=before)
        preempted = 0
        for idx, old in before.items():
            job = self.jobs[idx]
            if not job.parts:
                job.preemptions += 1
                preempted += 1
            elif job.parts[0].node != old[0].node:
                job.migrations += 1
                self.counts["migrations"] += 1
        self.counts["preemptions"] += preempted
        self.counts["reschedules"] += preempted > 0  # a round whose stopped jobs all got their place back is none

    def _ranked(self, jobs, now: float) -> list[tuple]:
        """Running jobs' priorities as of now (their state is not brought up to date: only stopped jobs need it)."""
        return sorted((*self.priority(job, now - job.last), job.idx) for job in jobs)

    def _co_adaptive_round(self, now: float) -> None:
        """Every job that waits or runs, in priority order, to the allocator's rebalance; when nothing waits and
        every running job is on its fastest GPU type, only the jobs on nodes that changed (no move can help)."""
        self.changed = False
        cluster = self.allocator.cluster
        if self.queue or (self.off_best and len(self.gpu_type_names) > 1):
            ranked = self._ranked(self.running.values(), now)
            head = self.queue.head(int(self.capacity["gpus"]))  # the rest could not start (`admission.contenders`)
            order = [self.jobs[entry[-1]].request for entry in sorted(ranked + head)]  # merges two runs
        else:
            on = {self._job_id(a) for node in self.allocator.touched() if node in cluster for a in cluster.jobs_on(node)}
            order = [self.jobs[entry[-1]].request for entry in self._ranked((self.by_id[j] for j in on), now)]
        self._take(self.allocator.rebalance(order, preempt=True), now)

    def _job_id(self, allocation_id: str) -> str:
        """The job an allocation belongs to (a gang part's id names its job before the separator)."""
        return allocation_id if allocation_id in self.by_id else allocation_id.rsplit(GANG_SEP, 1)[0]

    def _take(self, actions: list[Action], now: float) -> None:
        """Bring the jobs in line with a co-adaptive step's actions (already applied to the cluster)."""
        stopped = []
        for action in actions:
            job = self.by_id[action.job_id]
            self.recent.append((now, f"{action.kind} {action.job_id}", action.before, action.after))
            if action.kind == "start":
                self._start(job, action.after, now)
            elif action.kind == "stop":
                self._halt(job, now)
                job.preemptions += 1
                self.counts["preemptions"] += 1
                stopped.append(job)
            else:
                self._halt(job, now)
                moved = action.kind == "migrate"
                self._start(job, action.after, now, pause=self.config.migration_s if moved else self.config.resize_s)
                if moved:
                    job.migrations += 1
                else:
                    job.resizes += 1
                self.counts["migrations" if moved else "resizes"] += 1
        for action in actions:
            if action.kind == "start":
                self.queue.remove(self.by_id[action.job_id].idx)
        for job in stopped:
            self.queue.add((*self.priority(job, 0.0), job.idx))
        self.counts["reschedules"] += bool(stopped)
        for job in stopped:
            self.status[job.idx] = "waiting"

    # ------------------------------------------------------------------ job state changes

    def _advance(self, job: _Job, now: float) -> None:
        if job.parts:
            dt = now - job.last
            job.remaining -= job.speed * max(0.0, now - max(job.last, job.paused_until))
            job.attained += job.gpus * dt
            job.run_s += dt
        job.last = now

    def _speed(self, job: _Job, parts: tuple[Allocation, ...]) -> float:
        speeds = [self.truth.speed(job.truth_model, a.gpu_type, a.gpus, a.cpu_m, a.mem_mib) for a in parts]
        speed = gang_speed(speeds, self.config.gang_scaling)
        if not speed > 0:
            a = parts[speeds.index(min(speeds))]
            raise SimulationError(f"{job.request.job_id}: the truth gives {job.truth_model} on {a.gpu_type} no "
                                  f"throughput with {a.cpus:g} cores and {a.mem_gb:g} GiB (nothing measured at or "
                                  f"below that share): the job would never finish")
        return speed

    def _start(self, job: _Job, parts: tuple[Allocation, ...], now: float, pause: float | None = None) -> None:
        """Run `job` on `parts` from now; a job that ran before restarts from its checkpoint (`migration_s`)
        unless `pause` says otherwise."""
        job.speed = self._speed(job, parts)
        if pause is None:
            pause = 0.0 if math.isnan(job.start) else self.config.migration_s
        job.parts, job.last = parts, now
        job.paused_until = now + pause
        job.gpu_type, job.share = parts[0].gpu_type, parts[0].share
        if self.co_adaptive:
            speeds = self.allocator.policy.rounds.speeds(job.request, self.allocator.hints, self.gpu_type_names)
            job.off_best = speeds.get(job.gpu_type, 0.0) < max(speeds.values(), default=0.0) - 1e-9
            self.off_best += job.off_best
        if not job.gpu_types or job.gpu_types[-1] != job.gpu_type:
            job.gpu_types.append(job.gpu_type)
        if math.isnan(job.start):
            job.start = now
            self.counts["gangs"] += len(parts) > 1
        job.version += 1
        heapq.heappush(self.finishes, (now + pause + max(job.remaining, 0.0) / job.speed, job.version, job.idx))
        self.running[job.idx] = job
        self.status[job.idx] = "running"
        for a in parts:
            self._use(a, +1)
        self.counts["starts"] += 1
        self.changed = True

    def _halt(self, job: _Job, now: float) -> None:
        """Take a running job off the simulation's books (its resources are already back in the cluster)."""
        self._advance(job, now)
        if not job.parts:
            raise SimulationError(f"{job.request.job_id} stopped while not running")
        for a in job.parts:
            self._use(a, -1)
        self.off_best -= job.off_best
        job.off_best = False
        job.parts, job.speed = (), 0.0
        job.version += 1
        del self.running[job.idx]
        self.status[job.idx] = "waiting"
        self.changed = True

    def _stop(self, job: _Job, now: float) -> None:
        """Take a running job off the cluster (preempted or finished)."""
        released = self.allocator.release_parts(job.request.job_id)
        if sorted(released, key=lambda a: a.job_id) != sorted(job.parts, key=lambda a: a.job_id):
            raise SimulationError(f"{job.request.job_id}: the allocator released {released}, expected {job.parts}")
        self._halt(job, now)

    def _complete(self, job: _Job, now: float) -> None:
        if not math.isnan(job.finish):
            raise SimulationError(f"{job.request.job_id} finished twice")
        self._stop(job, now)
        if job.remaining > 1e-6 * max(job.work, 1.0):
            raise SimulationError(f"{job.request.job_id} completed with {job.remaining:g} reference seconds left")
        job.remaining = 0.0
        job.finish = now
        self.status[job.idx] = "completed"
        self.counts["completed"] += 1

    def _use(self, a: Allocation, sign: int) -> None:
        self.recent.append((self.now, "simulator books" if sign > 0 else "simulator frees", (), (a,)))
        self.used[0] += sign * a.gpus
        self.used[1] += sign * a.cpu_m
        self.used[2] += sign * a.mem_mib
        self.free_gpus -= sign * a.gpus

    # ------------------------------------------------------------------ invariants and results

    def _record(self, now: float) -> None:
        point = (now, self.used[0], self.used[1], self.used[2], len(self.queue))
        if self.timeline and self.timeline[-1][0] == now:
            self.timeline[-1] = point
        else:
            self.timeline.append(point)

    def _check(self, final: bool = False) -> None:
        cluster = self.allocator.cluster
        problems = cluster.check()
        totals = cluster.totals()
        in_use = [totals["gpus"] - totals["free_gpus"], totals["cpu_m"] - totals["free_cpu_m"],
                  totals["mem_mib"] - totals["free_mem_mib"]]
        if in_use != self.used:
            problems.append(f"simulator counts {self.used} in use, the cluster {in_use}")
        if any(u > c for u, c in zip(in_use, (totals["gpus"], totals["cpu_m"], totals["mem_mib"]))):
            problems.append(f"more in use than exists: {in_use} of {totals}")
        parts = sum(len(job.parts) for job in self.running.values())
        if len(cluster.allocations()) != parts:
            problems.append(f"{len(cluster.allocations())} allocations for {parts} running job parts")
        if final:
            unfinished = [j.request.job_id for j, s in zip(self.jobs, self.status) if s not in
                          ("completed", "rejected_too_big")]
            if unfinished:
                problems.append(f"{len(unfinished)} jobs never finished (first: {unfinished[0]})")
            done = self.counts["completed"] + self.counts["rejected_too_big"]
            if done != len(self.jobs):
                problems.append(f"{done} jobs accounted for out of {len(self.jobs)}")
            held = sum(j.attained for j in self.jobs)
            t = np.array(self.timeline, dtype=float).reshape(-1, 5)
            used = float(np.sum(t[:-1, 1] * np.diff(t[:, 0]))) if len(t) > 1 else 0.0
            if abs(held - used) > 1e-6 * max(held, 1.0):
                problems.append(f"GPU-seconds not conserved: jobs held {held:.6g}, the cluster lent {used:.6g}")
        if problems:
            raise InvariantError(self._explain(problems))

    def _explain(self, problems: list[str]) -> str:
        """The problems, then for each node they name: its jobs and the recent changes that touched it."""
        cluster = self.allocator.cluster
        nodes = [n for n in dict.fromkeys(p.split(" ", 1)[0] for p in problems) if n in cluster]
        lines = [f"invariant broken at t={self.now:g} s (a bug in hetplan, not in the inputs): " + "; ".join(problems)]
        for node in nodes:
            touched = [r for r in self.recent if any(a.node == node for a in r[2] + r[3])]
            lines.append(f"node {node}: jobs {cluster.jobs_on(node) or 'none'}; its last changes: "
                         + (" | ".join(map(_change, touched[-6:])) or "none recorded"))
        lines.append(f"last action: {_change(self.recent[-1]) if self.recent else 'none'}")
        return "\n".join(lines)

    def _job_frame(self) -> pd.DataFrame:
        f = self.frame
        start = np.array([j.start for j in self.jobs])
        finish = np.array([j.finish for j in self.jobs])
        arrival = np.array([j.arrival for j in self.jobs])
        run_s = np.array([j.run_s for j in self.jobs])
        return pd.DataFrame({
            "job_id": f["job_id"].astype(str), "model": f["model"].astype(str), "sim_model": f["sim_model"],
            "num_gpus": f["num_gpus"].astype(int), "arrival_s": arrival, "duration_s": f["duration_s"].astype(float),
            "status": self.status, "start_s": start, "finish_s": finish, "jct_s": finish - arrival,
            "queue_s": start - arrival, "wait_s": finish - arrival - run_s, "run_s": run_s,
            "mean_speed": np.divide(f["duration_s"].to_numpy(float), run_s, out=np.full(len(f), np.nan),
                                    where=run_s > 0),
            "preemptions": [j.preemptions for j in self.jobs], "migrations": [j.migrations for j in self.jobs],
            "resizes": [j.resizes for j in self.jobs], "gpu_type": [j.gpu_type for j in self.jobs],
            "gpu_types": ["+".join(j.gpu_types) for j in self.jobs], "share": [j.share for j in self.jobs],
        })

    def _timeline_frame(self) -> pd.DataFrame:
        t = np.array(self.timeline, dtype=float).reshape(-1, 5)
        return pd.DataFrame({"time_s": t[:, 0], "gpus": t[:, 1], "cpus": t[:, 2] / 1000,
                             "mem_gb": t[:, 3] / MIB_PER_GIB,
                             "waiting": t[:, 4].astype(int)})


def _change(change: tuple[float, str, tuple[Allocation, ...], tuple[Allocation, ...]]) -> str:
    """One of `Simulator.recent`, for messages: `t=.. s what: job@node (GPUs, millicores, MiB) -> ...`."""
    t, what, before, after = change
    parts = [", ".join(f"{a.job_id}@{a.node} ({a.gpus} GPUs, {a.cpu_m}m, {a.mem_mib} MiB)" for a in side) or "-"
             for side in (before, after)]
    return f"t={t:g} s {what}: {parts[0]} -> {parts[1]}"


def simulate(jobs: pd.DataFrame, nodes: Iterable[Node], truth: TruthCurves, policy: Policy | str = "hint",
             hints: HintSet | None = None, config: SimConfig | None = None) -> SimResult:
    """Simulate a prepared workload on `nodes`, placed by the allocator core with `policy` and `hints`."""
    config = config or SimConfig()
    allocator = Allocator(list(nodes), config.policy(policy) if isinstance(policy, str) else policy,
                          hints or HintSet.empty())
    return Simulator(jobs, allocator, truth, config).run()
