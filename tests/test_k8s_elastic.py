"""Issue 31, elastic GPU counts on the Kubernetes side, against the STRICT STAND-IN API server (`standin_apiserver.py`;
not a real kube-apiserver; its Indexed Job controller is labelled with what it simplifies) and the real allocator
service in process: an Indexed Job gang of 2 pods x 1 GPU scaled to 4 and back to 2 by `POST /v1/scale`. The
controller runs the checkpoint handshake on the gang's pods before each patch of the Job; the new pods are admitted on
their parts with their type's hinted cores and RAM; no pod runs without its part on a grow, nothing overcommits."""

from __future__ import annotations

import threading
import time
from io import StringIO

import pandas as pd
import pytest
from standin_apiserver import ApiError, eventually, k8s_pod
from standin_rules import validate_job_update
from servers import TOKEN
from test_k8s_controller import Rig, no_proxy, requests_of  # noqa: F401 - fixtures
from test_service_elastic import scaling_csv  # noqa: F401 - a fixture
from test_k8s_strict import leading

from hetplan.allocator import Allocator, Node
from hetplan.allocator.core import part_number
from hetplan.allocator.k8s import pods
from hetplan.allocator.service import ServiceSettings
from hetplan.hints import HintSet

NODES = [Node("gpu-a", "T4", 4, 32, 128), Node("gpu-b", "T4", 4, 32, 128)]
HINTS = """model,num_gpus,gpu_type,rank,cpus_per_gpu,mem_gb_per_gpu,expected_throughput,normalized_throughput,throughput_per_dollar,plan_id
res50,2,T4,1,6,30,260,1.0,170,p1
res50,4,T4,1,6,30,500,1.0,170,p1
"""
HINTED = (6000, 30 * 1024)  # each 1-GPU part: the T4 rows' cores and RAM per GPU


@pytest.fixture
def rig(tmp_path):
    hints = HintSet.from_frame(pd.read_csv(StringIO(HINTS), dtype=str))
    r = Rig(tmp_path, Allocator(NODES, "hint", hints))
    yield r
    r.close()


def indexed_job(name: str, count: int) -> dict:
    """An elastic Indexed Job: `count` pods of 1 GPU that run together (a gang), `torchrun --nnodes=1:4` in each."""
    template = k8s_pod(name, gpus=1, cpu="2", memory="8Gi",
                       annotations={pods.GANG_SIZE_KEY: str(count), pods.GRACE_KEY: "10"})
    template["spec"]["containers"][0]["command"] = ["torchrun", "--nnodes=1:4", "train.py"]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"completionMode": "Indexed", "completions": count, "parallelism": count,
                     "template": {"metadata": template["metadata"], "spec": template["spec"]}}}


def live(rig, name: str = "train") -> list[dict]:
    return [p for p in rig.api.job_pods("ml", name) if p["status"]["phase"] in ("Pending", "Running")]


def running(pod: dict) -> bool:
    return pod["status"]["phase"] == "Running" and not pods.has_gate(pod, pods.QUEUE_GATE)


class Sampler:
    """(running pods' indexes, parts allocated) every 2 ms while the test runs, each read at one instant."""

    def __init__(self, rig, job: str) -> None:
        self.rig, self.job, self.samples = rig, job, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            with self.rig.api.lock, self.rig.allocator.lock:
                indexes = sorted(int(pods.annotations(p)[pods.COMPLETION_INDEX]) for p in live(self.rig) if running(p))
                self.samples.append((indexes, len(self.rig.allocator.running([self.job]).get(self.job, ()))))

    def stop(self) -> list[tuple[list[int], int]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def handshake(rig, count: int, parallelism_before: int, seq: int | None = None) -> float:
    """The controller asked each of the `count` running pods to checkpoint for action `seq` (default: the last) and
    has not patched the Job yet; then the trainers answer. When the last answered (time.time(), the clock of the
    stand-in's calls)."""
    seq = rig.allocator.log.latest if seq is None else seq
    eventually(lambda: sum(pods.annotations(p).get(pods.CHECKPOINT_KEY) == str(seq) for p in live(rig)) == count)
    time.sleep(0.3)  # several controller passes: no answer, no patch
    job = rig.api.jobs[("ml", "train")]["spec"]
    assert (job["parallelism"], job["completions"]) == (parallelism_before, parallelism_before)
    for pod in live(rig):
        rig.api.pod_call("PATCH", "ml", pod["metadata"]["name"], None,
                         {"metadata": {"annotations": {pods.CHECKPOINTED_KEY: str(seq)}}}, "application/merge-patch+json")
    return time.time()


def check_parts(rig, job: str, count: int, hinted: bool = True) -> None:
    """Every live pod of index k runs on part k's node with its cores and RAM (`hinted`: the type's hinted share)."""
    parts = sorted(rig.allocator.running([job])[job], key=part_number)
    pods_now = live(rig)
    assert len(parts) == len(pods_now) == count
    for pod, part in zip(pods_now, parts):
        assert int(pods.annotations(pod)[pods.COMPLETION_INDEX]) == part_number(part)
        assert (pod["spec"]["nodeName"], requests_of(pod)) == (part.node, (part.cpu_m, part.mem_mib))
        assert not hinted or (part.cpu_m, part.mem_mib, part.share) == (*HINTED, "hinted"), part


def test_an_elastic_indexed_job_scales_2_4_2_checkpointing_first_and_never_overcommitting(rig):
    c = leading(rig)
    made = rig.api.create_job("ml", indexed_job("train", 2))
    job = f"ml/Job/{made['metadata']['uid']}"
    eventually(lambda: len(live(rig)) == 2 and all(running(p) for p in live(rig)))
    check_parts(rig, job, 2)
    first = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in live(rig)}
    sampler = Sampler(rig, job)

    r = rig.http.post("/v1/scale", json={"job_id": job, "parts": 4})
    assert r.json()["status"] == "scaled", r.json()
    grow = handshake(rig, 2, 2)
    eventually(lambda: len(live(rig)) == 4 and all(running(p) for p in live(rig)))
    check_parts(rig, job, 4)
    assert {n: first[n] for n in first} == {p["metadata"]["name"]: p["spec"]["nodeName"] for p in live(rig)[:2]}
    grown = len(sampler.samples)

    r = rig.http.post("/v1/scale", json={"job_id": job, "parts": 2})
    assert r.json()["status"] == "scaled", r.json()
    shrink = handshake(rig, 4, 4)
    eventually(lambda: len(live(rig)) == 2 and len(rig.api.job_pods("ml", "train")) == 2)  # 2 and 3 removed
    check_parts(rig, job, 2)
    assert {p["metadata"]["name"]: p["spec"]["nodeName"] for p in live(rig)} == first  # the first two ran on
    samples = sampler.stop()

    # the handshake came first: the Job was patched once after every pod's answer, each time
    patches = [(at, body["spec"]) for (method, path, body), at in zip(rig.api.calls, rig.api.call_times)
               if method == "PATCH" and path == "/apis/batch/v1/namespaces/ml/jobs/train"]
    assert [spec for _, spec in patches] == [{"parallelism": 4, "completions": 4}, {"parallelism": 2, "completions": 2}]
    assert grow < patches[0][0] < shrink < patches[1][0]
    # growing, no pod ever ran without its part; shrinking, only the removed indexes outlived theirs, until the
    # handshake and the Job controller ended them
    assert all(len(indexes) <= parts for indexes, parts in samples[:grown]), samples[:grown]
    assert all(len(indexes) <= parts or (parts, set(indexes)) == (2, {0, 1, 2, 3}) for indexes, parts in samples[grown:])
    assert samples[-1] == ([0, 1], 2)
    assert rig.api.overcommits == []
    counts = c.stats.counts
    assert (counts["rescales"], counts["rescaled"], counts["rescale-without-checkpoint"], counts["gang-misdeclared"],
            counts["gang-refused"]) == (2, 2, 0, 0, 0), counts


@pytest.mark.parametrize("change, field", [
    ({"parallelism": 4}, None),  # parallelism alone: fine
    ({"parallelism": 4, "completions": 4}, None),  # in tandem, the same value: an elastic Indexed Job
    ({"completions": 4}, "spec.completions"),  # alone: refused
    ({"parallelism": 3, "completions": 4}, "spec.completions"),  # in tandem but different
    ({"parallelism": -1}, "spec.parallelism"),
    ({"parallelism": "4"}, "spec.parallelism"),
    ({"completionMode": "NonIndexed"}, "spec.completionMode"),
    ({"template": {"spec": {}}}, "spec.template"),
])
def test_the_standin_refuses_job_updates_kubernetes_refuses(change, field):
    old = indexed_job("train", 2)
    old["metadata"]["uid"] = "u"
    new = {**old, "spec": {**old["spec"], **change}}
    if field is None:
        validate_job_update(old, new)
        return
    with pytest.raises(ApiError) as refused:
        validate_job_update(old, new)
    assert refused.value.body["code"] == 422 and field in refused.value.body["message"]
    nonindexed = {**old, "spec": {**old["spec"], "completionMode": "NonIndexed"}}
    with pytest.raises(ApiError):
        validate_job_update(nonindexed, {**nonindexed, "spec": {**nonindexed["spec"], "parallelism": 4,
                                                                "completions": 4}})


def test_a_shrink_never_admits_a_queued_pod_before_the_dropped_pods_are_gone(rig):
    """Bug: a shrink freed the dropped parts in the allocator at once, the queue's head started in that room, and its
    pod was ungated while the dropped pods still ran their checkpoint handshake (and then their graceful deletion) on
    the same GPUs. The queued pod is admitted only once no dropped pod is left on its node."""
    c = leading(rig)
    made = rig.api.create_job("ml", indexed_job("train", 4))
    job = f"ml/Job/{made['metadata']['uid']}"
    eventually(lambda: len(live(rig)) == 4 and all(running(p) for p in live(rig)))
    parts = sorted(rig.allocator.running([job])[job], key=part_number)
    for i in range(8 - 4):  # every other GPU held: the queued pod waits for room the shrink frees
        rig.api.create_pod("ml", k8s_pod(f"fill{i}", gpus=1, cpu="1", memory="4Gi"))
    assert rig.allocator.cluster.free_gpus_total() == 0
    rig.api.create_pod("ml", k8s_pod("q1", gpus=1, cpu="1", memory="4Gi"))
    assert pods.has_gate(rig.api.pod("ml", "q1"), pods.QUEUE_GATE)
    dropped_nodes = {p.node for p in parts[2:]}

    seen: list[tuple[bool, int]] = []  # (q1 ungated, dropped pods whose containers run), each read at one instant
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.002):
            with rig.api.lock:
                q1 = rig.api.pod("ml", "q1")
                dropped = [p for p in live(rig) if int(pods.annotations(p)[pods.COMPLETION_INDEX]) >= 2]
                seen.append((q1 is not None and not pods.has_gate(q1, pods.QUEUE_GATE), len(dropped)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    r = rig.http.post("/v1/scale", json={"job_id": job, "parts": 2})
    assert r.json()["status"] == "scaled", r.json()
    assert [a["kind"] for a in r.json()["actions"]][:2] == ["resize", "start"]  # q1 started in the freed room
    handshake(rig, 4, 4, r.json()["actions"][0]["seq"])
    eventually(lambda: (q := rig.api.pod("ml", "q1")) and q["status"]["phase"] == "Running")
    stop.set()
    sampler.join()
    assert rig.api.pod("ml", "q1")["spec"]["nodeName"] in dropped_nodes
    assert not [s for s in seen if s[0] and s[1]], "q1 ungated while a dropped pod was still there"
    assert any(not ungated and dropped for ungated, dropped in seen)  # it did wait
    assert c.stats.counts["admit-held"] == 1 and rig.api.overcommits == []


@pytest.fixture
def elastic_rig(tmp_path, scaling_csv):
    hints = HintSet.from_frame(pd.read_csv(StringIO(HINTS), dtype=str))
    settings = ServiceSettings(tick_seconds=0, token=TOKEN, scaling_models=scaling_csv)
    r = Rig(tmp_path, Allocator(NODES, "hint", hints), settings=settings)
    yield r
    r.close()


def test_an_elastic_gang_declared_on_its_pods_starts_at_the_count_the_round_chose(elastic_rig):
    """`hetplan.io/elastic-gpus` on the pod template: the controller submits the gang with its bounds, the service's
    elastic round (`--scaling-models`) starts it at a count of its own choosing, and the controller re-counts the
    Job (nothing runs yet: no checkpoint) and admits every pod that follows on its part."""
    rig = elastic_rig
    c = leading(rig)
    body = indexed_job("train", 2)
    body["spec"]["template"]["metadata"]["annotations"][pods.ELASTIC_KEY] = "2-8"
    made = rig.api.create_job("ml", body)
    job = f"ml/Job/{made['metadata']['uid']}"
    eventually(lambda: job in {w["job_id"] for w in rig.http.get("/v1/queue").json()["jobs"]})  # starts at a round
    assert rig.http.post("/v1/actions/tick", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    count = len(rig.allocator.running([job])[job])
    assert count > 2  # an idle cluster: it grew at its first start
    eventually(lambda: rig.api.jobs[("ml", "train")]["spec"]["parallelism"] == count)
    eventually(lambda: len(live(rig)) == count and all(running(p) for p in live(rig)))
    check_parts(rig, job, count, hinted=count in (2, 4))  # the hints have rows for 2 and 4 GPUs only
    assert rig.api.overcommits == []
    assert (c.stats.counts["rescales"], c.stats.counts["rescaled"], c.stats.counts["gang-mismatch"]) == (1, 1, 0)


@pytest.mark.parametrize("annotations, error", [
    ({pods.ELASTIC_KEY: "8"}, "MIN-MAX"),
    ({pods.ELASTIC_KEY: "2-x"}, "MIN-MAX"),
    ({pods.ELASTIC_KEY: "２-4"}, "MIN-MAX"),  # full-width digit
    ({pods.ELASTIC_KEY: "2-4", pods.RESTART_KEY: "nan"}, "seconds"),
    ({pods.ELASTIC_KEY: "2-4", pods.RESTART_KEY: "-1"}, "seconds"),
])
def test_an_elastic_annotation_hetplan_cannot_read_is_named(annotations, error):
    with pytest.raises(ValueError, match=error):
        pods.elastic_bounds({"metadata": {"annotations": annotations}})
    assert pods.elastic_bounds({"metadata": {"annotations": {pods.ELASTIC_KEY: "2-8", pods.RESTART_KEY: "45"}}}) == \
        {"min_gpus": 2, "max_gpus": 8, "restart_s": 45.0}


@pytest.mark.parametrize("present, expected", [
    (["0", "1", "2", "3"], {"2", "3"}),
    (["1", "2", "3"], {"2", "3"}),  # part 0's pod being created again: the dropped ones do not shift
    (["0", "1"], set()),
])
def test_the_parts_a_shrink_dropped_are_its_indexes_from_the_new_count(present, expected):
    """`Controller._dropped_on` for a gang shrunk 4 -> 2: the pods of parts 2 and 3 hold their GPUs until they are
    gone, whichever kept part's pod exists at the moment."""
    from hetplan.allocator.k8s.controller import Controller

    c = Controller.__new__(Controller)  # only the state `_dropped_on` reads
    c._lock, c._shrunk, c._gang_counts = threading.RLock(), {"g"}, {"g": 2}
    c.pods = {part: {"metadata": {"name": f"p{part}", "namespace": "ml", "uid": part,
                                  "annotations": {pods.JOB_ID_KEY: "g", pods.GANG_PART_KEY: part}},
                     "spec": {"nodeName": "gpu-a"}, "status": {"phase": "Running"}} for part in present}
    assert {name[1:] for _, name in c._dropped_on({"gpu-a"})} == expected
