"""A job as the scheduler sees it: its request, when it came, the service it got, where it runs."""

from __future__ import annotations

import math

from hetplan.allocator.spec import Allocation, Job


class JobState:
    """One job's scheduling state. `attained` is GPU-seconds held; `remaining` is reference seconds of work left
    (NaN where nobody says: the service is told no durations); `speed` reference seconds per second while running
    (0 where nobody measures it); `gpus` the GPUs it holds while running (its request's otherwise). An elastic job
    may run on `min_gpus` to `max_gpus` GPUs (a rigid one: both its request's) and a change of count costs it
    `restart_s`. The simulator extends it with the truth it keeps."""

    __slots__ = ("idx", "request", "gpus", "arrival", "remaining", "attained", "last", "speed", "parts",
                 "paused_until", "start", "run_s", "preemptions", "migrations", "resizes", "gpu_type", "share",
                 "off_best", "min_gpus", "max_gpus", "restart_s", "rescales", "since", "restarts_before")

    def __init__(self, idx: int, request: Job, arrival: float, remaining: float = math.nan,
                 bounds: tuple[int, int] | None = None, restart_s: float = 30.0) -> None:
        self.idx = idx  # submission order: the last tie-break of every order
        self.request = request
        self.gpus = request.num_gpus
        self.arrival = arrival
        self.remaining = remaining
        self.attained = 0.0
        self.last = arrival
        self.speed = 0.0
        self.parts: tuple[Allocation, ...] = ()  # one allocation per node it runs on; empty while not running
        self.paused_until = -math.inf  # restarting (no progress) until then
        self.start = math.nan  # its first start
        self.run_s = 0.0
        self.preemptions = 0
        self.migrations = 0
        self.resizes = 0
        self.gpu_type = ""
        self.share = ""
        self.off_best = False  # running on a GPU type its hints rank below another the cluster has
        self.min_gpus, self.max_gpus = bounds or (request.num_gpus, request.num_gpus)
        self.restart_s = restart_s
        self.rescales = 0  # changes of its GPU count
        self.since = math.nan  # when it last (re)started on its present parts
        self.restarts_before = 0  # restarts before the service last resumed it (the journal's count)

    @property
    def restarts(self) -> int:
        """Restarts so far: preempted, moved, re-counted (its elastic change budget counts them)."""
        return self.restarts_before + self.preemptions + self.migrations + self.rescales

    @property
    def job_id(self) -> str:
        return self.request.job_id

    def advance(self, now: float) -> None:
        """Bring the state up to `now`: a running job attains its GPUs' seconds and makes progress at its speed
        (none while it restarts)."""
        if self.parts:
            dt = now - self.last
            self.remaining -= self.speed * max(0.0, now - max(self.last, self.paused_until))
            self.attained += self.gpus * dt
            self.run_s += dt
        self.last = now
