"""The Kubernetes extender, hardened and neutral: quantities bounded before conversion (and equal to the
kubernetes client's parser inside the bounds), nodes of GPU types hetplan does not know and pods it has no hint
for pass with score 0, and pathological requests answered fast with a 4xx by the real service."""

import copy
import json
from decimal import Decimal
from io import StringIO
from pathlib import Path

import httpx
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as k8s_parse_quantity

from hetplan.allocator.cluster import Free
from hetplan.allocator.k8s.extender import (
    Candidate, ExtenderArgs, PodClass, filter_nodes, node_candidate, parse_quantity, pod_class, score_nodes,
)
from hetplan.allocator.spec import Shape
from hetplan.hints import HintSet, HintStore
from allocator_helpers import fixture, hint_set
from servers import Server

FIXTURES = Path(__file__).parent / "fixtures" / "extender"
HINTS = """model,num_gpus,gpu_type,rank,cpus_per_gpu,mem_gb_per_gpu,expected_throughput,normalized_throughput,throughput_per_dollar,plan_id
res50,2,A100-80GB,1,12,100,1500,1.0,90,p1
res50,2,V100,2,9,60,760,0.5,120,p1
res50,2,T4,3,6,30,260,0.17,170,p1
"""


def hints() -> HintSet:
    return HintSet.from_frame(pd.read_csv(StringIO(HINTS), dtype=str))


def args_with(pod_gpus: object = "2", node_patch: dict | None = None) -> dict:
    """The res50 filter fixture with the trainer's GPU request replaced and one node's fields patched."""
    args = json.loads((FIXTURES / "filter_args_res50_nodes.json").read_text())
    trainer = args["Pod"]["spec"]["containers"][0]["resources"]
    trainer["requests"]["nvidia.com/gpu"] = trainer["limits"]["nvidia.com/gpu"] = pod_gpus
    if node_patch:
        node = args["Nodes"]["items"][0]
        node["metadata"]["labels"].update(node_patch.get("labels", {}))
        for key in node_patch.get("drop_labels", ()):
            node["metadata"]["labels"].pop(key)
        node["status"]["allocatable"].update(node_patch.get("allocatable", {}))
    return args


PATHOLOGICAL = ["1e200000", "1e999999", "1e1000000", "1e-999999", "9" * 30 + "E", "1" * 65, "1e25"]
NOT_QUANTITIES = ["NaN", "Infinity", "-inf", "1_000", "0x10", "1e", "1.5.2", "12Q", "Ki", "1 Gi", "", " 5", "5\n"]


@pytest.mark.parametrize("text", PATHOLOGICAL + NOT_QUANTITIES)
def test_pathological_and_malformed_quantities_are_refused_before_conversion(text):
    with pytest.raises(ValueError, match="not a quantity|out of range"):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["٤", "４", "1_000", "1e3Gi", " 4", "4 ", "0x10", "4\n", "৪Gi", "1.5\u00a0Gi"])
def test_quantities_are_ascii_as_kubernetes_writes_them(text):
    """Python's int(), float() and Decimal() (and so kubernetes.utils.parse_quantity) take Unicode digits, `_` and
    spaces; Kubernetes' grammar takes none of them."""
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("number", [float("nan"), float("inf"), 1e309, 10**30, -(2**63), True])
def test_json_numbers_out_of_range_are_refused(number):
    with pytest.raises(ValueError, match="not a quantity|out of range"):
        parse_quantity(number)


@given(st.from_regex(r"\A[+-]?([0-9]{1,12}(\.[0-9]{0,6})?|\.[0-9]{1,6})(e[+-]?[0-9]{1,2}|Ki|Mi|Gi|Ti|m|k|M|G|T)?\Z"))
def test_inside_the_bounds_the_value_is_the_kubernetes_clients(text):
    try:
        ours = parse_quantity(text)
    except ValueError as exc:  # refused only for a bound, never for a quantity the client reads in range
        assert "out of range" in str(exc)
        assert abs(k8s_parse_quantity(text)) >= Decimal(2) ** 63 or "exponent" in str(exc)
        return
    assert ours == k8s_parse_quantity(text)


def test_nodes_of_unknown_gpu_products_pass_and_score_zero():
    """An A40 (not in hetplan's list) is an opaque type no hint names: it passes and scores 0; hinted types keep
    their ranks. A node with GPUs and no product label cannot be judged: it passes too."""
    items = args_with()["Nodes"]["items"]
    a40 = copy.deepcopy(items[0])
    a40["metadata"]["name"], a40["metadata"]["labels"]["nvidia.com/gpu.product"] = "a40", "NVIDIA-A40"
    unlabelled = copy.deepcopy(items[0])
    unlabelled["metadata"]["name"] = "no-gfd"
    unlabelled["metadata"]["labels"].pop("nvidia.com/gpu.product")
    candidates = [node_candidate(raw) for raw in [*items, a40, unlabelled]]
    assert candidates[-2].shape.gpu_type == "A40" and candidates[-1].neutral
    pod = PodClass("p", "ns", "res50", 2)
    outcome = filter_nodes(pod, candidates, hints())
    assert {"a40", "no-gfd"} <= set(outcome.passed)
    scores = dict(score_nodes(pod, candidates, hints()))
    assert scores["a40"] == scores["no-gfd"] == 0 and scores["ip-10-0-1-11.ec2.internal"] == 10
    assert "ip-10-0-4-44.ec2.internal" in outcome.unresolvable  # no GPUs at all: judged, not neutral


@pytest.mark.parametrize("model", [None, "never-hinted"])
def test_pods_without_hints_see_every_big_enough_gpu_node_equal(model):
    candidates = [node_candidate(raw) for raw in args_with()["Nodes"]["items"]]
    pod = PodClass("p", "ns", model, 2)
    outcome = filter_nodes(pod, candidates, hints())
    big_enough = [c.name for c in candidates if c.shape is not None and c.shape.gpus >= 2]
    assert outcome.passed == big_enough
    assert {score for _, score in score_nodes(pod, candidates, hints())} == {0}


def test_a_pathological_node_quantity_makes_that_node_unresolvable_only():
    args = ExtenderArgs.model_validate(args_with(node_patch={"allocatable": {"memory": "1e999999"}}))
    candidates = [node_candidate(raw) for raw in args.nodes.items]
    assert "out of range" in candidates[0].problem
    outcome = filter_nodes(pod_class(args.pod), candidates, hints())
    assert "bad allocatable" in outcome.unresolvable["ip-10-0-1-11.ec2.internal"]
    assert "ip-10-0-2-22.ec2.internal" in outcome.passed


# --- the real service ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from allocator_helpers import make_plan

    root = tmp_path_factory.mktemp("extender")
    HintStore(root / "store").publish(make_plan("p1"), pd.read_csv(StringIO(HINTS), dtype=str))
    server = Server(root, root / "store").start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            yield c
    finally:
        server.stop()


@pytest.mark.parametrize("quantity", ["1e200000", "1e999999", "1e1000000", "1" * 100])
def test_pathological_pod_quantities_get_a_400_and_the_service_keeps_answering(client, quantity):
    response = client.post("/filter", json=args_with(quantity))
    assert response.status_code == 400 and "nvidia.com/gpu" in response.json()["detail"]
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "1e309"])
def test_non_finite_json_numbers_get_a_422_naming_the_quantity_not_a_500(client, literal):
    """A number that is no finite float is a 422 wherever it is in a body (`middleware.JSONRequest`)."""
    body = json.dumps(args_with("__Q__")).replace('"__Q__"', literal)
    response = client.post("/filter", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][-1] == "nvidia.com/gpu" and literal not in response.text


def test_a_node_item_whose_metadata_is_no_object_is_unresolvable_not_a_500(client):
    """Found by reading what schemathesis could send (items are free-form objects): the name lookup assumed that
    metadata is an object."""
    args = args_with()
    args["Nodes"]["items"] += [{"metadata": "x"}, {"metadata": [1]}]
    result = client.post("/filter", json=args)
    assert result.status_code == 200, result.text
    assert result.json()["FailedAndUnresolvableNodes"]["<unnamed>"].startswith("not a v1.Node")
    assert len(result.json()["Nodes"]["items"]) == 3  # the fixture's three good nodes, the bad items not
    assert client.post("/prioritize", json=args).json()[-1] == {"Host": "<unnamed>", "Score": 0}


def test_the_service_passes_unknown_gpu_nodes_with_score_zero(client):
    args = args_with(node_patch={"labels": {"nvidia.com/gpu.product": "NVIDIA-B200"}})
    result = client.post("/filter", json=args).json()
    kept = [n["metadata"]["name"] for n in result["Nodes"]["items"]]
    assert "ip-10-0-1-11.ec2.internal" in kept
    scores = {h["Host"]: h["Score"] for h in client.post("/prioritize", json=args).json()}
    assert scores["ip-10-0-1-11.ec2.internal"] == 0 and scores["ip-10-0-2-22.ec2.internal"] > 0


# --- pure: quantities, pod classes, node objects, filter and scores ------------------------------------------


@pytest.mark.parametrize(("text", "value"), [
    ("64", "64"), ("95690m", "95.69"), ("1163406904Ki", str(1163406904 * 1024)), ("1.5Gi", str(int(1.5 * 2**30))),
    ("1e3", "1000"), ("2E", str(2 * 10**18)), ("100M", "100000000"), (".5", "0.5"), (8, "8"),
])
def test_quantities_parse_as_kubernetes_writes_them(text, value):
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize("bad", ["", "1.5.2", "12Q", "Ki", "1 Gi", True, float("nan")])
def test_bad_quantities_are_refused(bad):
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(bad)


def test_job_class_from_pod_labels_annotations_and_gpu_requests():
    res50 = ExtenderArgs.model_validate(fixture("filter_args_res50_nodes.json"))
    # own request: the containers' requests summed (8 + 0.1 cores, 64 GiB + 64 MiB)
    assert pod_class(res50.pod) == PodClass("train-res50-7x2kq", "ml-training", "res50", 2, 8100, 64 * 1024 + 64)
    transformer = ExtenderArgs.model_validate(fixture("prioritize_args_transformer_nodes.json"))
    cls = pod_class(transformer.pod)  # model from the annotation, GPUs from limits only, plus an init container
    assert (cls.model, cls.gpus) == ("transformer", 8)
    assert (cls.cpu_m, cls.mem_mib) == (16100, 200 * 1024 + 64)  # limits where no request, as Kubernetes defaults


def _node(name: str, gpus: int = 8, cpus: int = 64, mem_gib: int = 488, free_gpus: int = 8, free_cpus: int = 64,
          free_gib: int = 488) -> Candidate:
    return Candidate(name, Shape("V100", gpus, cpus * 1000, mem_gib * 1024),
                     Free(free_gpus, free_cpus * 1000, free_gib * 1024))


@pytest.mark.parametrize(("cpu_m", "mem_mib", "free_cpus", "outcome"), [
    (None, None, 16, "passed"),  # no own request: the GPU-proportional share (16 cores for 2 of 8 V100s) fits
    (None, None, 15, "failed"),
    (24000, None, 20, "failed"),  # its own 24 cores are its floor: 20 free do not do, whatever the share
    (24000, None, 24, "passed"),
    (4000, 8 * 1024, 4, "passed"),  # an own request below the share is the floor too (as the policies place)
    (65000, None, 64, "unresolvable"),  # more than the node has: preemption cannot help
])
def test_the_pods_own_request_is_its_floor_as_in_the_policies(cpu_m, mem_mib, free_cpus, outcome):
    """The extender once ignored a pod's own cpu/memory requests; it now uses `cluster.floor_need` on the pod's
    `Job`, so it passes a node exactly when the policies could place the pod there."""
    pod = PodClass("p", "ns", "never-hinted", 2, cpu_m, mem_mib)
    result = filter_nodes(pod, [_node("n", free_gpus=2, free_cpus=free_cpus)], hints())
    where = {"passed": "n" in result.passed, "failed": "n" in result.failed,
             "unresolvable": "n" in result.unresolvable}
    assert where[outcome], result


def test_a_hinted_type_degrades_to_the_smaller_of_the_own_request_and_the_hinted_share():
    """res50 x2 on V100 is hinted 18 cores; a pod asking 8 cores fits where 8 are free, one asking 20 where 20 are."""
    nodes = [_node("eight", free_gpus=2, free_cpus=8), _node("twenty", free_gpus=2, free_cpus=20)]
    assert filter_nodes(PodClass("p", "ns", "res50", 2, 8000), nodes, hints()).passed == ["eight", "twenty"]
    asks_twenty = filter_nodes(PodClass("p", "ns", "res50", 2, 20000), nodes, hints())
    assert asks_twenty.passed == ["twenty"] and "eight" in asks_twenty.failed


@pytest.mark.parametrize("cpu", ["٤", "４", "1_000", "-4", " 4"])
def test_a_pod_whose_cpu_request_is_no_quantity_is_refused(cpu):
    args = ExtenderArgs.model_validate(args_with())
    args.pod.spec.containers[0].resources.requests["cpu"] = cpu
    with pytest.raises(ValueError, match=r"container '[\w-]+' cpu"):
        pod_class(args.pod)


def test_node_objects_map_to_catalog_gpu_types_and_allocatable_capacity():
    items = fixture("filter_args_res50_nodes.json")["Nodes"]["items"]
    candidates = {c.name.split(".")[0]: c for c in map(node_candidate, items)}
    a100 = candidates["ip-10-0-1-11"].shape
    # 1163406904Ki of memory: whole MiB, rounded down
    assert (a100.gpu_type, a100.gpus, a100.cpu_m, a100.mem_mib) == ("A100-80GB", 8, 95690, 1163406904 // 1024)
    assert candidates["ip-10-0-2-22"].shape.gpu_type == "V100" and candidates["ip-10-0-3-33"].shape.gpu_type == "T4"
    cpu_only = candidates["ip-10-0-4-44"]
    assert cpu_only.shape is None and "no nvidia.com/gpu.product label" in cpu_only.problem
    assert candidates["ip-10-0-5-55"].shape.gpu_type == "L4"


def test_filter_and_scores_follow_the_hint_ranks():
    args = ExtenderArgs.model_validate(fixture("filter_args_res50_nodes.json"))
    candidates = [node_candidate(raw) for raw in args.nodes.items]
    outcome = filter_nodes(pod_class(args.pod), candidates, hint_set())
    assert [n.split(".")[0] for n in outcome.passed] == ["ip-10-0-1-11", "ip-10-0-2-22", "ip-10-0-3-33"]
    assert outcome.failed == {}
    assert outcome.unresolvable["ip-10-0-5-55.ec2.internal"] == "has 1 L4 GPUs; the pod needs 2 on one node"
    scores = dict(score_nodes(pod_class(args.pod), candidates, hint_set()))
    assert list(scores.values()) == [10, 7, 4, 0, 0]
    assert all(score == 0 for _, score in score_nodes(pod_class(args.pod), candidates, HintSet.empty()))
    one_gpu = PodClass("p", "ns", "transformer", 1)  # hinted on V100 only
    assert "ip-10-0-1-11.ec2.internal" in filter_nodes(one_gpu, candidates, hint_set()).passed
    strict = filter_nodes(one_gpu, candidates, hint_set(), strict=True)
    assert strict.passed == ["ip-10-0-2-22.ec2.internal"]
    assert strict.unresolvable["ip-10-0-1-11.ec2.internal"] == (
        "class (transformer, 1) has no hint for A100-80GB (hinted: V100)")




def test_node_memory_in_bytes_becomes_whole_mib_rounded_down():
    def node(memory: str) -> dict:
        return {"metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB"}},
                "status": {"allocatable": {"cpu": "64", "memory": memory, "nvidia.com/gpu": "8"}}}
    assert node_candidate(node("488Gi")).shape.mem_mib == 488 * 1024
    assert node_candidate(node("499712Mi")).shape.mem_mib == 488 * 1024
    assert node_candidate(node("488G")).shape.mem_mib == 488 * 10**9 // 2**20  # 465,393 MiB: 1000-GB units are fewer
    assert node_candidate(node(str(2**20 - 1))).problem == "no allocatable cpu or memory"  # under 1 MiB
