"""Route of adoption: `POST /v1/adopt`, an allocation for a pod that already runs on a node.

A pod the webhook left to the default path (no room when it was created, the allocator unreachable) that
Kubernetes placed since is *adopted* by the controller: the allocator gives its job an allocation on that node of
the pod's own request (`Allocator.adopt`), which the next re-sizing step grows toward its hinted share. While the
node sync counts room (`k8s.room`), that pod's usage is foreign until then: it is counted as the job's own for the
adoption, so the room it already holds is the room it is given.

A pod the scheduler bound to room the allocator gave meanwhile to a job whose pod is not bound yet (the node sync
had not seen the binding) wins it: that job's allocation there is taken back in the same change, the job placed
again elsewhere (`migrate`) or stopped (its pod waits; the controller asks for it again), and the response's
`actions` say so. A bound pod's room is not taken back: the node sync's pod watch may lag a binding, so the API
server is asked which of those jobs' pods are bound before any room is taken (`unbound_now`); only a pod bound in
the milliseconds between its answer and the change can be displaced (then moved like any running pod).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from hetplan.allocator.core import Allocator
from hetplan.allocator.service.allocation import run_logged
from hetplan.allocator.service.bodies import (
    WRITE_RESPONSES, ActionOut, AllocateResponse, JobRequest, Name, action_out, allocation_out, posted,
)
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import Allocation, Decision, Job

log = logging.getLogger(__name__)


class AdoptRequest(JobRequest):
    node: Name = Field(description="the node the job's pod already runs on")


def unbound(sync: Any, a: Allocator, node: str) -> set[str]:
    """The jobs holding room on `node` none of whose pods is bound to a node as the node sync's pods say (they may
    lag a binding: `unbound_now`). None before the sync has listed the pods."""
    if sync is None or not sync.pods_ready.is_set():
        return set()
    placed = sync.ledger.jobs()
    return {j for j in a.cluster.jobs_on(node) if j not in placed}


def unbound_now(ctx: ServiceContext, node: str) -> set[str]:
    """`unbound`, less the jobs the API server says have a pod bound now (`NodeSync.bound_jobs`): what a pod that
    runs on `node` may take back (`Allocator.adopt`). Nothing when the API server cannot be read."""
    a, sync = ctx.alloc(), ctx.node_sync
    with a.lock:
        candidates = unbound(sync, a, node)
    if not candidates:
        return candidates
    bound = sync.bound_jobs()
    return set() if bound is None else candidates - bound


def adopt_job(ctx: ServiceContext, job: Job, node: str,
              checked: set[str] | None = None) -> tuple[Decision, bool, list[ActionOut]]:
    """`Allocator.adopt` with the pod's room counted as its own (the node sync, if one runs); whether the job held
    an allocation already; the actions of the jobs whose unbound allocations gave the room back. `checked`:
    `unbound_now(ctx, node)`, read beforehand outside the allocator's lock (None: read here); only jobs still
    unbound then give room back."""
    a = ctx.alloc()
    sync = ctx.node_sync
    if checked is None:
        checked = unbound_now(ctx, node)
    with a.lock:
        replayed = bool(a.running([job.job_id]))
        if sync is not None and not replayed:
            sync.recount([node], owned=[job.job_id])
        try:
            decision, logged = run_logged(a, lambda: a.adopt(job, node, unbound(sync, a, node) & checked))
        finally:
            if sync is not None and not replayed:
                sync.recount([node])
        others = [x for x in logged if x.action.job_id != job.job_id]
        for x in others:
            after = x.action.after[0].node if x.action.after else "nowhere now (its pod waits)"
            log.info("adopt: %s runs on %s, where %s held room its pod was not bound to: action %d, %s to %s",
                     job.job_id, node, x.action.job_id, x.seq, x.action.kind, after)
        return decision, replayed, [action_out(x) for x in others]


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["allocation"], route_class=JSONRoute)

    @api.post("/v1/adopt", response_model=AllocateResponse, dependencies=ctx.writer,
              responses={**posted(), **WRITE_RESPONSES})
    async def adopt(body: AdoptRequest) -> AllocateResponse:
        """Allocate a job whose pod already runs on `node` (idempotent per job_id): its own request there, grown
        toward its hinted share by the next re-sizing step. A rejection is an answer, not an error: status 200."""
        job = body.to_job()
        checked = await run_in_threadpool(unbound_now, ctx, body.node)  # an API call: off the event loop
        decision, replayed, actions = await ctx.durably(adopt_job, ctx, job, body.node, checked)
        if isinstance(decision, Allocation):
            shown = allocation_out(decision, job.job_id)
            return AllocateResponse(status="allocated", job_id=job.job_id, hint_version=decision.hint_version,
                                    allocation=shown, parts=[shown], replayed=replayed, actions=actions)
        return AllocateResponse(status="rejected", job_id=job.job_id, hint_version=decision.hint_version,
                                reason=decision.reason.value, message=decision.message)

    return api
