"""Room as the kubelet counts it (`hetplan.allocator.k8s.room`, issue 33 item 4): the node sync watches every pod on
the STAND-IN API server (`standin_apiserver.py`; not a real kube-apiserver) and gives the allocator each node's
allocatable minus what other pods hold there. Bug pinned down: the allocator handed out all of `allocatable`,
ignoring daemon pods and pods that fell to the default scheduler, so pods it pinned waited Pending (28-34 at a
time, p90 time to Running 219-255 s)."""

from __future__ import annotations

import pytest

from hetplan.allocator import Allocator, Job
from hetplan.allocator.k8s import pods
from hetplan.allocator.k8s.nodes import NodeSync, load_client
from hetplan.allocator.k8s.room import Usage, room, usage
from hetplan.allocator.spec import CLOSED_LABEL, Node
from standin_apiserver import FakeApiServer, eventually, k8s_node, k8s_pod


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)


class Room:
    """The stand-in with two 4-GPU nodes (32 cores, 128 GiB), an allocator, and its node sync."""

    def __init__(self, tmp_path) -> None:
        self.api = FakeApiServer().start()
        self.api.nodes = {n: k8s_node(n, gpus="4", cpu="32", memory="128Gi") for n in ("gpu-a", "gpu-b")}
        self.allocator = Allocator([], "first-fit")
        self.sync = NodeSync(self.allocator, load_client(self.api.kubeconfig(tmp_path / "kubeconfig.yaml")),
                             recount_seconds=0.05)
        self.sync.start()
        eventually(lambda: self.sync.pods_ready.is_set() and len(self.allocator.cluster) == 2)

    def node(self, name: str) -> tuple[int, float, float]:
        n = self.allocator.cluster.node(name)
        return n.gpus, n.cpus, n.mem_gb

    def bound_pod(self, name: str, node: str, **kw) -> dict:
        pod = k8s_pod(name, **kw)
        pod["spec"]["nodeName"] = node
        return self.api.create_pod(pod["metadata"]["namespace"], pod)

    def close(self) -> None:
        self.sync.stop()
        self.api.stop()


@pytest.fixture
def r(tmp_path):
    out = Room(tmp_path)
    yield out
    out.close()


def test_daemon_pods_are_taken_off_every_nodes_room(r):
    r.api.add_daemons(cpu="500m", memory="1Gi")
    eventually(lambda: r.node("gpu-a") == (4, 31.5, 127.0) and r.node("gpu-b") == (4, 31.5, 127.0))


def test_a_pod_hetplan_does_not_hold_takes_its_gpus_cores_and_ram_until_it_is_gone(r):
    r.bound_pod("other", "gpu-a", model=None, gpus=2, cpu="10", memory="40Gi", namespace="team")
    eventually(lambda: r.node("gpu-a") == (2, 22.0, 88.0))
    assert r.node("gpu-b") == (4, 32.0, 128.0)
    r.api.pod_call("DELETE", "team", "other", None, None, "")  # graceful: it holds its room until removed
    eventually(lambda: r.api.pod("team", "other") is None)
    eventually(lambda: r.node("gpu-a") == (4, 32.0, 128.0))


def test_a_pod_holding_more_than_its_allocation_counts_the_excess_and_no_more(r):
    a = r.allocator.allocate(Job.request("ml/p1", "res50", 1, 4, 16))
    pod = r.bound_pod("p1", a.node, cpu="6", memory="16Gi", namespace="ml", annotations={pods.JOB_ID_KEY: "ml/p1"})
    assert pods.requests(pod) == (6000, 16384)  # a shrink to 4 cores not actuated yet: 2 cores beyond
    eventually(lambda: r.node(a.node) == (4, 30.0, 128.0))
    r.allocator.release("ml/p1")  # released while its pod still runs: all of it is foreign now
    eventually(lambda: r.node(a.node) == (3, 26.0, 112.0))


def test_an_overbooked_node_has_no_room_and_is_neither_refused_nor_closed(r):
    for i in range(2):
        r.allocator.allocate(Job.request(f"ml/big{i}", "res50", 2, 14, 60))
    on = r.allocator.running(["ml/big0"])["ml/big0"][0].node
    r.bound_pod("late", on, model=None, gpus=0, cpu="8", memory="8Gi", namespace="team")  # a pod not hetplan's
    assert on == r.allocator.running(["ml/big1"])["ml/big1"][0].node  # 4 GPUs, 28 cores, 120 GiB held there
    eventually(lambda: r.node(on) == (4, 28.0, 120.0))  # 32 - 8 cores is less than held: held, no room
    free = r.allocator.cluster.free(on)
    assert (free.gpus, free.cpu_m, free.mem_mib) == (0, 0, 0)
    assert CLOSED_LABEL not in r.allocator.cluster.node(on).labels and not r.allocator.cluster.check()


def test_a_default_path_pod_is_adopted_with_the_room_it_holds_counted_once(r):
    r.api.add_daemons(cpu="500m", memory="1Gi")
    r.bound_pod("fell", "gpu-a", gpus=2, cpu="6", memory="24Gi", namespace="ml")  # opted in, no job id
    eventually(lambda: r.node("gpu-a") == (2, 25.5, 103.0))
    with r.allocator.lock:  # what `POST /v1/adopt` does (service/adoption.py)
        r.sync.recount(["gpu-a"], owned=["ml/fell"])
        decision = r.allocator.adopt(Job.request("ml/fell", "res50", 2, 6, 24), "gpu-a")
        r.sync.recount(["gpu-a"])
    assert decision.node == "gpu-a" and (decision.cpu_m, decision.mem_mib) == (6000, 24 * 1024)
    eventually(lambda: r.node("gpu-a") == (4, 31.5, 127.0))  # its room is hetplan's now, counted once
    free = r.allocator.cluster.free("gpu-a")
    assert (free.gpus, free.cpu_m, free.mem_mib) == (2, 25500, 103 * 1024)


@pytest.mark.parametrize("foreign,used,expected", [
    (Usage(), Usage(), (4, 32000, 131072, False)),
    (Usage(1, 500, 1024), Usage(), (3, 31500, 130048, False)),
    (Usage(0, 20000, 0), Usage(2, 16000, 0), (4, 16000, 131072, False)),  # overbooked: never below `used`
    (Usage(4, 0, 0), Usage(), (1, 32000, 131072, True)),  # every GPU held by others: closed (full)
])
def test_room_is_allocatable_less_foreign_never_below_what_hetplan_holds(foreign, used, expected):
    out = room(Node("n", "T4", 4, 32, 128), foreign, used)
    assert (out.gpus, out.shape.cpu_m, out.shape.mem_mib, CLOSED_LABEL in out.labels) == expected


def test_usage_is_the_larger_of_spec_and_actuated_as_the_scheduler_counts():
    pod = k8s_pod("p", gpus=1, cpu="2", memory="8Gi")
    pod["status"] = {"containerStatuses": [{"name": "trainer", "resources": {"requests": {"cpu": "3",
                                                                                          "memory": "4Gi"}}}]}
    assert usage(pod) == Usage(1, 3000, 8192)  # a cpu shrink not actuated yet holds the old cores


def test_a_pod_list_before_the_node_list_removes_no_node(tmp_path):
    """Found by bench/k8s_strict.py: after a service restart the pod list can come before the Node list; the room's
    full recount then read every node the sync owns as deleted and removed them, allocations and all (the
    controller then evicted their pods). The room waits for the Nodes now."""
    from hetplan.allocator.k8s.nodes import SOURCE, SOURCE_LABEL

    api = FakeApiServer().start()
    try:
        api.nodes = {"gpu-a": k8s_node("gpu-a", gpus="4", cpu="32", memory="128Gi")}
        api.refuse_lists = 2  # the Node list fails twice (403) first: the pods are listed before it
        allocator = Allocator([Node("gpu-a", "T4", 4, 32, 128, {SOURCE_LABEL: SOURCE})], "first-fit")
        allocator.allocate(Job.request("ml/kept", "res50", 1, 2, 8))
        sync = NodeSync(allocator, load_client(api.kubeconfig(tmp_path / "kubeconfig.yaml")), backoff=(0.3, 0.3))
        sync.start()
        try:
            eventually(lambda: sync.pods_ready.is_set())
            assert not sync.ready.is_set() and "gpu-a" in allocator.cluster and "ml/kept" in allocator.running()
            eventually(lambda: sync.ready.is_set())
            assert "ml/kept" in allocator.running() and "gpu-a" in allocator.cluster
        finally:
            sync.stop()
    finally:
        api.stop()


def test_an_adoption_takes_back_only_unbound_room_newest_first_in_one_journaled_change(tmp_path):
    """`Allocator.adopt(..., unbound)`: where a running pod's node has no room, the newest allocations there whose
    pods are not bound give it back, as few as needed, placed again elsewhere (`migrate`) or stopped; one change,
    numbered and journaled; a bound job's room is never taken, and too little unbound room changes nothing."""
    from hetplan.allocator.core import NodeChanges
    from hetplan.allocator.durable import DurableAllocator
    from hetplan.allocator.spec import Rejection

    with DurableAllocator(tmp_path / "a.db", "first-fit") as a:
        a.change_nodes(NodeChanges(upsert=[Node("a", "T4", 4, 32, 128), Node("b", "T4", 4, 32, 128)]))
        for job in ("ml/old", "ml/mid", "ml/new"):  # 2 + 1 + 1 GPUs on a
            a.allocate(Job.request(job, "res50", 2 if job == "ml/old" else 1, 2, 8))
        a.allocate(Job.request("ml/b", "res50", 3, 2, 8))  # b keeps 1 GPU free
        fell = Job.request("ml/fell", "res50", 2, 2, 8)
        latest = a.log.latest
        assert isinstance(a.adopt(fell, "a"), Rejection)
        assert isinstance(a.adopt(fell, "a", unbound={"ml/mid"}), Rejection)  # too little; `old`, `new` are bound
        assert a.log.latest == latest and len(a.cluster.allocations()) == 4
        adopted = a.adopt(fell, "a", unbound={"ml/mid", "ml/new", "ml/b"})
        assert adopted.node == "a" and a.log.latest == latest + 3
        assert [(x.action.kind, x.action.job_id) for x in a.log.since(latest)] == [
            ("start", "ml/fell"), ("migrate", "ml/new"), ("stop", "ml/mid")]  # newest first; b had room for one
        running = {j: p[0].node for j, p in a.running().items()}
        assert running == {"ml/old": "a", "ml/fell": "a", "ml/new": "b", "ml/b": "b"} and not a.cluster.check()
    with DurableAllocator(tmp_path / "a.db", "first-fit") as again:  # journaled as one change
        assert {j: p[0].node for j, p in again.running().items()} == running and again.log.latest == latest + 3


@pytest.mark.parametrize("case", ["bound-the-watch-lags", "pending", "pods-unreadable"])
def test_a_pod_the_api_server_says_is_bound_keeps_its_room_however_late_the_pod_watch(r, case):
    """Bug: the adoption took room back from every job the node sync's pod list had not seen bound, and that list
    lags bindings: a pod bound a moment ago could lose its room. Now the API server is asked first: a bound pod
    keeps its room, only a pod it says is Pending gives it back, and nothing is given back when it cannot say."""
    from hetplan.allocator.service import ServiceSettings
    from hetplan.allocator.service.adoption import adopt_job
    from hetplan.allocator.service.context import ServiceContext
    from hetplan.allocator.spec import Rejection
    from standin_apiserver import Fault

    for job in ("other", "new"):  # 2 + 2 GPUs: gpu-a is full
        assert r.allocator.allocate(Job.request(f"ml/{job}", "res50", 2, 2, 8)).node == "gpu-a"
    r.bound_pod("other", "gpu-a", gpus=2, namespace="ml", annotations={pods.JOB_ID_KEY: "ml/other"})
    new = k8s_pod("new", gpus=2, namespace="ml", annotations={pods.JOB_ID_KEY: "ml/new"})
    if case == "pending":
        new["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]  # not bound, and not about to be
    else:
        new["spec"]["nodeName"] = "gpu-a"
    created = r.api.create_pod("ml", new)
    assert created["status"]["phase"] == ("Pending" if case == "pending" else "Running")
    eventually(lambda: "ml/other" in r.sync.ledger.jobs()
               and ("ml/new" in r.sync.ledger.jobs()) == (case != "pending"))
    r.sync.ledger.update("DELETED", created)  # the pod watch lags: the sync has not seen `new` bound (yet)
    if case == "pods-unreadable":
        r.api.faults.append(Fault("GET", r"^/api/v1/pods$", 500))
    ctx = ServiceContext(ServiceSettings(tick_seconds=0))
    ctx.allocator, ctx.node_sync = r.allocator, r.sync
    decision, _, actions = adopt_job(ctx, Job.request("ml/fell", "res50", 2, 2, 8), "gpu-a")
    if case == "pending":
        assert decision.node == "gpu-a" and [(x.kind, x.job_id) for x in actions] == [("migrate", "ml/new")]
        assert r.allocator.running(["ml/new"])["ml/new"][0].node == "gpu-b"
    else:
        assert isinstance(decision, Rejection) and actions == []
        assert r.allocator.running(["ml/new"])["ml/new"][0].node == "gpu-a"
    assert r.allocator.running(["ml/other"])["ml/other"][0].node == "gpu-a"
    assert r.api.faulted[500] == (case == "pods-unreadable")  # asked, and it could not answer
