"""The allocator as an HTTP service (FastAPI): allocation API, node admin, hints, health, metrics, K8s extender.

Run it with `hetplan serve` (one process: the state lives in memory and in SQLite, so never run several
workers on one database). Every request body is size-limited before it is parsed and validated with
pydantic; a bad body gets a 4xx naming what is wrong and changes nothing. Admin endpoints (node changes,
hint reload, tick) need `Authorization: Bearer <token>`; without a configured token they are disabled (403).

With the co-adaptive `hint` policy the allocator also re-sizes and moves running jobs (`Allocator.rebalance`):
on a release (the freed node's jobs grow), on an allocation that only fits if peers shrink (TUNE), and on a
periodic tick (moves to faster GPU types). Every such change is an *action*, returned with the request that
caused it and kept in a numbered log (`GET /v1/actions?since=N`) that a controller applies to the pods
(docs/kubernetes.md).
"""

from __future__ import annotations

import gc
import hmac
import json
import logging
import os
import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, SecretStr, StrictInt, model_validator
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hetplan.allocator import extender as k8s
from hetplan.allocator.cluster import StateError
from hetplan.allocator.core import NodeChanges
from hetplan.allocator.durable import DurableAllocator
from hetplan.allocator.metrics import Metrics
from hetplan.allocator.nodes_io import load_nodes
from hetplan.allocator.policies import POLICIES, get_policy
from hetplan.allocator.protocol import AllocatorAPI
from hetplan.allocator.rebalance import Action
from hetplan.allocator.sources import StoreHints
from hetplan.allocator.spec import Allocation, Decision, Job, Node, Reason, mib_to_gib
from hetplan.hints import HintStore, default_store_root

log = logging.getLogger(__name__)

TOKEN_ENV = "HETPLAN_ADMIN_TOKEN"
T = TypeVar("T")
KiB = 1024


class ServiceSettings(BaseModel):
    """How the service runs. `from_env` reads `HETPLAN_ALLOCATOR_*` variables (and `HETPLAN_ADMIN_TOKEN`)."""

    model_config = ConfigDict(extra="forbid")

    db: Path = Path(".hetplan") / "allocator.db"
    store: Path | None = None  # hint store root; None: $HETPLAN_HINT_STORE or .hetplan/hints
    policy: str = "hint"
    strict: bool = False  # hint policy only: place a class only on the GPU types its hints list
    token: SecretStr | None = None
    nodes: Path | None = None  # nodes to upsert at start-up (JSON, YAML or CSV)
    hint_poll_seconds: float = Field(1.0, ge=0)
    max_body_bytes: int = Field(64 * KiB, ge=1)
    max_extender_body_bytes: int = Field(32 * KiB * KiB, ge=1)  # Nodes mode carries whole v1.Node objects
    synchronous: Literal["FULL", "NORMAL", "EXTRA"] = "FULL"
    tick_seconds: float = Field(60.0, ge=0)  # co-adaptive rebalancing every so often; 0: only on request
    action_log: int = Field(10_000, ge=1)  # actions kept for GET /v1/actions

    @model_validator(mode="after")
    def _known_policy(self) -> ServiceSettings:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; one of {', '.join(sorted(POLICIES))}")
        if self.strict and self.policy not in ("hint", "hint-static"):
            raise ValueError("strict applies to the hint policy only")
        return self

    @classmethod
    def from_env(cls) -> ServiceSettings:
        values: dict[str, Any] = {}
        for field in cls.model_fields:
            raw = os.environ.get(f"HETPLAN_ALLOCATOR_{field.upper()}")
            if raw is not None:
                values[field] = raw
        if "token" not in values and os.environ.get(TOKEN_ENV):
            values["token"] = os.environ[TOKEN_ENV]
        return cls.model_validate(values)


# ------------------------------------------------------------------ request and response bodies

Name = Field(min_length=1, max_length=253, pattern=r"^\S(.*\S)?$")


class AllocateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str = Name
    model: str = Name
    num_gpus: StrictInt = Field(ge=1, le=1024)


class ReleaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str = Name


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


class ActionOut(BaseModel):
    """A change to a running job the allocator decided: `resize` (same node, other cores/RAM), `migrate`
    (other node: checkpoint, evict, re-create), `start` or `stop`. `before`/`after`: one allocation per node."""

    seq: int = Field(description="position in the action log (GET /v1/actions?since=...)")
    at: float = Field(description="when it was decided (Unix seconds)")
    kind: Literal["start", "stop", "migrate", "resize"]
    job_id: str
    before: list[AllocationOut]
    after: list[AllocationOut]


class ActionsResponse(BaseModel):
    latest: int = Field(description="the newest action's seq (0: none yet); pass it as `since` next time")
    actions: list[ActionOut]


class AllocateResponse(BaseModel):
    status: Literal["allocated", "rejected"]
    job_id: str
    hint_version: str | None
    allocation: AllocationOut | None = None
    replayed: bool = Field(False, description="true when the job id was already allocated (idempotent retry)")
    reason: str | None = None
    message: str | None = None
    actions: list[ActionOut] = Field([], description="peers re-sized to make room for this job")


class ReleaseResponse(BaseModel):
    job_id: str
    released: bool = Field(description="false when the job held no allocation (releasing twice is harmless)")
    allocation: AllocationOut | None = None
    actions: list[ActionOut] = Field([], description="the freed node's jobs grown into what it left")


class NodeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Name
    gpu_type: str = Field(min_length=1, max_length=100)
    gpus: StrictInt = Field(ge=1, le=1024)
    cpus: float = Field(gt=0, le=1e6, allow_inf_nan=False)
    mem_gb: float = Field(gt=0, le=1e9, allow_inf_nan=False,
                          description="RAM in GiB (2^30 bytes; the field keeps its name for compatibility)")
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
    force: bool = Field(False, description="removing a busy node releases its allocations instead of refusing")


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


def _out(a: Allocation) -> AllocationOut:
    return AllocationOut(**a.to_dict())


class ActionLog:
    """The last `size` actions, numbered from 1 in the order they were applied."""

    def __init__(self, size: int) -> None:
        self._entries: deque[ActionOut] = deque(maxlen=size)
        self._seq = 0

    def record(self, actions: Sequence[Action]) -> list[ActionOut]:
        now = time.time()
        out = []
        for action in actions:
            self._seq += 1
            out.append(ActionOut(seq=self._seq, at=now, kind=action.kind, job_id=action.job_id,
                                 before=[_out(a) for a in action.before], after=[_out(a) for a in action.after]))
        self._entries.extend(out)
        return out

    @property
    def latest(self) -> int:
        return self._seq

    def since(self, seq: int) -> ActionsResponse:
        return ActionsResponse(latest=self._seq, actions=[a for a in self._entries if a.seq > seq])


# ------------------------------------------------------------------ middleware


class BodyLimit:
    """Refuse request bodies over a limit (413) before the application reads them.

    Checks Content-Length when given, and counts the streamed bytes either way (chunked bodies), buffering up
    to the limit; the application then reads the buffered body.
    """

    def __init__(self, app: ASGIApp, default: int, prefixes: dict[str, int] | None = None) -> None:
        self.app = app
        self.default = default
        self.prefixes = prefixes or {}

    def _limit(self, path: str) -> int:
        for prefix, limit in self.prefixes.items():
            if path.startswith(prefix):
                return limit
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit = self._limit(scope["path"])
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await _plain_error(send, 400, "Content-Length is not a number")
                    return
                if length > limit:
                    await _plain_error(send, 413, f"request body of {length} bytes exceeds the limit of {limit}")
                    return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > limit:
                await _plain_error(send, 413, f"request body exceeds the limit of {limit} bytes")
                return
            if not message.get("more_body", False):
                break
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _plain_error(send: Send, status: int, detail: str) -> None:
    payload = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})


class RequestMetrics:
    """Count requests and time them (by route template, so that the label set stays small)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe_http(scope["method"], route, status, time.perf_counter() - start)


# ------------------------------------------------------------------ the application


def create_app(settings: ServiceSettings | None = None, allocator: AllocatorAPI | None = None) -> FastAPI:
    """The FastAPI application. Given no allocator, it opens one from `settings` at start-up and closes it after."""
    settings = settings or ServiceSettings()
    metrics = Metrics()
    state: dict[str, AllocatorAPI] = {}
    actions_log = ActionLog(settings.action_log)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if allocator is not None:
            state["alloc"] = allocator
            yield
            return
        store = HintStore(settings.store if settings.store is not None else default_store_root())
        hints = StoreHints(store, poll_seconds=settings.hint_poll_seconds)
        policy = get_policy(settings.policy, strict=True) if settings.strict else get_policy(settings.policy)
        opened = DurableAllocator(settings.db, policy, hints, synchronous=settings.synchronous)
        if settings.nodes is not None:
            seed = load_nodes(settings.nodes)
            opened.change_nodes(NodeChanges(upsert=seed))
            log.info("upserted %d nodes from %s", len(seed), settings.nodes)
        state["alloc"] = opened
        gc.freeze()  # the loaded state is long-lived: keep it out of every future collection (shorter GC pauses)
        log.info("allocator ready: %d nodes, %d allocations, policy %s, hints %s", len(opened.cluster),
                 len(opened.cluster.allocations()), opened.policy.name, opened.hints.version)
        ticker = asyncio.create_task(_tick_forever()) if settings.tick_seconds > 0 and opened.policy.rounds else None
        try:
            yield
        finally:
            if ticker is not None:
                ticker.cancel()
            opened.close()

    async def _tick_forever() -> None:
        while True:
            await asyncio.sleep(settings.tick_seconds)
            try:
                await run_in_threadpool(_tick)
            except Exception:  # a failed tick must not stop the next one; the state is unchanged (all or nothing)
                log.exception("rebalancing tick failed")

    app = FastAPI(title="hetplan allocator", version="1", lifespan=lifespan,
                  description="Hint-driven GPU job placement: allocation API, node admin, hints, Kubernetes "
                              "scheduler extender (`/filter`, `/prioritize`).")
    app.add_middleware(BodyLimit, default=settings.max_body_bytes,
                       prefixes={"/filter": settings.max_extender_body_bytes,
                                 "/prioritize": settings.max_extender_body_bytes})
    app.add_middleware(RequestMetrics, metrics=metrics)
    bearer = HTTPBearer(auto_error=False, description="The admin token (`hetplan serve --token`).")

    def alloc() -> AllocatorAPI:
        return state["alloc"]

    def require_admin(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if settings.token is None:
            raise HTTPException(403, f"admin endpoints are disabled: start the service with a token "
                                     f"(--token or ${TOKEN_ENV})")
        expected = settings.token.get_secret_value().encode()
        if credentials is None or not hmac.compare_digest(credentials.credentials.encode(), expected):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    async def durably(fn: Callable[..., T], *args: Any) -> T:
        """Run a state change: inline when commits do not fsync (microseconds), else in a worker thread so that
        an fsync never stalls the event loop."""
        if alloc().synchronous in ("OFF", "NORMAL"):
            return fn(*args)
        return await run_in_threadpool(fn, *args)

    def _allocate(job: Job) -> tuple[Decision, bool, list[ActionOut]]:
        a = alloc()
        with a.lock:
            replayed = a.cluster.allocation(job.job_id) is not None
            decision = a.allocate(job)
            if isinstance(decision, Allocation) or decision.reason is not Reason.NO_CAPACITY or not a.policy.rounds:
                return decision, replayed, []
            # TUNE: shrink the jobs on nodes with the GPUs free toward their floors if that makes room
            peers = [Job(p.job_id, p.model, p.gpus) for node in a.cluster.with_free_gpus(None, job.num_gpus)
                     for p in map(a.cluster.allocation, a.cluster.jobs_on(node)) if p is not None]
            actions = a.rebalance(peers + [job], preempt=False, move=False, nodes=[])
            placed = next((x.after[0] for x in actions if x.job_id == job.job_id and len(x.after) == 1), None)
            recorded = actions_log.record(actions)
            return (placed or decision), replayed, [r for r in recorded if r.job_id != job.job_id]

    def _release(job_id: str) -> tuple[Allocation | None, list[ActionOut]]:
        a = alloc()
        with a.lock:
            released = a.release(job_id)
            if released is None or not a.policy.rounds:
                return released, []
            peers = [Job(p.job_id, p.model, p.gpus) for p in map(a.cluster.allocation, a.cluster.jobs_on(released.node))
                     if p is not None]
            return released, actions_log.record(a.rebalance(peers, preempt=False, move=False, nodes=[released.node]))

    def _tick() -> list[ActionOut]:
        a = alloc()
        with a.lock:
            return actions_log.record(a.rebalance(a.running_jobs(), preempt=False, move=True))

    @app.post("/v1/allocate", response_model=AllocateResponse, tags=["allocation"])
    async def allocate(body: AllocateRequest) -> AllocateResponse:
        """Place a job (idempotent per job_id). A rejection is an answer, not an error: status 200."""
        job = Job(body.job_id, body.model, body.num_gpus)
        start = time.perf_counter()
        decision, replayed, actions = await durably(_allocate, job)
        metrics.observe_decision(decision, time.perf_counter() - start)
        if isinstance(decision, Allocation):
            return AllocateResponse(status="allocated", job_id=job.job_id, hint_version=decision.hint_version,
                                    allocation=_out(decision), replayed=replayed, actions=actions)
        return AllocateResponse(status="rejected", job_id=job.job_id, hint_version=decision.hint_version,
                                reason=decision.reason.value, message=decision.message)

    @app.post("/v1/release", response_model=ReleaseResponse, tags=["allocation"])
    async def release(body: ReleaseRequest) -> ReleaseResponse:
        """Free a job's resources (idempotent)."""
        released, actions = await durably(_release, body.job_id)
        metrics.observe_release(released is not None)
        return ReleaseResponse(job_id=body.job_id, released=released is not None,
                               allocation=_out(released) if released is not None else None, actions=actions)

    @app.get("/v1/actions", response_model=ActionsResponse, tags=["allocation"])
    def get_actions(since: int = 0) -> ActionsResponse:
        """Re-sizes and moves decided after action `since` (oldest first; the log keeps the last few thousand)."""
        return actions_log.since(since)

    @app.post("/v1/actions/tick", response_model=ActionsResponse, tags=["allocation", "admin"],
              dependencies=[Depends(require_admin)])
    async def tick() -> ActionsResponse:
        """Rebalance now instead of at the next periodic tick (admin); returns the actions it decided."""
        recorded = await durably(_tick)
        return ActionsResponse(latest=actions_log.latest, actions=recorded)

    @app.get("/v1/allocations", response_model=list[AllocationOut], tags=["allocation"])
    def allocations() -> list[AllocationOut]:
        a = alloc()
        with a.lock:
            return [_out(x) for x in a.cluster.allocations()]

    @app.get("/v1/nodes", response_model=NodesResponse, tags=["nodes"])
    def nodes() -> NodesResponse:
        a = alloc()
        with a.lock:
            cluster = a.cluster
            out = []
            for node in cluster.nodes():
                free = cluster.free(node.name)
                out.append(NodeOut(**node.to_dict(), free_gpus=free.gpus, free_cpus=free.cpu_m / 1000,
                                   free_mem_gb=mib_to_gib(free.mem_mib), jobs=cluster.jobs_on(node.name)))
            totals = cluster.totals()
        return NodesResponse(nodes=out, totals={
            "nodes": len(out), "gpus": totals["gpus"], "free_gpus": totals["free_gpus"],
            "cpus": totals["cpu_m"] / 1000, "free_cpus": totals["free_cpu_m"] / 1000,
            "mem_gb": mib_to_gib(totals["mem_mib"]), "free_mem_gb": mib_to_gib(totals["free_mem_mib"])})

    @app.post("/v1/nodes", response_model=NodeChangesResponse, tags=["nodes", "admin"],
              dependencies=[Depends(require_admin)], responses={409: {"description": "a change was refused"}})
    def change_nodes(body: NodeChangesIn) -> NodeChangesResponse:
        """Add, update and remove nodes, all or nothing (admin)."""
        changes = NodeChanges(upsert=[n.to_node() for n in body.upsert], remove=list(body.remove), force=body.force)
        try:
            evicted = alloc().change_nodes(changes)
        except StateError as exc:
            raise HTTPException(409, str(exc)) from None
        return NodeChangesResponse(upserted=len(changes.upsert), removed=len(changes.remove),
                                   evicted=[e.job_id for e in evicted])

    def _hints_response() -> HintsResponse:
        a = alloc()
        hints = a.hints
        rows = [HintRow(model=model, num_gpus=gpus, gpu_type=e.gpu_type, rank=e.rank, cpus_per_gpu=e.cpus_per_gpu,
                        mem_gb_per_gpu=e.mem_gb_per_gpu, expected_throughput=e.expected_throughput,
                        normalized_throughput=e.normalized_throughput)
                for (model, gpus), entries in sorted(hints.classes.items()) for e in entries]
        return HintsResponse(version=hints.version, classes=len(hints.classes), rows=rows,
                             last_error=a.hint_source.last_error)

    @app.get("/v1/hints", response_model=HintsResponse, tags=["hints"])
    def get_hints() -> HintsResponse:
        """The hint table in force (class keys: model names lower-cased)."""
        return _hints_response()

    @app.post("/v1/hints/reload", response_model=HintsResponse, tags=["hints", "admin"],
              dependencies=[Depends(require_admin)])
    def reload_hints() -> HintsResponse:
        """Look at the store's LATEST now instead of at the next poll (admin)."""
        alloc().reload_hints()
        return _hints_response()

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, Any]:
        a = alloc()
        with a.lock:
            return {"status": "ok", "policy": a.policy.name, "hint_version": a.hints.version,
                    "nodes": len(a.cluster), "allocations": len(a.cluster.allocations())}

    @app.get("/metrics", response_class=PlainTextResponse, tags=["ops"])
    def prometheus() -> PlainTextResponse:
        a = alloc()
        with a.lock:
            totals = a.cluster.totals()
            gauges = {
                "nodes": ("Nodes known to the allocator.", float(len(a.cluster))),
                "allocations": ("Running allocations.", float(len(a.cluster.allocations()))),
                "gpus": ("GPUs in the cluster.", float(totals["gpus"])),
                "free_gpus": ("Free GPUs.", float(totals["free_gpus"])),
                "free_cpus": ("Free cores.", totals["free_cpu_m"] / 1000),
                "free_mem_gb": ("Free RAM (GiB).", mib_to_gib(totals["free_mem_mib"])),
            }
            version = a.hints.version
        text = metrics.render(gauges, {"version": version or ""})
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------------ Kubernetes scheduler extender

    def _candidates(args: k8s.ExtenderArgs) -> list[k8s.Candidate]:
        if args.nodes is not None:
            return [k8s.node_candidate(raw) for raw in args.nodes.items]
        a = alloc()
        out = []
        with a.lock:
            for name in args.node_names or []:
                if name in a.cluster:
                    out.append(k8s.Candidate(name, a.cluster.node(name).shape, a.cluster.free(name)))
                else:
                    out.append(k8s.Candidate(name, None, None, "node not registered with hetplan (POST /v1/nodes)",
                                             neutral=True))
        return out

    def _pod(args: k8s.ExtenderArgs) -> k8s.PodClass:
        try:
            return k8s.pod_class(args.pod)
        except ValueError as exc:
            raise HTTPException(400, f"Pod: {exc}") from None

    @app.post("/filter", response_model=k8s.ExtenderFilterResult, tags=["kubernetes"])
    def extender_filter(args: k8s.ExtenderArgs) -> JSONResponse:
        """kube-scheduler extender filter: `ExtenderArgs` in, `ExtenderFilterResult` out."""
        pod = _pod(args)
        outcome = k8s.filter_nodes(pod, _candidates(args), alloc().hints, strict=alloc().policy.strict)
        result = k8s.ExtenderFilterResult(failed_nodes=outcome.failed,
                                          failed_and_unresolvable=outcome.unresolvable)
        if args.nodes is not None:
            keep = set(outcome.passed)
            result.nodes = {**args.nodes.model_dump(exclude={"items"}),
                            "items": [raw for raw in args.nodes.items
                                      if (raw.get("metadata") or {}).get("name") in keep]}
        else:
            result.node_names = outcome.passed
        return JSONResponse(result.model_dump(by_alias=True))

    @app.post("/prioritize", response_model=list[k8s.HostPriority], tags=["kubernetes"])
    def extender_prioritize(args: k8s.ExtenderArgs) -> JSONResponse:
        """kube-scheduler extender prioritize: `ExtenderArgs` in, `HostPriorityList` (scores 0-10) out."""
        pod = _pod(args)
        scores = k8s.score_nodes(pod, _candidates(args), alloc().hints)
        return JSONResponse([{"Host": host, "Score": score} for host, score in scores])

    return app


def app_from_env() -> FastAPI:
    """`uvicorn --factory hetplan.allocator.service:app_from_env`: settings from the environment."""
    return create_app(ServiceSettings.from_env())
