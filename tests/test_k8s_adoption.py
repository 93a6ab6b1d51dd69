"""Adoption by the controller against the STRICT STAND-IN API server (`standin_apiserver.py`; not a real
kube-apiserver): a pod the allocator refuses is a fault of that pod alone, a pod being deleted is not adopted again,
and a pod the API server says is bound keeps its room however late the node sync's pod watch is."""

from __future__ import annotations

import logging
import time

import pytest
from standin_apiserver import eventually, k8s_pod
from test_k8s_controller import allocation, no_proxy, rig  # noqa: F401 - fixtures
from test_k8s_strict import leading

from hetplan.allocator.k8s import pods
from hetplan.allocator.actions import Action

BAD_PODS = [  # (case, k8s_pod's arguments, annotations): each one a 4xx from the allocator, or unreadable
    ("job-id-over-253-chars", {"labels": {pods.JOB_LABEL: "j" * 260}}, {}),  # a job id is its owner's (label)
    ("job-id-not-printable", {"labels": {pods.JOB_LABEL: "a\tb"}}, {}),
    ("requested-cpu-out-of-range", {}, {pods.REQUESTED_CPU_KEY: "2000000000"}),
    ("requested-cpu-400-digits", {}, {pods.REQUESTED_CPU_KEY: "9" * 400}),
    ("over-1024-gpus", {"gpus": 2000}, {pods.JOB_ID_KEY: "ml/huge"}),
]


@pytest.mark.parametrize("case,shape,notes", BAD_PODS, ids=[c[0] for c in BAD_PODS])
def test_a_pod_the_allocator_refuses_stalls_nothing_else(rig, caplog, case, shape, notes):
    """Bug: the allocator's 4xx (or an OverflowError reading the pod) escaped `_adopt`: the reconcile pass (and so
    the start of leading) or every adoption pass aborted at that pod, retried every 0.2 s; the leader then gave the
    Lease up and /healthz said 503. Now it is counted `adopt-refused`, logged naming the pod, and asked again
    `adopt_every` s later; the other pods are adopted."""
    caplog.set_level(logging.INFO, logger="hetplan.allocator.k8s.controller")
    rig.api.webhook_url = None  # the webhook is down: these take the default path (a job id annotation the webhook
    rig.api.create_pod("ml", k8s_pod("bad", **shape, annotations=notes))  # would replace by the owner's survives)
    assert pods.annotations(rig.api.pod("ml", "bad")) == notes
    rig.api.create_pod("ml", k8s_pod("good", cpu="3", memory="10Gi"))
    rig.api.create_pod("ml", k8s_pod("lost", annotations={pods.JOB_ID_KEY: "ml/lost"}))  # its allocation lost
    c = leading(rig, adopt_every=30)
    eventually(lambda: {"ml/good", "ml/lost"} <= set(rig.allocator.running()))
    eventually(lambda: c.stats.counts["adopt-refused"] >= 1)
    refused = c.stats.counts["adopt-refused"]
    time.sleep(1)  # 20 passes: not asked again before `adopt_every`
    assert c.stats.counts["adopt-refused"] == refused == 1
    assert c.stats.counts["errors"] == 0 and c.elector.leading() and c.healthy()
    lines = [r.getMessage() for r in caplog.records if "has no allocation" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("controller: pod ml/bad has no allocation and ") \
        and len(lines[0].splitlines()) == 1, lines


@pytest.mark.parametrize("victim", ["running", "gone"])
def test_a_forged_job_id_annotation_claims_no_other_jobs_allocation(rig, victim):
    """Bug: adoption took `hetplan.io/job-id` from the pod where the webhook does not: a pod created with the
    webhook down (or patched since) naming another job was adopted as that job (its allocation given to the forged
    pod, or its pod's target applied to it) and its end released that job. Now it is adopted under its own id (its
    owner's, `pods.adoptable_job`), its annotation rewritten, reported once; the named job is untouched."""
    rig.api.create_pod("ml", k8s_pod("p1", gpus=2, cpu="3", memory="10Gi"))
    mine = allocation(rig.allocator, "ml/p1")
    if victim == "gone":  # its pod deleted and its allocation released: the id is free to take
        rig.api.pod_call("DELETE", "ml", "p1", None, {"gracePeriodSeconds": 0}, "")
        rig.service.release("ml/p1")
    rig.api.webhook_url = None  # the webhook is down: the pod is created as written
    rig.api.create_pod("ml", k8s_pod("evil", gpus=2, cpu="1", memory="2Gi", annotations={pods.JOB_ID_KEY: "ml/p1"}))
    c = leading(rig)
    eventually(lambda: "ml/evil" in rig.allocator.running())
    evil = eventually(lambda: (p := rig.api.pod("ml", "evil")) and pods.job_id(p) == "ml/evil" and p)
    assert pods.node_of(evil) == allocation(rig.allocator, "ml/evil").node
    if victim == "running":
        assert allocation(rig.allocator, "ml/p1") == mine and c.live("ml/p1") == [rig.api.pod("ml", "p1")]
    else:
        assert "ml/p1" not in rig.allocator.running()
    assert c.stats.counts["job-id-forged"] == 1 and c.stats.counts["errors"] == 0
    rig.api.finish("ml", "evil")  # its end releases its own job only
    eventually(lambda: "ml/evil" not in rig.allocator.running())
    assert ("ml/p1" in rig.allocator.running()) == (victim == "running"), [a for a in rig.allocator.log.since(0)]


def test_a_pod_being_deleted_is_not_adopted_again(tmp_path):
    """Bug: a reconcile adopted a terminating pod whose allocation was gone (a `stop` evicted it): its room was
    allocated again to a pod on its way out."""
    from test_k8s_controller import NODES, Rig

    from hetplan.allocator import Allocator

    r = Rig(tmp_path, Allocator(NODES, "first-fit"), termination_seconds=3)
    try:
        c = leading(r)
        r.api.create_pod("ml", k8s_pod("p1", annotations={pods.GRACE_KEY: "30"}))
        a = allocation(r.allocator, "ml/p1")
        r.allocator.apply_actions([Action("stop", "ml/p1", (a,), ())])
        eventually(lambda: pods.terminating(c.pods.get(("ml", "p1"), {})))
        c.reconcile()
        assert "ml/p1" not in r.allocator.running() and c.stats.counts["adopted"] == 0
        assert r.api.evictions[("ml", "p1")] == 1
    finally:
        r.close()


OWN_REQUESTS = [  # (case, k8s_pod's cpu/memory, annotations, the allocate body's cpus/mem_gb, or the error's field)
    ("requests-as-written", ("3", "10Gi"), {}, {"cpus": 3.0, "mem_gb": 10.0}),
    ("annotations-over-requests", ("3", "10Gi"), {pods.REQUESTED_CPU_KEY: "1500",
                                                  pods.REQUESTED_MEMORY_KEY: "2048"}, {"cpus": 1.5, "mem_gb": 2.0}),
    ("asks-none", (None, None), {}, {}),
    ("empty-annotation-asks-none", ("3", "10Gi"), {pods.REQUESTED_CPU_KEY: "", pods.REQUESTED_MEMORY_KEY: ""}, {}),
    ("negative", ("3", "10Gi"), {pods.REQUESTED_CPU_KEY: "-1"}, pods.REQUESTED_CPU_KEY),
    ("spaced", ("3", "10Gi"), {pods.REQUESTED_MEMORY_KEY: " 1"}, pods.REQUESTED_MEMORY_KEY),
    ("not-ascii-digits", ("3", "10Gi"), {pods.REQUESTED_CPU_KEY: "²"}, pods.REQUESTED_CPU_KEY),
    ("400-digits", ("3", "10Gi"), {pods.REQUESTED_MEMORY_KEY: "9" * 400}, pods.REQUESTED_MEMORY_KEY),
    ("5000-digits", ("3", "10Gi"), {pods.REQUESTED_CPU_KEY: "9" * 5000}, pods.REQUESTED_CPU_KEY),
]


@pytest.mark.parametrize("case,shape,notes,expected", OWN_REQUESTS, ids=[c[0] for c in OWN_REQUESTS])
def test_the_webhook_and_adoption_read_a_pods_own_request_alike(case, shape, notes, expected):
    """One reading of the own request (`pods.own_request`) for both: the webhook's allocate body and adoption's
    request carry the same `cpus`/`mem_gb`, and a pod one refuses the other refuses, naming the annotation."""
    from hetplan.allocator.k8s import adoption, webhook

    pod = k8s_pod("p1", cpu=shape[0], memory=shape[1], namespace="ml", annotations=notes)
    asked: list[dict] = []

    def allocate(body: dict) -> dict:
        asked.append(body)
        return {"status": "rejected", "reason": "test", "message": "stop here"}

    if isinstance(expected, str):
        with pytest.raises(webhook.Unserved, match=expected):
            webhook.admit(pod, "ml", allocate, lambda job: None)
        with pytest.raises(ValueError, match=expected):
            adoption.request(pod)
        assert not asked
        return
    with pytest.raises(webhook.Unserved):
        webhook.admit(pod, "ml", allocate, lambda job: None)
    adopted = adoption.request(pod)
    assert {k: v for k, v in asked[0].items() if k in ("cpus", "mem_gb")} == expected
    assert {k: v for k, v in adopted.items() if k in ("cpus", "mem_gb")} == expected


def _owned(name: str, job_id: str) -> dict:
    pod = k8s_pod(name, namespace="ml", annotations={pods.JOB_ID_KEY: job_id})
    pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "t", "uid": "u-1", "controller": True}]
    return pod


ADOPTABLE = [  # (case, pod, the job id adoption acts on)
    ("own-annotation", k8s_pod("p1", namespace="ml", annotations={pods.JOB_ID_KEY: "ml/p1"}), "ml/p1"),
    ("no-annotation", k8s_pod("p1", namespace="ml"), "ml/p1"),
    ("forged", k8s_pod("evil", namespace="ml", annotations={pods.JOB_ID_KEY: "ml/p1"}), "ml/evil"),
    ("bare-replacement", k8s_pod("p1-m7", namespace="ml", annotations={pods.JOB_ID_KEY: "ml/p1"}), "ml/p1"),
    ("replacement-of-an-m-name", k8s_pod("t-m7", namespace="ml", annotations={pods.JOB_ID_KEY: "ml/t-m2"}),
     "ml/t-m2"),
    ("replacement-name-of-another", k8s_pod("p2-m7", namespace="ml", annotations={pods.JOB_ID_KEY: "ml/p1"}),
     "ml/p2-m7"),
    ("other-namespace", k8s_pod("p1-m7", namespace="ml", annotations={pods.JOB_ID_KEY: "team/p1"}), "ml/p1-m7"),
    ("owned-forged", _owned("w-0", "ml/p1"), "ml/Job/u-1"),
    ("owned-replacement-like-name", _owned("p1-m7", "ml/p1"), "ml/Job/u-1"),
]


@pytest.mark.parametrize("case,pod,job", ADOPTABLE, ids=[c[0] for c in ADOPTABLE])
def test_adoption_takes_a_job_id_by_the_webhooks_rule(case, pod, job):
    from hetplan.allocator.k8s import adoption

    assert pods.adoptable_job(pod) == job == adoption.request(pod)["job_id"]
