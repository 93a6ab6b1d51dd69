"""Alibaba's pod list (its first 40 pods, lifetimes x3000 as `bench/pods_ticks.py`: synthetic density) through the
webhook and one controller on the STAND-IN API server (not a real cluster), on the trace's 1,213 GPU nodes.
`bench/k8s_replay.py` runs more of it. Checked: every pod served; each ran with at least its own request (what
the stand-in kubelet actuated); no node's actuated resources above its allocatable at any pod change; 0 drift and
every allocation released at the end."""

from __future__ import annotations

import pytest

from hetplan.allocator.replay import pod_events
from k8s_rig import OPENB, Rig, openb_nodes, replay_events
from standin_apiserver import eventually


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.slow
def test_the_first_40_alibaba_pods_run_with_their_own_request_and_no_node_overcommits(tmp_path):
    events = pod_events(OPENB / "openb_pod_list_default.csv", stretch=3000)
    keep = sorted({e.body["job_id"] for e in events if not e.release})[:40]
    events = [e for e in events if e.body["job_id"] in set(keep)]
    assert len(events) == 80 and any(e.body["num_gpus"] == 0 for e in events)  # CPU-only pods among them
    (tmp_path / "store").mkdir()
    rig = Rig(tmp_path, openb_nodes(), tmp_path / "store", ["--tick", "0"],
              ["--poll", "0.1", "--reconcile", "5", "--orphan-grace", "5"], replicas=1)
    try:
        rig.start()
        result = replay_events(rig, events, seconds=4)
        eventually(lambda: rig.allocations() == {}, 30)  # every pod ended in the trace: all released
        kinds = {a["kind"] for a in rig.actions()["actions"]}
    finally:
        rig.close()
    counts = result["counts"]
    assert counts["asked"] == 40 and counts["served"] == 40 and counts["ended"] == 40
    assert result["below"] == [] and rig.api.overcommits == [] and rig.api.webhook_failures == 0
    assert kinds == {"start", "stop"}  # no hints, no tick: placements and releases only
