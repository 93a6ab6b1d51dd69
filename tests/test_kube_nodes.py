"""The Kubernetes node sync: v1.Node -> hetplan Node (table-driven), what the sync does with busy, cordoned and
vanished nodes, the real kubernetes client against a stand-in API server over HTTP, and `hetplan serve
--kubeconfig` failing fast on a kubeconfig it cannot use."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetplan.allocator import Allocator, DurableAllocator, Job, Node, NodeChanges
from hetplan.allocator.k8s.nodes import SOURCE_LABEL, NodeSync, Skip, load_client, to_node
from hetplan.allocator.metrics import Metrics
from hetplan.allocator.spec import CLOSED_LABEL, Allocation, Rejection
from hetplan.catalog.products import product_rules
from hetplan.gpus import GPU_NAMES, K8S_PRODUCT
from standin_apiserver import FakeApiServer, eventually, k8s_node


# --- (a) the translation, table-driven ------------------------------------------------------------------------------

PLACED = [  # (case, node arguments, gpu_type, gpus, cpus, mem_gb)
    ("known product", {"product": "NVIDIA-A100-SXM4-80GB", "gpus": "8"}, "A100-80GB", 8, 63.5, 256.0),
    ("PCIe board of a known type", {"product": "NVIDIA-H100-PCIe"}, "H100", 4, 63.5, 256.0),
    ("gpu.memory tells the 32 GB V100", {"product": "Tesla-V100-SXM2", "labels": {"nvidia.com/gpu.memory": "32768"}},
     "V100-32GB", 4, 63.5, 256.0),
    ("unknown product: opaque type", {"product": "NVIDIA-B200"}, "B200", 4, 63.5, 256.0),
    ("unknown product with a board suffix", {"product": "NVIDIA-A40-PCIe"}, "A40-PCIE", 4, 63.5, 256.0),
    ("whole cores", {"cpu": "64"}, "T4", 4, 64.0, 256.0),
    ("millicores", {"cpu": "95690m"}, "T4", 4, 95.69, 256.0),
    ("exponent", {"cpu": "1e3"}, "T4", 4, 1000.0, 256.0),
    ("memory in Ki, rounded down to whole MiB", {"memory": "1163406904Ki"}, "T4", 4, 63.5, 1136139 / 1024),
    ("memory in 10^9-byte units", {"memory": "488G"}, "T4", 4, 63.5, 488 * 10**9 // 2**20 / 1024),
    ("memory in Mi", {"memory": "499712Mi"}, "T4", 4, 63.5, 488.0),
    ("plain bytes", {"memory": "274877906944"}, "T4", 4, 63.5, 256.0),
]


@pytest.mark.parametrize("case,args,gpu_type,gpus,cpus,mem_gb", PLACED, ids=[c[0] for c in PLACED])
def test_a_ready_gpu_node_becomes_a_hetplan_node(case, args, gpu_type, gpus, cpus, mem_gb):
    node = to_node(k8s_node("n1", **args))
    assert isinstance(node, Node), node
    assert (node.name, node.gpu_type, node.gpus, node.cpus, node.mem_gb) == ("n1", gpu_type, gpus, cpus, mem_gb)
    assert node.labels[SOURCE_LABEL] == "kubernetes" and node.labels["kubernetes.io/hostname"] == "n1"
    assert node.open


SKIPPED = [  # (case, node arguments, kind)
    ("no GPUs allocatable", {"gpus": "0"}, "no-gpus"),
    ("no GPU resource at all (a CPU node)", {"gpus": None, "product": None}, "no-gpus"),
    ("GPUs but no product label", {"product": None}, "no-product"),
    ("product label that is no GPU name", {"product": "(unknown)"}, "no-product"),
    ("cordoned", {"unschedulable": True}, "unschedulable"),
    ("NotReady", {"ready": "False"}, "not-ready"),
    ("Ready unknown (node lost)", {"ready": "Unknown"}, "not-ready"),
    ("no Ready condition yet", {"ready": None}, "not-ready"),
    ("cpu not a quantity", {"cpu": "lots"}, "bad-quantity"),
    ("cpu exponent out of bounds", {"cpu": "1e30"}, "bad-quantity"),
    ("cpu huge but a quantity", {"cpu": "9e18"}, "bad-quantity"),
    ("memory pathological", {"memory": "1e200000"}, "bad-quantity"),
    ("memory under one MiB", {"memory": "1e3"}, "bad-quantity"),
    ("memory too long", {"memory": "1" * 65}, "bad-quantity"),
    ("fractional GPUs", {"gpus": "1.5"}, "bad-quantity"),
    ("more GPUs than any node", {"gpus": "2000"}, "bad-quantity"),
    ("negative cores", {"cpu": "-4"}, "bad-quantity"),
]


@pytest.mark.parametrize("case,args,kind", SKIPPED, ids=[c[0] for c in SKIPPED])
def test_a_node_hetplan_cannot_place_on_is_skipped_with_its_reason(case, args, kind):
    started = time.perf_counter()
    skip = to_node(k8s_node("n1", **args))
    assert time.perf_counter() - started < 0.5  # bounded before conversion
    assert isinstance(skip, Skip) and skip.name == "n1" and skip.kind == kind, skip
    assert skip.reason and "\n" not in skip.reason


def test_a_node_labelled_closed_in_kubernetes_is_kept_closed_to_placement():
    node = to_node(k8s_node("n1", labels={CLOSED_LABEL: "maintenance"}))  # kubectl label node n1 hetplan.io/closed=...
    assert isinstance(node, Node) and not node.open


@pytest.mark.parametrize("obj", [{}, {"metadata": "n1"}, {"metadata": {"name": "n1", "labels": {"a": 1}}},
                                 {"metadata": {"labels": {}}}, None])
def test_what_is_no_v1_node_is_skipped_not_raised(obj):
    assert isinstance(to_node(obj), Skip)  # type: ignore[arg-type]


def test_every_product_label_hetplan_writes_maps_back_to_a_known_gpu_type():
    labels = {product for _, product, _ in product_rules()} | set(K8S_PRODUCT.values())
    for product in sorted(labels):
        node = to_node(k8s_node("n1", product=product))
        assert isinstance(node, Node) and node.gpu_type in GPU_NAMES, (product, node)
    assert {gpu: to_node(k8s_node("n", product=p)).gpu_type for gpu, p in K8S_PRODUCT.items()} == \
        {gpu: gpu for gpu in K8S_PRODUCT}


# --- (b) what the sync does, without a network -----------------------------------------------------------------------


def sync_on(allocator, metrics: Metrics | None = None) -> NodeSync:
    return NodeSync(allocator, api=None, metrics=metrics)  # type: ignore[arg-type] - never started: no client


def nodes_of(allocator) -> dict[str, Node]:
    with allocator.lock:
        return {n.name: n for n in allocator.cluster.nodes()}


def test_the_sync_owns_only_the_nodes_it_made_and_takes_over_a_namesake():
    a = Allocator([Node("from-file", "T4", 4, 32, 128), Node("placeholder", "T4", 4, 32, 128)], "first-fit")
    sync = sync_on(a)
    sync.apply_list([k8s_node("gpu-a"), k8s_node("placeholder", gpus="8"), k8s_node("cpu-1", gpus=None, product=None)])
    nodes = nodes_of(a)
    assert sorted(nodes) == ["from-file", "gpu-a", "placeholder"]
    assert SOURCE_LABEL not in nodes["from-file"].labels
    assert nodes["placeholder"].gpus == 8 and nodes["placeholder"].labels[SOURCE_LABEL] == "kubernetes"
    sync.apply_list([])  # every Node gone: the sync removes its own, never the file's
    assert sorted(nodes_of(a)) == ["from-file"]
    sync.apply_event("DELETED", k8s_node("from-file"))
    assert sorted(nodes_of(a)) == ["from-file"]
    assert a.cluster.check() == []


def test_a_cordoned_busy_node_keeps_its_jobs_takes_no_new_ones_and_goes_once_idle():
    a = Allocator(policy="first-fit")
    sync = sync_on(a)
    sync.apply_list([k8s_node("gpu-a", gpus="4"), k8s_node("gpu-b", gpus="4")])
    busy = a.allocate(Job("j1", "res50", 2))
    assert isinstance(busy, Allocation) and busy.node == "gpu-a"
    sync.apply_event("MODIFIED", k8s_node("gpu-a", unschedulable=True))
    sync.apply_event("MODIFIED", k8s_node("gpu-b", unschedulable=True))  # idle: removed at once
    nodes = nodes_of(a)
    assert sorted(nodes) == ["gpu-a"] and nodes["gpu-a"].labels[CLOSED_LABEL] == "unschedulable"
    assert a.cluster.allocation("j1") == busy  # the pod still runs: so does its allocation
    assert isinstance(a.allocate(Job("j2", "res50", 1)), Rejection)  # 2 GPUs free, but closed
    assert a.cluster.check() == []
    a.release("j1")
    sync.reconcile()  # what the loop does before every watch
    assert nodes_of(a) == {}
    sync.apply_event("MODIFIED", k8s_node("gpu-a"))  # uncordoned
    assert nodes_of(a)["gpu-a"].open and isinstance(a.allocate(Job("j2", "res50", 1)), Allocation)


def test_a_busy_node_that_comes_back_before_going_idle_reopens_with_its_jobs():
    a = Allocator(policy="first-fit")
    sync = sync_on(a)
    sync.apply_list([k8s_node("gpu-a", gpus="4")])
    a.allocate(Job("j1", "res50", 2))
    sync.apply_event("MODIFIED", k8s_node("gpu-a", ready="Unknown"))
    assert nodes_of(a)["gpu-a"].labels[CLOSED_LABEL] == "not-ready"
    sync.apply_event("MODIFIED", k8s_node("gpu-a"))
    assert nodes_of(a)["gpu-a"].open and a.cluster.allocation("j1") is not None
    assert isinstance(a.allocate(Job("j2", "res50", 2)), Allocation)


def test_a_deleted_busy_node_is_removed_and_its_allocations_evicted_and_logged(caplog):
    a = Allocator(policy="first-fit")
    metrics = Metrics()
    sync = sync_on(a, metrics)
    sync.apply_list([k8s_node("gpu-a"), k8s_node("cpu-1", gpus=None, product=None)])
    a.allocate(Job("j1", "res50", 2))
    with caplog.at_level(logging.WARNING, logger="hetplan.allocator.k8s.nodes"):
        sync.apply_event("DELETED", k8s_node("gpu-a"))
    assert nodes_of(a) == {} and a.cluster.allocation("j1") is None
    assert "j1@gpu-a" in caplog.text
    text = metrics.render()
    assert 'hetplan_allocator_kube_node_changes_total{change="remove"} 1.0' in text
    assert 'hetplan_allocator_kube_skipped_nodes{reason="no-gpus"} 1.0' in text
    assert "hetplan_allocator_kube_synced_nodes 0.0" in text


def test_a_refused_update_closes_the_node_until_it_is_idle_then_applies():
    a = Allocator(policy="first-fit")
    sync = sync_on(a)
    sync.apply_list([k8s_node("gpu-a", gpus="4")])
    a.allocate(Job("j1", "res50", 4))
    sync.apply_event("MODIFIED", k8s_node("gpu-a", gpus="2"))  # two GPUs failed under a 4-GPU job
    node = nodes_of(a)["gpu-a"]
    assert node.gpus == 4 and node.labels[CLOSED_LABEL] == "update-refused"
    a.release("j1")
    sync.reconcile()
    node = nodes_of(a)["gpu-a"]
    assert node.gpus == 2 and node.open


def test_a_heartbeat_that_changes_nothing_writes_nothing(tmp_path):
    metrics = Metrics()
    with DurableAllocator(tmp_path / "a.db", "first-fit", synchronous="NORMAL") as a:
        sync = sync_on(a, metrics)
        sync.apply_list([k8s_node("gpu-a", rv="5")])
        for rv in range(6, 30):
            sync.apply_event("MODIFIED", k8s_node("gpu-a", rv=str(rv)))  # new resourceVersion, same node
        assert 'kube_node_changes_total{change="upsert"} 1.0' in metrics.render()


def test_a_list_applies_as_one_batch_and_falls_back_to_node_by_node(tmp_path):
    with DurableAllocator(tmp_path / "a.db", "first-fit") as a:
        a.change_nodes(NodeChanges(upsert=[Node("gpu-x", "V100", 4, 32, 128)]))
        a.allocate(Job("j1", "res50", 4))
        sync = sync_on(a)
        # gpu-x is busy on V100 and its namesake Node says T4: that takeover is refused, the rest applies
        sync.apply_list([k8s_node(f"gpu-{i}") for i in range(5)] + [k8s_node("gpu-x")])
        nodes = nodes_of(a)
        assert sorted(nodes) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-x"]
        assert nodes["gpu-x"].gpu_type == "V100" and SOURCE_LABEL not in nodes["gpu-x"].labels
    with DurableAllocator(tmp_path / "a.db", "first-fit") as again:
        assert nodes_of(again) == nodes


# --- (c) end to end: the real kubernetes client against a stand-in API server ---------------------------------------


@pytest.fixture
def api_server():
    server = FakeApiServer().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_the_real_client_lists_watches_and_relists_after_410_into_a_durable_allocator(tmp_path, api_server, caplog):
    caplog.set_level(logging.INFO, logger="hetplan.allocator.k8s.nodes")
    db = tmp_path / "allocator.db"
    allocator = DurableAllocator(db, "first-fit")
    allocator.change_nodes(NodeChanges(upsert=[Node("from-file", "L4", 1, 8, 32)]))
    api_server.nodes = {n["metadata"]["name"]: n for n in (
        k8s_node("gpu-a", product="Tesla-T4", gpus="4"),
        k8s_node("gpu-b", product="NVIDIA-B200", gpus="8", memory="2063000000Ki"),
        k8s_node("cpu-c", product=None, gpus=None),
        k8s_node("gpu-d", unschedulable=True))}
    metrics = Metrics()
    sync = NodeSync(allocator, load_client(api_server.kubeconfig(tmp_path / "kubeconfig.yaml")), metrics=metrics,
                    backoff=(0.05, 0.2))
    sync.start()
    try:
        # phase 1: the list
        assert sync.ready.wait(20)
        nodes = eventually(lambda: (n := nodes_of(allocator)) and "gpu-b" in n and n)
        assert sorted(nodes) == ["from-file", "gpu-a", "gpu-b"]
        assert nodes["gpu-b"].gpu_type == "B200" and nodes["gpu-b"].mem_gb == 2063000000 // 1024 / 1024
        assert 'kube_skipped_nodes{reason="unschedulable"} 1.0' in metrics.render()
        assert isinstance(allocator.allocate(Job("big", "res50", 8)), Allocation)  # on gpu-b, the 8-GPU node
        assert isinstance(allocator.allocate(Job("small", "res50", 2)), Allocation)  # on gpu-a

        # phase 2: ADDED, MODIFIED, then a cordon of a busy node and DELETED of another
        api_server.push("ADDED", k8s_node("gpu-e", product="NVIDIA-H100-80GB-HBM3", gpus="4", rv="101"))
        api_server.push("MODIFIED", k8s_node("gpu-a", cpu="95690m", gpus="4", rv="102"))
        eventually(lambda: "gpu-e" in nodes_of(allocator) and nodes_of(allocator)["gpu-a"].cpus == 95.69)
        assert nodes_of(allocator)["gpu-e"].gpu_type == "H100"
        api_server.push("MODIFIED", k8s_node("gpu-b", product="NVIDIA-B200", gpus="8", memory="2063000000Ki",
                                             unschedulable=True, rv="103"))
        api_server.push("DELETED", k8s_node("gpu-a", cpu="95690m", rv="104"))
        eventually(lambda: "gpu-a" not in nodes_of(allocator) and not nodes_of(allocator)["gpu-b"].open)
        assert allocator.cluster.allocation("small") is None  # evicted with its node
        assert allocator.cluster.allocation("big").node == "gpu-b"  # kept on the cordoned node
        assert "small@gpu-a" in caplog.text

        # phase 3: the watch expires (410 Gone): list again; gpu-e vanished meanwhile, gpu-f joined
        del api_server.nodes["gpu-a"]
        del api_server.nodes["gpu-d"]
        api_server.nodes["gpu-f"] = k8s_node("gpu-f", product="NVIDIA-L4", gpus="1", rv="200")
        api_server.nodes["gpu-b"] = k8s_node("gpu-b", product="NVIDIA-B200", gpus="8", memory="2063000000Ki",
                                             unschedulable=True, rv="103")
        api_server.resource_version = "200"
        api_server.events.put({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version: 100 (150)", "reason": "Expired", "code": 410}})
        eventually(lambda: api_server.lists == 2 and "gpu-f" in nodes_of(allocator))
        nodes = nodes_of(allocator)
        assert sorted(nodes) == ["from-file", "gpu-b", "gpu-f"]
        assert nodes["gpu-b"].labels[CLOSED_LABEL] == "unschedulable" and nodes["gpu-f"].gpu_type == "L4"
        eventually(lambda: any("resourceVersion=200" in r and "watch=" in r for r in api_server.requests))

        # phase 4: the busy node's job ends and the node is uncordoned
        allocator.release("big")
        api_server.push("MODIFIED", k8s_node("gpu-b", product="NVIDIA-B200", gpus="8", memory="2063000000Ki",
                                             rv="201"))
        eventually(lambda: "gpu-b" in nodes_of(allocator) and nodes_of(allocator)["gpu-b"].open)
        assert allocator.cluster.check() == []
        assert "hetplan_allocator_kube_sync_errors_total 0.0" in metrics.render()
    finally:
        started = time.monotonic()
        sync.stop()
        assert time.monotonic() - started < 5  # the watch is interrupted, not waited out
        allocator.close()
    with DurableAllocator(db, "first-fit") as reopened:  # every change was committed
        assert sorted(nodes_of(reopened)) == ["from-file", "gpu-b", "gpu-f"]


def test_errors_are_logged_counted_and_retried_and_a_broken_watch_resumes(tmp_path, api_server, caplog):
    caplog.set_level(logging.WARNING, logger="hetplan.allocator.k8s.nodes")
    allocator = Allocator(policy="first-fit")
    metrics = Metrics()
    api_server.refuse_lists = 2
    api_server.nodes = {"gpu-a": k8s_node("gpu-a")}
    sync = NodeSync(allocator, load_client(api_server.kubeconfig(tmp_path / "kubeconfig.yaml")), metrics=metrics,
                    backoff=(0.05, 0.1))
    sync.start()
    try:
        eventually(lambda: "gpu-a" in nodes_of(allocator))
        assert "hetplan_allocator_kube_sync_errors_total 2.0" in metrics.render()
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 2 and all(len(w.splitlines()) == 1 for w in warnings)
        assert "HTTP 403 Forbidden: nodes is forbidden" in warnings[0]  # the API server's message, one line
        assert "(the service account needs get, list and watch on nodes)" in warnings[0]
        eventually(lambda: any("watch=" in r for r in api_server.requests))
        api_server.events.put({"type": "DROP"})  # the connection breaks mid-watch
        api_server.push("ADDED", k8s_node("gpu-b", rv="150"))
        eventually(lambda: "gpu-b" in nodes_of(allocator))
        assert api_server.lists == 1  # resumed from the last resourceVersion, not listed again
        assert "hetplan_allocator_kube_sync_errors_total 3.0" in metrics.render()
    finally:
        sync.stop()


def test_an_unreachable_api_server_never_stops_the_sync(tmp_path, api_server):
    config = api_server.kubeconfig(tmp_path / "kubeconfig.yaml")
    config.write_text(config.read_text().replace(api_server.url, "http://127.0.0.1:1"))  # nothing listens there
    metrics = Metrics()
    sync = NodeSync(Allocator(), load_client(config), metrics=metrics, backoff=(0.05, 0.1), request_timeout=2)
    sync.start()
    try:
        eventually(lambda: "kube_sync_errors_total 3.0" in metrics.render())
        assert sync._thread is not None and sync._thread.is_alive()
    finally:
        sync.stop()


def test_the_service_runs_the_sync_from_its_settings(tmp_path, api_server):
    from fastapi.testclient import TestClient

    from hetplan.allocator.service import ServiceSettings, create_app

    api_server.nodes = {"gpu-a": k8s_node("gpu-a", product="NVIDIA-A10G", gpus="1")}
    settings = ServiceSettings(db=tmp_path / "a.db", store=tmp_path / "store", tick_seconds=0,
                               kubeconfig=api_server.kubeconfig(tmp_path / "kubeconfig.yaml"))
    with TestClient(create_app(settings)) as client:
        body = eventually(lambda: (b := client.get("/v1/nodes").json())["nodes"] and b)
        assert [(n["name"], n["gpu_type"]) for n in body["nodes"]] == [("gpu-a", "A10G")]
        assert "hetplan_allocator_kube_synced_nodes 1.0" in client.get("/metrics").text


def test_the_extender_in_node_cache_mode_fails_a_closed_node():
    from fastapi.testclient import TestClient

    from hetplan.allocator.service import ServiceSettings, create_app

    a = Allocator(policy="first-fit")
    sync = sync_on(a)
    sync.apply_list([k8s_node("gpu-a", gpus="4"), k8s_node("gpu-b", gpus="4")])
    a.allocate(Job("j1", "res50", 2))
    sync.apply_event("MODIFIED", k8s_node("gpu-a", unschedulable=True))
    args = json.loads((Path(__file__).parent / "fixtures" / "extender" / "filter_args_res50_nodenames.json")
                      .read_text())
    args["NodeNames"] = ["gpu-a", "gpu-b"]
    with TestClient(create_app(ServiceSettings(tick_seconds=0), allocator=a)) as client:
        result = client.post("/filter", json=args).json()
    assert result["NodeNames"] == ["gpu-b"]
    assert result["FailedAndUnresolvableNodes"] == {
        "gpu-a": "closed to new placement (hetplan.io/closed=unschedulable)"}


# --- (d) hetplan serve --kubeconfig ----------------------------------------------------------------------------------


def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from hetplan.cli import main; main()", "serve",
                           "--db", str(tmp_path / "never.db"), "--port", "1", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_hetplan_serve_with_a_kubeconfig_serves_the_clusters_gpu_nodes(tmp_path, api_server):
    import httpx

    from servers import Server

    api_server.nodes = {"gpu-a": k8s_node("gpu-a", product="NVIDIA-L40S", gpus="2"),
                        "cpu-b": k8s_node("cpu-b", product=None, gpus=None)}
    config = api_server.kubeconfig(tmp_path / "kubeconfig.yaml")
    server = Server(tmp_path, tmp_path / "store", extra=("--kubeconfig", str(config))).start()
    try:
        listed = eventually(lambda: (b := httpx.get(f"{server.url}/v1/nodes", timeout=5).json())["nodes"] and b)
        assert [(n["name"], n["gpu_type"], n["gpus"]) for n in listed["nodes"]] == [("gpu-a", "L40S", 2)]
    finally:
        server.stop()


def test_serve_with_a_missing_kubeconfig_fails_in_one_line_before_serving(tmp_path):
    done = serve(tmp_path, "--kubeconfig", str(tmp_path / "missing.yaml"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"error: kubeconfig {tmp_path / 'missing.yaml'}: no such file"]
    assert not (tmp_path / "never.db").exists()


def test_serve_with_an_unusable_kubeconfig_fails_in_one_line(tmp_path):
    config = tmp_path / "kubeconfig.yaml"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    done = serve(tmp_path, "--kubeconfig", str(config))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: kubeconfig {config}: "), done.stderr


@pytest.mark.slow
def test_serve_help_and_a_serve_without_kubeconfig_import_no_kubernetes_client():
    code = ("import sys\nfrom hetplan.cli import app\n"
            "try:\n    app(['serve', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('KUBERNETES', 'kubernetes' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--kubeconfig" in done.stdout and "KUBERNETES False" in done.stdout
