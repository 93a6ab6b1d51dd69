"""Route of adoption: `POST /v1/adopt`, an allocation for a pod that already runs on a node.

A pod the webhook left to the default path (no room when it was created, the allocator unreachable) that
Kubernetes placed since is *adopted* by the controller: the allocator gives its job an allocation on that node of
the pod's own request (`Allocator.adopt`), which the next re-sizing step grows toward its hinted share. While the
node sync counts room (`k8s.room`), that pod's usage is foreign until then: it is counted as the job's own for the
adoption, so the room it already holds is the room it is given.

A pod the scheduler bound to room the allocator gave meanwhile to a job whose pod is not bound yet (the node sync
had not seen the binding) wins it: that job's allocation there is taken back in the same change, the job placed
again elsewhere (`migrate`) or stopped (its pod waits; the controller asks for it again), and the response's
`actions` say so. A bound pod's room is never taken back.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter
from pydantic import Field

from hetplan.allocator.core import Allocator
from hetplan.allocator.service.allocation import run_logged
from hetplan.allocator.service.bodies import (
    WRITE_RESPONSES, ActionOut, AllocateRequest, AllocateResponse, Name, action_out, allocation_out, posted,
)
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import Allocation, Decision, Job

log = logging.getLogger(__name__)


class AdoptRequest(AllocateRequest):
    node: Name = Field(description="the node the job's pod already runs on")


def unbound(sync: Any, a: Allocator, node: str) -> set[str]:
    """The jobs holding room on `node` none of whose pods is bound to a node (the node sync's pods): what a pod that
    runs there may take back (`Allocator.adopt`). None before the sync has listed the pods."""
    if sync is None or not sync.pods_ready.is_set():
        return set()
    placed = sync.ledger.jobs()
    return {j for j in a.cluster.jobs_on(node) if j not in placed}


def adopt_job(ctx: ServiceContext, job: Job, node: str) -> tuple[Decision, bool, list[ActionOut]]:
    """`Allocator.adopt` with the pod's room counted as its own (the node sync, if one runs); whether the job held
    an allocation already; the actions of the jobs whose unbound allocations gave the room back."""
    a = ctx.alloc()
    sync = ctx.node_sync
    with a.lock:
        replayed = bool(a.running([job.job_id]))
        if sync is not None and not replayed:
            sync.recount([node], owned=[job.job_id])
        try:
            decision, logged = run_logged(a, lambda: a.adopt(job, node, unbound(sync, a, node)))
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
        decision, replayed, actions = await ctx.durably(adopt_job, ctx, job, body.node)
        if isinstance(decision, Allocation):
            shown = allocation_out(decision, job.job_id)
            return AllocateResponse(status="allocated", job_id=job.job_id, hint_version=decision.hint_version,
                                    allocation=shown, parts=[shown], replayed=replayed, actions=actions)
        return AllocateResponse(status="rejected", job_id=job.job_id, hint_version=decision.hint_version,
                                reason=decision.reason.value, message=decision.message)

    return api
