"""Issue 30 on the Kubernetes side, against the STRICT STAND-IN API server (`standin_apiserver.py`; not a real
kube-apiserver) and the real allocator in process: owner-bound job ids, queued pods held behind the scheduling gate
`hetplan.io/queued` and admitted by the controller, preemption (checkpoint, eviction, the pod created again to wait
in the queue), and the Kueue split (hetplan's gate and Kueue's never both on a pod)."""

from __future__ import annotations

import base64
import json
import logging
import threading

import pytest
from standin_apiserver import CONTROLLER_USER, ApiError, Fault, eventually, json_patch, k8s_pod
from test_k8s_controller import allocation, no_proxy, requests_of, rig  # noqa: F401 - fixtures
from test_k8s_strict import leading

from hetplan.allocator import Job
from hetplan.allocator.k8s import pods, webhook
from hetplan.allocator.k8s.moves import Preemption, preempt_step

JOB_UID = "6f1c2a9e-0000-4000-8000-000000000001"


def owned(name: str, kind: str = "Job", uid: str = JOB_UID, labels: dict | None = None,
          annotations: dict | None = None) -> dict:
    pod = k8s_pod(name, labels=labels, annotations=annotations)
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": kind, "name": "train", "uid": uid,
                                           "controller": True, "blockOwnerDeletion": True}]
    return pod


OWNERS = [  # (case, pod, the job id)
    ("bare", k8s_pod("p1"), "ml/p1"),
    ("job", owned("train-x7k2p"), f"ml/Job/{JOB_UID}"),
    ("indexed-job", owned("train-2-x7k2p", annotations={pods.COMPLETION_INDEX: "2"}), f"ml/Job/{JOB_UID}/2"),
    ("jobset", owned("js-w-0-1-abcde", labels={pods.JOBSET_LABEL: "js", pods.JOBSET_INDEX: "0"},
                     annotations={pods.COMPLETION_INDEX: "1"}), "ml/JobSet/js/0-1"),
    ("pytorchjob", owned("pt-worker-3", kind="PyTorchJob", labels={pods.KUBEFLOW_LABEL: "pt",
                                                                    pods.KUBEFLOW_ROLE: "Worker",
                                                                    pods.KUBEFLOW_INDEX: "3"}),
     f"ml/PyTorchJob/{JOB_UID}/worker-3"),
    ("label", k8s_pod("anything", labels={pods.JOB_LABEL: "nightly"}), "ml/label/nightly"),
    ("replicaset", owned("web-5d9f-abcde", kind="ReplicaSet"), "ml/web-5d9f-abcde"),
    ("annotation-ignored", k8s_pod("evil", annotations={pods.JOB_ID_KEY: "ml/p1"}), "ml/evil"),
]


@pytest.mark.parametrize("case,pod,job", OWNERS, ids=[o[0] for o in OWNERS])
def test_a_job_id_is_its_owners_never_an_annotation(case, pod, job):
    assert pods.owner_job(pod, "ml") == job


GATES = [  # (the pod's scheduling gates, held by the queue's, held by a move's)
    ([], False, False), ([pods.QUEUE_GATE], True, False), ([pods.MIGRATION_GATE], False, True),
    ([pods.KUEUE_GATE, pods.QUEUE_GATE], True, False), ([pods.KUEUE_GATE], False, False),
    (["hetplan.io/queued-not"], False, False),
]


@pytest.mark.parametrize("names,queued,moving", GATES)
def test_has_gate_names_exactly_one_gate_and_without_gate_removes_only_it(names, queued, moving):
    pod = k8s_pod("g")
    if names:
        pod["spec"]["schedulingGates"] = [{"name": n} for n in names]
    assert (pods.has_gate(pod, pods.QUEUE_GATE), pods.has_gate(pod, pods.MIGRATION_GATE)) == (queued, moving)
    for gate in (pods.QUEUE_GATE, pods.MIGRATION_GATE):
        if pods.has_gate(pod, gate):
            rest = json_patch(pod, pods.without_gate(pod, gate))["spec"].get("schedulingGates") or []
            assert [g["name"] for g in rest] == [n for n in names if n != gate]


def test_a_user_set_job_id_annotation_claims_no_other_jobs_allocation(rig):
    """Bug: the webhook took `hetplan.io/job-id` from the pod: a pod naming another job's id got that job's
    allocation (the allocator answers an allocated id again, idempotent), pinned where the other job runs."""
    rig.api.create_pod("ml", k8s_pod("p1", gpus=2))
    mine = allocation(rig.allocator, "ml/p1")
    evil = rig.api.create_pod("ml", k8s_pod("evil", gpus=2, annotations={pods.JOB_ID_KEY: "ml/p1"}))
    assert pods.job_id(evil) == "ml/evil" and allocation(rig.allocator, "ml/p1") == mine
    assert set(rig.allocator.running()) == {"ml/p1", "ml/evil"}
    assert pods.node_of(evil) == allocation(rig.allocator, "ml/evil").node


def test_a_pod_its_job_creates_again_keeps_the_job_id(rig):
    first = rig.api.create_pod("ml", owned("train-aaaaa"))
    job = pods.job_id(first)
    rig.api.finish("ml", "train-aaaaa", phase="Failed")
    again = rig.api.create_pod("ml", owned("train-bbbbb"))
    assert job == pods.job_id(again) == f"ml/Job/{JOB_UID}"


# ------------------------------------------------------------------ the stand-in as strict as Kubernetes


def gated_pod(rig, name: str = "g1", **spec) -> dict:
    rig.api.webhook_url = None
    pod = k8s_pod(name)
    pod["spec"].update({"schedulingGates": [{"name": pods.QUEUE_GATE}], **spec})
    return rig.api.create_pod("ml", pod)


def patch(rig, name: str, body, ctype: str = "application/merge-patch+json") -> dict:
    return rig.api.pod_call("PATCH", "ml", name, None, body, ctype)[1]


PIN = {"key": "metadata.name", "operator": "In", "values": ["gpu-b"]}
ZONE = {"key": "zone", "operator": "In", "values": ["a"]}
UPDATES = [  # (case, gated, the pod's own spec, the patch, refused with)
    ("add-a-gate", True, {}, {"spec": {"schedulingGates": [{"name": pods.QUEUE_GATE}, {"name": "x/y"}]}},
     "only deletion is allowed"),
    ("add-a-gate-to-an-ungated-pod", False, {}, {"spec": {"schedulingGates": [{"name": "x/y"}]}},
     "only deletion is allowed"),
    ("pin-an-ungated-pod", False, {}, {"spec": {"affinity": pods.pinned_affinity({}, "gpu-b")}}, "may not change"),
    ("pin-a-gated-pod", True, {}, {"spec": {"affinity": pods.pinned_affinity({}, "gpu-b")}}, None),
    ("narrow-a-gated-pods-terms", True, {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
     {"nodeSelectorTerms": [{"matchExpressions": [ZONE]}]}}}},
     {"spec": {"affinity": pods.narrowed_affinity({"affinity": {"nodeAffinity": {
         "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [ZONE]}]}}}},
         "gpu-b")}}, None),
    ("re-point-a-gated-pod", True, {"affinity": pods.pinned_affinity({}, "gpu-a")},
     {"spec": {"affinity": pods.pinned_affinity({}, "gpu-b")}}, "only additions"),
    ("add-a-node-selector-key", True, {"nodeSelector": {"a": "1"}}, {"spec": {"nodeSelector": {"b": "2"}}}, None),
    ("change-a-node-selector-key", True, {"nodeSelector": {"a": "1"}}, {"spec": {"nodeSelector": {"a": "2"}}},
     "only additions"),
    ("resources-outside-resize", True, {}, {"spec": {"containers": [{"name": "trainer", "resources": {
        "requests": {"cpu": "9"}}}]}}, "resize subresource"),
    ("remove-the-gate", True, {}, {"spec": {"schedulingGates": None}}, None),
]


@pytest.mark.parametrize("case,gated,spec,body,refused", UPDATES, ids=[u[0] for u in UPDATES])
def test_the_standin_allows_a_pod_update_only_as_kubernetes_does(rig, case, gated, spec, body, refused):
    if gated:
        gated_pod(rig, **spec)
    else:
        rig.api.webhook_url = None
        rig.api.create_pod("ml", k8s_pod("g1"))
    if refused is None:
        patch(rig, "g1", body, "application/strategic-merge-patch+json")
        return
    with pytest.raises(ApiError, match=refused) as exc:
        patch(rig, "g1", body, "application/strategic-merge-patch+json")
    assert exc.value.body["code"] == 422


def test_a_gated_pod_is_never_scheduled_nor_bound_nor_created_with_a_node(rig):
    gated_pod(rig)
    rig.api.schedule()
    assert rig.api.pod("ml", "g1")["status"]["phase"] == "Pending" and not rig.api.pod("ml", "g1")["spec"].get(
        "nodeName")
    with pytest.raises(ApiError, match="non-empty .spec.schedulingGates"):
        rig.api.pod_call("POST", "ml", "g1", "binding", {"target": {"name": "gpu-a"}}, "")
    with pytest.raises(ApiError, match="cannot be set until all schedulingGates have been cleared"):
        gated_pod(rig, "g2", nodeName="gpu-a")
    patch(rig, "g1", [{"op": "remove", "path": "/spec/schedulingGates"}], "application/json-patch+json")
    assert rig.api.pod("ml", "g1")["status"]["phase"] == "Running"


def test_a_pending_pods_resources_change_through_resize_and_the_scheduler_fits_them(rig):
    gated_pod(rig)
    rig.api.pod_call("PATCH", "ml", "g1", "resize", {"spec": {"containers": [{"name": "trainer", "resources": {
        "requests": {"cpu": "5", "memory": "20Gi"}}}]}}, "application/strategic-merge-patch+json")
    patch(rig, "g1", [{"op": "remove", "path": "/spec/schedulingGates"}], "application/json-patch+json")
    assert requests_of(rig.api.pod("ml", "g1")) == (5000, 20480)
    assert rig.api.pod("ml", "g1")["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] == "5"


# ------------------------------------------------------------------ queued pods wait gated


def queued_answer(job: str, position: int = 3, why: str = "no-room") -> dict:
    return {"status": "queued", "job_id": job, "position": position, "why": why, "message": "waits"}


def admitted(pod: dict, answer: dict, user: str = "system:serviceaccount:default:launcher") -> tuple[dict, list]:
    """The webhook's review of `pod` with the allocator answering `answer`: the pod as admitted, the releases."""
    released: list[str] = []
    review = {"request": {"uid": "u1", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "ml",
                          "object": pod, "userInfo": {"username": user}}}
    out = webhook.review(review, lambda body: answer, released.append)["response"]
    assert out["allowed"]
    patch_ops = json.loads(base64.b64decode(out["patch"])) if out.get("patch") else []
    return json_patch(pod, patch_ops), released


def test_the_webhook_holds_a_queued_pod_behind_the_gate_with_its_place_never_the_default_path():
    pod, released = admitted(k8s_pod("q1", cpu="3", memory="10Gi"), queued_answer("ml/q1"))
    assert pods.has_gate(pod, pods.QUEUE_GATE) and not released and pods.node_of(pod) is None
    notes = pods.annotations(pod)
    assert (pods.job_id(pod), notes[pods.QUEUE_POSITION_KEY], notes[pods.QUEUE_WHY_KEY]) == ("ml/q1", "3", "no-room")
    assert requests_of(pod) == (3000, 10240) and pod["spec"]["containers"][0]["resizePolicy"]
    # a pod with gates of its own keeps them: hetplan's is added
    pod["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    again, _ = admitted(k8s_pod("q2") | {"spec": pod["spec"]}, queued_answer("ml/q2"))
    assert [g["name"] for g in again["spec"]["schedulingGates"]] == ["example.com/quota", pods.QUEUE_GATE]


def test_a_kueue_pod_is_never_queued_by_hetplan():
    """Kueue admits these (its own gate): hetplan's gate and Kueue's never both hold a pod. Queued: taken off
    hetplan's queue and admitted unchanged (adopted where it runs); allocated: sized and placed, no gate of ours."""
    pod = k8s_pod("k1", labels={pods.KUEUE_LABEL: "team-a"})
    pod["spec"]["schedulingGates"] = [{"name": pods.KUEUE_GATE}]
    held, released = admitted(pod, queued_answer("ml/k1"))
    assert released == ["ml/k1"] and held == pod
    placed, released = admitted(pod, {"status": "allocated", "allocation": {"node": "gpu-a", "cpus": 4, "mem_gb": 16}})
    assert not released and pods.node_of(placed) == "gpu-a" and requests_of(placed) == (4000, 16384)
    for admitted_pod in (held, placed):
        names = [g["name"] for g in admitted_pod["spec"]["schedulingGates"]]
        assert names == [pods.KUEUE_GATE]


def test_only_the_controller_may_name_a_pods_job_id(rig):
    pod = k8s_pod("again", annotations={pods.JOB_ID_KEY: "ml/p1"})
    as_user, _ = admitted(pod, queued_answer("x"))
    as_controller, _ = admitted(pod, queued_answer("x"), CONTROLLER_USER)
    assert (pods.job_id(as_user), pods.job_id(as_controller)) == ("ml/again", "ml/p1")


def create_queued(rig, name: str, cpu: str = "2", memory: str = "8Gi", gpus: int = 4) -> dict:
    """A pod as the webhook admits it when the allocator queues its job (created with the webhook off)."""
    pod, _ = admitted(k8s_pod(name, cpu=cpu, memory=memory, gpus=gpus), queued_answer(f"ml/{name}"))
    url, rig.api.webhook_url = rig.api.webhook_url, None
    try:
        return rig.api.create_pod("ml", pod)
    finally:
        rig.api.webhook_url = url


def ungated_without_allocation(rig) -> list[str]:
    """The invariant: pods that lost the queue's gate although the allocator does not run their job."""
    running = set(rig.allocator.running())
    return [pods.key(p)[1] for p in rig.api.live_pods() if pods.job_id(p) and not pods.has_gate(p, pods.QUEUE_GATE)
            and pods.job_id(p) not in running and not pods.terminating(p)]


@pytest.mark.parametrize("restart", [False, True], ids=["steady", "controller-killed-mid-way"])
def test_a_queued_pod_is_admitted_by_its_start_and_never_before(rig, restart):
    c = leading(rig)
    rig.api.create_pod("ml", k8s_pod("big", gpus=4))  # fills one node's GPUs
    for name in ("q1", "q2"):
        create_queued(rig, name, cpu="1", memory="4Gi")
    rig.api.schedule()
    assert all(rig.api.pod("ml", n)["status"]["phase"] == "Pending" for n in ("q1", "q2"))
    assert ungated_without_allocation(rig) == []
    if restart:
        c.stop()
    rig.allocator.allocate(Job.request("ml/q1", "res50", 4, 2, 8))  # a `start` in the log: q1 admitted
    if restart:
        c = leading(rig, "c2")
    eventually(lambda: rig.api.pod("ml", "q1")["status"]["phase"] == "Running")
    q1, a = rig.api.pod("ml", "q1"), allocation(rig.allocator, "ml/q1")
    assert not pods.has_gate(q1, pods.QUEUE_GATE) and q1["spec"]["nodeName"] == a.node
    assert requests_of(q1) == (a.cpu_m, a.mem_mib)
    assert ungated_without_allocation(rig) == [] and rig.api.overcommits == []
    q2 = rig.api.pod("ml", "q2")
    assert pods.has_gate(q2, pods.QUEUE_GATE) and q2["status"]["phase"] == "Pending"
    resizes = [m for m, p, _ in rig.api.calls if p.endswith("/pods/q1/resize")]
    assert (a.cpu_m, a.mem_mib) != (1000, 4096) and len(resizes) == 1  # sized while gated, then pinned, ungated


@pytest.mark.parametrize("code", [422, 429], ids=["refused", "answered-later"])
def test_a_gated_pods_resize_is_booked_as_any_pods(rig, code):
    """Bug: `_admit_queued` had its own copy of the resize: a refusal was counted `queued-resize-refused` but not
    booked (the next reconcile sent it again), and a 429 failed the whole pass. Now a refused resize is booked as
    any pod's (not sent again; the pod admitted at its own request) and a 429 is sent again with a backoff, the pod
    gated meanwhile."""
    c = leading(rig)
    rig.api.create_pod("ml", k8s_pod("big", gpus=4))
    create_queued(rig, "q1", cpu="1", memory="4Gi")
    rig.api.faults.append(Fault("PATCH", r"/pods/q1/resize$", code))
    rig.allocator.allocate(Job.request("ml/q1", "res50", 4, 2, 8))  # its `start`: 2 cores, 8 GiB
    got = allocation(rig.allocator, "ml/q1")
    a = pods.Target(got.node, got.cpu_m, got.mem_mib)
    eventually(lambda: not pods.has_gate(rig.api.pod("ml", "q1"), pods.QUEUE_GATE))
    eventually(lambda: not pods.has_gate(c.live("ml/q1")[0], pods.QUEUE_GATE))  # and the controller's watch has it
    q1 = rig.api.pod("ml", "q1")
    resizes = [m for m, p, _ in rig.api.calls if p.endswith("/pods/q1/resize")]
    if code == 422:
        assert c._refused[pods.uid(q1)] == a and c.stats.counts["resize-refused"] == 1
        assert requests_of(q1) == (1000, 4096) and len(resizes) == 1  # admitted at its own request
        c.converge("ml/q1", a, 0)  # the same target again: not sent again
        assert len([m for m, p, _ in rig.api.calls if p.endswith("/pods/q1/resize")]) == 1
    else:
        assert c.stats.counts["resize-retried"] == 1 and c.stats.counts["resize-refused"] == 0
        assert requests_of(q1) == (a.cpu_m, a.mem_mib) and len(resizes) == 2  # sized, then ungated
    assert c.stats.counts["errors"] == 0 and ungated_without_allocation(rig) == []


# ------------------------------------------------------------------ preemption


def stop(rig, c, job: str, seq: int = 10**6) -> None:
    """The controller applies a preempting `stop` of `job` (the allocator in process cannot log one yet: the service's
    queue does; its allocation is kept here, so that no plain `stop` of the log races this one)."""
    before = allocation(rig.allocator, job)
    eventually(lambda: c.live(job))  # the watch has brought its pod
    c.apply({"kind": "stop", "job_id": job, "seq": seq, "at": 0, "preempted": True,
             "before": [{"node": before.node, "cpus": before.cpu_m / 1000, "mem_gb": before.mem_mib / 1024}],
             "after": []})


def test_a_preempted_bare_pod_checkpoints_is_evicted_and_waits_again_under_its_job_id(rig, caplog):
    caplog.set_level(logging.INFO, logger="hetplan.allocator.k8s.controller")
    c = leading(rig)
    first = rig.api.create_pod("ml", k8s_pod("p1", annotations={pods.GRACE_KEY: "30"}))
    stop(rig, c, "ml/p1")
    eventually(lambda: pods.annotations(rig.api.pod("ml", "p1")).get(pods.CHECKPOINT_KEY) == str(10**6))
    assert rig.api.evictions[("ml", "p1")] == 0  # it checkpoints first
    patch(rig, "p1", {"metadata": {"annotations": {pods.CHECKPOINTED_KEY: str(10**6)}}})
    again = eventually(lambda: (p := rig.api.pod("ml", "p1")) and pods.uid(p) != pods.uid(first) and p)
    assert rig.api.evictions[("ml", "p1")] == 1 and pods.job_id(again) == "ml/p1"
    # placed where room is, or queued (gated)
    assert pods.node_of(again) is not None or pods.has_gate(again, pods.QUEUE_GATE)
    assert c.stats.counts["releases"] == 0 and c.stats.counts["preempted-recreated"] == 1
    assert c.stats.counts["preempted-without-checkpoint"] == 0


def preempted_pod(phase: str = "Running", deleted: bool = False, answered: bool = False) -> dict:
    notes = {pods.CHECKPOINTED_KEY: "7"} if answered else {}
    meta = {"name": "p1", "namespace": "ml", "uid": "u1", "annotations": notes,
            **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleted else {})}
    return {"metadata": meta, "spec": {"nodeName": "gpu-a"}, "status": {"phase": phase}}


@pytest.mark.parametrize("bare, evicted, pod, step", [
    (True, True, None, "recreate"),  # removed: created again under its name
    (False, True, None, "done"),  # its owner creates it again
    (True, False, preempted_pod("Succeeded"), "ended"),  # ended by itself, deleted by no one: its job is over
    (True, False, preempted_pod("Failed"), "ended"),
    (True, True, preempted_pod("Succeeded", deleted=True), "wait"),  # evicted: wait for its removal
    (True, False, preempted_pod("Succeeded", deleted=True), "wait"),  # deleted by someone: removed soon
    (True, False, preempted_pod("Succeeded", answered=True), "remove"),  # checkpointed this preemption, then exited
    (True, True, preempted_pod("Succeeded"), "remove"),  # evicted as it exited by itself: deleted by no one
    (True, False, preempted_pod("Succeeded", deleted=True, answered=True), "wait"),  # removed soon
    (False, False, preempted_pod("Succeeded", answered=True), "done"),  # its owner creates it again
    (False, False, preempted_pod("Succeeded"), "done"),
    (True, False, preempted_pod("Running", deleted=True), "wait"),  # terminating
])
def test_a_preemption_steps_by_its_pods_state(bare, evicted, pod, step):
    p = Preemption("ml/p1", ("ml", "p1"), "u1", 7, bare=bare, snapshot={}, asked_at=0.0, evicted=evicted)
    assert preempt_step(p, pod, now=1.0) == step


def test_a_bare_pod_that_checkpoints_then_exits_by_itself_waits_in_the_queue_not_forever(rig):
    """Bug: a preempted bare pod that answered its checkpoint and exited before its eviction stayed (ended, deleted
    by no one) and its preemption waited for its removal forever: its job never got a pod again."""
    c = leading(rig)
    first = rig.api.create_pod("ml", k8s_pod("p1", annotations={pods.GRACE_KEY: "30"}))
    stop(rig, c, "ml/p1")
    eventually(lambda: pods.annotations(rig.api.pod("ml", "p1")).get(pods.CHECKPOINT_KEY) == str(10**6))
    with rig.api.lock:  # the trainer answers and exits at once: the controller never sees it running and answered
        pod = rig.api.pods[("ml", "p1")]
        pod["metadata"]["annotations"][pods.CHECKPOINTED_KEY] = str(10**6)
        rig.api.finish("ml", "p1")
    again = eventually(lambda: (p := rig.api.pod("ml", "p1")) and pods.uid(p) != pods.uid(first) and p)
    assert pods.job_id(again) == "ml/p1" and rig.api.evictions[("ml", "p1")] == 0
    assert c.stats.counts["preempted-exited"] == 1 and c.stats.counts["preempted-recreated"] == 1
    assert c.stats.counts["releases"] == 0 and c.stats.counts["preempted-ended"] == 0
    eventually(lambda: c.intents.load() == {} and not c._preemptions)


@pytest.mark.parametrize("released", [False, True])
def test_a_kill_between_a_bare_pods_eviction_and_its_creation_again_is_finished_by_the_next_leader(rig, released):
    """Bug (found by test_controller_kill9): the preemption lived only in the leader's memory; killed after the
    eviction, the pod was lost and its job waited without one. Recorded before the eviction, it is finished by the
    next leader; the entry is dropped once the pod exists again, or (the job released since) without creating it."""
    c1 = leading(rig)
    first = rig.api.create_pod("ml", k8s_pod("p1", annotations={pods.GRACE_KEY: "0.2"}))

    def killed(p) -> None:  # the leader dies between the eviction and the creation again
        threading.Thread(target=c1.stop, daemon=True).start()
        raise RuntimeError("killed")

    c1._recreate = killed
    stop(rig, c1, "ml/p1")
    eventually(lambda: rig.api.pod("ml", "p1") is None and c1._stopping.is_set())
    assert list(c1.intents.load()) == [("ml", "p1")] and rig.api.evictions[("ml", "p1")] == 1
    if released:
        rig.service.release("ml/p1")  # as `POST /v1/release` does: the job is neither queued nor allocated
    c2 = leading(rig, "c2")
    eventually(lambda: c2.intents.load() == {} and not c2._preemptions)
    again = rig.api.pod("ml", "p1")
    if released:
        assert again is None and c2.stats.counts["preempted-recreated"] == 0
    else:
        assert pods.uid(again) != pods.uid(first) and pods.job_id(again) == "ml/p1"
        assert c2.stats.counts["preemptions-restored"] == 1 and c2.stats.counts["preempted-recreated"] == 1
    assert c2.stats.counts["releases"] == 0


def test_a_preemption_without_a_checkpoint_evicts_after_its_grace_and_says_so(rig, caplog):
    caplog.set_level(logging.INFO, logger="hetplan.allocator.k8s.controller")
    c = leading(rig)
    rig.api.create_pod("ml", owned("train-aaaaa", annotations={pods.GRACE_KEY: "0.3"}))
    job = f"ml/Job/{JOB_UID}"
    stop(rig, c, job)
    eventually(lambda: rig.api.pod("ml", "train-aaaaa") is None)
    assert c.stats.counts["preempted-without-checkpoint"] == 1 and rig.api.evictions[("ml", "train-aaaaa")] == 1
    assert any("did not answer its checkpoint" in r.getMessage() for r in caplog.records)
    assert c.stats.counts["preempted-recreated"] == 0 and c.stats.counts["releases"] == 0  # its Job creates it
    again = rig.api.create_pod("ml", owned("train-bbbbb"))  # as the Job controller does
    assert pods.job_id(again) == job


def test_a_queued_pod_that_asks_no_cores_or_ram_can_be_sized_and_comes_back_as_the_same_job():
    """Bugs the differential through the cluster path found: a pod without cpu/memory requests was queued BestEffort
    (no resize can give it cores or RAM: its `start` could never size it), and, created again after a preemption
    with its last allocation as its requests, was submitted with that as its floor (409: the default path)."""
    asked: list[dict] = []

    def allocate(body: dict) -> dict:
        asked.append(body)
        return queued_answer(body["job_id"])

    pod = k8s_pod("bare", cpu=None, memory=None)
    out = webhook.review({"request": {"uid": "u1", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "ml",
                                      "object": pod, "userInfo": {"username": "u"}}}, allocate, lambda job: None)
    held = json_patch(pod, json.loads(base64.b64decode(out["response"]["patch"])))
    assert requests_of(held) == (1, 1) and pods.has_gate(held, pods.QUEUE_GATE)  # Burstable, resizable at its start
    notes = pods.annotations(held)
    assert (notes[pods.REQUESTED_CPU_KEY], notes[pods.REQUESTED_MEMORY_KEY]) == ("", "")
    last_run = pods.with_target(held, pods.Target("gpu-a", 8000, 62464))  # as it ran before its preemption
    again = pods.recreated(last_run)
    webhook.review({"request": {"uid": "u2", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "ml",
                                "object": again, "userInfo": {"username": CONTROLLER_USER}}}, allocate, lambda j: None)
    assert [("cpus" in b, "mem_gb" in b) for b in asked] == [(False, False), (False, False)]
