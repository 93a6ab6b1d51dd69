"""Routes for operators: liveness (`/healthz`) and Prometheus metrics (`/metrics`)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from hetplan.allocator.core import Allocator
from hetplan.allocator.metrics import CONTENT_TYPE, Gauges
from hetplan.allocator.service.bodies import HealthResponse
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import mib_to_gib


T = TypeVar("T")

LOOK_S = 0.02
"""How long a probe or a scrape waits for the allocator's lock before it answers with the state it last read."""


STALE_S = 30.0
"""How old that state may be: a lock busy for longer (a stuck round, a deadlock) is waited for, so that a liveness
probe times out and the kubelet restarts the service, as it should."""


class LastRead(Generic[T]):
    """What a read under the allocator's lock gave last: a liveness probe or a metrics scrape that comes during a
    round (0.1-0.5 s under the lock at 10,000 queued jobs) answers with it instead of waiting for the round, unless
    it is older than `STALE_S`."""

    def __init__(self) -> None:
        self.value: T | None = None
        self.at = -math.inf

    def read(self, lock: threading.RLock, fn: Callable[[], T]) -> T:
        fresh = self.value is not None and time.monotonic() - self.at < STALE_S
        if lock.acquire(timeout=LOOK_S if fresh else -1):
            try:
                self.value, self.at = fn(), time.monotonic()
            finally:
                lock.release()
        assert self.value is not None
        return self.value


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["ops"], route_class=JSONRoute)
    health: LastRead[HealthResponse] = LastRead()
    gauges: LastRead[tuple[Gauges, dict[str, str]]] = LastRead()

    @api.get("/healthz", response_model=HealthResponse)
    def healthz() -> HealthResponse:
        a = ctx.alloc()
        return health.read(a.lock, lambda: HealthResponse(
            status="ok", policy=a.policy.name, hint_version=a.hints.version, nodes=len(a.cluster),
            allocations=len(a.cluster.allocations())))

    def state() -> tuple[Gauges, dict[str, str]]:
        a = ctx.alloc()
        return gauges.read(a.lock, lambda: _state(a))

    ctx.metrics.watch(state)

    @api.get("/metrics", response_class=PlainTextResponse)
    def prometheus() -> PlainTextResponse:
        return PlainTextResponse(ctx.metrics.render(), media_type=CONTENT_TYPE)

    return api


def _state(a: Allocator) -> tuple[Gauges, dict[str, str]]:
    """The allocator's gauges (call under its lock)."""
    totals = a.cluster.totals()
    gauges = {
        "nodes": ("Nodes known to the allocator.", float(len(a.cluster))),
        "allocations": ("Running allocations.", float(len(a.cluster.allocations()))),
        "gpus": ("GPUs in the cluster.", float(totals["gpus"])),
        "free_gpus": ("Free GPUs.", float(totals["free_gpus"])),
        "free_cpus": ("Free cores.", totals["free_cpu_m"] / 1000),
        "free_mem_gb": ("Free RAM (GiB).", mib_to_gib(totals["free_mem_mib"])),
    }
    return gauges, {"version": a.hints.version or ""}
