"""No submission waits for a round (issue 30): while the allocator's lock is busy, a new job is parked in the
scheduler's inbox (`hetplan.scheduler.inbox`, its own SQLite file) and answered `queued` (why `busy`) at once; the
next call under the lock hands it over, first come first, at the time it came. Parked submissions survive a kill -9
and are handed over once.

The service tests hold the allocator's lock in the test (as a long round holds it) and assert on order: the answer
comes while the lock is held, which cannot happen when the submission waits for the lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from hetplan.allocator import Node
from hetplan.allocator.core import NodeChanges
from hetplan.allocator.durable import DurableAllocator
from hetplan.allocator.service import ServiceSettings, create_app
from hetplan.allocator.spec import Job
from hetplan.scheduler.inbox import Inbox, inbox_path
from hetplan.scheduler.online import Conflict, OnlineScheduler
from servers import TOKEN, on_loopback

ANSWER_S = 5.0
"""How long a parked submission's answer may take: generous, since the tests assert on order, not on time."""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _durable(db, clock: Clock | None = None, gpus: int = 4) -> DurableAllocator:
    alloc = DurableAllocator(db, "first-fit", clock=clock or time.time)
    if not alloc.cluster.nodes():
        alloc.change_nodes(NodeChanges(upsert=[Node("a", "V100", gpus, 32, 256)]))
    return alloc


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[str, DurableAllocator]]:
    alloc = _durable(tmp_path / "a.db")
    app = create_app(ServiceSettings(token=TOKEN, tick_seconds=0, order="fifo"), allocator=alloc)
    try:
        with on_loopback(app) as url:
            yield url, alloc
    finally:
        alloc.close()


def test_a_submission_while_the_lock_is_busy_is_answered_queued_and_handed_over_in_order(served):
    url, alloc = served
    with httpx.Client(base_url=url, timeout=ANSWER_S) as client:
        assert client.get("/v1/queue").status_code == 200  # the scheduler has looked once: it knows the node
        alloc.lock.acquire()  # a long round
        try:
            first = client.post("/v1/allocate", json={"job_id": "j1", "model": "m", "num_gpus": 4})
            second = client.post("/v1/allocate", json={"job_id": "j2", "model": "m", "num_gpus": 1})
            again = client.post("/v1/allocate", json={"job_id": "j1", "model": "m", "num_gpus": 4})
            other = client.post("/v1/allocate", json={"job_id": "j1", "model": "m", "num_gpus": 2})
            too_big = threading.Event()  # more GPUs than any type has: it waits for the lock, then is refused
            pending = threading.Thread(target=lambda: too_big.set() if client.post(
                "/v1/allocate", json={"job_id": "j9", "model": "m", "num_gpus": 8}).json()["status"] == "rejected"
                else None)
            pending.start()
            time.sleep(0.3)
            assert not too_big.is_set()  # still waiting for the lock: only what the inbox can take is parked
        finally:
            alloc.lock.release()
        pending.join(timeout=ANSWER_S)
        assert too_big.is_set()
        for answer in (first, second, again):
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert (body["status"], body["why"], body["position"]) == ("queued", "busy", None), body
            assert "round" in body["message"]
        assert other.status_code == 409 and "num_gpus 4, asked 2" in other.json()["detail"]
        queue = client.get("/v1/queue").json()["jobs"]
        running = {a["job_id"] for a in client.get("/v1/allocations").json()}
    assert running == {"j1"}  # the first come takes the node
    assert [(j["job_id"], j["position"]) for j in queue] == [("j2", 1)]
    assert Inbox(inbox_path(alloc.journal.path)).pending() == []


def test_a_parked_submission_survives_a_kill_and_keeps_the_time_it_came(tmp_path):
    clock = Clock()
    db = tmp_path / "a.db"
    s = OnlineScheduler(_durable(db, clock, gpus=1), "fifo", clock=clock, inbox=Inbox(inbox_path(db)))
    assert s.submit(Job("run", "m", 1)).status == "allocated"
    clock.now = 10.0
    assert s.park(Job("p1", "m", 1)).why == "busy"
    clock.now = 20.0
    assert s.park(Job("p2", "m", 1)).why == "busy"
    # no drain and no close: what a kill -9 leaves; a new service hands both over before anything else
    clock.now = 30.0
    again = OnlineScheduler(_durable(db, clock, gpus=1), "fifo", clock=clock, inbox=Inbox(inbox_path(db)))
    waiting = again.queue()
    assert [(w.job_id, w.position, w.arrival) for w in waiting] == [("p1", 1, 10.0), ("p2", 2, 20.0)]
    assert again.inbox.pending() == []


def test_a_submission_handed_over_twice_is_queued_once(tmp_path):
    """Killed between the journal's commit of the hand-over and the inbox's delete: the next start hands it over
    again, and the job id makes that a replay."""
    clock = Clock()
    db = tmp_path / "a.db"
    s = OnlineScheduler(_durable(db, clock, gpus=1), "fifo", clock=clock, inbox=Inbox(inbox_path(db)))
    s.submit(Job("run", "m", 1))
    clock.now = 5.0
    s.park(Job("p1", "m", 1))
    with s.allocator.lock:
        s._submit(Job("p1", "m", 1), 5.0)  # the journal has it; the inbox still does (the kill came here)
    again = OnlineScheduler(_durable(db, clock, gpus=1), "fifo", clock=clock, inbox=Inbox(inbox_path(db)))
    assert [w.job_id for w in again.queue()] == ["p1"]
    assert again.inbox.pending() == []


def test_a_parked_job_refused_at_hand_over_is_judged_anew_when_asked_again(tmp_path):
    db = tmp_path / "a.db"
    s = OnlineScheduler(_durable(db), "fifo", inbox=Inbox(inbox_path(db)))
    s.queue()
    huge = Job("huge", "m", 1, cpu_m=1_000_000)  # more cores than any node has: never runnable here
    assert s.park(huge).why == "busy"
    assert s.queue() == []  # handed over, refused (kept with why)
    assert s.inbox.get("huge").rejected is not None
    assert s.park(huge) is None  # asked again: not parked on a stale refusal, it waits for the lock ...
    answer = s.submit(huge)  # ... and is judged now
    assert answer.status == "rejected" and "core" in answer.rejection.message.lower()
    fixed = Job("huge", "m", 1, cpu_m=1000)  # the same id, a request that fits: no conflict with the old one
    assert s.park(huge).why == "busy" and s.queue() == []  # refused at hand-over again
    assert s.park(fixed) is None and s.submit(fixed).status == "allocated"  # the stale refusal is gone


@pytest.mark.parametrize("job, why", [
    (Job("share", "m", 0, gpu_milli=500), "a share is placed, never queued"),
    (Job("big", "m", 8), "more GPUs than any type has: refused under the lock"),
    (Job("known", "m", 1), "a known job id: its state needs the books"),
])
def test_what_the_inbox_does_not_take_waits_for_the_lock(tmp_path, job, why):
    db = tmp_path / "a.db"
    s = OnlineScheduler(_durable(db), "fifo", inbox=Inbox(inbox_path(db)))
    s.submit(Job("known", "m", 1))
    assert s.park(job) is None, why
    assert s.inbox.pending() == []


def test_a_parked_job_asked_again_for_another_request_is_a_conflict(tmp_path):
    db = tmp_path / "a.db"
    s = OnlineScheduler(_durable(db), "fifo", inbox=Inbox(inbox_path(db)))
    s.queue()
    s.park(Job("p", "m", 1))
    with pytest.raises(Conflict, match="num_gpus 1, asked 2"):
        s.park(Job("p", "m", 2))


def test_a_parked_submission_is_handed_over_when_the_lock_frees_without_another_call(tmp_path):
    """No tick and no other request: the inbox's own hand-over takes the lock when the round lets it go."""
    db = tmp_path / "a.db"
    s = OnlineScheduler(_durable(db), "fifo", inbox=Inbox(inbox_path(db)))
    with s.allocator.lock:  # a round
        assert s.park(Job("p1", "m", 1)).why == "busy"
        time.sleep(0.2)
        assert "p1" not in s.loop.by_id  # it cannot be handed over while the round holds the lock
    deadline = time.monotonic() + ANSWER_S
    while "p1" not in s.allocator.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "p1" in s.allocator.running() and s.inbox.pending() == []
