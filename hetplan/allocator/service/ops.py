"""Routes for operators: liveness (`/healthz`) and Prometheus metrics (`/metrics`)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from hetplan.allocator.metrics import CONTENT_TYPE, Gauges
from hetplan.allocator.service.bodies import HealthResponse
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import mib_to_gib


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["ops"], route_class=JSONRoute)

    @api.get("/healthz", response_model=HealthResponse)
    def healthz() -> HealthResponse:
        a = ctx.alloc()
        with a.lock:
            return HealthResponse(status="ok", policy=a.policy.name, hint_version=a.hints.version,
                                  nodes=len(a.cluster), allocations=len(a.cluster.allocations()))

    def state() -> tuple[Gauges, dict[str, str]]:
        a = ctx.alloc()
        with a.lock:
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

    ctx.metrics.watch(state)

    @api.get("/metrics", response_class=PlainTextResponse)
    def prometheus() -> PlainTextResponse:
        return PlainTextResponse(ctx.metrics.render(), media_type=CONTENT_TYPE)

    return api
