"""The controller's core loop and the admission webhook, with the real kubernetes client against the STAND-IN API
server on loopback (`standin_apiserver.py`: not a real kube-apiserver; none runs here) and the real allocator
service in process (FastAPI's TestClient)."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from hetplan.allocator import Allocator, Node
from hetplan.allocator.k8s import pods
from hetplan.allocator.k8s.controller import Controller
from hetplan.allocator.k8s.nodes import load_client
from hetplan.allocator.k8s.service_client import AllocatorClient
from hetplan.allocator.k8s.webhook import WebhookServer
from hetplan.allocator.actions import Action
from hetplan.allocator.service import ServiceSettings, create_app
from standin_apiserver import FakeApiServer, eventually, k8s_node, k8s_pod, pod_requests

NODES = [Node("gpu-a", "T4", 4, 32, 128), Node("gpu-b", "T4", 4, 32, 128)]


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)


class Rig:
    """The stand-in, an allocator service in process, the webhook, and controllers on them."""

    def __init__(self, tmp_path, allocator: Allocator, settings: ServiceSettings | None = None, **standin) -> None:
        self.allocator = allocator
        self.api = FakeApiServer(**standin).start()
        self.api.nodes = {n.name: k8s_node(n.name, gpus=str(n.gpus), cpu=str(int(n.cpus)), memory=f"{int(n.mem_gb)}Gi")
                          for n in allocator.cluster.nodes()}
        self.http = TestClient(create_app(settings or ServiceSettings(tick_seconds=0), allocator=allocator)).__enter__()
        self.service = AllocatorClient(http=self.http)
        self.webhook = WebhookServer(self.service, host="127.0.0.1", port=0).start()
        self.api.webhook_url = f"http://127.0.0.1:{self.webhook.port}/mutate"
        self.config = self.api.kubeconfig(tmp_path / "kubeconfig.yaml")
        self.controllers: list[Controller] = []

    def controller(self, identity: str = "c1", **kw) -> Controller:
        options = {"poll": 0.05, "reconcile_seconds": 60, "orphan_grace": 0.5, "checkpoint_grace": 5,
                   "lease_seconds": 2, **kw}
        c = Controller(load_client(self.config), self.service, identity=identity, **options).start()
        self.controllers.append(c)
        return c

    def close(self) -> None:
        for c in self.controllers:
            c.stop()
        self.webhook.stop()
        self.http.__exit__(None, None, None)
        self.api.stop()


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path, Allocator(NODES, "first-fit"))
    yield r
    r.close()


def requests_of(pod: dict) -> tuple[int, int]:
    r = pod_requests(pod)
    return int(r["cpu"] * 1000), int(r["memory"] / 2**20)


def allocation(allocator: Allocator, job: str):
    return allocator.running([job])[job][0]


def test_the_webhook_gives_an_opted_in_pod_its_allocation_and_pins_its_node(rig):
    rig.api.create_pod("ml", k8s_pod("p1", gpus=2, cpu="3", memory="10Gi", sidecar=True))
    pod = rig.api.pod("ml", "p1")
    a = allocation(rig.allocator, "ml/p1")
    assert pods.job_id(pod) == "ml/p1" and pod["spec"]["nodeName"] == a.node and pod["status"]["phase"] == "Running"
    assert requests_of(pod) == (a.cpu_m, a.mem_mib)  # the pod's requests (trainer + sidecar) are the allocation
    assert pods.annotations(pod)[pods.REQUESTED_CPU_KEY] == "3100"  # its own request, the floor, kept
    trainer = pod["spec"]["containers"][0]["resources"]
    # Burstable on purpose (a memory limit = its request, no cpu limit): resizable in place on 1.33 (pods.py)
    assert trainer["requests"]["memory"] == trainer["limits"]["memory"] and "cpu" not in trainer["limits"]
    assert trainer["limits"]["nvidia.com/gpu"] == "2" and pod["status"]["qosClass"] == "Burstable"


def test_a_pod_hetplan_cannot_serve_takes_the_default_path_with_one_reason(rig, caplog):
    caplog.set_level(logging.INFO, logger="hetplan.allocator.k8s.webhook")
    rig.api.create_pod("ml", k8s_pod("huge", gpus=3, cpu="200"))  # more cores than any node: the allocator refuses
    rig.api.create_pod("ml", k8s_pod("plain", model=None))  # not opted in: the webhook is not even called
    huge = rig.api.pod("ml", "huge")
    assert pods.job_id(huge) is None and "affinity" not in huge["spec"]  # admitted unchanged
    assert [r.getMessage() for r in caplog.records if "huge" in r.getMessage()] == [
        "webhook: pod ml/huge left to the default scheduler: allocator: too-big: "
        + rig.allocator.decide(__import__("hetplan.allocator", fromlist=["Job"]).Job.request(
            "x", "res50", 3, 200, 8)).message]
    assert rig.allocator.running() == {}


def test_resize_goes_through_the_subresource_migrate_through_eviction_and_the_cursor_survives(rig):
    c = rig.controller()
    rig.api.create_pod("ml", k8s_pod("p1", gpus=1, annotations={pods.GRACE_KEY: "10"}))
    a = allocation(rig.allocator, "ml/p1")
    eventually(lambda: c.cursor == rig.allocator.log.latest)

    bigger = replace(a, cpu_m=a.cpu_m + 4000, mem_mib=a.mem_mib + 8192)
    rig.allocator.apply_actions([Action("resize", "ml/p1", (a,), (bigger,))])
    eventually(lambda: requests_of(rig.api.pod("ml", "p1")) == (bigger.cpu_m, bigger.mem_mib))
    resizes = [call for call in rig.api.calls if call[1].endswith("/pods/p1/resize")]
    assert len(resizes) == 1 and resizes[0][0] == "PATCH"
    assert rig.api.pod("ml", "p1")["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] == \
        pods.cpu_text(bigger.cpu_m)  # the stand-in kubelet actuated it

    other = "gpu-b" if a.node == "gpu-a" else "gpu-a"
    moved = replace(bigger, node=other)
    rig.allocator.apply_actions([Action("migrate", "ml/p1", (bigger,), (moved,))])
    seq = rig.allocator.log.latest
    new = f"p1-m{seq}"
    eventually(lambda: pods.annotations(rig.api.pod("ml", "p1")).get(pods.CHECKPOINT_KEY) == str(seq))
    replacement = rig.api.pod("ml", new)
    # waits for the checkpoint
    assert pods.has_gate(replacement, pods.MIGRATION_GATE) and replacement["status"]["phase"] == "Pending"
    rig.api.pod_call("PATCH", "ml", "p1", None, {"metadata": {"annotations": {pods.CHECKPOINTED_KEY: str(seq)}}},
                     "application/merge-patch+json")  # the trainer wrote its checkpoint
    eventually(lambda: rig.api.pod("ml", "p1") is None and rig.api.pod("ml", new)["status"]["phase"] == "Running")
    replacement = rig.api.pod("ml", new)
    assert replacement["spec"]["nodeName"] == other and requests_of(replacement) == (moved.cpu_m, moved.mem_mib)
    assert pods.job_id(replacement) == "ml/p1" and allocation(rig.allocator, "ml/p1").node == other
    assert [m for m, path, _ in rig.api.calls if path.endswith("/pods/p1/eviction")] == ["POST"]
    assert not [call for call in rig.api.calls if call[0] == "DELETE"]  # moved through Eviction only

    eventually(lambda: c.cursor == rig.allocator.log.latest)
    assert rig.api.objects[("configmaps", "hetplan", "hetplan-controller-cursor")]["data"]["cursor"] == str(seq)
    rig.api.finish("ml", new)  # the job ends: released
    eventually(lambda: rig.allocator.running() == {} and c.stats.counts["releases"] == 1)  # counted after release
    assert c.stats.counts["releases"] == 1 and c.stats.counts["errors"] == 0, c.stats.counts


def test_a_pdb_holds_an_eviction_until_it_allows_it(rig):
    rig.api.pdbs = [{"metadata": {"name": "keep-one", "namespace": "ml"},
                     "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}}}]
    rig.api.create_pod("ml", k8s_pod("p1", labels={"app": "trainer"}, annotations={pods.GRACE_KEY: "0"}))
    c = rig.controller()
    a = allocation(rig.allocator, "ml/p1")
    moved = replace(a, node="gpu-b" if a.node == "gpu-a" else "gpu-a")
    rig.allocator.apply_actions([Action("migrate", "ml/p1", (a,), (moved,))])
    eventually(lambda: c.stats.counts["eviction-blocked"] >= 1)
    assert rig.api.pod("ml", "p1")["status"]["phase"] == "Running"
    rig.api.create_pod("ml", k8s_pod("p2", model=None, gpus=0, labels={"app": "trainer"}))  # a second healthy pod
    eventually(lambda: rig.api.pod("ml", "p1") is None)
    eventually(lambda: c.stats.counts["evictions"] == 1)  # counted once the API call returned


def test_reconcile_at_start_and_after_410_repairs_drift_both_ways(tmp_path):
    r = Rig(tmp_path, Allocator(NODES, "first-fit", retain=2))
    try:
        r.api.create_pod("ml", k8s_pod("kept"))
        r.api.create_pod("ml", k8s_pod("lost"))
        r.allocator.release("ml/lost")  # the allocator forgot a running pod (say, a database moved aside)
        r.allocator.allocate(__import__("hetplan.allocator", fromlist=["Job"]).Job("ml/ghost", "res50", 1))
        a = allocation(r.allocator, "ml/kept")
        small = replace(a, cpu_m=a.cpu_m - 1000)
        r.allocator.apply_actions([Action("resize", "ml/kept", (a,), (small,))])  # while no controller ran
        c = r.controller()
        eventually(lambda: "ml/ghost" not in r.allocator.running() and "ml/lost" in r.allocator.running())
        eventually(lambda: requests_of(r.api.pod("ml", "kept")) == (small.cpu_m, small.mem_mib))
        lost = allocation(r.allocator, "ml/lost")
        assert requests_of(r.api.pod("ml", "lost")) == (lost.cpu_m, lost.mem_mib)
        # counted once the service's answer is back (after the change the test saw)
        eventually(lambda: c.stats.counts["orphans-released"] == 1 and c.stats.counts["adopted"] == 1)
        # the log moves on by more than it keeps while the controller is away: 410, reconcile, continue
        c.stop()
        r.controllers.clear()
        for _ in range(3):
            k = allocation(r.allocator, "ml/kept")
            r.allocator.apply_actions([Action("resize", "ml/kept", (k,), (replace(k, cpu_m=k.cpu_m + 500),))])
        c2 = r.controller("c2")
        eventually(lambda: c2.stats.counts["gone"] == 1 and c2.cursor == r.allocator.log.latest)
        k = allocation(r.allocator, "ml/kept")
        eventually(lambda: requests_of(r.api.pod("ml", "kept")) == (k.cpu_m, k.mem_mib))
    finally:
        r.close()


def test_a_pod_watch_expired_lists_again_and_releases_what_ended_meanwhile(rig):
    c = rig.controller()
    rig.api.create_pod("ml", k8s_pod("p1"))
    eventually(lambda: ("ml", "p1") in c.pods)
    with rig.api.lock:
        pod = rig.api.pods.pop(("ml", "p1"))  # deleted without an event the controller could see
        rig.api.rv += 1
    rig.api.compact()  # then the watch's resourceVersion is gone: the watch is answered 410 and lists again
    assert pod
    # the release is counted just after the service answers it: wait for both, not the first alone
    eventually(lambda: rig.allocator.running() == {}
               and c.stats.counts["releases"] + c.stats.counts["orphans-released"] >= 1)


def test_two_replicas_never_both_act_and_the_second_takes_over(rig):
    first = rig.controller("c1")
    eventually(lambda: first.elector.leading())
    second = rig.controller("c2")
    rig.api.create_pod("ml", k8s_pod("p1"))
    a = allocation(rig.allocator, "ml/p1")
    rig.allocator.apply_actions([Action("resize", "ml/p1", (a,), (replace(a, cpu_m=a.cpu_m + 1000),))])
    eventually(lambda: first.cursor == rig.allocator.log.latest)
    assert not second.elector.leading() and second.cursor is None
    first._stopping.set()  # killed: it stops renewing (no graceful release)
    eventually(lambda: second.elector.leading(), 10)
    b = allocation(rig.allocator, "ml/p1")
    rig.allocator.apply_actions([Action("resize", "ml/p1", (b,), (replace(b, cpu_m=b.cpu_m + 1000),))])
    eventually(lambda: requests_of(rig.api.pod("ml", "p1"))[0] == b.cpu_m + 1000)
    lease = rig.api.objects[("leases", "hetplan", "hetplan-controller")]["spec"]
    assert lease["holderIdentity"] == "c2" and lease["leaseTransitions"] == 1


def test_a_late_event_of_a_deleted_pod_does_not_release_the_pod_created_again_under_its_name(rig):
    """Job ids are `<namespace>/<name>`: a pod deleted and created again by name holds the same job id. The old pod's
    DELETED event, handled after the new pod exists, must not release the new pod's allocation (checked by UID)."""
    # another replica holds the lease: this controller watches (and queues the old pod's end) but does not act yet
    rig.api.object_call("POST", "leases", "hetplan", None, {"metadata": {"name": "hetplan-controller"}, "spec": {
        "holderIdentity": "elsewhere", "leaseDurationSeconds": 60, "renewTime": "2026-12-01T00:00:00.000000Z"}})
    c = rig.controller(lease_seconds=60)
    rig.api.create_pod("ml", k8s_pod("p1"))
    old_uid = rig.api.pod("ml", "p1")["metadata"]["uid"]
    rig.api.pod_call("DELETE", "ml", "p1", None, None, "")
    eventually(lambda: rig.api.pod("ml", "p1") is None)  # graceful: terminating, then a terminal phase, then gone
    rig.api.create_pod("ml", k8s_pod("p1"))  # created again by name: the webhook gets the same job id
    new_uid = rig.api.pod("ml", "p1")["metadata"]["uid"]
    assert new_uid != old_uid and "ml/p1" in rig.allocator.running()
    eventually(lambda: pods.uid(c.pods.get(("ml", "p1"), {})) == new_uid and len(c._ended) >= 1)
    with rig.api.lock:  # the other replica is gone: this one takes over and handles the old pod's end
        del rig.api.objects[("leases", "hetplan", "hetplan-controller")]
    eventually(lambda: c.elector.leading() and not c._ended)
    eventually(lambda: c.stats.counts["reconciles"] >= 1)
    assert "ml/p1" in rig.allocator.running() and c.stats.counts["releases"] == 0
    # the cache held the new pod; without it (the watch behind), the API server is asked: same answer
    c._ended.append({"metadata": {"namespace": "ml", "name": "p1", "uid": old_uid,
                                  "annotations": {pods.JOB_ID_KEY: "ml/p1"}}, "status": {"phase": "Succeeded"}})
    with c._lock:
        del c.pods[("ml", "p1")]
    eventually(lambda: c.stats.counts["release-skipped-reused"] == 1)
    assert "ml/p1" in rig.allocator.running() and c.stats.counts["releases"] == 0
    rig.api.pod_call("DELETE", "ml", "p1", None, None, "")  # the new pod's own end does release it
    eventually(lambda: rig.allocator.running() == {})


def test_a_deferred_resize_is_reported_and_followed_until_the_kubelet_actuates_it_and_infeasible_is_not_retried(rig):
    c = rig.controller(deferred_backoff_max=1)
    rig.api.create_pod("ml", k8s_pod("p1", cpu="4"))
    a = allocation(rig.allocator, "ml/p1")
    # a pod hetplan does not manage takes most of the node's cores (the allocator does not see it)
    hog = k8s_pod("hog", model=None, gpus=0, cpu=f"{32 - a.cpu_m // 1000 - 1}", memory="1Gi")
    hog["spec"]["affinity"] = pods.pinned_affinity({}, a.node)
    rig.api.create_pod("ml", hog)
    assert rig.api.pod("ml", "hog")["spec"].get("nodeName") == a.node
    bigger = replace(a, cpu_m=a.cpu_m + 4000)
    rig.allocator.apply_actions([Action("resize", "ml/p1", (a,), (bigger,))])
    eventually(lambda: pods.resize_pending(rig.api.pod("ml", "p1")) is not None)
    assert pods.resize_pending(rig.api.pod("ml", "p1"))[0] == "Deferred"  # the stand-in kubelet: no room now
    eventually(lambda: pods.annotations(rig.api.pod("ml", "p1")).get(pods.RESIZE_PENDING_KEY, "").startswith(
        "Deferred: "))
    eventually(lambda: c.stats.counts["resize-deferred-waits"] >= 2)  # looked at again, with a backoff
    assert c.stats.counts["resize-deferred"] == 1 and len([x for x in rig.api.calls if x[1].endswith("/resize")]) == 1
    rig.api.pod_call("DELETE", "ml", "hog", None, None, "")  # room frees: the kubelet actuates it
    eventually(lambda: c.stats.counts["resize-deferred-done"] == 1)
    pod = rig.api.pod("ml", "p1")
    assert pods.RESIZE_PENDING_KEY not in pods.annotations(pod) and pods.resize_pending(pod) is None
    assert pod["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] == pods.cpu_text(bigger.cpu_m)

    rig.api.kubelet_refuses.add(("ml", "p1"))  # the kubelet will never fit the next one
    smaller = replace(bigger, cpu_m=bigger.cpu_m - 1000)
    rig.allocator.apply_actions([Action("resize", "ml/p1", (bigger,), (smaller,))])
    eventually(lambda: c.stats.counts["resize-infeasible"] == 1)
    eventually(lambda: pods.annotations(rig.api.pod("ml", "p1")).get(pods.RESIZE_PENDING_KEY, "").startswith(
        "Infeasible: "))
    c.reconcile()  # a reconcile does not retry it: the pod's spec already says what the allocator wants
    assert len([x for x in rig.api.calls if x[1].endswith("/resize")]) == 2
    assert c.stats.counts["resize-infeasible"] == 1 and c.stats.counts["errors"] == 0
    assert rig.api.overcommits == []


def test_a_resize_that_comes_mid_move_is_applied_once_the_replacement_is_bound_not_at_the_next_reconcile(rig):
    c = rig.controller(lease_seconds=30)  # reconciles every 60 s: only the one at start may run in this test
    eventually(lambda: c.stats.counts["reconciles"] == 1)
    rig.api.create_pod("ml", k8s_pod("p1", annotations={pods.GRACE_KEY: "30"}))
    a = allocation(rig.allocator, "ml/p1")
    moved = replace(a, node="gpu-b" if a.node == "gpu-a" else "gpu-a")
    rig.allocator.apply_actions([Action("migrate", "ml/p1", (a,), (moved,))])
    seq = rig.allocator.log.latest
    eventually(lambda: pods.annotations(rig.api.pod("ml", "p1")).get(pods.CHECKPOINT_KEY) == str(seq))
    grown = replace(moved, cpu_m=moved.cpu_m + 2000)
    rig.allocator.apply_actions([Action("resize", "ml/p1", (moved,), (grown,))])
    eventually(lambda: c.cursor == rig.allocator.log.latest)
    assert requests_of(rig.api.pod("ml", f"p1-m{seq}")) == (moved.cpu_m, moved.mem_mib)  # mid-move: waits
    rig.api.pod_call("PATCH", "ml", "p1", None, {"metadata": {"annotations": {pods.CHECKPOINTED_KEY: str(seq)}}},
                     "application/merge-patch+json")
    eventually(lambda: requests_of(rig.api.pod("ml", f"p1-m{seq}")) == (grown.cpu_m, grown.mem_mib), 10)
    assert rig.api.pod("ml", f"p1-m{seq}")["spec"]["nodeName"] == moved.node
    assert c.stats.counts["reconciles"] == 1 and c.stats.counts["errors"] == 0, c.stats.counts
