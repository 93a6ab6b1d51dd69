"""Routes of the Kubernetes scheduler extender: `/filter` and `/prioritize` (`hetplan.allocator.k8s.extender`).

A body over `PROCESS_BODY_BYTES` (up to 32 MiB: a v1.NodeList of whole Nodes) is parsed, validated and reduced to
what the routes need in the service's worker process (`BodyWorker`, `extender_body.read_large_file`, the body and
the items' encoding passed in a temporary file): JSON parsing and validation hold the GIL, which in a thread would
make every other request wait. Smaller bodies are read as any other (`JSONRoute`) and reduced in the route
(`extender_body.reduce_args`): the same answers and errors either way.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse

from hetplan.allocator.k8s import extender as k8s
from hetplan.allocator.service.bodies import Responses, posted
from hetplan.allocator.service.bodyworker import WorkerDied
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.extender_body import (
    PROCESS_BODY_BYTES, ExtenderBody, NodeItems, fetch_items, items_path, raise_read_error, read_large_file,
    reduce_args, spill,
)
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import CLOSED_LABEL


def node_name_limit(nodes: int) -> int:
    """The most `NodeNames` one `/filter` or `/prioritize` body may list when hetplan knows `nodes` nodes: twice as
    many, and at least 1,024 more (nodes the scheduler knows and hetplan does not yet: being synced, or skipped).
    The scheduler lists only nodes that passed its own filters, so a longer list is no scheduler's (413)."""
    return max(2 * nodes, nodes + 1024)


TOO_MANY_NAMES = "NodeNames lists more nodes than max(2 x the nodes hetplan knows, those + 1,024)"
WORKER_DIED = "the body could not be read: the process reading large extender bodies died twice on it"
_STATE_KEY = "extender_body"


def filter_answer(result: k8s.ExtenderFilterResult, items: NodeItems, keep: set[str]) -> bytes:
    """`result` as JSON with `Nodes` the NodeList sent, keeping the items named in `keep`, spliced from the items'
    own encoding (`NodeItems.encoded`) in runs of adjacent kept items: what `result.model_dump_json(by_alias=True)`
    writes with those items in `Nodes`, without encoding up to 32 MiB of them again."""
    head = result.model_dump_json(by_alias=True)
    assert result.nodes is None and head.startswith('{"Nodes":null'), head[:40]
    blob, ends = items.encoded, items.ends
    pieces: list[Any] = [b'{"Nodes":', items.rest[:-1], b',"items":[' if len(items.rest) > 2 else b'"items":[']
    run_start: int | None = None
    runs = 0
    for i, name in enumerate([*items.names, None]):
        if name is not None and name in keep:
            run_start = i if run_start is None else run_start
            continue
        if run_start is not None:
            pieces += [b","] * (runs > 0) + _slices(blob, ends[run_start - 1] + 1 if run_start else 0, ends[i - 1])
            runs, run_start = runs + 1, None
    pieces += [b"]}", head[len('{"Nodes":null'):].encode()]
    return b"".join(pieces)


SLICE_BYTES = 1 << 20


def _slices(blob: bytes, start: int, end: int) -> list[bytes]:
    """`blob[start:end]` as bytes of at most `SLICE_BYTES` (the whole `blob` when that is all of it): each copy
    holds the GIL only that long, and `bytes.join` of bytes alone copies without it."""
    if start == 0 and end == len(blob):
        return [blob]
    return [blob[i:min(i + SLICE_BYTES, end)] for i in range(start, end, SLICE_BYTES)]


def router(ctx: ServiceContext) -> APIRouter:
    class ExtenderRoute(JSONRoute):
        """A `JSONRoute` that reads a body over `PROCESS_BODY_BYTES` in the worker process: the route then finds
        the reduction in the request's state and FastAPI a placeholder `ExtenderArgs` (never read)."""

        async def read_large(self, request: Request, body: bytes) -> Any:
            if len(body) <= PROCESS_BODY_BYTES:
                return await super().read_large(request, body)
            known = len(ctx.alloc().cluster)
            path = await asyncio.to_thread(spill, body)
            try:
                read = await ctx.body_worker.run(read_large_file, path, known, node_name_limit(known),
                                                 self.path == "/filter")
                raise_read_error(read)
                setattr(request.state, _STATE_KEY, await asyncio.to_thread(fetch_items, path, read[1]))
            except WorkerDied:
                raise HTTPException(413, WORKER_DIED) from None
            finally:
                await asyncio.to_thread(_unlink, path, items_path(path))
            return k8s.ExtenderArgs.model_construct(pod=k8s.Pod.model_construct(), nodes=None, node_names=[])

    api = APIRouter(tags=["kubernetes"], route_class=ExtenderRoute)
    responses: Responses = posted(bad_request="a Pod's GPU, cpu or memory request is no quantity (or no whole "
                                              "number of GPUs)", too_large=TOO_MANY_NAMES)

    def reduced(request: Request, args: k8s.ExtenderArgs, encode: bool) -> ExtenderBody:
        """The body's reduction: made in the worker process for a large body, else here."""
        body = getattr(request.state, _STATE_KEY, None)
        if body is None:
            known = len(ctx.alloc().cluster)
            body = reduce_args(args, known, node_name_limit(known), encode)
        return body

    def pod_class(body: ExtenderBody) -> k8s.PodClass:
        if body.pod is None:
            raise HTTPException(400, body.pod_error)
        return body.pod

    def node_names(body: ExtenderBody) -> list[str]:
        """NodeNames mode: the names, at most `node_name_limit` of them (413 otherwise); checked before anything
        reads them, a pod hetplan allocated included."""
        if body.names is None:
            raise HTTPException(413, f"NodeNames lists {body.name_count} nodes; hetplan knows {body.known}, so at "
                                     f"most {body.limit} are accepted")
        return body.names

    def candidates(body: ExtenderBody) -> list[k8s.Candidate]:
        """The nodes to judge. `Nodes`: from the objects sent (no allocator state). `NodeNames`: from the
        allocator's state, read under its lock in one pass over the named nodes it knows (`Cluster.view`, at most
        `node_name_limit` names: O(cluster)); everything else, the filter and the scores, runs without the lock."""
        if body.nodes is not None:
            return body.nodes.candidates()
        names = node_names(body)
        a = ctx.alloc()
        with a.lock:
            view = a.cluster.view(names)
        out = []
        for name in names:
            known = view.get(name)
            if known is None:
                out.append(k8s.Candidate(name, None, None, "node not registered with hetplan (POST /v1/nodes)",
                                         neutral=True))
                continue
            node, free = known
            if not node.open:
                out.append(k8s.Candidate(name, None, None, f"closed to new placement ({CLOSED_LABEL}="
                                                           f"{node.labels[CLOSED_LABEL]})"))
            else:
                out.append(k8s.Candidate(name, node.shape, free))
        return out

    def allocated_to(body: ExtenderBody) -> set[str] | None:
        """The node(s) of the pod's job when the allocator already holds its allocation (annotation
        `hetplan.io/job-id`, written by the webhook or an adoption): its room there is taken by that very
        allocation, so free capacity cannot judge it; None for any other pod."""
        if not body.job:
            return None
        a = ctx.alloc()
        with a.lock:
            parts = a.running([body.job]).get(body.job)
        return {p.node for p in parts} if parts else None

    @api.post("/filter", response_model=k8s.ExtenderFilterResult, responses=responses)
    def extender_filter(args: k8s.ExtenderArgs, request: Request) -> Response:
        """kube-scheduler extender filter: `ExtenderArgs` in, `ExtenderFilterResult` out. A pod hetplan allocated
        passes exactly the node(s) of its allocation; any other is judged by the nodes' free capacity."""
        body = reduced(request, args, encode=True)
        pod = pod_class(body)
        names = body.nodes.names if body.nodes is not None else node_names(body)
        mine = allocated_to(body)
        if mine is not None:
            reason = f"hetplan allocated this pod to {', '.join(sorted(mine))}"
            outcome = k8s.FilterOutcome([n for n in names if n in mine], {}, {n: reason for n in names
                                                                              if n not in mine})
        else:
            a = ctx.alloc()
            outcome = k8s.filter_nodes(pod, candidates(body), a.hints, strict=a.policy.strict)
        result = k8s.ExtenderFilterResult(failed_nodes=outcome.failed,
                                          failed_and_unresolvable=outcome.unresolvable)
        if body.nodes is not None:
            # spliced from the items' own encoding: a Nodes answer is up to 32 MiB, which encoding again (or a dict
            # copy then json.dumps, 5 times slower) would take the GIL for
            return Response(filter_answer(result, body.nodes, set(outcome.passed)), media_type="application/json")
        result.node_names = outcome.passed
        return Response(result.model_dump_json(by_alias=True), media_type="application/json")

    @api.post("/prioritize", response_model=list[k8s.HostPriority], responses=responses)
    def extender_prioritize(args: k8s.ExtenderArgs, request: Request) -> JSONResponse:
        """kube-scheduler extender prioritize: `ExtenderArgs` in, `HostPriorityList` (scores 0-10) out."""
        body = reduced(request, args, encode=False)
        pod = pod_class(body)
        scores = k8s.score_nodes(pod, candidates(body), ctx.alloc().hints)
        return JSONResponse([{"Host": host, "Score": score} for host, score in scores])

    return api


def _unlink(*paths: str) -> None:
    for path in paths:
        Path(path).unlink(missing_ok=True)
