"""The journal: an allocator journaled to SQLite, killed and restored at random points, is the in-memory allocator.

A differential test: random sequences of allocate / release / admit / rebalance (gangs, GPU shares, CPU-only jobs,
own requests) / node changes (add, close, reopen, remove, forced) / hint publishes run on an in-memory `Allocator`
and on a `DurableAllocator` that is abandoned without closing (a crash: nothing but what was committed survives)
and reopened from its file at random points. After every step both have the same state, the same bookkeeping and
the same action log, and every invariant holds. Plus the action log's contract: numbered without gaps across
restarts, bounded, and an explicit "too old".
"""

import random
import sqlite3

import pandas as pd
import pytest

from allocator_helpers import allocated
from hetplan.allocator import Allocator, DurableAllocator, Job, Node, NodeChanges, StateError, get_policy
from hetplan.allocator.journal import ActionLog, TooOld
from hetplan.allocator.actions import Action
from hetplan.hints import HintSet

GPU_TYPES = ("V100", "T4")
MODELS = ("res50", "transformer", "unhinted")


def _hints(version: str, scale: float) -> HintSet:
    rows = [("res50", 1, "V100", 1, 9.5, 60.3, 380), ("res50", 1, "T4", 2, 11, 40, 130),
            ("res50", 2, "V100", 1, 7.25, 58.9, 700), ("res50", 4, "T4", 1, 12, 48.2, 500),
            ("transformer", 1, "T4", 1, 1, 46.1, 300), ("transformer", 1, "V100", 2, 1.5, 20, 250),
            ("transformer", 8, "V100", 1, 1, 61, 2000), ("res50", 12, "V100", 1, 4, 30, 4000)]
    return HintSet.from_frame(pd.DataFrame([
        dict(model=m, num_gpus=g, gpu_type=t, rank=r, cpus_per_gpu=c * scale, mem_gb_per_gpu=mem,
             expected_throughput=thr, normalized_throughput=1, throughput_per_dollar=1, plan_id=version)
        for m, g, t, r, c, mem, thr in rows]))


HINTS = [_hints("h1", 1.0), _hints("h2", 0.6)]


class Clock:
    """A clock both allocators read: the step number, so that actions are stamped alike."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _node(rng: random.Random, k: int) -> Node:
    gpu_type = rng.choice(GPU_TYPES)
    gpus = rng.choice((4, 8))
    return Node(f"n{k}", gpu_type, gpus, gpus * rng.choice((6, 8, 12)), gpus * rng.choice((40, 64)))


def _job(rng: random.Random, k: int) -> Job:
    gpus = rng.choice((0, 0.25, 0.5, 1, 1, 1, 2, 2, 4, 8, 12))
    cpus = rng.choice((None, None, None, 2, 8, 40))
    mem = rng.choice((None, None, None, 8, 100))
    return Job.request(f"j{k}", rng.choice(MODELS), gpus, cpus, mem)


def _state(a: Allocator) -> dict:
    """Everything that decides what the allocator does next, comparable with `==`."""
    return {"cluster": a.cluster.snapshot(), "order": [x.job_id for x in a.cluster.allocations()],
            "gangs": dict(a._gangs), "touched": a.touched(), "history": dict(a.history), "latest": a.log.latest,
            "log": [(x.seq, x.at, x.action) for x in a.log.entries()], "hints": a.hints.version}


def _outcome(call):
    """What a call returned, or the error it raised (as type and message)."""
    try:
        return ("ok", call())
    except StateError as exc:
        return ("error", type(exc).__name__, str(exc))


class Pair:
    """The in-memory allocator and the durable one, driven alike."""

    def __init__(self, tmp_path, policy: str, rng: random.Random, retain: int) -> None:
        self.path, self.policy, self.retain = tmp_path / f"{policy}.db", policy, retain
        self.clock, self.hint_index = Clock(), 0
        self.memory = Allocator(None, get_policy(policy), HINTS[0], clock=self.clock, retain=retain)
        self.durable = self._open()
        self.restarts = 0

    def _open(self) -> DurableAllocator:
        return DurableAllocator(self.path, get_policy(self.policy), HINTS[self.hint_index], synchronous="NORMAL",
                                clock=self.clock, retain=self.retain)

    def kill_and_restore(self) -> None:
        self.durable = self._open()  # the old one is abandoned mid-flight, its connection never closed
        self.restarts += 1

    def publish(self, index: int) -> None:
        self.hint_index = index
        for a in (self.memory, self.durable):
            a.hint_source.set(HINTS[index])

    def both(self, op) -> None:
        got = [_outcome(lambda a=a: op(a)) for a in (self.memory, self.durable)]
        assert got[0] == got[1]

    def check(self, step: int) -> None:
        for a in (self.memory, self.durable):
            assert a.cluster.check() == [], (step, a.cluster.check())
            running = a.running()
            assert sum(len(p) for p in running.values()) == len(a.cluster.allocations())
            for job_id, parts in a._gangs.items():  # a gang is whole or gone
                assert len(parts) > 1 or parts[0] != job_id
                assert running.get(job_id) == tuple(a.cluster.allocation(p) for p in parts)
        assert _state(self.memory) == _state(self.durable), step


def _run(pair: Pair, rng: random.Random, steps: int) -> None:
    jobs, nodes = 0, 0
    waiting: list[Job] = []
    for _ in range(4):
        pair.both(lambda a, n=_node(rng, nodes): a.change_nodes(NodeChanges(upsert=[n])))
        nodes += 1
    for step in range(steps):
        pair.clock.now = float(step)
        r = rng.random()
        names = [n.name for n in pair.memory.cluster.nodes()]
        running = list(pair.memory.running())
        if r < 0.35:
            job = _job(rng, jobs)
            jobs += 1
            pair.both(lambda a, job=job: a.allocate(job))
            if rng.random() < 0.1:
                pair.both(lambda a, job=job: a.allocate(job))  # a retry: the same answer, nothing changes
            if job.job_id not in pair.memory.running():
                waiting.append(job)
        elif r < 0.55:
            job_id = rng.choice(running) if running and rng.random() < 0.9 else "nobody"
            pair.both(lambda a, j=job_id: a.release_parts(j))
        elif r < 0.62 and waiting:
            batch = [w for w in waiting[-6:] if w.job_id not in pair.memory.running()]
            pair.both(lambda a, b=batch: a.admit(b))
        elif r < 0.75:
            order = pair.memory.running_jobs() + [w for w in waiting[-6:] if w.job_id not in pair.memory.running()]
            rng.shuffle(order)
            preempt, move = rng.random() < 0.5, rng.random() < 0.7
            scope = rng.choice((None, None, []))
            pair.both(lambda a, o=order, p=preempt, m=move, s=scope: a.rebalance(o, p, m, s))
        elif r < 0.80:
            pair.both(lambda a, n=_node(rng, nodes): a.change_nodes(NodeChanges(upsert=[n])))
            nodes += 1
        elif r < 0.86 and names:
            node = pair.memory.cluster.node(rng.choice(names))
            labels = {} if node.labels else {"hetplan.io/closed": "true"}
            changed = Node(node.name, node.gpu_type, node.gpus, node.cpus, node.mem_gb, labels)
            pair.both(lambda a, c=changed: a.change_nodes(NodeChanges(upsert=[c])))
        elif r < 0.90 and len(names) > 2:
            gone, force = rng.choice(names), rng.random() < 0.6
            pair.both(lambda a, g=gone, f=force: a.change_nodes(NodeChanges(remove=[g], force=f)))
        elif r < 0.93:
            pair.publish(1 - pair.hint_index)
        else:
            pair.kill_and_restore()
        pair.check(step)


@pytest.mark.parametrize("policy,seed", [("hint", s) for s in range(12)] + [("hint-static", 0), ("first-fit", 0)])
def test_a_durable_allocator_killed_and_restored_at_random_is_the_in_memory_one(tmp_path, policy, seed):
    rng = random.Random(seed)
    pair = Pair(tmp_path, policy, rng, retain=rng.choice((5, 50, 10_000)))
    _run(pair, rng, 750)  # 14 sequences x 750 steps: 10,500 steps
    assert pair.restarts > 10 and pair.memory.log.latest > 100


def test_the_random_sequences_reach_gangs_shares_moves_and_evictions(tmp_path):
    """The differential test is only as good as what it reaches: count the kinds of change it made."""
    rng = random.Random(3)
    pair = Pair(tmp_path, "hint", rng, retain=10_000)
    _run(pair, rng, 750)
    actions = [x.action for x in pair.memory.log.entries()]
    kinds = {a.kind for a in actions}
    assert kinds == {"start", "stop", "resize", "migrate"}
    assert any(len(a.after) > 1 for a in actions)  # gangs started
    assert any(p.gpu_milli for a in actions for p in a.after)  # GPU shares
    assert any(p.gpus == 0 and not p.gpu_milli for a in actions for p in a.after)  # CPU-only jobs
    assert any(len({p.gpu_type for p in a.before + a.after}) > 1 for a in actions)  # moves across GPU types
    assert any(h.moves for h in pair.memory.history.values())  # move histories (journaled)


# ---------------------------------------------------------------- the action log's contract


def _stop(job: str) -> Action:
    return Action("stop", job, (), ())


@pytest.mark.parametrize("since,expected", [
    (0, TooOld), (1, TooOld), (2, [3, 4, 5]), (3, [4, 5]), (5, []), (6, TooOld), (-1, TooOld),
])
def test_the_log_serves_what_came_after_since_or_says_too_old(since, expected):
    log = ActionLog(retain=3)
    log.extend(log.number([_stop(f"j{i}") for i in range(5)], at=1.0))  # 1..5, keeps 3..5
    assert (log.oldest, log.latest) == (3, 5)
    if expected is TooOld:
        with pytest.raises(TooOld, match=f"since={since}"):
            log.since(since)
    else:
        assert [x.seq for x in log.since(since)] == expected


def test_an_empty_log_answers_since_0_and_nothing_else():
    log = ActionLog()
    assert log.since(0) == [] and log.oldest == 1
    with pytest.raises(TooOld):
        log.since(1)


def test_numbering_goes_on_after_a_restart_without_a_gap_and_retention_is_bounded(tmp_path):
    db = tmp_path / "a.db"
    node = Node("v", "V100", 8, 64, 488)
    with DurableAllocator(db, "first-fit", retain=4) as a:
        a.change_nodes(NodeChanges(upsert=[node]))
        for k in range(6):
            allocated(a.allocate(Job(f"j{k}", "m", 1)))
        assert (a.log.oldest, a.log.latest) == (3, 6)
    with DurableAllocator(db, "first-fit", retain=4) as again:
        assert [x.seq for x in again.log.since(2)] == [3, 4, 5, 6]
        again.release("j0")
        assert [(x.seq, x.action.kind, x.action.job_id) for x in again.log.since(6)] == [(7, "stop", "j0")]
    with sqlite3.connect(db) as raw:  # the file keeps no more than the log does
        assert [s for (s,) in raw.execute("SELECT seq FROM actions ORDER BY seq")] == [4, 5, 6, 7]


def test_a_journal_that_fails_to_commit_leaves_memory_as_it_was(tmp_path):
    """The one apply point is all or nothing: a commit that raises (a full disk, a locked file) undoes the change."""
    with DurableAllocator(tmp_path / "a.db", "hint", HINTS[0]) as a:
        a.change_nodes(NodeChanges(upsert=[Node("v", "V100", 8, 64, 488)]))
        allocated(a.allocate(Job("keep", "res50", 1)))
        before = _state(a)

        def refuse(change, retain):
            raise sqlite3.OperationalError("database or disk is full")

        a.journal.commit = refuse
        for op in (lambda: a.allocate(Job("new", "res50", 2)), lambda: a.release("keep"),
                   lambda: a.rebalance(a.running_jobs()), lambda: a.change_nodes(NodeChanges(remove=["v"], force=True)),
                   lambda: a.change_nodes(NodeChanges(upsert=[Node("w", "T4", 4, 48, 192)]))):
            with pytest.raises(sqlite3.OperationalError):
                op()
            assert _state(a) == before and a.cluster.check() == []
