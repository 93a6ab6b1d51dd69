"""Route of a gang's count: `POST /v1/scale`, a running gang of fixed parts (a multi-pod job) to another number of
parts (elastic training: an Indexed Job or PyTorchJob running `torchrun --nnodes=MIN:MAX`, issue 31).

All or nothing (`Allocator.scale`): the answer is the gang's parts after, or, where the new parts do not fit, its
parts as they were and why (status 200: an answer, not an error). The change is one `resize` action in the log whose
`before` and `after` differ in their number of parts: the controller applies it as a checkpoint handshake on the
gang's pods, then a patch of its owner's count (`k8s/owners.py`; docs/kubernetes.md). Journaled with the
job's submission, so a restart (or a preemption) brings the gang back at its new count.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from hetplan.allocator.core import NotAGang, Scaled, UnknownJob
from hetplan.allocator.service.allocation import run_logged
from hetplan.allocator.service.bodies import (
    WRITE_RESPONSES, ActionOut, AllocationOut, ErrorOut, JobId, action_out, allocation_out, posted, whole,
)
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import MAX_GPUS


class ScaleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: JobId
    parts: whole(2, MAX_GPUS) = Field(description="the gang's new number of parts (pods), each of the GPUs and own "
                                                   "request its parts have; at most 1,024 GPUs in all")


class ScaleResponse(BaseModel):
    status: Literal["scaled", "unchanged", "rejected"] = Field(
        description="`scaled`: the gang holds `parts` now (a `resize` action in the log); `unchanged`: it had that "
                    "many already; `rejected`: the new parts do not fit, nothing changed (`reason`, `message`)")
    job_id: str
    parts: list[AllocationOut] = Field(description="every part after, `<job_id>#k` in order")
    reason: str | None = None
    message: str | None = None
    actions: list[ActionOut] = Field([], description="what the change logged: the gang's `resize` first, then any "
                                                     "job of the queue that started in the room a shrink freed")


def scale_job(ctx: ServiceContext, job_id: str, parts: int) -> tuple[Scaled, list[ActionOut]]:
    """`OnlineScheduler.scale` under the allocator's lock; what it did and the actions it logged."""
    a = ctx.alloc()
    with a.lock:
        scaled, logged = run_logged(a, lambda: ctx.sched().scale(job_id, parts))
        assert isinstance(scaled, Scaled)
        return scaled, [action_out(x) for x in logged]


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["allocation"], route_class=JSONRoute)

    @api.post("/v1/scale", response_model=ScaleResponse, dependencies=ctx.writer,
              responses={**posted(), **WRITE_RESPONSES,
                         404: {"model": ErrorOut, "description": "the job holds no resources"},
                         409: {"model": ErrorOut, "description": "the job is no running gang of fixed parts "
                                                                 "(allocated without `parts`, or waiting)"}})
    async def scale(body: ScaleRequest) -> ScaleResponse:
        """Change a running gang of fixed parts to `parts` parts, all or nothing: parts 0..parts-1 stay where and
        as they are, new ones are placed on nodes of the gang's GPU type (each whole on one node), a shrink drops
        the highest-numbered. Asking for the count it has changes nothing (`unchanged`)."""
        try:
            scaled, actions = await ctx.durably(scale_job, ctx, body.job_id, int(body.parts))
        except UnknownJob as exc:
            raise HTTPException(404, str(exc)) from None
        except NotAGang as exc:
            raise HTTPException(409, str(exc)) from None
        except ValueError as exc:  # a count the gang can never have (more than 1,024 GPUs in all)
            raise HTTPException(422, f"parts: {exc}") from None
        shown = [allocation_out(p, body.job_id) for p in scaled.parts]
        if scaled.rejection is not None:
            return ScaleResponse(status="rejected", job_id=body.job_id, parts=shown,
                                 reason=scaled.rejection.reason.value, message=scaled.rejection.message)
        return ScaleResponse(status="scaled" if scaled.changed else "unchanged", job_id=body.job_id, parts=shown,
                             actions=actions)

    return api
