"""Route of the log's notes: `POST /v1/notes`, what the controller reports about an action it applied that the
allocator cannot see: `checkpoint-timeout`, a pod that did not answer its checkpoint request within its grace period
and was evicted (a move, a preemption) or whose gang's Job was patched (a rescale) without a checkpoint.

A note is an entry of the action log (`GET /v1/actions` shows it, numbered as any action) that changes nothing.
Idempotent: the same note (kind, job, action, pod) asked for again is answered with the one logged (`status:
exists`), so a controller restarted between reporting and forgetting its report never logs it twice.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from hetplan.allocator.actions import NOTE_KINDS
from hetplan.allocator.journal import Note
from hetplan.allocator.service.bodies import WRITE_RESPONSES, ActionOut, ErrorOut, JobId, action_out, posted
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute


class NoteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal[NOTE_KINDS] = Field(description="what happened: `checkpoint-timeout`")  # type: ignore[valid-type]
    job_id: JobId
    of: int = Field(ge=1, description="the action it is about (its `seq`)")
    pod: str = Field(min_length=1, max_length=320, pattern=r"^[a-z0-9.-]+/[a-zA-Z0-9._-]+$",
                     description="the pod, `namespace/name` (a gang's Job for a rescale)")
    detail: str = Field("", max_length=500, description="what happened, in words")


class NoteResponse(BaseModel):
    status: Literal["logged", "exists"] = Field(description="`logged` now, or `exists`: the same note was logged "
                                                            "before (nothing appended)")
    action: ActionOut


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["allocation"], route_class=JSONRoute)

    @api.post("/v1/notes", response_model=NoteResponse, dependencies=ctx.writer,
              responses={**posted(), **WRITE_RESPONSES,
                         409: {"model": ErrorOut, "description": "`of` names an action the log has not reached"}})
    async def note(body: NoteRequest) -> NoteResponse:
        """Append a note about action `of` to the action log (idempotent; see the module)."""
        a = ctx.alloc()

        def write() -> tuple:
            return a.note(body.kind, body.job_id, Note(body.of, body.pod, body.detail))

        try:
            logged, new = await ctx.durably(write)
        except ValueError as exc:  # an action number the log has not reached: the body is fine, the state is not
            raise HTTPException(409, str(exc)) from None
        return NoteResponse(status="logged" if new else "exists", action=action_out(logged))

    return api
