"""The Kueue export (v1beta2): each shape's real board label, allocatable quotas, a LocalQueue, and every object
valid under Kueue's own CRD schema (tests/fixtures/kueue, see PROVENANCE.md there)."""

from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
import yaml

from hetplan.catalog import load_default_catalog
from hetplan.catalog.products import gpu_product
from hetplan.contracts import Plan
from hetplan.gpus import normalize_gpu
from hetplan.planner.kueue import API_VERSION, KueueOptions, SystemReserve, kueue_manifests, kueue_yaml, plan_flavors

SCHEMAS = Path(__file__).parent / "fixtures" / "kueue"
KINDS = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues"}


def validator(kind: str) -> jsonschema.Validator:
    schema = yaml.safe_load((SCHEMAS / f"{KINDS[kind]}.v1beta2.yaml").read_text())
    return jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())


def check_crds(docs: list[dict]) -> None:
    """jsonschema against the CRD's OpenAPI schema, plus the CEL rules (x-kubernetes-validations) that apply."""
    for doc in docs:
        assert doc["apiVersion"] == API_VERSION
        errors = [e.message for e in validator(doc["kind"]).iter_errors(doc)]
        assert errors == [], (doc["kind"], errors)
        spec = doc["spec"]
        if doc["kind"] == "ResourceFlavor":
            assert all(t["effect"] in ("NoSchedule", "PreferNoSchedule", "NoExecute") for t in spec.get("nodeTaints", []))
            for tol in spec.get("tolerations", []):
                assert tol.get("key") or tol.get("operator") == "Exists"
                assert tol.get("operator") in (None, "Equal", "Exists")
        if doc["kind"] == "ClusterQueue":
            for group in spec.get("resourceGroups", []):
                assert all(len(f["resources"]) == len(group["coveredResources"]) for f in group["flavors"])
                assert all(not any("borrowingLimit" in r for r in f["resources"]) for f in group["flavors"]) \
                    or "cohortName" in spec


def plan_of(shapes: dict[str, tuple[str, int, float, float]], added: dict[str, int], owned: dict[str, int]) -> Plan:
    return Plan(plan_id="p-test", created_at=datetime(2026, 12, 1, tzinfo=timezone.utc), budget_per_hour=100.0,
                cost_per_hour=50.0, node_counts=added, owned_nodes=owned, objective=1.0, lp_bound=1.0, gap=0.0,
                solver="highs", solve_seconds=0.1,
                shapes={n: {"gpu_type": g, "gpus": k, "vcpus": c, "mem_gb": m, "price_per_hour": 1.0}
                        for n, (g, k, c, m) in shapes.items()})


HINTS = pd.DataFrame({"gpu_type": ["A100-80GB", "H100", "A40"], "rank": [1, 2, 3]})
MIXED = plan_of({"azure:Standard_NC24ads_A100_v4": ("A100-80GB", 1, 24, 220.0),        # PCIe board
                 "azure:Standard_ND96amsr_A100_v4": ("A100-80GB", 8, 96, 1800.0),      # SXM4 board
                 "lab-h100": ("H100", 8, 128, 2048.0),                                  # owned, no rule
                 "lab-a40": ("A40", 4, 64, 512.0)},                                      # opaque GPU type
                added={"azure:Standard_NC24ads_A100_v4": 3, "azure:Standard_ND96amsr_A100_v4": 1},
                owned={"lab-h100": 2, "lab-a40": 5})


def test_every_object_is_valid_v1beta2_and_the_queues_reference_each_other():
    docs = list(yaml.safe_load_all(kueue_yaml(MIXED, None, HINTS)))
    check_crds(docs)
    flavors = [d for d in docs if d["kind"] == "ResourceFlavor"]
    (queue,) = [d for d in docs if d["kind"] == "ClusterQueue"]
    (local,) = [d for d in docs if d["kind"] == "LocalQueue"]
    assert local["spec"]["clusterQueue"] == queue["metadata"]["name"] and local["metadata"]["namespace"] == "default"
    listed = [f["name"] for f in queue["spec"]["resourceGroups"][0]["flavors"]]
    assert listed == [f["metadata"]["name"] for f in flavors]  # every flavor defined once, in preference order


def test_each_shape_gets_its_own_boards_label():
    """The PCIe and SXM4 A100-80GB shapes are two flavors; the owned H100 gets the common board, stated; the
    opaque A40 a label derived from its name, stated."""
    by_label = {f.product.label: f for f in plan_flavors(MIXED, None, HINTS)}
    assert set(by_label) == {"NVIDIA-A100-80GB-PCIe", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA-A40"}
    assert by_label["NVIDIA-A100-80GB-PCIe"].shapes == ("azure:Standard_NC24ads_A100_v4",)
    assert by_label["NVIDIA-A100-80GB-PCIe"].product.basis == "rule"
    assert by_label["NVIDIA-H100-80GB-HBM3"].product.basis == "default-board"
    assert by_label["NVIDIA-A40"].product.basis == "derived"
    text = kueue_yaml(MIXED, None, HINTS)
    assert "nvidia.com/gpu.product=NVIDIA-A40 (derived: A40 is not a GPU type hetplan knows)" in text
    assert [f.gpu_type for f in plan_flavors(MIXED, None, HINTS)][:2] == ["A100-80GB", "A100-80GB"]  # rank 1 first


def test_every_catalog_rule_names_a_board_of_the_shapes_own_gpu_type():
    catalog = load_default_catalog()
    for name, gpu_type in zip(catalog["name"], catalog["gpu_type"]):
        product = gpu_product(name, gpu_type)
        assert normalize_gpu(product.label) == gpu_type, (name, product)


def test_quotas_are_allocatable_capacity_minus_the_system_reserve():
    """3 x NC24ads (24 cores, 220 GiB): reserve 0.08 + 0.24 cores and 0.42 + 11 GiB per node, so
    3 x 23.68 = 71.04 cores and 3 x 208.58 = 625.74 -> 625 GiB."""
    docs = kueue_manifests(MIXED, None, HINTS)
    (queue,) = [d for d in docs if d["kind"] == "ClusterQueue"]
    quota = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]}
             for f in queue["spec"]["resourceGroups"][0]["flavors"]}
    assert quota["gpu-nvidia-a100-80gb-pcie"] == {"cpu": "71040m", "memory": "625Gi", "nvidia.com/gpu": 3}


@pytest.mark.parametrize("reserve", [SystemReserve(), SystemReserve(0, 0, 0, 0), SystemReserve(2, 0.1, 16, 0.1)])
def test_quotas_never_exceed_capacity_and_a_zero_reserve_is_capacity(reserve):
    flavors = plan_flavors(MIXED, None, HINTS, KueueOptions(reserve=reserve))
    shapes = MIXED.shapes
    counts = {**MIXED.node_counts, **MIXED.owned_nodes}
    for f in flavors:
        cores = sum(shapes[s].vcpus * counts[s] for s in f.shapes)
        gib = sum(shapes[s].mem_gb * counts[s] for s in f.shapes)
        assert f.gpus == sum(shapes[s].gpus * counts[s] for s in f.shapes)
        assert 0 <= f.cpu_m <= cores * 1000 and 0 <= f.mem_gib <= gib
        if reserve == SystemReserve(0, 0, 0, 0):
            assert (f.cpu_m, f.mem_gib) == (int(cores * 1000), int(gib))


def test_taints_tolerations_and_names_are_options():
    options = KueueOptions(queue="gpu-batch", local_queue="team-a", namespace="ml",
                           taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
                           tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                           products={"lab-h100": "NVIDIA-H100-NVL"})
    docs = kueue_manifests(MIXED, None, HINTS, options=options)
    check_crds(docs)
    flavors = {d["spec"]["nodeLabels"]["nvidia.com/gpu.product"]: d for d in docs if d["kind"] == "ResourceFlavor"}
    assert "NVIDIA-H100-NVL" in flavors  # the override
    assert all(d["spec"]["nodeTaints"][0]["effect"] == "NoSchedule" for d in flavors.values())
    local = next(d for d in docs if d["kind"] == "LocalQueue")
    assert local["metadata"] == {"name": "team-a", "namespace": "ml"} and local["spec"]["clusterQueue"] == "gpu-batch"


@pytest.mark.parametrize("bad, message", [
    (dict(taints=[{"key": "k", "effect": "Sometimes"}]), "effect"),
    (dict(tolerations=[{"operator": "Equal", "value": "x"}]), "empty key"),
    (dict(queue="GPU Queue"), "DNS-1123"),
    (dict(taints=[{"key": f"k{i}", "effect": "NoSchedule"} for i in range(9)]), "at most 8"),
])
def test_bad_options_are_refused_with_the_reason(bad, message):
    with pytest.raises(ValueError, match=message):
        KueueOptions(**bad)


@pytest.mark.parametrize("kind, broken", [
    ("ClusterQueue", {"spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": "f", "resources": [{"name": "cpu", "nominalQuota": "12 cores"}]}]}]}}),
    ("ResourceFlavor", {"spec": {"nodeLabels": {f"k{i}": "v" for i in range(9)}}}),
    ("LocalQueue", {"spec": {"clusterQueue": "Not_A_Name"}}),
])
def test_the_schema_copy_catches_what_kueue_would_refuse(kind, broken):
    assert list(validator(kind).iter_errors({"apiVersion": API_VERSION, "kind": kind, **broken}))
