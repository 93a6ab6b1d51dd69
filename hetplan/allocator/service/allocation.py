"""Routes of the allocation API: allocate, release, the action log and its tick, the allocations.

Each route is one call of the allocator under its lock; the actions it caused are read back from the allocator's
own numbered log (`Allocator.log`), the same log `GET /v1/actions` serves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from fastapi import APIRouter, HTTPException

from hetplan.allocator.core import Allocator
from hetplan.allocator.journal import LoggedAction, TooOld
from hetplan.allocator.service.bodies import (
    ADMIN_RESPONSES, WRITE_RESPONSES, ActionOut, ActionsResponse, AllocateRequest, AllocateResponse, AllocationOut,
    AsciiInt, ErrorOut, ReleaseRequest, ReleaseResponse, action_out, allocation_out, posted,
)
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import Allocation, Decision, Job

log = logging.getLogger(__name__)


def run_logged(a: Allocator, change: Callable[[], object]) -> tuple[object, list[LoggedAction]]:
    """Run `change` under the lock; its result and the actions it logged."""
    with a.lock:
        before = a.log.latest
        result = change()
        try:
            return result, a.log.since(before)
        except TooOld:  # more actions than the log keeps: those it still has
            return result, [x for x in a.log.entries() if x.seq > before]


def allocate_job(ctx: ServiceContext, job: Job) -> tuple[Decision, bool, tuple[Allocation, ...], list[ActionOut]]:
    """Place `job` (`Allocator.allocate`: with co-adaptive rounds the simulator's admission step, peers shrunk
    toward their floors where that makes room); its decision, whether it was a retry, its parts, the peers' actions."""
    a = ctx.alloc()
    with a.lock:
        replayed = bool(a.running([job.job_id]))
        decision, logged = run_logged(a, lambda: a.allocate(job))
        parts = a.running([job.job_id]).get(job.job_id, ()) if isinstance(decision, Allocation) else ()
        return decision, replayed, parts, [action_out(x) for x in logged if x.action.job_id != job.job_id]


def release_job(ctx: ServiceContext, job_id: str) -> tuple[tuple[Allocation, ...], list[ActionOut]]:
    """Free a job (every part of a gang); with co-adaptive rounds the freed nodes' jobs then grow into what it left.
    The release stands whatever happens after it: a failed regrowth is logged and left to the next tick."""
    a = ctx.alloc()
    with a.lock:
        parts, logged = run_logged(a, lambda: a.release_parts(job_id))
        if parts and a.policy.rounds:
            nodes = list(dict.fromkeys(p.node for p in parts))
            try:
                _, grown = run_logged(a, lambda: a.rebalance(a.jobs_on(nodes), preempt=False, move=False, nodes=nodes))
                logged += grown
            except Exception:  # noqa: BLE001 - a fault barrier: the release is committed, the next tick re-sizes
                log.exception("re-sizing after releasing %s failed; the next tick tries again", job_id)
        return parts, [action_out(x) for x in logged if x.action.job_id != job_id]


def rebalance_tick(ctx: ServiceContext) -> list[ActionOut]:
    """One rebalancing step over every running job (moves allowed), recorded in the action log."""
    a = ctx.alloc()
    _, logged = run_logged(a, a.tick)
    return [action_out(x) for x in logged]


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["allocation"], route_class=JSONRoute)

    @api.post("/v1/allocate", response_model=AllocateResponse, dependencies=ctx.writer,
              responses={**posted(), **WRITE_RESPONSES})
    async def allocate(body: AllocateRequest) -> AllocateResponse:
        """Place a job (idempotent per job_id). A job larger than any node runs as a gang over nodes of one GPU
        type, all or nothing (`parts`). A rejection is an answer, not an error: status 200."""
        job = body.to_job()
        start = time.perf_counter()
        decision, replayed, parts, actions = await ctx.durably(allocate_job, ctx, job)
        ctx.metrics.observe_decision(decision, time.perf_counter() - start)
        if isinstance(decision, Allocation):
            shown = [allocation_out(p, job.job_id) for p in parts]
            return AllocateResponse(status="allocated", job_id=job.job_id, hint_version=decision.hint_version,
                                    allocation=shown[0], parts=shown, replayed=replayed, actions=actions)
        return AllocateResponse(status="rejected", job_id=job.job_id, hint_version=decision.hint_version,
                                reason=decision.reason.value, message=decision.message)

    @api.post("/v1/release", response_model=ReleaseResponse, dependencies=ctx.writer,
              responses={**posted(), **WRITE_RESPONSES})
    async def release(body: ReleaseRequest) -> ReleaseResponse:
        """Free a job's resources, every part of a gang (idempotent)."""
        parts, actions = await ctx.durably(release_job, ctx, body.job_id)
        ctx.metrics.observe_release(bool(parts))
        return ReleaseResponse(job_id=body.job_id, released=bool(parts),
                               allocation=allocation_out(parts[0], body.job_id) if parts else None,
                               actions=actions)

    @api.get("/v1/actions", response_model=ActionsResponse,
             responses={410: {"model": ErrorOut, "description": "`since` is older than the oldest action kept, or "
                                                                 "ahead of the newest: list /v1/allocations again and "
                                                                 "continue from the `latest` it reports"}})
    def get_actions(since: AsciiInt = 0) -> ActionsResponse:
        """Every change applied after action `since` (oldest first): starts, stops, re-sizes and moves, numbered
        without gaps across restarts; the log keeps the last `HETPLAN_ALLOCATOR_ACTION_LOG` (default 10,000)."""
        a = ctx.alloc()
        with a.lock:
            try:
                logged = a.log.since(since)
            except TooOld as exc:
                raise HTTPException(410, str(exc)) from None
            return ActionsResponse(latest=a.log.latest, actions=[action_out(x) for x in logged])

    @api.post("/v1/actions/tick", response_model=ActionsResponse, tags=["admin"], dependencies=ctx.admin,
              responses={**posted(body=False), **ADMIN_RESPONSES})
    async def tick() -> ActionsResponse:
        """Rebalance now instead of at the next periodic tick (admin); returns the actions it decided."""
        recorded = await ctx.durably(rebalance_tick, ctx)
        return ActionsResponse(latest=ctx.alloc().log.latest, actions=recorded)

    @api.get("/v1/allocations", response_model=list[AllocationOut])
    def allocations() -> list[AllocationOut]:
        """Every allocation, in the order jobs got them; a gang's parts together, each with `part_of`."""
        a = ctx.alloc()
        with a.lock:
            return [allocation_out(p, job_id) for job_id, parts in a.running().items() for p in parts]

    return api
