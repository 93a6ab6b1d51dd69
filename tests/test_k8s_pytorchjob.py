"""Issue 31 item 5, elastic counts of a Kubeflow **PyTorchJob** (training operator v1, `elasticPolicy`), against the
STRICT STAND-IN API server (`standin_apiserver.py`; not a real kube-apiserver, and its training operator is a
labelled simplification) and the real allocator service in process: a gang of 2 workers x 1 GPU scaled to 4 and
back to 2 (checkpoint handshake first, then a merge patch of `Worker.replicas`); a count outside the
`elasticPolicy` is refused before any pod is asked, and the allocator holds the gang at its pods' count again; an
elastic gang's bounds are narrowed to the policy when it is submitted. Also `owners`' rules, table-driven, and the
stand-in's PyTorchJob validation."""

from __future__ import annotations

import copy
import time

import pytest
from standin_apiserver import ApiError, Fault, eventually, k8s_pod
from servers import TOKEN
from standin_rules import validate_pytorchjob
from test_k8s_controller import requests_of
from test_k8s_elastic import HINTED, elastic_rig, rig, running  # noqa: F401 - fixtures
from test_k8s_strict import leading
from test_service_elastic import scaling_csv  # noqa: F401 - a fixture

from hetplan.allocator.core import part_number
from hetplan.allocator.k8s import owners, pods

PATH = "/apis/kubeflow.org/v1/namespaces/ml/pytorchjobs/train"


def pytorchjob(workers: int, low: int = 1, high: int = 4, elastic: str | None = None) -> dict:
    """An elastic PyTorchJob: `workers` pods of 1 GPU that run together (a gang), `elasticPolicy` low..high."""
    notes = {pods.GANG_SIZE_KEY: str(workers), pods.GRACE_KEY: "10", **({pods.ELASTIC_KEY: elastic} if elastic else {})}
    template = k8s_pod("t", gpus=1, cpu="2", memory="8Gi", annotations=notes)
    template["spec"]["containers"][0]["name"] = "pytorch"
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "train"},
            "spec": {"elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": low, "maxReplicas": high},
                     "pytorchReplicaSpecs": {"Worker": {"replicas": workers, "restartPolicy": "OnFailure",
                                                        "template": {"metadata": template["metadata"],
                                                                     "spec": template["spec"]}}}}}


def create(rig, body: dict) -> str:
    """The PyTorchJob created (as `kubectl apply` would); its gang's job id."""
    code, made = rig.api.pytorchjob_call("POST", "ml", None, body)
    assert code == 201
    return f"ml/PyTorchJob/{made['metadata']['uid']}"


def live(rig) -> list[dict]:
    return [p for p in rig.api.pytorchjob_pods("ml", "train") if p["status"]["phase"] in ("Pending", "Running")]


def index(pod: dict) -> int:
    return int(pod["metadata"]["labels"][pods.KUBEFLOW_INDEX])


def check_parts(rig, job: str, count: int, hinted: bool = True) -> None:
    """Worker k runs on part k's node with its cores and RAM (`hinted`: the type's hinted share)."""
    parts = sorted(rig.allocator.running([job])[job], key=part_number)
    now = live(rig)
    assert len(parts) == len(now) == count
    for pod, part in zip(now, parts):
        assert index(pod) == part_number(part)
        assert (pod["spec"]["nodeName"], requests_of(pod)) == (part.node, (part.cpu_m, part.mem_mib))
        assert not hinted or (part.cpu_m, part.mem_mib, part.share) == (*HINTED, "hinted"), part


def answer(rig, count: int, seq: int) -> None:
    """The `count` running workers were asked to checkpoint for action `seq`; the trainers answer."""
    eventually(lambda: sum(pods.annotations(p).get(pods.CHECKPOINT_KEY) == str(seq) for p in live(rig)) == count)
    for pod in live(rig):
        rig.api.pod_call("PATCH", "ml", pod["metadata"]["name"], None,
                         {"metadata": {"annotations": {pods.CHECKPOINTED_KEY: str(seq)}}},
                         "application/merge-patch+json")


def patches(rig) -> list[dict]:
    return [body for method, path, body in rig.api.calls if method == "PATCH" and path == PATH]


def test_an_elastic_pytorchjob_scales_2_4_2_checkpointing_first_and_never_overcommitting(rig):
    c = leading(rig)
    job = create(rig, pytorchjob(2))
    eventually(lambda: len(live(rig)) == 2 and all(running(p) for p in live(rig)))
    check_parts(rig, job, 2)
    first = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in live(rig)}

    for count, was in ((4, 2), (2, 4)):
        r = rig.http.post("/v1/scale", json={"job_id": job, "parts": count})
        assert r.json()["status"] == "scaled", r.json()
        seq = r.json()["actions"][0]["seq"]
        eventually(lambda: sum(pods.annotations(p).get(pods.CHECKPOINT_KEY) == str(seq) for p in live(rig)) == was)
        assert rig.api.pytorchjobs[("ml", "train")]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == was
        answer(rig, was, seq)
        eventually(lambda: len(live(rig)) == count and all(running(p) for p in live(rig))
                   and len(rig.api.pytorchjob_pods("ml", "train")) == count)
        check_parts(rig, job, count)
    assert {p["metadata"]["name"]: p["spec"]["nodeName"] for p in live(rig)} == first  # workers 0 and 1 ran on
    uid = job.rsplit("/", 1)[1]  # the patch names the object it was read as: a precondition
    assert patches(rig) == [{"metadata": {"uid": uid}, "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": n}}}}
                            for n in (4, 2)]
    assert rig.api.overcommits == []
    counts = c.stats.counts
    assert (counts["rescales"], counts["rescaled"], counts["rescale-refused"], counts["gang-refused"]) == (2, 2, 0, 0)


def test_a_count_outside_the_elastic_policy_is_refused_before_any_pod_is_asked_and_reverted(rig):
    c = leading(rig)
    job = create(rig, pytorchjob(2, high=3))
    eventually(lambda: len(live(rig)) == 2 and all(running(p) for p in live(rig)))
    r = rig.http.post("/v1/scale", json={"job_id": job, "parts": 4})  # 4 workers: maxReplicas is 3
    assert r.json()["status"] == "scaled", r.json()
    eventually(lambda: c.stats.counts["rescale-refused"] == 1 and c.stats.counts["rescale-reverted"] == 1)
    eventually(lambda: len(rig.allocator.running([job])[job]) == 2)  # the allocator holds 2 parts again
    eventually(lambda: c.cursor == rig.allocator.log.latest)  # the revert's own action applied: nothing to do
    assert patches(rig) == []
    assert all(pods.CHECKPOINT_KEY not in pods.annotations(p) for p in live(rig))  # no trainer was interrupted
    check_parts(rig, job, 2)
    assert (c.stats.counts["rescales"], c.stats.counts["rescaled"]) == (2, 0)  # the revert found the count set
    assert rig.api.overcommits == []


def test_an_elastic_pytorchjobs_bounds_are_narrowed_to_its_policy_when_submitted(elastic_rig):
    """`hetplan.io/elastic-gpus: 2-8` on an idle cluster of 8 GPUs, but `maxReplicas: 4`: the elastic round starts
    it at 4 (unnarrowed, at 8), and the operator's workers follow."""
    rig = elastic_rig
    c = leading(rig)
    job = create(rig, pytorchjob(2, high=4, elastic="2-8"))
    eventually(lambda: job in {w["job_id"] for w in rig.http.get("/v1/queue").json()["jobs"]})
    assert rig.http.post("/v1/actions/tick", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert len(rig.allocator.running([job])[job]) == 4
    eventually(lambda: len(live(rig)) == 4 and all(running(p) for p in live(rig)))
    check_parts(rig, job, 4)
    assert (c.stats.counts["rescaled"], c.stats.counts["rescale-refused"]) == (1, 0)
    assert rig.api.overcommits == []


def owned(kind: str, name: str = "train", uid: str = "u1", labels: dict | None = None) -> dict:
    return {"metadata": {"namespace": "ml", "name": f"{name}-x", "labels": labels or {},
                         "ownerReferences": [{"kind": kind, "name": name, "uid": uid, "controller": True}]}}


@pytest.mark.parametrize("members, expected", [
    ([owned("Job"), owned("Job")], owners.Owner("Job", "ml", "train", "u1")),
    ([owned("PyTorchJob")], owners.Owner("PyTorchJob", "ml", "train", "u1")),
    ([owned("Job", labels={pods.JOBSET_LABEL: "js"})], "JobSet"),  # its child Job: the JobSet would undo a patch
    ([owned("Job"), owned("Job", name="other", uid="u2")], "2 objects"),
    ([{"metadata": {"namespace": "ml", "name": "bare"}}], "0 objects"),
    ([owned("TFJob")], "TFJob"),
])
def test_the_owner_of_a_gang_is_one_job_or_pytorchjob(members, expected):
    if isinstance(expected, owners.Owner):
        assert owners.owner_of(members) == expected
    else:
        with pytest.raises(owners.Unsupported, match=expected):
            owners.owner_of(members)


JOB, TORCH = owners.Owner("Job", "ml", "t"), owners.Owner("PyTorchJob", "ml", "t")


def torch_spec(workers: int = 2, master: bool = False, policy: dict | None = None) -> dict:
    replicas = {"Worker": {"replicas": workers}, **({"Master": {"replicas": 1}} if master else {})}
    return {"spec": {"pytorchReplicaSpecs": replicas, **({"elasticPolicy": policy} if policy is not None else {})}}


@pytest.mark.parametrize("owner, obj, parts, expected", [
    (JOB, {"spec": {"parallelism": 2}}, 4, {"spec": {"parallelism": 4, "completions": 4}}),
    (TORCH, torch_spec(policy={"minReplicas": 1, "maxReplicas": 4}), 4,
     {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 4}}}}),
    (TORCH, torch_spec(master=True, policy={"minReplicas": 1, "maxReplicas": 4}), 4,  # master + 3 workers
     {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}}),
    (TORCH, torch_spec(policy={"maxReplicas": 4}), 4,  # one bound alone stands for both (the operator's default)
     {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 4}}}}),
    (TORCH, torch_spec(policy={"maxReplicas": 4}), 3, r"3 is outside .*\(4\.\.4\)"),
    (TORCH, torch_spec(policy={"minReplicas": 3}), 4, r"4 is outside .*\(3\.\.3\)"),
    (TORCH, torch_spec(policy={"rdzvBackend": "c10d"}), 4, r"4 is outside .*\(2\.\.2\)"),  # neither: its replicas
    (TORCH, torch_spec(policy={"minReplicas": 1, "maxReplicas": 4, "metrics": [{"type": "Resource"}]}), 4,
     "HorizontalPodAutoscaler"),  # the operator's autoscaler sets the count
    (TORCH, torch_spec(policy={"minReplicas": 1, "maxReplicas": 3}), 4, "Worker.replicas: 4 is outside"),
    (TORCH, torch_spec(policy={"minReplicas": 2, "maxReplicas": 4}), 1, "Worker.replicas: 1 is outside"),
    (TORCH, torch_spec(master=True, policy={"maxReplicas": 4}), 1, "Worker.replicas: 0 is outside"),
    (TORCH, torch_spec(), 4, "spec.elasticPolicy"),  # a fixed --nnodes: not elastic
    (TORCH, {"spec": {"elasticPolicy": {"maxReplicas": 4}, "pytorchReplicaSpecs": {"Worker": {},
                                                                                  "Master": {"replicas": "1"}}}}, 4,
     "Master.replicas: '1' is no whole number"),
])
def test_the_count_patch_of_each_owner(owner, obj, parts, expected):
    if isinstance(expected, dict):
        assert owners.count_patch(owner, obj, parts) == expected
        assert owners.parts_of(owner, {**obj, "spec": {**obj["spec"], **expected["spec"]}} if owner.kind == "Job"
                               else _patched(obj, expected)) == parts
    else:
        with pytest.raises(ValueError, match=expected):
            owners.count_patch(owner, obj, parts)


def _patched(obj: dict, patch: dict) -> dict:
    out = copy.deepcopy(obj)
    out["spec"]["pytorchReplicaSpecs"]["Worker"].update(patch["spec"]["pytorchReplicaSpecs"]["Worker"])
    return out


@pytest.mark.parametrize("owner, obj, gpus, bounds, expected", [
    (JOB, {}, 1, {"min_gpus": 2, "max_gpus": 8}, {"min_gpus": 2, "max_gpus": 8}),  # a Job: its annotation alone
    (TORCH, torch_spec(policy={"minReplicas": 1, "maxReplicas": 3}), 1, {"min_gpus": 2, "max_gpus": 8},
     {"min_gpus": 2, "max_gpus": 3}),
    (TORCH, torch_spec(policy={"minReplicas": 2, "maxReplicas": 6}), 2, {"min_gpus": 2, "max_gpus": 8,
                                                                         "restart_s": 40.0},
     {"min_gpus": 4, "max_gpus": 8, "restart_s": 40.0}),  # 2..6 workers of 2 GPUs
    (TORCH, torch_spec(master=True, policy={"minReplicas": 1, "maxReplicas": 2}), 1, {"min_gpus": 1, "max_gpus": 8},
     {"min_gpus": 2, "max_gpus": 3}),  # the master is a part too
    (TORCH, torch_spec(policy={"minReplicas": 1, "maxReplicas": 2}), 1, {}, {}),  # not declared elastic: fixed
    (TORCH, torch_spec(policy={"minReplicas": 5, "maxReplicas": 6}), 1, {"min_gpus": 2, "max_gpus": 4},
     "leave no count"),
])
def test_an_elastic_gangs_bounds_within_its_owner(owner, obj, gpus, bounds, expected):
    if isinstance(expected, dict):
        assert owners.narrowed(owner, obj, bounds, gpus) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            owners.narrowed(owner, obj, bounds, gpus)


@pytest.mark.parametrize("change, field", [
    (lambda j: None, None),
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas=0), "Worker].replicas: Forbidden"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas="4"), "must be an integer"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"].update(Master={"replicas": 2, **copy.deepcopy(
        j["spec"]["pytorchReplicaSpecs"]["Worker"])}), "Master].replicas: Forbidden: must be 1"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"].update(Chief=j["spec"]["pytorchReplicaSpecs"]["Worker"]),
     "Unsupported value: 'Chief'"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"].update(Master={**j["spec"]["pytorchReplicaSpecs"].pop("Worker"),
                                                               "replicas": 1}),
     "must be configured if elastic policy is used"),
    (lambda j: j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].update(name="main"),
     'a container named "pytorch"'),
    (lambda j: j["metadata"].update(name="Train"), "DNS-1035"),
])
def test_the_standin_refuses_pytorchjobs_the_training_operator_refuses(change, field):
    job = pytorchjob(2)
    change(job)
    if field is None:
        validate_pytorchjob(job)
        return
    with pytest.raises(ApiError) as refused:
        validate_pytorchjob(job)
    assert refused.value.body["code"] == 422 and field in refused.value.body["message"]


def test_an_ambiguous_patch_is_sent_again_and_counts_once(rig):
    """The PyTorchJob's patch is committed but its answer lost (a 500 after etcd wrote it): the controller sends the
    same merge patch again (it sets a count, so twice is once), and the gang grows once."""
    c = leading(rig)
    job = create(rig, pytorchjob(2))
    eventually(lambda: len(live(rig)) == 2 and all(running(p) for p in live(rig)))
    rig.api.faults.append(Fault("PATCH", PATH + "$", 500, commit=True))
    r = rig.http.post("/v1/scale", json={"job_id": job, "parts": 4})
    answer(rig, 2, r.json()["actions"][0]["seq"])
    eventually(lambda: len(live(rig)) == 4 and all(running(p) for p in live(rig)))
    check_parts(rig, job, 4)
    assert rig.api.faulted[500] == 1 and len(patches(rig)) == 2 and c.stats.counts["rescaled"] == 1
    assert rig.api.overcommits == []


def test_a_pytorchjob_that_cannot_be_read_holds_back_its_own_gang_only(elastic_rig):
    """Reading the PyTorchJob fails (500s) when its elastic gang is submitted: that gang is refused and asked for
    again, while a pod created meanwhile is queued as usual; once the reads succeed the gang is queued too, and the
    round starts both, the gang within its policy."""
    rig = elastic_rig
    c = leading(rig, adopt_every=0.2)
    rig.api.faults.append(Fault("GET", PATH + "$", 500, times=3))
    job = create(rig, pytorchjob(2, high=4, elastic="2-8"))
    rig.api.create_pod("ml", k8s_pod("solo", gpus=1, cpu="1", memory="4Gi"))
    eventually(lambda: rig.api.faulted[500] == 3 and c.stats.counts["gang-refused"] == 3)
    eventually(lambda: {job, "ml/solo"} <= {w["job_id"] for w in rig.http.get("/v1/queue").json()["jobs"]})
    assert rig.http.post("/v1/actions/tick", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert 2 <= len(rig.allocator.running([job])[job]) <= 4
    eventually(lambda: rig.api.pod("ml", "solo")["status"]["phase"] == "Running")


def test_a_refused_shrink_keeps_its_pods_and_nothing_is_admitted_where_they_run(rig):
    """4 workers shrunk to 2 below `minReplicas: 3`: refused before any pod is asked; not taken back in the allocator
    (growing back could place the parts elsewhere than the pods that still run), so the queued pod the allocator
    started in the freed room stays gated while the dropped workers run, and is admitted once they end."""
    c = leading(rig)
    job = create(rig, pytorchjob(4, low=3))
    eventually(lambda: len(live(rig)) == 4 and all(running(p) for p in live(rig)))
    for i in range(4):  # every other GPU held: the queued pod waits for the room the shrink frees
        rig.api.create_pod("ml", k8s_pod(f"fill{i}", gpus=1, cpu="1", memory="4Gi"))
    rig.api.create_pod("ml", k8s_pod("q1", gpus=1, cpu="1", memory="4Gi"))
    assert pods.has_gate(rig.api.pod("ml", "q1"), pods.QUEUE_GATE)
    r = rig.http.post("/v1/scale", json={"job_id": job, "parts": 2})
    assert [a["kind"] for a in r.json()["actions"]][:2] == ["resize", "start"]  # q1 started in the freed room
    eventually(lambda: c.stats.counts["rescale-refused"] == 1 and c.stats.counts["rescale-unreverted"] == 1)
    eventually(lambda: c.stats.counts["admit-held"] >= 1)
    time.sleep(0.5)  # several passes: q1 stays gated, all 4 workers run, nobody was asked to checkpoint
    assert pods.has_gate(rig.api.pod("ml", "q1"), pods.QUEUE_GATE)
    assert len(live(rig)) == 4 and all(running(p) for p in live(rig)) and patches(rig) == []
    assert all(pods.CHECKPOINT_KEY not in pods.annotations(p) for p in live(rig))
    for name in ("train-worker-2", "train-worker-3"):  # the dropped workers end (the job's own doing)
        rig.api.finish("ml", name)
    eventually(lambda: (q := rig.api.pod("ml", "q1")) and q["status"]["phase"] == "Running")
    assert rig.api.overcommits == []


def test_a_jobsets_gang_declared_elastic_runs_at_its_fixed_count(elastic_rig):
    """A JobSet's pods (their owner a child Job the JobSet re-creates from its own template) declaring
    `hetplan.io/elastic-gpus`: submitted at their fixed count, said once, never re-counted."""
    rig = elastic_rig
    c = leading(rig)
    notes = {pods.GANG_SIZE_KEY: "2", pods.ELASTIC_KEY: "2-8", pods.COMPLETION_INDEX: ""}
    for i in range(2):
        pod = k8s_pod(f"js-0-{i}", gpus=1, cpu="2", memory="8Gi",
                      annotations={**notes, pods.COMPLETION_INDEX: str(i)})
        pod["metadata"]["labels"].update({pods.JOBSET_LABEL: "js", pods.JOBSET_INDEX: "0"})
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "js-0", "uid": "u-js-0",
                                               "controller": True}]
        rig.api.create_pod("ml", pod)
    eventually(lambda: "ml/JobSet/js" in {w["job_id"] for w in rig.http.get("/v1/queue").json()["jobs"]})
    assert rig.http.post("/v1/actions/tick", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert len(rig.allocator.running(["ml/JobSet/js"])["ml/JobSet/js"]) == 2  # an idle cluster, yet not grown
    eventually(lambda: all(running(rig.api.pod("ml", f"js-0-{i}")) for i in range(2)))
    assert (c.stats.counts["elastic-unsupported"], c.stats.counts["rescales"]) == (1, 0)


@pytest.mark.parametrize("parts, count, dropped", [
    (["0", "1", "2", "3"], 2, {"2", "3"}),
    (["1", "2", "3"], 2, {"2", "3"}),  # index 0's pod made again: the dropped ones do not shift
    (["worker-0", "worker-1", "worker-2", "worker-3"], 2, {"worker-2", "worker-3"}),
    (["worker-1", "worker-2", "worker-3"], 2, {"worker-2", "worker-3"}),  # worker 0's pod made again
    (["master-0", "worker-0", "worker-1", "worker-2"], 2, {"worker-1", "worker-2"}),  # the master is a part
    (["a", "b", "c"], 2, {"c"}),  # other names: by their place in order
])
def test_the_parts_a_shrink_dropped(parts, count, dropped):
    assert pods.dropped_parts(parts, count) == dropped
