"""Route of adoption: `POST /v1/adopt`, an allocation for a pod that already runs on a node.

A pod the webhook left to the default path (no room when it was created, the allocator unreachable) that
Kubernetes placed since is *adopted* by the controller: the allocator gives its job an allocation on that node of
the pod's own request (`Allocator.adopt`), which the next re-sizing step grows toward its hinted share. While the
node sync counts room (`k8s.room`), that pod's usage is foreign until then: it is counted as the job's own for the
adoption, so the room it already holds is the room it is given.
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import Field

from hetplan.allocator.service.bodies import (
    WRITE_RESPONSES, AllocateRequest, AllocateResponse, Name, allocation_out, posted,
)
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import Allocation, Decision, Job


class AdoptRequest(AllocateRequest):
    node: Name = Field(description="the node the job's pod already runs on")


def adopt_job(ctx: ServiceContext, job: Job, node: str) -> tuple[Decision, bool]:
    """`Allocator.adopt` with the pod's room counted as its own (the node sync, if one runs); and whether the job
    held an allocation already."""
    a = ctx.alloc()
    sync = ctx.node_sync
    with a.lock:
        replayed = bool(a.running([job.job_id]))
        if sync is not None and not replayed:
            sync.recount([node], owned=[job.job_id])
        try:
            return a.adopt(job, node), replayed
        finally:
            if sync is not None and not replayed:
                sync.recount([node])


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["allocation"], route_class=JSONRoute)

    @api.post("/v1/adopt", response_model=AllocateResponse, dependencies=ctx.writer,
              responses={**posted(), **WRITE_RESPONSES})
    async def adopt(body: AdoptRequest) -> AllocateResponse:
        """Allocate a job whose pod already runs on `node` (idempotent per job_id): its own request there, grown
        toward its hinted share by the next re-sizing step. A rejection is an answer, not an error: status 200."""
        job = body.to_job()
        decision, replayed = await ctx.durably(adopt_job, ctx, job, body.node)
        if isinstance(decision, Allocation):
            shown = allocation_out(decision, job.job_id)
            return AllocateResponse(status="allocated", job_id=job.job_id, hint_version=decision.hint_version,
                                    allocation=shown, parts=[shown], replayed=replayed, actions=[])
        return AllocateResponse(status="rejected", job_id=job.job_id, hint_version=decision.hint_version,
                                reason=decision.reason.value, message=decision.message)

    return api
