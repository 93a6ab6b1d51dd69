"""Gangs of fixed parts (a multi-pod job: `Job.part_gpus`, `parts` in `POST /v1/allocate`): every part whole on one
node, all started or none, kept as parts through ticks and restarts; bad requests refused naming the field."""

from __future__ import annotations

import json

import httpx
import pytest

from hetplan.allocator.core import Allocator
from hetplan.allocator.durable import DurableAllocator
from hetplan.allocator.spec import GANG_SEP, Allocation, Job, Node
from hetplan.hints import HintStore
from hetplan.scheduler.online import OnlineScheduler
from allocator_helpers import hint_set, hints_frame, make_plan, v100
from servers import TOKEN, Server

MODEL = "resnet50"  # a class the helpers' hint table knows


def two_nodes() -> list[Node]:
    return [v100("a", gpus=4, cpus=32, mem_gb=244), v100("b", gpus=4, cpus=32, mem_gb=244)]


def parts_of(alloc: Allocator, job_id: str) -> tuple[Allocation, ...]:
    return alloc.running([job_id]).get(job_id, ())


def check_gang(parts: tuple[Allocation, ...], job_id: str, count: int, size: int) -> None:
    """The invariant: exactly `count` parts `<job>#0..count-1`, each of `size` GPUs on one node, the size kept."""
    assert sorted(a.job_id for a in parts) == [f"{job_id}{GANG_SEP}{k}" for k in range(count)]
    assert all(a.gpus == size and a.part_gpus == size for a in parts), parts


# ---------------------------------------------------------------------- the request

@pytest.mark.parametrize("kwargs, field", [
    ({"num_gpus": 8, "part_gpus": 3}, "part_gpus"),  # does not divide
    ({"num_gpus": 4, "part_gpus": 4}, "part_gpus"),  # one part: not a gang
    ({"num_gpus": 4, "part_gpus": 0}, "part_gpus"),
    ({"num_gpus": 4, "part_gpus": True}, "part_gpus"),
    ({"num_gpus": 4, "part_gpus": 2.0}, "part_gpus"),
])
def test_a_bad_part_size_is_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Job("j", MODEL, **kwargs)


@pytest.mark.parametrize("num_gpus, parts, field", [
    (0.5, 2, "num_gpus"),  # a share cannot be a part
    (0, 2, "num_gpus"),
    (4, 1, "parts"),
    (4, 2.5, "parts"),
    (600, 2, "num_gpus"),  # 1,200 GPUs in all
])
def test_a_bad_request_of_parts_is_refused_naming_the_field(num_gpus, parts, field):
    with pytest.raises(ValueError, match=field):
        Job.request("j", MODEL, num_gpus, parts=parts)


def test_a_request_of_parts_is_each_pods_request_times_parts():
    job = Job.request("j", MODEL, 4, cpus=2.5, mem_gb=10, parts=3)
    assert (job.num_gpus, job.part_gpus, job.parts, job.cpu_m, job.mem_mib) == (12, 4, 3, 7500, 30 * 1024)


# ---------------------------------------------------------------------- the allocator

@pytest.mark.parametrize("policy", ["hint", "hint-static"])
def test_parts_that_fit_one_node_still_start_as_parts_all_or_nothing(policy):
    alloc = Allocator([v100("a", gpus=8)], policy, hint_set())
    held = alloc.allocate(Job("x", MODEL, 2))
    assert isinstance(held, Allocation)
    # 2 x 4 on an 8-GPU node with 6 free: neither part starts
    assert not isinstance(alloc.allocate(Job("g", MODEL, 8, part_gpus=4)), Allocation)
    assert parts_of(alloc, "g") == ()
    # 2 x 3 fits: two parts on the one node, never one allocation of 6
    assert isinstance(alloc.allocate(Job("h", MODEL, 6, part_gpus=3)), Allocation)
    check_gang(parts_of(alloc, "h"), "h", 2, 3)
    assert alloc.cluster.check() == []


def test_ticks_and_a_restart_keep_the_parts(tmp_path):
    db = tmp_path / "a.db"
    alloc = DurableAllocator(db, "hint", hint_set())
    for node in two_nodes():
        alloc.upsert_node(node)
    assert isinstance(alloc.allocate(Job("g", MODEL, 4, part_gpus=2)), Allocation)
    check_gang(parts_of(alloc, "g"), "g", 2, 2)
    alloc.tick()
    check_gang(parts_of(alloc, "g"), "g", 2, 2)
    assert [j.part_gpus for j in alloc.running_jobs()] == [2]
    alloc.close()
    again = DurableAllocator(db, "hint", hint_set())
    try:
        check_gang(parts_of(again, "g"), "g", 2, 2)
        again.tick()
        check_gang(parts_of(again, "g"), "g", 2, 2)
        # a retry of the same request is its state; another part size is a conflict
        assert isinstance(again.allocate(Job("g", MODEL, 4, part_gpus=2)), Allocation)
        assert "parts of" in again.allocate(Job("g", MODEL, 4)).message
    finally:
        again.close()


def test_the_queue_never_starts_half_a_gang_and_starts_it_whole_when_room_frees():
    alloc = Allocator(two_nodes(), "hint", hint_set())
    sched = OnlineScheduler(alloc, "fifo")
    assert sched.submit(Job("x", MODEL, 4)).status == "allocated"  # one node busy: room for one part of 4
    first = sched.submit(Job("g1", MODEL, 8, part_gpus=4))
    second = sched.submit(Job("g2", MODEL, 8, part_gpus=4))
    assert (first.status, first.why, second.status) == ("queued", "gang-waiting", "queued")
    assert parts_of(alloc, "g1") == parts_of(alloc, "g2") == ()
    sched.release("x")
    check_gang(parts_of(alloc, "g1"), "g1", 2, 4)
    assert {a.node for a in parts_of(alloc, "g1")} == {"a", "b"}
    assert parts_of(alloc, "g2") == ()  # the second gang takes no half of what is left (nothing)
    sched.release("g1")
    check_gang(parts_of(alloc, "g2"), "g2", 2, 4)


def test_parts_larger_than_any_node_or_asking_more_cores_than_a_node_has_are_refused():
    alloc = Allocator(two_nodes(), "hint", hint_set())
    sched = OnlineScheduler(alloc, "fifo")
    assert sched.submit(Job("big", MODEL, 16, part_gpus=8)).status == "rejected"
    fat = sched.submit(Job.request("fat", MODEL, 2, cpus=40, parts=2))
    assert (fat.status, fat.rejection.reason.value) == ("rejected", "too-big"), fat
    assert "each part" in fat.rejection.message


# ---------------------------------------------------------------------- the HTTP service

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    store = root / "store"
    HintStore(store).publish(make_plan("p1"), hints_frame("p1"))
    nodes = root / "nodes.json"
    nodes.write_text(json.dumps([n.to_dict() for n in two_nodes()]))
    srv = Server(root, store, nodes, extra=("--order", "fifo")).start()
    yield srv
    srv.stop()


def test_the_service_takes_parts_and_answers_every_part(server):
    admin = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=server.url, timeout=10, headers=admin) as c:
        for body, field in [({"parts": 1}, "parts"), ({"parts": 2.5}, "parts"), ({"parts": "2"}, "parts")]:
            r = c.post("/v1/allocate", json={"job_id": "bad", "model": MODEL, "num_gpus": 4, **body})
            assert r.status_code == 422 and field in r.text, r.text
        # schema-valid, yet never runnable (the schema cannot relate two fields): rejected, naming the field
        for body in [{"parts": 2, "num_gpus": 0.5}, {"parts": 2, "num_gpus": 0}, {"parts": 1024, "num_gpus": 2}]:
            r = c.post("/v1/allocate", json={"job_id": "bad", "model": MODEL, **body})
            assert (r.status_code, r.json()["status"], r.json()["reason"]) == (200, "rejected", "too-big"), r.text
            assert "num_gpus" in r.json()["message"]
        assert c.get("/v1/allocations").json() == [] and c.get("/v1/queue").json()["jobs"] == []  # nothing changed
        r = c.post("/v1/allocate", json={"job_id": "x", "model": MODEL, "num_gpus": 4})
        assert r.json()["status"] == "allocated"
        r = c.post("/v1/allocate", json={"job_id": "g", "model": MODEL, "num_gpus": 4, "cpus": 2, "parts": 2})
        assert (r.json()["status"], r.json()["why"]) == ("queued", "gang-waiting"), r.json()
        assert c.post("/v1/release", json={"job_id": "x"}).status_code == 200
        r = c.post("/v1/allocate", json={"job_id": "g", "model": MODEL, "num_gpus": 4, "cpus": 2, "parts": 2})
        body = r.json()
        assert body["status"] == "allocated" and body["replayed"], body
        assert sorted((p["job_id"], p["gpus"], p["part_of"]) for p in body["parts"]) == [
            ("g#0", 4, "g"), ("g#1", 4, "g")]
        assert all(p["cpus"] >= 2 for p in body["parts"])  # each part at least its pod's own request
