"""Request and response bodies of the HTTP API, the answers besides 200 that the routes document, and the numbered
action log. RAM is GiB in every body (the `mem_gb` field names are kept for compatibility)."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, StrictBool, ValidationInfo,
    WithJsonSchema, model_validator,
)
from pydantic_core import PydanticCustomError

from hetplan.allocator.journal import LoggedAction
from hetplan.contracts.trace import restart_cost
from hetplan.scheduler.online import Bounds
from hetplan.allocator.spec import (
    JOB_ID_RULE, MAX_GPUS, MAX_NAME, MILLI_PER_GPU, NAME_RULE, Allocation, Job, Node, check_job_id, check_name,
    gpu_request,
)


def _name(value: str, info: ValidationInfo) -> str:
    return check_name(value, info.field_name or "name")


NAME_PATTERN = r"^[^\p{C}\p{Z}]( *[^\p{C}\p{Z}])*$"
"""`spec.check_name`'s rule as an ECMA-262 pattern for the OpenAPI schema (`\p{C}`: control, format, surrogate,
private-use and unassigned; `\p{Z}`: separators). `check_name` alone enforces it."""

NAME_FORMAT = "printable"
"""The name's `format` in the OpenAPI schema (an annotation: `NAME_RULE` says what it means), for generators that
cannot read `\\p{...}` classes (schemathesis registers a strategy for it, tests/test_openapi.py)."""

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME, description=NAME_RULE,
                            json_schema_extra={"pattern": NAME_PATTERN, "format": NAME_FORMAT}), AfterValidator(_name)]
"""A model or node name: `spec.check_name` (one rule for the library and the API)."""


def _job_id(value: str, info: ValidationInfo) -> str:
    return check_job_id(value, info.field_name or "job_id")


JOB_ID_PATTERN = r"^[^\p{C}\p{Z}#]( *[^\p{C}\p{Z}#])*$"
"""`spec.check_job_id`'s rule as an ECMA-262 pattern: `NAME_PATTERN` without `#` (`spec.GANG_SEP`)."""

JOB_ID_FORMAT = "job-id"
"""The job id's `format` in the OpenAPI schema: `NAME_FORMAT` without `#` (`JOB_ID_RULE`)."""

JobId = Annotated[str, Field(min_length=1, max_length=MAX_NAME, description=JOB_ID_RULE,
                             json_schema_extra={"pattern": JOB_ID_PATTERN, "format": JOB_ID_FORMAT}),
                  AfterValidator(_job_id)]
"""A job id: `spec.check_job_id` (a name without `#`, which names a gang's parts)."""


def number(low: float, high: float) -> Any:
    """A JSON number (an integer or not; never a string, a bool, NaN or inf) from `low` to `high`: one error naming
    the field when it is none, and the schema `{"type": "number", "minimum": low, "maximum": high}`."""

    def check(value: object) -> int | float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PydanticCustomError("number_type", "Input should be a JSON number")
        if isinstance(value, float) and not math.isfinite(value):
            raise PydanticCustomError("finite_number", "Input should be a finite number")
        if value < low:
            raise PydanticCustomError("greater_than_equal", "Input should be greater than or equal to {ge}",
                                      {"ge": low})
        if value > high:
            raise PydanticCustomError("less_than_equal", "Input should be less than or equal to {le}", {"le": high})
        return value

    return Annotated[int | float, PlainValidator(check),
                     WithJsonSchema({"type": "number", "minimum": low, "maximum": high})]


def _ascii_int(value: object) -> object:
    if isinstance(value, str) and not re.fullmatch(r"-?[0-9]{1,4000}", value):
        raise PydanticCustomError("int_parsing", "Input should be a whole number in ASCII digits")
    return value


AsciiInt = Annotated[int, BeforeValidator(_ascii_int)]
"""A whole number as a query parameter writes it: ASCII digits only (int() would take "1_0", " 1" or "٤")."""


def _whole(value: int | float) -> int:
    if value != int(value):
        raise PydanticCustomError("int_from_float", "Input should be a whole number")
    return int(value)


def whole(low: int, high: int) -> Any:
    """A whole JSON number from `low` to `high`; 8.0 is whole (JSON Schema's `integer` says so too)."""
    return Annotated[number(low, high), AfterValidator(_whole),
                     WithJsonSchema({"type": "integer", "minimum": low, "maximum": high})]


def _gpus(value: int | float) -> int | float:
    gpu_request(value)  # ValueError (1.5 GPUs, a share below 0.001) -> 422 naming num_gpus
    return value


GpuCount = Annotated[number(0, MAX_GPUS), AfterValidator(_gpus), WithJsonSchema({"anyOf": [
    {"type": "integer", "minimum": 0, "maximum": MAX_GPUS},
    {"type": "number", "minimum": 1 / MILLI_PER_GPU, "maximum": 1 - 1 / MILLI_PER_GPU}]})]
"""`spec.gpu_request`'s rule: 0 to 1,024 whole GPUs (2.0 is whole), or a share of one GPU from 0.001 to 0.999."""


class JobRequest(BaseModel):
    """One pod's request: a job id, its model, its GPUs and its own cores and RAM."""

    model_config = ConfigDict(extra="forbid")
    job_id: JobId
    model: Name
    num_gpus: GpuCount = Field(
        description="0: CPU-only; from 0.001 to 0.999: a share of one GPU (rounded to the nearest 0.001; shares "
                    "never span devices and never add up to more than one GPU per device); 1 to 1,024: whole GPUs")
    cpus: number(0, 1e6) | None = Field(
        None, description="the job's own CPU request (cores), a floor: it gets at least this, its hinted share where "
                          "the node allows; absent: the hinted or GPU-proportional share")
    mem_gb: number(0, 1e9) | None = Field(
        None, description="the job's own RAM request in GiB, a floor (as cpus)")

    @model_validator(mode="after")
    def _valid_request(self) -> JobRequest:
        self.to_job()  # raises ValueError (1.5 GPUs, a share below 0.001) -> 422
        return self

    def to_job(self) -> Job:
        return Job.request(self.job_id, self.model, self.num_gpus, self.cpus, self.mem_gb)


class AllocateRequest(JobRequest):
    parts: whole(2, MAX_GPUS) | None = Field(
        None, description="a job of that many parts (pods), each of num_gpus whole GPUs and its own cpus and mem_gb: "
                          "a gang, every part whole on one node of one GPU type, all started or none (the answer's "
                          "`parts`, part k as `<job_id>#k`); absent: one part, or a gang the allocator splits for "
                          "a job larger than any node")

    min_gpus: whole(1, MAX_GPUS) | None = Field(
        None, description="elastic (with `max_gpus`; needs `parts`): the fewest GPUs in all it may run on, a "
                          "multiple of num_gpus and at least 2 parts; with `hetplan serve --scaling-models` each "
                          "round chooses its count within the bounds (a `resize` action whose parts differ in "
                          "number), else it runs at num_gpus x parts")
    max_gpus: whole(1, MAX_GPUS) | None = Field(
        None, description="elastic: the most GPUs in all it may run on (a multiple of num_gpus, at most one GPU "
                          "type's GPUs)")
    restart_s: number(0, 86_400) | None = Field(
        None, description="elastic: seconds a change of its count costs it (checkpoint, restart, rendezvous); "
                          "default: the model's (Sia's per-model costs), else 30")

    @model_validator(mode="after")
    def _valid_request(self) -> AllocateRequest:
        if self.parts is None:
            self.to_job()  # raises ValueError (1.5 GPUs, a share below 0.001) -> 422
        self._valid_bounds()
        return self  # with parts: `to_job` below, in the route

    def _valid_bounds(self) -> None:
        """Elastic bounds: both or none, on a gang of fixed parts, whole parts (at least 2), around its request."""
        if self.min_gpus is None and self.max_gpus is None:
            if self.restart_s is not None:
                raise ValueError("restart_s: only an elastic job (min_gpus and max_gpus) has a restart cost")
            return
        if self.min_gpus is None or self.max_gpus is None:
            raise ValueError(f"{'min_gpus' if self.min_gpus is None else 'max_gpus'}: an elastic job gives both "
                             "min_gpus and max_gpus")
        if self.parts is None:
            raise ValueError("min_gpus: an elastic job is a gang of fixed parts (give `parts`: a pod cannot change "
                             "its GPU count, a job changes its number of pods)")
        size = int(self.num_gpus)
        if self.max_gpus < self.min_gpus:
            raise ValueError(f"max_gpus: {self.max_gpus} is below min_gpus {self.min_gpus}")
        for name in ("min_gpus", "max_gpus"):
            value = getattr(self, name)
            if size < 1 or value % size or value < 2 * size:
                raise ValueError(f"{name}: {value} GPUs is no whole number of parts of {self.num_gpus} GPUs, at "
                                 "least 2")
        asked = size * int(self.parts)
        if not self.min_gpus <= asked <= self.max_gpus:
            raise ValueError(f"min_gpus: the job asks for {asked} GPUs ({self.parts} parts of {size}), outside "
                             f"its bounds {self.min_gpus}-{self.max_gpus}")

    def bounds(self) -> Bounds | None:
        """Its elastic bounds (None: a rigid job)."""
        if self.min_gpus is None or self.max_gpus is None:
            return None
        restart = restart_cost(self.model) if self.restart_s is None else float(self.restart_s)
        return Bounds(int(self.min_gpus), int(self.max_gpus), restart)

    def to_job(self) -> Job:
        """The job asked for; `ValueError` for parts of a share or CPU-only, or of more than 1,024 GPUs in all
        (the schema cannot say so: the service answers them `rejected`, a job that can never run)."""
        return Job.request(self.job_id, self.model, self.num_gpus, self.cpus, self.mem_gb,
                           None if self.parts is None else int(self.parts))


class ReleaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: JobId


class AllocationOut(BaseModel):
    job_id: str
    model: str
    node: str
    gpu_type: str
    gpus: int
    cpus: float
    mem_gb: float = Field(description="RAM given, in GiB (2^30 bytes; the field keeps its name for compatibility)")
    hint_version: str | None
    policy: str
    share: str
    rank: int | None
    gpu_share: float | None = Field(None, description="for a GPU share: the fraction of one GPU (gpus is 0)")
    device: int | None = Field(None, description="for a GPU share: the shared device's slot on the node, the same "
                                                 "for every job sharing it")
    requested_cpus: float | None = Field(None, description="the job's own CPU request, if it stated one")
    requested_mem_gb: float | None = Field(None, description="the job's own RAM request in GiB, if it stated one")
    part_of: str | None = Field(None, description="for a part of a gang (a job larger than any node, run over "
                                                  "several nodes of one GPU type): the job's id; `job_id` is then "
                                                  "the part's, `<job id>#<k>`")


class ActionOut(BaseModel):
    """A change the allocator applied to a job: `start` (allocated), `stop` (released, preempted or evicted with
    its node), `resize` (same node, other cores/RAM) or `migrate` (other node: checkpoint, evict, re-create).
    `before`/`after`: one allocation per node (several for a gang)."""

    seq: int = Field(description="position in the action log (GET /v1/actions?since=...)")
    at: float = Field(description="when it was decided (Unix seconds)")
    kind: Literal["start", "stop", "migrate", "resize", "checkpoint-timeout"] = Field(
        description="`checkpoint-timeout`: a note, no change: the pod of action `of` did not answer its checkpoint "
                    "request in its grace period and was evicted (or its Job patched) without one")
    job_id: str
    before: list[AllocationOut]
    after: list[AllocationOut]
    preempted: bool = Field(False, description="a `stop` that is not the job's end: a round preempted it (or its "
                                               "room was taken back); it waits in the queue to run again "
                                               "(checkpoint, then evict)")
    of: int | None = Field(None, description="a note's: the action it is about")
    pod: str | None = Field(None, description="a note's: the pod (`namespace/name`; a gang's Job for a rescale)")
    detail: str | None = Field(None, description="a note's: what happened, in words")


class ActionsResponse(BaseModel):
    latest: int = Field(description="the newest action's seq (0: none yet); pass it as `since` next time. Numbers "
                                    "go on across restarts, without gaps")
    actions: list[ActionOut]


class AllocateResponse(BaseModel):
    status: Literal["allocated", "queued", "rejected"] = Field(
        description="`allocated`: it runs (`allocation`, `parts`); `queued`: it waits its turn (`position`, `why`) "
                    "and starts by a `start` action in the log; `rejected`: it can never run here (`reason`)")
    job_id: str
    hint_version: str | None
    allocation: AllocationOut | None = None
    replayed: bool = Field(False, description="true when the job id was known already (idempotent retry)")
    position: int | None = Field(None, description="queued: its place in the queue's order, 1 first")
    why: Literal["no-room", "lower-priority", "gang-waiting", "busy"] | None = Field(
        None, description="queued: no node has its GPUs and floor free; jobs ahead of it take the room there is; "
                          "it needs more GPUs than any node (a gang) and waits for enough of one type; `busy`: a "
                          "scheduling round was running, the job is recorded and takes its place when it ends (no "
                          "`position` yet: `GET /v1/queue` has it)")
    reason: str | None = None
    message: str | None = None
    parts: list[AllocationOut] = Field([], description="every part of the allocation: one for a job on one node, "
                                                       "several for a gang (then `allocation` is the first)")
    actions: list[ActionOut] = Field([], description="peers re-sized to make room for this job")


class ReleaseResponse(BaseModel):
    job_id: str
    released: bool = Field(description="false when the job held no allocation (releasing twice is harmless)")
    dequeued: bool = Field(False, description="true when the job was waiting in the queue and left it")
    allocation: AllocationOut | None = None
    actions: list[ActionOut] = Field([], description="the freed node's jobs grown into what it left")


GPU_TYPE_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._+ -]{0,62}[A-Za-z0-9._+-])?$"
"""ASCII letters, digits and `._+-` (spaces inside): what `hetplan.gpus.canonical_gpu` keeps as a GPU type name."""


class NodeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Name
    gpu_type: str = Field(min_length=1, max_length=64, pattern=GPU_TYPE_PATTERN,
                          description="a GPU type: a known one in any common spelling (V100, Tesla-T4, A100-80GB), "
                                      "else kept as an opaque type")
    gpus: whole(1, 1024)
    cpus: number(0.001, 1e6) = Field(description="cores (whole millicores, rounded down)")
    mem_gb: number(1 / 1024, 1e9) = Field(description="RAM in GiB (2^30 bytes; whole MiB, rounded down; the field "
                                                       "keeps its name for compatibility)")
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _valid_node(self) -> NodeIn:
        self.to_node()  # raises ValueError (unknown GPU type, ...) -> 422
        return self

    def to_node(self) -> Node:
        return Node(self.name, self.gpu_type, self.gpus, self.cpus, self.mem_gb, self.labels)


class NodeOut(BaseModel):
    name: str
    gpu_type: str
    gpus: int
    cpus: float
    mem_gb: float = Field(description="RAM in GiB (2^30 bytes)")
    labels: dict[str, str]
    free_gpus: int
    free_cpus: float
    free_mem_gb: float = Field(description="free RAM in GiB (2^30 bytes)")
    jobs: list[str]


class NodesResponse(BaseModel):
    nodes: list[NodeOut]
    totals: dict[str, float] = Field(description="nodes, gpus, free_gpus, cpus, free_cpus, mem_gb and free_mem_gb "
                                                 "(RAM in GiB) summed over all nodes")


class NodeChangesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    upsert: list[NodeIn] = Field(default_factory=list, max_length=100_000)
    remove: list[str] = Field(default_factory=list, max_length=100_000)
    force: StrictBool = Field(False, description="removing a busy node releases its allocations instead of refusing")


class NodeChangesResponse(BaseModel):
    upserted: int
    removed: int
    evicted: list[str]


class HintRow(BaseModel):
    model: str
    num_gpus: int
    gpu_type: str
    rank: int
    cpus_per_gpu: float
    mem_gb_per_gpu: float = Field(description="RAM per GPU in GiB (2^30 bytes), as in the hint table")
    expected_throughput: float
    normalized_throughput: float


class HintsResponse(BaseModel):
    version: str | None
    classes: int
    rows: list[HintRow]
    last_error: str | None = None


class HealthResponse(BaseModel):
    status: Literal["ok"]
    policy: str
    hint_version: str | None
    nodes: int
    allocations: int


class ErrorOut(BaseModel):
    """The body of every error answer but 422 (FastAPI's validation errors): what is wrong."""

    detail: str


Responses = dict[int | str, dict[str, Any]]


def _error(description: str, **extra: Any) -> dict[str, Any]:
    return {"model": ErrorOut, "description": description, **extra}


def posted(body: bool = True, bad_request: str = "", too_large: str = "") -> Responses:
    """The answers every POST route gives besides its own: the body limit's (`middleware.BodyLimit`) and, for a route
    that takes a JSON body, `middleware.JSONRoute`'s 415; `bad_request`: what else the route answers 400 to,
    `too_large`: what else it answers 413 to."""
    unreadable = "Content-Length is no number"
    limit = "the body is over the size limit (refused before it is read)"
    out = {400: _error(f"{bad_request}; or {unreadable}" if bad_request else unreadable),
           413: _error(f"{limit}; or {too_large}" if too_large else limit)}
    if body:
        out[415] = _error("the body is no JSON (Content-Type: application/json)")
    return out


ADMIN_RESPONSES: Responses = {
    401: _error("missing or wrong bearer token",
                headers={"WWW-Authenticate": {"description": "the scheme to use: Bearer", "schema": {"type": "string"}}}),
    403: _error("admin endpoints are disabled: the service was started without a token"),
}
"""The answers of an admin route's token check (`ServiceContext.admin`)."""

WRITE_RESPONSES: Responses = {
    401: _error("missing or wrong bearer token: with a write token configured, allocator writes need it (or the "
                "admin token)", headers={"WWW-Authenticate": {"description": "the scheme to use: Bearer",
                                                             "schema": {"type": "string"}}}),
}
"""The answers of a write route's token check (`ServiceContext.writer`)."""

REFUSED: Responses = {409: _error("a change was refused (all or nothing: nothing changed)")}


def allocation_out(a: Allocation, job_id: str | None = None) -> AllocationOut:
    """An allocation as the API shows it; `job_id`: the job it belongs to (a gang part's `part_of`)."""
    return AllocationOut(**a.to_dict(), part_of=job_id if job_id is not None and job_id != a.job_id else None)


def action_out(x: LoggedAction) -> ActionOut:
    return ActionOut(seq=x.seq, at=x.at, kind=x.action.kind, job_id=x.action.job_id,
                     before=[allocation_out(a, x.action.job_id) for a in x.action.before],
                     after=[allocation_out(a, x.action.job_id) for a in x.action.after], preempted=x.preempted,
                     **({} if x.note is None else x.note.to_dict()))


class QueuedOut(BaseModel):
    job_id: str
    model: str
    num_gpus: int
    position: int = Field(description="its place in the order, 1 first")
    why: Literal["no-room", "lower-priority", "gang-waiting"]
    arrival: float = Field(description="when it was submitted (the service's clock, seconds)")
    attained_gpu_s: float = Field(description="GPU-seconds it held before (the las order's key)")


class QueueResponse(BaseModel):
    order: str = Field(description="the scheduling order: fifo (arrival) or las (least attained service first)")
    jobs: list[QueuedOut]
