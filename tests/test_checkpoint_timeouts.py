"""Issue 30: a checkpoint that never comes back is said so in the allocator's action log. The service's side
(`POST /v1/notes`: idempotent, journaled, bad input refused with a 422 naming the field and nothing logged) and the
controller's, against the STRICT STAND-IN API server (`standin_apiserver.py`; not a real kube-apiserver) and the real
allocator service in process: a preemption or a move whose pod never answers is evicted after its grace period and
one `checkpoint-timeout` note is logged, however the controller is killed around the eviction and the report."""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient
from standin_apiserver import eventually, k8s_pod
from test_k8s_controller import no_proxy, rig  # noqa: F401 - fixtures
from test_k8s_queue import JOB_UID, owned, stop
from test_k8s_strict import leading, start_move

from hetplan.allocator import Allocator, Job, Node
from hetplan.allocator.durable import DurableAllocator
from hetplan.allocator.history import job_histories
from hetplan.allocator.k8s import pods
from hetplan.allocator.service import ServiceSettings, create_app

NODES = [Node("gpu-a", "T4", 4, 32, 128)]
NOTE = {"kind": "checkpoint-timeout", "job_id": "ml/p1", "of": 1, "pod": "ml/p1", "detail": "move: evicted"}


def notes(actions: list[dict]) -> list[dict]:
    return [a for a in actions if a["kind"] == "checkpoint-timeout"]


@pytest.fixture
def client():
    with TestClient(create_app(ServiceSettings(tick_seconds=0), allocator=Allocator(NODES, "first-fit"))) as c:
        assert c.post("/v1/allocate", json={"job_id": "ml/p1", "model": "res50", "num_gpus": 1}).status_code == 200
        yield c


def test_a_note_is_logged_once_however_often_it_is_sent_and_changes_nothing(client):
    before = client.get("/v1/allocations").json()
    first, again = client.post("/v1/notes", json=NOTE).json(), client.post("/v1/notes", json=NOTE).json()
    assert (first["status"], again["status"]) == ("logged", "exists") and first["action"] == again["action"]
    assert first["action"] | {"at": 0} == {"seq": 2, "at": 0, "kind": "checkpoint-timeout", "job_id": "ml/p1",
                                           "before": [], "after": [], "preempted": False, "of": 1, "pod": "ml/p1",
                                           "detail": "move: evicted"}
    other = client.post("/v1/notes", json={**NOTE, "pod": "ml/p1-m7"}).json()  # another pod: another note
    assert other["status"] == "logged" and other["action"]["seq"] == 3
    log = client.get("/v1/actions").json()
    assert [a["seq"] for a in notes(log["actions"])] == [2, 3] and log["latest"] == 3
    assert client.get("/v1/allocations").json() == before  # nothing changed hands
    # the queue and the job histories read the log on: a note is neither a start nor a stop
    assert client.post("/v1/allocate", json={"job_id": "ml/p2", "model": "res50", "num_gpus": 1}).json()["status"] \
        == "allocated"
    assert [j["job_id"] for j in client.get("/v1/jobs").json()["jobs"]] == ["ml/p1", "ml/p2"]


@pytest.mark.parametrize("change, field", [
    ({"kind": "start"}, "kind"),  # not a note
    ({"of": 0}, "of"),
    ({"of": "1; drop"}, "of"),
    ({"pod": "p1"}, "pod"),  # no namespace
    ({"pod": ""}, "pod"),
    ({"job_id": "ml/p1#0"}, "job_id"),  # a gang's part
    ({"detail": "x" * 501}, "detail"),
    ({"extra": 1}, "extra"),
])
def test_a_bad_note_is_refused_naming_its_field_and_logs_nothing(client, change, field):
    latest = client.get("/v1/actions").json()["latest"]
    r = client.post("/v1/notes", json={**NOTE, **change})
    assert r.status_code == 422 and field in r.text, r.text
    assert client.get("/v1/actions").json()["latest"] == latest


def test_a_note_about_an_action_the_log_has_not_reached_is_a_conflict(client):
    r = client.post("/v1/notes", json={**NOTE, "of": 99})
    assert r.status_code == 409 and r.json()["detail"].startswith("of must be an action number from 1 to 1")
    assert client.get("/v1/actions").json()["latest"] == 1


def test_a_note_survives_a_restart_of_a_durable_allocator(tmp_path):
    from hetplan.allocator.journal import Note

    with DurableAllocator(tmp_path / "a.db", "first-fit") as a:
        a.upsert_node(NODES[0])
        a.allocate(Job.request("ml/p1", "res50", 1))
        x, new = a.note("checkpoint-timeout", "ml/p1", Note(a.log.latest, "ml/p1", "preemption"))
        assert new
    with DurableAllocator(tmp_path / "a.db", "first-fit") as a:
        kept = a.log.entries()[-1]
        assert (kept.seq, kept.action.kind, kept.note) == (x.seq, "checkpoint-timeout", x.note)
        assert a.note("checkpoint-timeout", "ml/p1", x.note) == (kept, False)  # not logged twice after a restart
        assert [j.job_id for j in job_histories(a.log.entries()).jobs] == ["ml/p1"]


# ------------------------------------------------------------------ the controller


def logged_notes(rig) -> list[tuple[str, int, str]]:
    return [(a["job_id"], a["of"], a["pod"]) for a in notes(rig.service.actions(0)["actions"])]


def test_a_preemption_without_a_checkpoint_is_evicted_and_said_so_in_the_log(rig):
    c = leading(rig)
    rig.api.create_pod("ml", owned("train-aaaaa", annotations={pods.GRACE_KEY: "0.3"}))
    job = f"ml/Job/{JOB_UID}"
    eventually(lambda: job in rig.allocator.running())
    seq = rig.allocator.log.latest
    stop(rig, c, job, seq)
    eventually(lambda: logged_notes(rig) == [(job, seq, "ml/train-aaaaa")])
    assert rig.api.evictions[("ml", "train-aaaaa")] == 1 and c.stats.counts["preempted-without-checkpoint"] == 1
    assert c.stats.counts["reported"] == 1 and c.reports.load_reports() == {}


def test_a_move_without_a_checkpoint_is_said_so_and_one_that_answers_is_not(rig):
    c = leading(rig)
    rig.api.create_pod("ml", k8s_pod("p1", annotations={pods.GRACE_KEY: "0.3"}))
    rig.api.create_pod("ml", k8s_pod("p2", annotations={pods.GRACE_KEY: "30"}))
    _, late, new1 = start_move(rig, "ml/p1")
    _, answered, new2 = start_move(rig, "ml/p2")
    eventually(lambda: pods.annotations(rig.api.pod("ml", "p2")).get(pods.CHECKPOINT_KEY) == str(answered))
    rig.api.pod_call("PATCH", "ml", "p2", None, {"metadata": {"annotations": {pods.CHECKPOINTED_KEY: str(answered)}}},
                     "application/merge-patch+json")
    eventually(lambda: all((rig.api.pod("ml", n) or {}).get("status", {}).get("phase") == "Running"
                           for n in (new1, new2)))
    assert logged_notes(rig) == [("ml/p1", late, "ml/p1")] and c.stats.counts["migrated-without-checkpoint"] == 1


@pytest.mark.parametrize("killed", ["after-the-eviction", "after-the-report"])
def test_a_leader_killed_around_the_report_loses_it_never_and_never_logs_it_twice(rig, killed):
    """Killed between the eviction and the report (the note not logged), or between the report and forgetting it
    (logged, still recorded): the next leader reports it, and the log holds it once."""
    c1 = leading(rig)

    def kill(*args, **kw):  # the leader dies here
        threading.Thread(target=c1.stop, daemon=True).start()
        raise RuntimeError("killed")

    if killed == "after-the-eviction":
        c1.service = type("Dead", (), {**{k: getattr(c1.service, k) for k in ("actions", "allocations", "latest",
                                                                                "queued", "release", "allocate",
                                                                                "adopt")}, "note": kill})()
    else:
        c1.reports.drop_report = kill
    rig.api.create_pod("ml", owned("train-aaaaa", annotations={pods.GRACE_KEY: "0.3"}))
    job = f"ml/Job/{JOB_UID}"
    eventually(lambda: job in rig.allocator.running())
    seq = rig.allocator.log.latest
    stop(rig, c1, job, seq)
    eventually(lambda: rig.api.pod("ml", "train-aaaaa") is None and c1._stopping.is_set())
    assert logged_notes(rig) == ([] if killed == "after-the-eviction" else [(job, seq, "ml/train-aaaaa")])
    assert list(c1.reports.load_reports()) == [f"{seq}.ml.train-aaaaa"]  # recorded before the eviction, still there
    c2 = leading(rig, "c2")
    eventually(lambda: c2.reports.load_reports() == {})
    assert logged_notes(rig) == [(job, seq, "ml/train-aaaaa")]
    assert c2.stats.counts["reports-restored"] == 1
    assert c2.stats.counts["reported" if killed == "after-the-eviction" else "reported-already"] == 1


def test_a_timeout_recorded_before_an_eviction_never_sent_is_dropped_not_reported(rig):
    """Killed between recording the timeout and the eviction: the pod still runs, unevicted, so the next leader
    drops the entry (a move or preemption in progress decides again, and records again if it times out again)."""
    c1 = leading(rig)
    rig.api.create_pod("ml", owned("train-aaaaa", annotations={pods.GRACE_KEY: "30"}))
    job = f"ml/Job/{JOB_UID}"
    eventually(lambda: job in rig.allocator.running())
    seq = rig.allocator.log.latest
    c1.stop()
    c1.reports.put_report({"job": job, "seq": seq, "what": "preemption", "ns": "ml", "name": "train-aaaaa",
                           "uid": pods.uid(rig.api.pod("ml", "train-aaaaa")), "grace": 30.0, "parts": 0})
    c2 = leading(rig, "c2")
    eventually(lambda: c2.reports.load_reports() == {})
    assert logged_notes(rig) == [] and c2.stats.counts["reports-restored"] == 0
