"""Routes of the hint table in force: read it, or reload it from the store now (admin)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from hetplan.allocator.service.bodies import ADMIN_RESPONSES, ErrorOut, HintRow, HintsResponse, Responses, posted
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute


NOT_RELOADED: Responses = {409: {"model": ErrorOut, "description": "the version LATEST names cannot be loaded (a "
                                                                   "LATEST that is no version, a missing or corrupt "
                                                                   "file: named); the table in force stays"}}


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["hints"], route_class=JSONRoute)

    def hints_response() -> HintsResponse:
        a = ctx.alloc()
        hints = a.hints
        rows = [HintRow(model=model, num_gpus=gpus, gpu_type=e.gpu_type, rank=e.rank, cpus_per_gpu=e.cpus_per_gpu,
                        mem_gb_per_gpu=e.mem_gb_per_gpu, expected_throughput=e.expected_throughput,
                        normalized_throughput=e.normalized_throughput)
                for (model, gpus), entries in sorted(hints.classes.items()) for e in entries]
        return HintsResponse(version=hints.version, classes=len(hints.classes), rows=rows,
                             last_error=a.hint_source.last_error)

    @api.get("/v1/hints", response_model=HintsResponse)
    def get_hints() -> HintsResponse:
        """The hint table in force (class keys: model names lower-cased)."""
        return hints_response()

    @api.post("/v1/hints/reload", response_model=HintsResponse, tags=["admin"], dependencies=ctx.admin,
              responses={**posted(body=False), **ADMIN_RESPONSES, **NOT_RELOADED})
    def reload_hints() -> HintsResponse:
        """Look at the store's LATEST now instead of at the next poll (admin); 409 naming the file when the version it
        names cannot be loaded (the table in force stays)."""
        a = ctx.alloc()
        hints = a.reload_hints()
        error = a.hint_source.last_error
        if error is not None:
            raise HTTPException(409, f"hints not reloaded ({hints.version} stays in force): {error}")
        return hints_response()

    return api
