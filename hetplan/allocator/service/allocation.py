"""Routes of the allocation API: allocate (submit), release, the queue, the action log and its round, the allocations.

Each route is one call of the allocator under its lock; the actions it caused are read back from the allocator's
own numbered log (`Allocator.log`), the same log `GET /v1/actions` serves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

from fastapi import APIRouter, HTTPException
from fastapi.exceptions import RequestValidationError

from hetplan.allocator.core import Allocator
from hetplan.allocator.journal import LoggedAction, TooOld
from hetplan.allocator.service.bodies import (
    ADMIN_RESPONSES, WRITE_RESPONSES, ActionOut, ActionsResponse, AllocateRequest, AllocateResponse, AllocationOut,
    AsciiInt, ErrorOut, QueuedOut, QueueResponse, ReleaseRequest, ReleaseResponse, action_out, allocation_out, posted,
)
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import Allocation, Job, Reason
from hetplan.scheduler.online import Bounds, Conflict, Submitted


def run_logged(a: Allocator, change: Callable[[], object]) -> tuple[object, list[LoggedAction]]:
    """Run `change` under the lock; its result and the actions it logged."""
    with a.lock:
        before = a.log.latest
        result = change()
        try:
            return result, a.log.since(before)
        except TooOld:  # more actions than the log keeps: those it still has
            return result, [x for x in a.log.entries() if x.seq > before]


class BadBounds(ValueError):
    """Elastic bounds no GPU type of the cluster can host (the route answers 422, naming the field)."""


BUSY_WAIT_S = 0.02
"""How long a submission waits for the allocator's lock before it is parked (`OnlineScheduler.park`) instead."""


def allocate_job(ctx: ServiceContext, job: Job, bounds: Bounds | None = None) -> tuple[Submitted, list[ActionOut]]:
    """Submit `job` to the scheduler (`OnlineScheduler.submit`): it starts now if its turn and room allow (peers
    shrunk toward their floors where that makes room), else it waits in the queue; its answer and the actions
    this caused for other jobs. While a round (or another long change) holds the lock, a new job is parked in the
    scheduler's inbox and answered `queued` (why `busy`) at once: no submission waits for a round (an elastic one
    does: its bounds are checked against the cluster). `BadBounds` (nothing changed) for elastic `bounds` above
    every GPU type's GPUs."""
    a, sched = ctx.alloc(), ctx.sched()
    if not a.lock.acquire(timeout=BUSY_WAIT_S):
        parked = sched.park(job, bounds)
        if parked is not None:
            return parked, []
        a.lock.acquire()
    try:
        if bounds is not None:
            largest = max(a.cluster.gpus_by_type()[0].values(), default=0)
            if bounds.max_gpus > largest:
                raise BadBounds(f"max_gpus: {bounds.max_gpus} GPUs, but no GPU type has more than {largest} in "
                                "open nodes")
        submitted, logged = run_logged(a, lambda: sched.submit(job, bounds))
        return submitted, [action_out(x) for x in logged if x.action.job_id != job.job_id]
    finally:
        a.lock.release()


def release_job(ctx: ServiceContext, job_id: str) -> tuple[tuple[Allocation, ...], bool, list[ActionOut]]:
    """Free a job (every part of a gang) or take it out of the queue; what it freed goes to the queue at once, and
    (co-adaptive) the freed nodes' jobs grow into what is left. The release stands whatever happens after it."""
    a = ctx.alloc()
    with a.lock:
        (parts, dequeued), logged = run_logged(a, lambda: ctx.sched().release(job_id))
        return parts, dequeued, [action_out(x) for x in logged if x.action.job_id != job_id]


def rebalance_tick(ctx: ServiceContext) -> list[ActionOut]:
    """One scheduling round (`OnlineScheduler.round`: preemptive where the order says so), in the action log."""
    a = ctx.alloc()
    _, logged = run_logged(a, ctx.sched().round)
    return [action_out(x) for x in logged]


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["allocation"], route_class=JSONRoute)

    @api.post("/v1/allocate", response_model=AllocateResponse, dependencies=ctx.writer,
              responses={**posted(), **WRITE_RESPONSES,
                         409: {"model": ErrorOut, "description": "the job id is known with another request"}})
    async def allocate(body: AllocateRequest) -> AllocateResponse:
        """Submit a job (idempotent per job_id): it runs now (`allocated`) or waits its turn in the queue
        (`queued`, with its position and why), and a `start` action in the log says when it runs. A job larger
        than any node runs as a gang over nodes of one GPU type, all or nothing (`parts`). `rejected` (status 200)
        only for a job that can never run here."""
        try:
            job = body.to_job()
        except ValueError as exc:  # parts of a share, or of more GPUs than any cluster: it can never run
            return AllocateResponse(status="rejected", job_id=body.job_id, hint_version=ctx.alloc().hints.version,
                                    reason=Reason.TOO_BIG.value, message=str(exc))
        start = time.perf_counter()
        try:
            submitted, actions = await ctx.durably(allocate_job, ctx, job, body.bounds())
        except Conflict as exc:
            raise HTTPException(409, str(exc)) from None
        except BadBounds as exc:  # a 422 as the body's own validation answers it (`middleware.validation_error`)
            raise RequestValidationError([{"type": "value_error", "loc": ("body", "max_gpus"),
                                           "msg": f"Value error, {exc}"}]) from None
        version = ctx.alloc().hints.version
        if submitted.status == "allocated":
            shown = [allocation_out(p, job.job_id) for p in submitted.parts]
            ctx.metrics.observe_decision(submitted.parts[0], time.perf_counter() - start)
            return AllocateResponse(status="allocated", job_id=job.job_id, hint_version=submitted.parts[0].hint_version,
                                    allocation=shown[0], parts=shown, replayed=submitted.replayed, actions=actions)
        if submitted.status == "queued":
            ctx.metrics.observe_queued(time.perf_counter() - start)
            return AllocateResponse(status="queued", job_id=job.job_id, hint_version=version,
                                    replayed=submitted.replayed, position=submitted.position, why=submitted.why,
                                    message=submitted.message, actions=actions)
        rejection = submitted.rejection
        assert rejection is not None
        ctx.metrics.observe_decision(rejection, time.perf_counter() - start)
        return AllocateResponse(status="rejected", job_id=job.job_id, hint_version=rejection.hint_version,
                                reason=rejection.reason.value, message=rejection.message)

    @api.post("/v1/release", response_model=ReleaseResponse, dependencies=ctx.writer,
              responses={**posted(), **WRITE_RESPONSES})
    async def release(body: ReleaseRequest) -> ReleaseResponse:
        """Free a job's resources, every part of a gang, or take it out of the queue (idempotent)."""
        parts, dequeued, actions = await ctx.durably(release_job, ctx, body.job_id)
        ctx.metrics.observe_release(bool(parts))
        return ReleaseResponse(job_id=body.job_id, released=bool(parts), dequeued=dequeued,
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
        """Run a scheduling round now instead of at the next periodic tick (admin); returns the actions it decided."""
        recorded = await ctx.durably(rebalance_tick, ctx)
        return ActionsResponse(latest=ctx.alloc().log.latest, actions=recorded)

    @api.get("/v1/queue", response_model=QueueResponse)
    def get_queue() -> QueueResponse:
        """The waiting jobs in the order they would start, each with why it waits and the service it attained."""
        waiting = ctx.sched().queue()
        return QueueResponse(order=ctx.sched().loop.order, jobs=[QueuedOut(**asdict(w)) for w in waiting])

    @api.get("/v1/allocations", response_model=list[AllocationOut])
    def allocations() -> list[AllocationOut]:
        """Every allocation, in the order jobs got them; a gang's parts together, each with `part_of`."""
        a = ctx.alloc()
        with a.lock:
            return [allocation_out(p, job_id) for job_id, parts in a.running().items() for p in parts]

    return api
