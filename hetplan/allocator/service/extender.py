"""Routes of the Kubernetes scheduler extender: `/filter` and `/prioritize` (`hetplan.allocator.k8s.extender`)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Response
from fastapi.responses import JSONResponse

from hetplan.allocator.k8s import extender as k8s
from hetplan.allocator.k8s.pods import JOB_ID_KEY
from hetplan.allocator.service.bodies import Responses, posted
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.middleware import JSONRoute
from hetplan.allocator.spec import CLOSED_LABEL


def node_name_limit(nodes: int) -> int:
    """The most `NodeNames` one `/filter` or `/prioritize` body may list when hetplan knows `nodes` nodes: twice as
    many, and at least 1,024 more (nodes the scheduler knows and hetplan does not yet: being synced, or skipped).
    The scheduler lists only nodes that passed its own filters, so a longer list is no scheduler's (413)."""
    return max(2 * nodes, nodes + 1024)


TOO_MANY_NAMES = "NodeNames lists more nodes than max(2 x the nodes hetplan knows, those + 1,024)"


def router(ctx: ServiceContext) -> APIRouter:
    api = APIRouter(tags=["kubernetes"], route_class=JSONRoute)
    responses: Responses = posted(bad_request="a Pod's GPU, cpu or memory request is no quantity (or no whole "
                                              "number of GPUs)", too_large=TOO_MANY_NAMES)

    def candidates(args: k8s.ExtenderArgs) -> list[k8s.Candidate]:
        """The nodes to judge. `Nodes`: from the objects sent (no allocator state). `NodeNames`: from the
        allocator's state, read under its lock in one pass over the named nodes it knows (`Cluster.view`, at most
        `node_name_limit` names: O(cluster)); everything else, the filter and the scores, runs without the lock."""
        if args.nodes is not None:
            return [k8s.node_candidate(raw) for raw in args.nodes.items]
        a = ctx.alloc()
        names = args.node_names or []
        limit = node_name_limit(len(a.cluster))
        if len(names) > limit:
            raise HTTPException(413, f"NodeNames lists {len(names)} nodes; hetplan knows {len(a.cluster)}, so at "
                                     f"most {limit} are accepted")
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

    def pod_class(args: k8s.ExtenderArgs) -> k8s.PodClass:
        try:
            return k8s.pod_class(args.pod)
        except ValueError as exc:
            raise HTTPException(400, f"Pod: {exc}") from None

    def allocated_to(args: k8s.ExtenderArgs) -> set[str] | None:
        """The node(s) of the pod's job when the allocator already holds its allocation (annotation
        `hetplan.io/job-id`, written by the webhook or an adoption): its room there is taken by that very
        allocation, so free capacity cannot judge it; None for any other pod."""
        job = args.pod.metadata.annotations.get(JOB_ID_KEY)
        if not job:
            return None
        a = ctx.alloc()
        with a.lock:
            parts = a.running([job]).get(job)
        return {p.node for p in parts} if parts else None

    @api.post("/filter", response_model=k8s.ExtenderFilterResult, responses=responses)
    def extender_filter(args: k8s.ExtenderArgs) -> JSONResponse:
        """kube-scheduler extender filter: `ExtenderArgs` in, `ExtenderFilterResult` out. A pod hetplan allocated
        passes exactly the node(s) of its allocation; any other is judged by the nodes' free capacity."""
        pod = pod_class(args)
        a = ctx.alloc()
        mine = allocated_to(args)
        if mine is not None:
            names = [k8s.item_name(raw) for raw in args.nodes.items] if args.nodes is not None \
                else list(args.node_names or [])
            reason = f"hetplan allocated this pod to {', '.join(sorted(mine))}"
            outcome = k8s.FilterOutcome([n for n in names if n in mine], {}, {n: reason for n in names
                                                                              if n not in mine})
        else:
            outcome = k8s.filter_nodes(pod, candidates(args), a.hints, strict=a.policy.strict)
        result = k8s.ExtenderFilterResult(failed_nodes=outcome.failed,
                                          failed_and_unresolvable=outcome.unresolvable)
        if args.nodes is not None:
            keep = set(outcome.passed)
            result.nodes = {**args.nodes.model_dump(exclude={"items"}),
                            "items": [raw for raw in args.nodes.items if k8s.item_name(raw) in keep]}
        else:
            result.node_names = outcome.passed
        # encoded straight to JSON (pydantic's encoder): a Nodes answer is up to 32 MiB, and a dict copy of it then
        # json.dumps would take 5 times as long
        return Response(result.model_dump_json(by_alias=True), media_type="application/json")

    @api.post("/prioritize", response_model=list[k8s.HostPriority], responses=responses)
    def extender_prioritize(args: k8s.ExtenderArgs) -> JSONResponse:
        """kube-scheduler extender prioritize: `ExtenderArgs` in, `HostPriorityList` (scores 0-10) out."""
        pod = pod_class(args)
        scores = k8s.score_nodes(pod, candidates(args), ctx.alloc().hints)
        return JSONResponse([{"Host": host, "Score": score} for host, score in scores])

    return api
