"""Durability: restores, restarts, killed processes and threads never lose or overcommit an allocation."""

import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest

from hetplan.allocator import (
    Allocation, Allocator, DurableAllocator, Job, Node, NodeChanges, OvercommitError,
)
from allocator_helpers import (
    T4, allocated, hint_set, v100,
)


# --- durability ---------------------------------------------------------------------------------------------------


def test_restore_puts_a_released_allocation_back_only_where_it_still_fits():
    allocator = Allocator([Node("n1", "V100", 2, 8, 100)], "proportional")
    first = allocator.allocate(Job("a", "res50", 1))
    assert isinstance(first, Allocation)
    assert not allocator.restore(first)  # still held: nothing to restore
    allocator.release("a")
    taker = allocator.allocate(Job("b", "res50", 2))  # takes the whole node
    assert isinstance(taker, Allocation)
    before = allocator.cluster.snapshot()
    assert not allocator.restore(first) and allocator.cluster.snapshot() == before  # no room: nothing changes
    allocator.release("b")
    assert allocator.restore(first) and allocator.cluster.allocation("a") == first
    assert allocator.cluster.check() == []


def test_restart_restores_nodes_and_allocations_and_keeps_idempotency(tmp_path):
    db = tmp_path / "a.db"
    with DurableAllocator(db, "hint", hint_set()) as alloc:
        alloc.change_nodes(NodeChanges(upsert=[v100("v1"), T4, Node("l4", "NVIDIA-L4", 1, 4, 16, {"zone": "b"})]))
        first = allocated(alloc.allocate(Job("a", "res50", 1)))
        allocated(alloc.allocate(Job("b", "transformer", 1)))
        alloc.release("b")
        alloc.upsert_node(Node("t4", "T4", 4, 40, 192))
        snapshot = alloc.cluster.snapshot()
    with DurableAllocator(db, "hint", hint_set("other")) as again:
        assert again.cluster.snapshot() == snapshot
        assert [n.name for n in again.cluster.nodes()] == ["v1", "t4", "l4"]
        assert again.allocate(Job("a", "res50", 1)) == first  # the same decision, its original hint version
        assert again.cluster.allocation("a").hint_version == "p1"


def test_a_database_that_would_overcommit_is_refused_at_start(tmp_path):
    db = tmp_path / "a.db"
    with DurableAllocator(db, "hint") as alloc:
        alloc.upsert_node(v100("v1", gpus=1))
    with sqlite3.connect(db) as raw:
        for job in ("x", "y"):
            raw.execute("INSERT INTO allocations (job_id, model, node, gpu_type, gpus, cpu_m, mem_mb, policy, share, "
                        "created_at) VALUES (?, 'm', 'v1', 'V100', 1, 0, 0, 'hint', 'hinted', 0)", (job,))
    with pytest.raises(OvercommitError):
        DurableAllocator(db, "hint")


CRASH = textwrap.dedent("""
    import os, signal, sys
    from hetplan.allocator import DurableAllocator, Job, Node
    alloc = DurableAllocator(sys.argv[1], "proportional")
    alloc.upsert_node(Node("v1", "V100", 8, 64, 488))
    for i in range(5):
        alloc.allocate(Job(f"j{i}", "res50", 1))
    alloc.release("j0")
    print("committed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_killed_process_loses_no_allocation(tmp_path):
    db = tmp_path / "crash.db"
    proc = subprocess.run([sys.executable, "-c", CRASH, str(db)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and "committed" in proc.stdout, proc.stderr
    with DurableAllocator(db, "proportional") as alloc:
        assert sorted(a.job_id for a in alloc.cluster.allocations()) == ["j1", "j2", "j3", "j4"]
        assert alloc.cluster.free("v1").gpus == 4 and alloc.cluster.check() == []


def test_many_threads_in_process_never_overcommit_and_lose_no_release(tmp_path):
    alloc = DurableAllocator(tmp_path / "t.db", "hint", hint_set())
    alloc.change_nodes(NodeChanges(upsert=[v100("v1"), v100("v2"), T4]))
    held: dict[int, set[str]] = {}
    problems: list[str] = []

    def worker(t: int) -> None:
        rng = random.Random(t)
        mine: set[str] = set()
        for i in range(60):
            job = Job(f"t{t}-{i}", rng.choice(["res50", "transformer", "vgg"]), rng.choice([1, 1, 2]))
            if isinstance(alloc.allocate(job), Allocation):
                mine.add(job.job_id)
            if mine and rng.random() < 0.5:
                victim = rng.choice(sorted(mine))
                if alloc.release(victim) is None:
                    problems.append(f"lost release {victim}")
                mine.discard(victim)
        held[t] = mine

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == [] and alloc.cluster.check() == []
    assert {a.job_id for a in alloc.cluster.allocations()} == set().union(*held.values())
    alloc.close()


