"""The one scheduling loop (`hetplan.scheduler`): orders, the queue, the service's use of it and its restart.

Tiny literal clusters, checkable by hand; the simulator's use of the same loop is tests/test_sim.py's, and the two
drivers are compared decision by decision in tests/test_differential.py.
"""

from __future__ import annotations

import pytest

from hetplan.allocator import Allocator, Node
from hetplan.allocator.core import NodeChanges
from hetplan.allocator.durable import DurableAllocator
from hetplan.allocator.policies import POLICIES, FirstFitPolicy
from hetplan.allocator.spec import Job
from hetplan.hints import HintSet
from hetplan.hints.index import HintEntry, class_key
from hetplan.scheduler import ORDERS, JobState, Queue
from hetplan.scheduler.online import Conflict, OnlineScheduler

NODES = [Node("a", "V100", 4, 32, 256), Node("b", "V100", 4, 32, 256)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _state(idx: int, arrival: float, attained: float = 0.0, gpus: int = 1, remaining: float = 100.0) -> JobState:
    s = JobState(idx, Job(f"j{idx}", "m", gpus), arrival, remaining)
    s.attained = attained
    return s


@pytest.mark.parametrize(("order", "expected"), [
    ("fifo", ["j0", "j1", "j2"]),  # arrival
    ("las", ["j2", "j1", "j0"]),  # least attained GPU-seconds first
    ("srtf", ["j1", "j0", "j2"]),  # least remaining work first
])
def test_each_order_ranks_the_same_three_jobs_its_way(order, expected):
    jobs = {0: _state(0, 0.0, attained=50.0, remaining=30.0), 1: _state(1, 1.0, attained=20.0, remaining=10.0),
            2: _state(2, 2.0, attained=0.0, remaining=90.0)}
    queue = Queue(jobs)
    for j in jobs.values():
        queue.add((*ORDERS[order](j, 0.0), j.idx))
    assert [jobs[e[-1]].job_id for e in queue.entries] == expected
    assert [queue.position(i) for i in range(3)] == [expected.index(f"j{i}") + 1 for i in range(3)]


def test_a_job_that_does_not_fit_waits_in_the_queue_and_starts_when_room_comes_back():
    clock = Clock()
    s = OnlineScheduler(Allocator(NODES, "first-fit", clock=clock), "fifo")
    assert s.submit(Job("big1", "m", 4)).status == "allocated"
    assert s.submit(Job("big2", "m", 4)).status == "allocated"
    waiting = s.submit(Job("next", "m", 2))
    assert (waiting.status, waiting.position, waiting.why) == ("queued", 1, "no-room")
    later = s.submit(Job("later", "m", 1))
    assert (later.status, later.position) == ("queued", 2)
    assert s.submit(Job("next", "m", 2)).replayed  # asked again: the same place, nothing changed
    with pytest.raises(Conflict, match="num_gpus 2, asked 3"):
        s.submit(Job("next", "m", 3))
    assert [w.job_id for w in s.queue()] == ["next", "later"]
    clock.now = 10.0
    parts, dequeued = s.release("big1")
    assert parts and not dequeued
    assert s.queue() == [] and {j for j in s.allocator.running()} == {"big2", "next", "later"}
    assert s.release("nobody") == ((), False)


def test_a_gang_waits_with_its_reason_and_a_job_too_big_for_every_type_is_refused():
    s = OnlineScheduler(Allocator(NODES, "hint"), "las")
    assert s.submit(Job("one", "m", 1)).status == "allocated"
    gang = s.submit(Job("gang", "m", 8))
    assert (gang.status, gang.why) == ("queued", "gang-waiting")
    never = s.submit(Job("never", "m", 9))
    assert never.status == "rejected" and never.rejection.reason.value == "too-big"
    assert s.release("gang") == ((), True)  # its pod went away: it leaves the queue
    assert s.queue() == []


def test_las_rounds_preempt_the_job_that_has_had_most_and_keep_what_it_attained():
    clock = Clock()
    s = OnlineScheduler(Allocator([Node("a", "V100", 2, 16, 128)], "first-fit", clock=clock), "las")
    assert s.submit(Job("old", "m", 2)).status == "allocated"
    clock.now = 100.0
    assert s.submit(Job("new", "m", 2)).status == "queued"
    s.round()
    assert list(s.allocator.running()) == ["new"]
    (old,) = s.queue()
    assert (old.job_id, old.attained_gpu_s) == ("old", pytest.approx(200.0))  # 2 GPUs x 100 s
    logged = s.allocator.log.entries()
    assert [(x.action.kind, x.action.job_id, x.preempted) for x in logged][-2:] == \
        [("stop", "old", True), ("start", "new", False)]


@pytest.mark.parametrize("policy", ["first-fit", "proportional", "hint-static"])
def test_a_reschedule_stops_only_the_jobs_whose_room_a_job_ahead_of_them_takes(policy):
    """A 3-GPU job outranks the running ones: `who_runs` leaves two of them out by counting GPUs, but no node
    could hold it (a gang over 2-GPU nodes, placed after): nobody is stopped, nothing is logged."""
    clock = Clock()
    s = OnlineScheduler(Allocator([Node("a", "V100", 2, 16, 128), Node("b", "V100", 2, 16, 128)], policy,
                                  clock=clock), "las")
    for name in ("r1", "r3", "r2"):
        assert s.submit(Job(name, "m", 1)).status == "allocated"
    where = {job: parts[0].node for job, parts in s.allocator.running().items()}
    logged = len(s.allocator.log.entries())
    clock.now = 100.0
    s.submit(Job("w", "m", 3))
    s.round()
    assert {job: parts[0].node for job, parts in s.allocator.running().items()} == where
    assert len(s.allocator.log.entries()) == logged and [w.job_id for w in s.queue()] == ["w"]
    assert (s.loop.counts["kept"], s.loop.counts["preemptions"]) == (2, 0)


def test_a_restart_resumes_the_same_queue_in_the_same_order_with_the_same_attained_service(tmp_path):
    clock = Clock()
    db = tmp_path / "a.db"
    first = DurableAllocator(db, "first-fit", clock=clock)
    first.change_nodes(NodeChanges(upsert=[Node("a", "V100", 2, 16, 128)]))
    s = OnlineScheduler(first, "las")
    s.submit(Job("a1", "m", 2))
    for k, name in enumerate(["b1", "b2", "b3"], 1):
        clock.now = 10.0 * k
        s.submit(Job(name, "m", 1))
    clock.now = 100.0
    s.round()  # a1 (200 GPU-s) preempted; b1 and b2 run
    clock.now = 150.0
    s.round()  # b3 (0) outranks b1, b2 (50 each): b2 stops (the later of two equals)
    before = [(w.job_id, w.position, round(w.attained_gpu_s, 9)) for w in s.queue()]
    running = sorted(s.allocator.running())
    # no close: what a kill -9 leaves is what the last commit wrote
    clock.now = 160.0
    again = OnlineScheduler(DurableAllocator(db, "first-fit", clock=clock), "las")
    assert [(w.job_id, w.position, round(w.attained_gpu_s, 9)) for w in again.queue()] == before
    assert sorted(again.allocator.running()) == running
    assert before[-1][0] == "a1" and before[-1][2] == 200.0
    s2 = again.submit(Job("a1", "m", 2))
    assert s2.replayed and s2.status == "queued"


def test_changes_made_by_others_are_booked_at_the_next_call():
    """A node removed with its job, and a pod adopted without a submission: the scheduler sees both."""
    s = OnlineScheduler(Allocator(NODES, "first-fit"), "fifo")
    assert s.submit(Job("on-a", "m", 4)).parts[0].node == "a"
    s.allocator.change_nodes(NodeChanges(remove=["a"], force=True))  # its job is evicted with it
    s.allocator.adopt(Job("outside", "m", 1, cpu_m=1000, mem_mib=1024), "b")
    waiting = s.queue()
    assert [w.job_id for w in waiting] == ["on-a"]  # it waits to run again
    assert s.state("outside") is not None and s.state("outside").parts  # adopted: known, running
    assert s.release("outside")[0]
    assert s.submit(Job("on-a", "m", 4)).replayed


def test_a_round_that_raises_changes_nothing_and_the_next_one_runs():
    clock = Clock()
    s = OnlineScheduler(Allocator([Node("a", "V100", 2, 16, 128)], "hint", clock=clock), "las")
    s.submit(Job("old", "m", 2))
    clock.now = 100.0
    s.submit(Job("new", "m", 2))
    real = s.allocator.rebalance

    def broken(*args, **kwargs):
        raise RuntimeError("a policy fault")

    s.allocator.rebalance = broken
    with pytest.raises(RuntimeError, match="a policy fault"):
        s.round()
    assert list(s.allocator.running()) == ["old"] and [w.job_id for w in s.queue()] == ["new"]
    assert s.loop.wants_round()  # still something to do: the next tick tries again
    s.allocator.rebalance = real
    s.round()
    assert list(s.allocator.running()) == ["new"] and [w.job_id for w in s.queue()] == ["old"]


# ---------------------------------------------------------------------- one job's fault never fails the others

class Cursed(FirstFitPolicy):
    """first-fit, except that placing a job of model `cursed` raises: a policy's own bug for one class."""

    name = "first-fit-cursed"

    def place(self, job, state, hints):
        if job.model == "cursed":
            raise RuntimeError(f"no rule for model {job.model}")
        return super().place(job, state, hints)


# "broken"'s hinted cores are NaN: its need cannot be worked out (hint-static's `place`, hint's class view raise)
BROKEN = HintSet("h1", {class_key(model, 1): (HintEntry("V100", 1, cores, 4.0, 1.0),)
                        for model, cores in [("ok", 1.0), ("broken", float("nan"))]})


@pytest.mark.parametrize("policy, bad_model", [("hint-static", "broken"), ("hint", "broken"),
                                               ("first-fit-cursed", "cursed")])
def test_a_job_whose_placement_raises_is_skipped_and_logged_once_and_the_others_run(caplog, monkeypatch, policy,
                                                                                    bad_model):
    monkeypatch.setitem(POLICIES, Cursed.name, Cursed)  # registered for this test only (the registry is global)
    clock = Clock()
    s = OnlineScheduler(Allocator([Node("a", "V100", 2, 16, 128)], policy, BROKEN, clock=clock), "las")
    with caplog.at_level("DEBUG"):
        assert s.submit(Job("j0", "ok", 1)).status == "allocated"
        clock.now = 100.0
        bad = s.submit(Job("bad", bad_model, 1))  # ahead of j2 in the order, its placement raises
        assert (bad.status, bad.position) == ("queued", 1)
        assert s.submit(Job("j2", "ok", 1)).status == "allocated"  # it starts though bad is ahead of it
        for now in (300.0, 600.0, 900.0):  # bad outranks both: rounds try it, never stop a job for it
            clock.now = now
            s.round()
        clock.now = 1000.0
        assert s.release("j0")[0]  # the freed GPU: bad is tried again, fails again, waits on
    assert sorted(s.allocator.running()) == ["j2"] and [w.job_id for w in s.queue()] == ["bad"]
    assert [x.action.kind for x in s.allocator.log.entries()] == ["start", "start", "stop"]  # j0, j2; j0 released
    assert not s.allocator.cluster.check()
    warned = [(r.name, r.getMessage()) for r in caplog.records if r.levelname == "WARNING" and "job bad" in r.message]
    assert warned and len({name for name, _ in warned}) == len(warned), warned  # once per layer that saw it
    assert all(f"job {j}" not in r.getMessage() for r in caplog.records for j in ("j0", "j2"))
    assert s.loop.faults.keys() == {"bad"}
    s.release("bad")  # out of the queue: out of the faults
    assert s.loop.faults == {} and s.queue() == []
