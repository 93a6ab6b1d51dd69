"""A step is given only the waiting jobs that could start (`admission.contenders`; the simulator's queue head):
its answer must be the one the whole queue gets, step for step and replay for replay."""

from __future__ import annotations

import random

import pytest

from hetplan.allocator import Allocator
from hetplan.allocator.admission import contenders
from hetplan.allocator.policies import get_policy
from hetplan.allocator.spec import Job, Node
from hetplan.scheduler import Queue
from hetplan.sim.engine import SimConfig, simulate
from test_step_paths import TYPES, _classes, _hints, _jobs, _truth


@pytest.mark.parametrize(("gpus", "room", "kept"), [
    ((1, 1, 1, 1), 3, 3),  # the fourth 1-GPU job of a class could never start with 3 GPUs to give
    ((2, 2, 1, 2), 4, 3),  # two 2-GPU jobs fill 4 GPUs; the 1-GPU job is another class
    ((8, 4, 4), 6, 1),  # no 8-GPU job fits in 6; one 4-GPU job does
    ((1, 2, 1), 0, 0),  # nothing fits in no room
])
def test_of_each_class_the_first_room_over_gpus_contend(gpus, room, kept):
    waiting = [Job(f"j{i}", "m", g) for i, g in enumerate(gpus)]
    out = contenders(waiting, room)
    assert len(out) == kept and out == [job for job in waiting if job in out]  # a subsequence, in order


def test_own_requests_are_classes_of_their_own():
    """A job with its own cores/RAM finds a place under other conditions than its model's others."""
    waiting = [Job("a", "m", 1), Job("b", "m", 1, cpu_m=30_000), Job("c", "m", 1), Job("d", "m", 1, cpu_m=30_000)]
    assert [job.job_id for job in contenders(waiting, 1)] == ["a", "b"]


@pytest.mark.parametrize("seed", range(6))
def test_a_step_on_the_contenders_takes_the_actions_it_takes_on_the_whole_queue(seed):
    classes = _classes(seed, 4)
    nodes = [Node(f"{t}-{i}", t, 4, 8, 64) for t in TYPES for i in range(2)]  # 24 GPUs; 5-core jobs: one a node
    rng = random.Random(seed)
    alloc = Allocator(nodes, get_policy("hint"), _hints(classes, (1, 2, 4)))
    known: dict[str, Job] = {}
    cut = compared = 0
    for step in range(30):
        for k in range(rng.randint(0, 8)):
            job = Job(f"j{step}-{k}", f"m{rng.randrange(4)}", rng.choice([1, 1, 1, 2, 4]),
                      cpu_m=rng.choice([None, None, None, 5_000]))
            known[job.job_id] = job
        for job_id in rng.sample(sorted(known), k=min(len(known), rng.randint(0, 3))):
            alloc.release(job_id)
            del known[job_id]
        order = rng.sample(list(known.values()), k=len(known))
        running = alloc.running()
        waiting = [job for job in order if job.job_id not in running]
        for preempt in (True, False):
            room = alloc.cluster.totals()["gpus"] if preempt else alloc.cluster.free_gpus_total()
            head = {job.job_id for job in contenders(waiting, room)}
            short = [job for job in order if job.job_id in running or job.job_id in head]
            whole = alloc.plan_rebalance(order, preempt=preempt, move=preempt)
            assert alloc.plan_rebalance(short, preempt=preempt, move=preempt) == whole, (step, preempt)
            cut += len(short) < len(order)
            compared += 1
        alloc.rebalance(order, preempt=True)
        assert not alloc.cluster.check()
    assert cut >= compared // 3  # the queue outgrew the contenders often: the comparison had something to cut


@pytest.mark.parametrize("policy", ["hint", "hint-static"])
def test_an_overloaded_replay_is_the_same_with_the_whole_queue_given_to_every_step(monkeypatch, policy):
    """The simulator's queue head (`Queue.head`) against the whole queue, on a cluster the arrivals overload
    (the queue grows far past what 12 GPUs can start): the same job table, timeline and counts."""
    classes = _classes(3, 6)
    nodes = [Node(f"{t.lower()}-{i}", t, 2, 8, 64) for t in TYPES for i in range(2)]
    jobs = _jobs(classes, 400, 4, [1, 1, 1, 2, 4], 60.0, (1.0, 2.5))
    config = SimConfig("las", 360.0, migration_s=30.0, resize_s=5.0)
    cut = []
    head = Queue.head

    def seen(self, room):
        out = head(self, room)
        cut.append(len(out) < len(self))
        return out

    monkeypatch.setattr(Queue, "head", seen)
    tables = {}
    for whole in (False, True):
        monkeypatch.setattr(Queue, "whole", whole)
        result = simulate(jobs, nodes, _truth(classes), policy, _hints(classes, (1, 2, 4)), config)
        tables[whole] = (result.jobs.to_csv(index=False), result.timeline.to_csv(index=False), result.counts)
        if not whole:
            assert sum(cut) > len(cut) // 2  # overloaded: most steps were given a head shorter than the queue
    assert tables[False] == tables[True]
    assert result.timeline["waiting"].max() > 100
