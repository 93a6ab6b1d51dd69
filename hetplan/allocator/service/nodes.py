"""Routes of node admin: the nodes with their free capacity (RAM in GiB), and all-or-nothing node changes."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Response

from hetplan.allocator.cluster import StateError
from hetplan.allocator.core import NodeChanges
from hetplan.allocator.service.bodies import (
    ADMIN_RESPONSES, REFUSED, NodeChangesIn, NodeChangesResponse, NodeOut, NodesResponse, posted,
)
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import mib_to_gib


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["nodes"], route_class=JSONRoute)

    @api.get("/v1/nodes", response_model=NodesResponse)
    def nodes() -> Response:
        """Every node with its free capacity and jobs. The allocator's lock is held only to copy the state
        (`Cluster.listing`, a few ms at 10,000 nodes); the answer is built and encoded without it, in this worker
        thread, so allocations never wait on a listing."""
        a = ctx.alloc()
        with a.lock:
            listing = a.cluster.listing()
            totals = a.cluster.totals()
        out = [NodeOut(**node.to_dict(), free_gpus=free.gpus, free_cpus=free.cpu_m / 1000,
                       free_mem_gb=mib_to_gib(free.mem_mib), jobs=sorted(jobs)) for node, free, jobs in listing]
        answer = NodesResponse(nodes=out, totals={
            "nodes": len(out), "gpus": totals["gpus"], "free_gpus": totals["free_gpus"],
            "cpus": totals["cpu_m"] / 1000, "free_cpus": totals["free_cpu_m"] / 1000,
            "mem_gb": mib_to_gib(totals["mem_mib"]), "free_mem_gb": mib_to_gib(totals["free_mem_mib"])})
        return Response(answer.model_dump_json(by_alias=True), media_type="application/json")

    @api.post("/v1/nodes", response_model=NodeChangesResponse, tags=["admin"], dependencies=ctx.admin,
              responses={**posted(), **ADMIN_RESPONSES, **REFUSED})
    def change_nodes(body: NodeChangesIn) -> NodeChangesResponse:
        """Add, update and remove nodes, all or nothing (admin)."""
        changes = NodeChanges(upsert=[n.to_node() for n in body.upsert], remove=list(body.remove), force=body.force)
        try:
            evicted = ctx.alloc().change_nodes(changes)
        except StateError as exc:
            raise HTTPException(409, str(exc)) from None
        return NodeChangesResponse(upserted=len(changes.upsert), removed=len(changes.remove),
                                   evicted=[e.job_id for e in evicted])

    return api
