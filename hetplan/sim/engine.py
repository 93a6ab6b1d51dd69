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

With an elastic rule (`SimConfig.elastic`, on a multi-GPU truth: `hetplan.sim.scaling_truth`) every round instead
gives each job a GPU type and a GPU count within its bounds (`hetplan.scheduler.elastic`); jobs start only at
rounds, as in Sia, and a count change is a restart.

Placement is `hetplan.allocator.Allocator` with a named policy and hint set: the simulator never decides
where a job goes or what share it gets. A job's speed is read off the truth curves for the allocation it got;
a gang (a job over several nodes) runs at its slowest part's per-GPU speed times `gang_scaling`
(`hetplan.gangs.gang_speed`, the rule the planner values gangs with).
Costs (stated assumptions, `SimConfig`): a job that resumes after a preemption or moves to another node makes
no progress for `migration_s` (checkpoint and restart); an in-place re-size pauses it for `resize_s`. It holds
its resources meanwhile. The first start is free.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hetplan.allocator import Allocator
from hetplan.allocator.cluster import Cluster
from hetplan.allocator.policies import Policy, get_policy
from hetplan.allocator.spec import MIB_PER_GIB, Allocation, Job, Node, mib_to_gib
from hetplan.allocator.stability import Stability
from hetplan.gangs import GANG_SCALING, gang_speed
from hetplan.hints import HintSet
from hetplan.scheduler import ORDERS, Order, Scheduler, StartKind, register_order
from hetplan.scheduler.elastic import Elastic, ElasticRule
from hetplan.scheduler.state import JobState
from hetplan.sim.scaling_truth import ScalingTruth, reference_rate
from hetplan.sim.truth import TruthCurves

SCHEDULERS = ORDERS
"""The scheduling orders by name (`hetplan.scheduler.orders`; `register_scheduler` adds one)."""
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
    scheduler: Order = "las"
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
    elastic: ElasticRule | None = None
    """Rounds choose every job's GPU type and count (`hetplan.scheduler.elastic`; needs a `ScalingTruth`); jobs
    start only at rounds, as in Sia."""
    trace_restarts: bool = False
    """A restart (resume, move, count change) costs the trace's per-job `restart_s` instead of `migration_s`."""

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


class _Job(JobState):
    """A job's simulation state: the scheduler's, with the truth it runs by. Work and remaining are in reference
    seconds."""

    __slots__ = ("model", "truth_model", "work", "finish", "version", "gpu_types", "gpu_counts", "batch",
                 "reference_rate", "paused_from", "restart_waste")

    def __init__(self, idx: int, request: Job, truth_model: str, arrival: float, work: float) -> None:
        super().__init__(idx, request, arrival, work)
        self.model = request.model  # what the allocator is asked for (the trace's model)
        self.truth_model = truth_model  # what the job's speed is read as
        self.work = work
        self.finish = math.nan
        self.version = 0
        self.gpu_types: list[str] = []  # every GPU type it ran on, in order
        self.gpu_counts: list[int] = []  # every GPU count it ran on, in order
        self.batch = math.nan  # global batch (a scaling truth reads it)
        self.reference_rate = math.nan  # samples/s of its reference allocation (a scaling truth's unit of work)
        self.paused_from = 0.0
        self.restart_waste = 0.0  # GPU-seconds held while restarting


register_scheduler = register_order
"""Make a scheduling order available to `SimConfig` (and so to `simulate`, `evaluate`, `plan --workload`)."""


@dataclass
class SimResult:
    """Per-job outcomes, the resource-use timeline, the cluster's capacity and event counts."""

    jobs: pd.DataFrame
    timeline: pd.DataFrame  # time_s, gpus, cpus, mem_gb in use and jobs waiting from that time on
    capacity: dict[str, float]  # gpus, cpus, mem_gb
    counts: dict[str, int]


class Simulator:
    """Replays `jobs` (a prepared workload: job_id, model, sim_model, num_gpus, arrival_s, duration_s) through the
    one scheduling loop (`hetplan.scheduler.Scheduler`) on an allocator (see `hetplan.sim.workload.prepare_workload`).
    The simulator keeps time, speeds and the truth; the scheduler decides. The allocator is asked for each job's
    `model` (as the trace names it, so hints keyed by it apply); its speed is read off the truth as `sim_model`."""

    def __init__(self, jobs: pd.DataFrame, allocator: Allocator, truth: TruthCurves, config: SimConfig) -> None:
        self.allocator = allocator
        allocator.clock = lambda: self.now  # ages (the stability rule) and actions in simulated time
        self.truth = truth
        self.config = config
        self.frame = jobs.reset_index(drop=True)
        self.jobs = [
            _Job(i, Job(str(job_id), str(model), int(gpus)), str(truth_model), float(arrival), float(duration))
            for i, (job_id, model, truth_model, gpus, arrival, duration) in enumerate(zip(
                self.frame["job_id"], self.frame["model"], self.frame["sim_model"], self.frame["num_gpus"],
                self.frame["arrival_s"], self.frame["duration_s"]))
        ]
        elastic = None
        if config.elastic is not None:
            if not isinstance(truth, ScalingTruth):
                raise SimulationError("elastic scheduling needs a multi-GPU truth (--truth-placements)")
            elastic = Elastic(truth.rates(host_shares(allocator.cluster) if config.elastic.price_host else None),
                              config.elastic)
        self._elastic_jobs(truth)
        self.scheduler = Scheduler(allocator, config.scheduler, config.round_s, listener=self,
                                   jobs=dict(enumerate(self.jobs)), elastic=elastic)
        totals = allocator.cluster.totals()
        self.capacity = {"gpus": totals["gpus"], "cpus": totals["cpu_m"] / 1000,
                         "mem_gb": mib_to_gib(totals["mem_mib"])}
        self.used = [0, 0, 0]  # GPUs, millicores, MB
        self.finishes: list[tuple[float, int, int]] = []  # heap of (time, version, idx)
        self.timeline: list[tuple[float, int, int, int, int]] = []
        self.now = 0.0
        self.counts = {"jobs": len(self.jobs), "completed": 0, "rejected_too_big": 0, "gangs": 0, "events": 0}
        self.status = ["pending"] * len(self.jobs)
        # the last allocation changes (time, what, before, after), to explain a failed check
        self.recent: deque[tuple[float, str, tuple[Allocation, ...], tuple[Allocation, ...]]] = deque(maxlen=RECENT)

    def _elastic_jobs(self, truth: TruthCurves | ScalingTruth) -> None:
        """Bounds and restart costs from the workload's elastic columns (an elastic scheduler reads the bounds;
        `trace_restarts` the costs); for a scaling truth, each job's global batch and reference rate."""
        f = self.frame
        low = f["min_gpus"] if "min_gpus" in f else f["num_gpus"]
        high = f["max_gpus"] if "max_gpus" in f else f["num_gpus"]
        restart = f["restart_s"] if "restart_s" in f else pd.Series(self.config.migration_s, index=f.index)
        scaling = isinstance(truth, ScalingTruth)
        if scaling and "batch_size" not in f:
            raise SimulationError("a multi-GPU truth needs the trace's batch_size column (a Sia workload: "
                                  "hetplan trace import --format sia)")
        for job, lo, hi, r in zip(self.jobs, low, high, restart):
            if self.config.elastic is not None and not pd.isna(lo):
                job.min_gpus, job.max_gpus = int(lo), int(hi)
            if self.config.trace_restarts and not pd.isna(r):
                job.restart_s = float(r)
            else:
                job.restart_s = self.config.migration_s
        if scaling:
            for job, batch in zip(self.jobs, f["batch_size"]):
                job.batch = float(batch)
                job.reference_rate = reference_rate(job.truth_model, job.request.num_gpus, job.batch)

    # ------------------------------------------------------------------ the main loop

    def run(self) -> SimResult:
        scheduler = self.scheduler
        arrivals = sorted((j for j in self.jobs), key=lambda j: (j.arrival, j.idx))
        limit = max(self.allocator.cluster.gpus_by_type()[0].values(), default=0)  # one GPU type's GPUs (gangs)
        too_big = [j for j in arrivals if (j.min_gpus if self.scheduler.elastic else j.gpus) > limit]
        for job in too_big:
            self.status[job.idx] = "rejected_too_big"
        self.counts["rejected_too_big"] = len(too_big)
        rejected = {j.idx for j in too_big}
        arrivals = [j for j in arrivals if j.idx not in rejected]
        self.truth.require({j.truth_model for j in arrivals}, self.allocator.cluster.gpu_types())
        self._record(arrivals[0].arrival if arrivals else 0.0)
        nxt = 0
        while nxt < len(arrivals) or scheduler.running or scheduler.queue:
            t_arrival = arrivals[nxt].arrival if nxt < len(arrivals) else math.inf
            t_finish = self._next_finish()
            t_round = scheduler.next_round(self.now) if scheduler.wants_round() else math.inf
            now = self.now = min(t_arrival, t_finish, t_round)
            while self.finishes and self.finishes[0][0] <= now + EPS:
                _, version, idx = heapq.heappop(self.finishes)
                job = self.jobs[idx]
                if version == job.version and job.parts:
                    self._complete(job, now)
            while nxt < len(arrivals) and arrivals[nxt].arrival <= now:
                self.status[arrivals[nxt].idx] = "waiting"
                scheduler.submit(arrivals[nxt], now)
                nxt += 1
            if now >= t_round - EPS:
                scheduler.round(now)
            else:
                scheduler.fill(now)
            if scheduler.queue and not scheduler.running and nxt == len(arrivals) and not scheduler.changed \
                    and (scheduler.elastic is None or now >= t_round - EPS):
                raise SimulationError(f"{len(scheduler.queue)} jobs wait on an idle cluster that cannot place them")
            self._record(now)
            self.counts["events"] += 1
            if self.config.check_every and self.counts["events"] % self.config.check_every == 0:
                self._check()
        self._check(final=True)
        counts = {**self.counts, **scheduler.counts}
        return SimResult(self._job_frame(), self._timeline_frame(), self.capacity, counts)

    def _next_finish(self) -> float:
        while self.finishes:
            time, version, idx = self.finishes[0]
            if version == self.jobs[idx].version:
                return time
            heapq.heappop(self.finishes)  # stale: the job was preempted or moved since
        return math.inf

    # ------------------------------------------------------------------ what the scheduler did (`Listener`)

    def started(self, job: JobState, parts: tuple[Allocation, ...], now: float, kind: StartKind) -> None:
        """Run `job` on `parts` from now at the truth's speed; a job that ran before restarts from its checkpoint
        (`migration_s`; an in-place re-size `resize_s`)."""
        assert isinstance(job, _Job)
        job.speed = self._speed(job, parts)
        if kind == "resize":
            pause = self.config.resize_s
        elif kind in ("migrate", "rescale"):
            pause = job.restart_s
        else:
            pause = 0.0 if math.isnan(job.start) else job.restart_s
        job.paused_until, job.paused_from = now + pause, now
        gpu_type = parts[0].gpu_type
        if not job.gpu_types or job.gpu_types[-1] != gpu_type:
            job.gpu_types.append(gpu_type)
        gpus = sum(a.gpus for a in parts)
        if not job.gpu_counts or job.gpu_counts[-1] != gpus:
            job.gpu_counts.append(gpus)
        if math.isnan(job.start):
            self.counts["gangs"] += len(parts) > 1
        job.version += 1
        heapq.heappush(self.finishes, (now + pause + max(job.remaining, 0.0) / job.speed, job.version, job.idx))
        self.status[job.idx] = "running"
        for a in parts:
            self._use(a, +1)

    def halted(self, job: JobState, now: float) -> None:
        assert isinstance(job, _Job)
        self._book_pause(job, now)
        for a in job.parts:
            self._use(a, -1)
        job.version += 1
        self.status[job.idx] = "waiting"

    def note(self, now: float, what: str, before: tuple[Allocation, ...], after: tuple[Allocation, ...]) -> None:
        self.recent.append((now, what, before, after))

    def _book_pause(self, job: _Job, now: float) -> None:
        """GPU-seconds the job held while restarting, up to now."""
        held = min(now, job.paused_until) - job.paused_from
        job.restart_waste += max(held, 0.0) * sum(a.gpus for a in job.parts)

    def _speed(self, job: _Job, parts: tuple[Allocation, ...]) -> float:
        if isinstance(self.truth, ScalingTruth):
            speed = self.truth.job_speed(job.truth_model, parts, job.batch, job.reference_rate)
            if not speed > 0:
                raise SimulationError(f"{job.request.job_id}: the truth gives {job.truth_model} no throughput on "
                                      f"{len(parts)} nodes of {parts[0].gpu_type}")
            return speed
        speeds = [self.truth.speed(job.truth_model, a.gpu_type, a.gpus, a.cpu_m, a.mem_mib) for a in parts]
        speed = gang_speed(speeds, self.config.gang_scaling)
        if not speed > 0:
            a = parts[speeds.index(min(speeds))]
            raise SimulationError(f"{job.request.job_id}: the truth gives {job.truth_model} on {a.gpu_type} no "
                                  f"throughput with {a.cpus:g} cores and {a.mem_gb:g} GiB (nothing measured at or "
                                  f"below that share): the job would never finish")
        return speed

    def _complete(self, job: _Job, now: float) -> None:
        if not math.isnan(job.finish):
            raise SimulationError(f"{job.request.job_id} finished twice")
        self.scheduler.finish(job.request.job_id, now)
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

    # ------------------------------------------------------------------ invariants and results

    def _record(self, now: float) -> None:
        point = (now, self.used[0], self.used[1], self.used[2], len(self.scheduler.queue))
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
        parts = sum(len(job.parts) for job in self.scheduler.running.values())
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
            "resizes": [j.resizes for j in self.jobs], "rescales": [j.rescales for j in self.jobs],
            "gpu_counts": [">".join(map(str, j.gpu_counts)) for j in self.jobs],
            "restart_waste_gpu_s": [j.restart_waste for j in self.jobs], "gpu_type": [j.gpu_type for j in self.jobs],
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


def host_shares(cluster: Cluster) -> dict[str, tuple[float, float]]:
    """Per GPU type, the cores and GiB per GPU its nodes give (the GPU-proportional share, the least of its
    node shapes): what an elastic round prices a type's hosts at."""
    out: dict[str, tuple[float, float]] = {}
    for node in cluster.nodes():
        share = (node.cpus / node.gpus, node.mem_gb / node.gpus)
        old = out.get(node.gpu_type, share)
        out[node.gpu_type] = (min(old[0], share[0]), min(old[1], share[1]))
    return out


def simulate(jobs: pd.DataFrame, nodes: Iterable[Node], truth: TruthCurves, policy: Policy | str = "hint",
             hints: HintSet | None = None, config: SimConfig | None = None) -> SimResult:
    """Simulate a prepared workload on `nodes`, placed by the allocator core with `policy` and `hints`."""
    config = config or SimConfig()
    allocator = Allocator(list(nodes), config.policy(policy) if isinstance(policy, str) else policy,
                          hints or HintSet.empty())
    return Simulator(jobs, allocator, truth, config).run()
