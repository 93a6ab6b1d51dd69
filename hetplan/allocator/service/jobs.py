"""Route of the job history (read-only): every job the action log still holds from its first start, with its spans.

`hetplan trace export --url` turns it into a trace (`hetplan.traces.history`); it reads the log and changes nothing.
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from hetplan.allocator.history import job_histories
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute


class PartOut(BaseModel):
    node: str
    gpu_type: str
    gpus: int
    cpu_m: int = Field(description="Millicores given.")
    mem_mib: int = Field(description="RAM given, MiB.")
    gpu_milli: int = Field(description="A share of one GPU, in thousandths (with gpus 0).")


class SpanOut(BaseModel):
    start: float = Field(description="When the job got these parts (the allocator's clock, seconds).")
    end: float | None = Field(description="When it gave them up (null: it still holds them).")
    parts: list[PartOut]


class JobOut(BaseModel):
    job_id: str
    model: str
    num_gpus: int = Field(description="Whole GPUs of its first span (0: CPU-only or a share of one GPU).")
    done: bool = Field(description="Its last span has ended (released, or evicted and not started again).")
    run_s: float = Field(description="Seconds it held resources (its ended spans).")
    spans: list[SpanOut]


class JobsResponse(BaseModel):
    latest: int = Field(description="The number of the action log's newest action.")
    partial: int = Field(description="Jobs left out: their first start is older than the log keeps.")
    jobs: list[JobOut]


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["allocation"], route_class=JSONRoute)

    @api.get("/v1/jobs", response_model=JobsResponse)
    def get_jobs() -> JobsResponse:
        """Every job the action log holds from its first start, in order of that start: model, GPUs, and the spans
        it held each set of parts (GPU type, cores, RAM). What `hetplan trace export` makes a trace of."""
        a = ctx.alloc()
        with a.lock:
            entries = a.log.entries()
        return JobsResponse.model_validate(job_histories(entries).to_dict())

    return api
