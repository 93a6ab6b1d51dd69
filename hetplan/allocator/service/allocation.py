"""Routes of the allocation API: allocate, release, the action log and its tick, the allocations."""

from __future__ import annotations

import time

from fastapi import APIRouter

from hetplan.allocator.service.bodies import (
    ADMIN_RESPONSES, ActionOut, ActionsResponse, AllocateRequest, AllocateResponse, AllocationOut, AsciiInt,
    ReleaseRequest, ReleaseResponse, allocation_out, posted,
)
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import Allocation, Decision, Job, Reason


def allocate_job(ctx: ServiceContext, job: Job) -> tuple[Decision, bool, list[ActionOut]]:
    """Place `job`; with co-adaptive rounds, shrink peers toward their floors when that makes room (TUNE)."""
    a = ctx.alloc()
    with a.lock:
        replayed = a.cluster.allocation(job.job_id) is not None
        decision = a.allocate(job)
        if isinstance(decision, Allocation) or decision.reason is not Reason.NO_CAPACITY or not a.policy.rounds \
                or not job.whole:
            return decision, replayed, []
        # TUNE: shrink the jobs on nodes with the GPUs free toward their floors if that makes room
        peers = [p.job() for node in a.cluster.with_free_gpus(None, job.num_gpus)
                 for p in map(a.cluster.allocation, a.cluster.jobs_on(node)) if p is not None and _may_shrink(p)]
        if not peers:
            return decision, replayed, []
        actions = a.rebalance(peers + [job], preempt=False, move=False, nodes=[])
        placed = next((x.after[0] for x in actions if x.job_id == job.job_id and len(x.after) == 1), None)
        recorded = ctx.actions.record(actions)
        return (placed or decision), replayed, [r for r in recorded if r.job_id != job.job_id]


def _may_shrink(a: Allocation) -> bool:
    """Whether TUNE could take anything from `a`: a whole-GPU job holding more than its own request (or without
    one, whose floor the round policy knows)."""
    return a.gpus > 0 and (a.request_cpu_m is None or a.cpu_m > a.request_cpu_m or a.request_mem_mib is None
                           or a.mem_mib > a.request_mem_mib)


def release_job(ctx: ServiceContext, job_id: str) -> tuple[Allocation | None, list[ActionOut]]:
    """Free a job; with co-adaptive rounds, the freed node's jobs grow into what it left."""
    a = ctx.alloc()
    with a.lock:
        released = a.release(job_id)
        if released is None or not a.policy.rounds:
            return released, []
        peers = [p.job() for p in map(a.cluster.allocation, a.cluster.jobs_on(released.node))
                 if p is not None]
        return released, ctx.actions.record(a.rebalance(peers, preempt=False, move=False, nodes=[released.node]))


def rebalance_tick(ctx: ServiceContext) -> list[ActionOut]:
    """One rebalancing step over every running job (moves allowed), recorded in the action log."""
    a = ctx.alloc()
    with a.lock:
        return ctx.actions.record(a.rebalance(a.running_jobs(), preempt=False, move=True))


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["allocation"], route_class=JSONRoute)

    @api.post("/v1/allocate", response_model=AllocateResponse, responses=posted())
    async def allocate(body: AllocateRequest) -> AllocateResponse:
        """Place a job (idempotent per job_id). A rejection is an answer, not an error: status 200."""
        job = body.to_job()
        start = time.perf_counter()
        decision, replayed, actions = await ctx.durably(allocate_job, ctx, job)
        ctx.metrics.observe_decision(decision, time.perf_counter() - start)
        if isinstance(decision, Allocation):
            return AllocateResponse(status="allocated", job_id=job.job_id, hint_version=decision.hint_version,
                                    allocation=allocation_out(decision), replayed=replayed, actions=actions)
        return AllocateResponse(status="rejected", job_id=job.job_id, hint_version=decision.hint_version,
                                reason=decision.reason.value, message=decision.message)

    @api.post("/v1/release", response_model=ReleaseResponse, responses=posted())
    async def release(body: ReleaseRequest) -> ReleaseResponse:
        """Free a job's resources (idempotent)."""
        released, actions = await ctx.durably(release_job, ctx, body.job_id)
        ctx.metrics.observe_release(released is not None)
        return ReleaseResponse(job_id=body.job_id, released=released is not None,
                               allocation=allocation_out(released) if released is not None else None,
                               actions=actions)

    @api.get("/v1/actions", response_model=ActionsResponse)
    def get_actions(since: AsciiInt = 0) -> ActionsResponse:
        """Re-sizes and moves decided after action `since` (oldest first; the log keeps the last few thousand)."""
        return ctx.actions.since(since)

    @api.post("/v1/actions/tick", response_model=ActionsResponse, tags=["admin"], dependencies=ctx.admin,
              responses={**posted(body=False), **ADMIN_RESPONSES})
    async def tick() -> ActionsResponse:
        """Rebalance now instead of at the next periodic tick (admin); returns the actions it decided."""
        recorded = await ctx.durably(rebalance_tick, ctx)
        return ActionsResponse(latest=ctx.actions.latest, actions=recorded)

    @api.get("/v1/allocations", response_model=list[AllocationOut])
    def allocations() -> list[AllocationOut]:
        a = ctx.alloc()
        with a.lock:
            return [allocation_out(x) for x in a.cluster.allocations()]

    return api
