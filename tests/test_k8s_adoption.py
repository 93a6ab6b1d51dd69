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
    ("job-id-over-253-chars", {}, {pods.JOB_ID_KEY: "ml/" + "j" * 260}),
    ("job-id-not-printable", {}, {pods.JOB_ID_KEY: "ml/a\tb"}),
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
