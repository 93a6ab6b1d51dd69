"""Routes of the Kubernetes scheduler extender: `/filter` and `/prioritize` (`hetplan.allocator.extender`)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse

from hetplan.allocator import extender as k8s
from hetplan.allocator.service.bodies import Responses, posted
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import CLOSED_LABEL


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["kubernetes"], route_class=JSONRoute)
    responses: Responses = posted(bad_request="a Pod's GPU request is no whole-number quantity")

    def candidates(args: k8s.ExtenderArgs) -> list[k8s.Candidate]:
        if args.nodes is not None:
            return [k8s.node_candidate(raw) for raw in args.nodes.items]
        a = ctx.alloc()
        out = []
        with a.lock:
            for name in args.node_names or []:
                node = a.cluster.node(name) if name in a.cluster else None
                if node is not None and not node.open:
                    out.append(k8s.Candidate(name, None, None, f"closed to new placement ({CLOSED_LABEL}="
                                                               f"{node.labels[CLOSED_LABEL]})"))
                elif node is not None:
                    out.append(k8s.Candidate(name, node.shape, a.cluster.free(name)))
                else:
                    out.append(k8s.Candidate(name, None, None, "node not registered with hetplan (POST /v1/nodes)",
                                             neutral=True))
        return out

    def pod_class(args: k8s.ExtenderArgs) -> k8s.PodClass:
        try:
            return k8s.pod_class(args.pod)
        except ValueError as exc:
            raise HTTPException(400, f"Pod: {exc}") from None

    @api.post("/filter", response_model=k8s.ExtenderFilterResult, responses=responses)
    def extender_filter(args: k8s.ExtenderArgs) -> JSONResponse:
        """kube-scheduler extender filter: `ExtenderArgs` in, `ExtenderFilterResult` out."""
        pod = pod_class(args)
        a = ctx.alloc()
        outcome = k8s.filter_nodes(pod, candidates(args), a.hints, strict=a.policy.strict)
        result = k8s.ExtenderFilterResult(failed_nodes=outcome.failed,
                                          failed_and_unresolvable=outcome.unresolvable)
        if args.nodes is not None:
            keep = set(outcome.passed)
            result.nodes = {**args.nodes.model_dump(exclude={"items"}),
                            "items": [raw for raw in args.nodes.items if k8s.item_name(raw) in keep]}
        else:
            result.node_names = outcome.passed
        return JSONResponse(result.model_dump(by_alias=True))

    @api.post("/prioritize", response_model=list[k8s.HostPriority], responses=responses)
    def extender_prioritize(args: k8s.ExtenderArgs) -> JSONResponse:
        """kube-scheduler extender prioritize: `ExtenderArgs` in, `HostPriorityList` (scores 0-10) out."""
        pod = pod_class(args)
        scores = k8s.score_nodes(pod, candidates(args), ctx.alloc().hints)
        return JSONResponse([{"Host": host, "Score": score} for host, score in scores])

    return api
