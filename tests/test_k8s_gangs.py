"""Issue 30, multi-pod gangs on the Kubernetes side, against the STRICT STAND-IN API server (`standin_apiserver.py`;
not a real kube-apiserver) and the real allocator service in process: the pods of an Indexed Job that declares a
gang (`hetplan.io/gang-size`) wait gated until all exist, are submitted once as one gang of fixed parts and are
admitted together or not at all."""

from __future__ import annotations

import time

import pytest
from standin_apiserver import eventually, k8s_pod
from test_k8s_controller import no_proxy, requests_of, rig  # noqa: F401 - fixtures
from test_k8s_strict import leading

from hetplan.allocator.k8s import pods
from hetplan.allocator.k8s.room import PodLedger, Usage
from hetplan.allocator.spec import Allocation

UID1 = "6f1c2a9e-0000-4000-8000-0000000000a1"
UID2 = "6f1c2a9e-0000-4000-8000-0000000000a2"


def indexed(name: str, index: int, uid: str, size: int = 2, gpus: int = 4) -> dict:
    """A pod of an Indexed Job (completions = parallelism = `size`) as the Job controller creates it."""
    pod = k8s_pod(name, gpus=gpus, cpu="2", memory="8Gi", labels={pods.COMPLETION_INDEX: str(index)},
                  annotations={pods.COMPLETION_INDEX: str(index), pods.GANG_SIZE_KEY: str(size)})
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": uid,
                                           "controller": True, "blockOwnerDeletion": True}]
    return pod


def state(rig, names: list[str]) -> list[tuple[bool, str | None]]:
    """(gated, node) of each pod."""
    return [(pods.has_gate(p, pods.QUEUE_GATE), p["spec"].get("nodeName")) for p in (rig.api.pod("ml", n) for n in names)]


def never_half(rig, job: str, names: list[str]) -> None:
    """The invariant: the gang's pods are all gated and it holds nothing, or none is gated and it holds every part."""
    gated = [pods.has_gate(rig.api.pod("ml", n), pods.QUEUE_GATE) for n in names]
    held = rig.allocator.running([job]).get(job, ())
    assert (all(gated) and not held) or (not any(gated) and len(held) == len(names)), (gated, held)


def test_pod_declaring_a_gang_names_the_gang_and_its_part():
    gang = pods.gang(indexed("t-1", 1, UID1, size=3), "ml")
    assert gang == pods.Gang(f"ml/Job/{UID1}", "1", 3)
    assert pods.part_order(["10", "2", "0", "1"]) == ["0", "1", "2", "10"]
    bare = k8s_pod("b", annotations={pods.GANG_SIZE_KEY: "2"})  # no owner, no index: no gang to be part of
    for pod in (bare, indexed("t-0", 0, UID1, size=1)):
        with pytest.raises(ValueError, match=pods.GANG_SIZE_KEY):
            pods.gang(pod, "ml")
    assert pods.gang(k8s_pod("plain"), "ml") is None


def test_an_indexed_job_gang_is_admitted_whole_or_not_at_all(rig):
    c = leading(rig)
    rig.api.create_pod("ml", k8s_pod("big", gpus=4))  # one node's GPUs busy: room for one 4-GPU pod only
    job1, gang1 = f"ml/Job/{UID1}", ["train-0-aaaaa", "train-1-bbbbb"]
    rig.api.create_pod("ml", indexed(gang1[0], 0, UID1))
    time.sleep(0.3)  # several controller passes: one pod of two is not asked for
    assert state(rig, gang1[:1]) == [(True, None)] and job1 not in rig.allocator.running()
    assert rig.http.get("/v1/queue").json()["jobs"] == []  # not even queued
    assert c.stats.counts["gang-refused"] == 0 and pods.annotations(rig.api.pod("ml", gang1[0]))[
        pods.QUEUE_WHY_KEY] == "gang-waiting"
    rig.api.create_pod("ml", indexed(gang1[1], 1, UID1))
    eventually(lambda: any(j["job_id"] == job1 for j in rig.http.get("/v1/queue").json()["jobs"]))  # submitted
    rig.api.schedule()
    for _ in range(5):  # room for one of them only: both stay gated, Pending
        never_half(rig, job1, gang1)
        time.sleep(0.05)
    assert state(rig, gang1) == [(True, None), (True, None)]

    rig.api.finish("ml", "big")  # its room frees: the gang starts as one, both pods ungated together
    eventually(lambda: all(p["status"]["phase"] == "Running" for p in (rig.api.pod("ml", n) for n in gang1)))
    never_half(rig, job1, gang1)
    parts = sorted(rig.allocator.running([job1])[job1], key=lambda a: a.job_id)
    for name, part in zip(gang1, parts):  # part k is the pod of index k, with its part's node, cores and RAM
        pod = rig.api.pod("ml", name)
        assert (pod["spec"]["nodeName"], requests_of(pod)) == (part.node, (part.cpu_m, part.mem_mib))
        assert part.cpu_m >= 2000 and part.gpus == 4
    assert {a.node for a in parts} == {"gpu-a", "gpu-b"} and rig.api.overcommits == []

    # a second gang never takes a half: it waits whole while the first runs, even when a pod of the first goes
    job2, gang2 = f"ml/Job/{UID2}", ["other-0-ccccc", "other-1-ddddd"]
    for k, name in enumerate(gang2):
        rig.api.create_pod("ml", indexed(name, k, UID2))
    eventually(lambda: any(j["job_id"] == job2 for j in rig.http.get("/v1/queue").json()["jobs"]))
    rig.api.finish("ml", gang1[0], phase="Failed")  # one pod of the running gang ends: its part is kept
    time.sleep(0.3)
    assert len(rig.allocator.running([job1])[job1]) == 2 and state(rig, gang2) == [(True, None), (True, None)]
    assert rig.api.pod("ml", gang1[1])["status"]["phase"] == "Running"  # the other is left as it is
    again = rig.api.create_pod("ml", indexed("train-0-eeeee", 0, UID1))  # the Job creates index 0 again
    eventually(lambda: rig.api.pod("ml", "train-0-eeeee")["status"]["phase"] == "Running")
    assert pods.job_id(again) == job1 and rig.api.pod("ml", "train-0-eeeee")["spec"]["nodeName"] == parts[0].node

    for name in ("train-0-eeeee", gang1[1]):  # the first gang ends: its parts are released, the second starts whole
        rig.api.finish("ml", name)
    eventually(lambda: all(p["status"]["phase"] == "Running" for p in (rig.api.pod("ml", n) for n in gang2)))
    never_half(rig, job2, gang2)
    assert job1 not in rig.allocator.running() and rig.api.overcommits == []


@pytest.mark.parametrize("count, expected", [
    (2, Usage()),  # each pod of the gang on the node is one of its parts there: nothing foreign
    (3, Usage(2, 2000, 8192)),  # a pod more than its parts there is foreign, whole
])
def test_a_gangs_pods_on_one_node_are_its_parts_there_not_foreign_room(count, expected):
    ledger = PodLedger()
    members = []
    for k in range(count):
        pod = pods.with_target(indexed(f"t-{k}", k, UID1, gpus=2), pods.Target("gpu-a", 2000, 8192))
        pod["spec"]["nodeName"] = "gpu-a"
        pod["metadata"]["annotations"][pods.JOB_ID_KEY] = f"ml/Job/{UID1}"
        members.append(pod)
    ledger.replace(members)
    parts = [Allocation(f"ml/Job/{UID1}#{k}", "res50", "gpu-a", "T4", 2, 2000, 8192, None, "first-fit",
                        "proportional", part_gpus=2) for k in range(2)]
    assert ledger.foreign("gpu-a", lambda job: parts if job == f"ml/Job/{UID1}" else []) == expected
