"""Durability: restores, restarts, killed processes and threads never lose or overcommit an allocation."""

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from hetplan.allocator import (
    Allocation, Allocator, DurableAllocator, Job, Node, NodeChanges, OvercommitError, StateError,
)
from hetplan.allocator.dblock import DatabaseLock
from hetplan.allocator.durable import check_database
from allocator_helpers import T4, allocated, hint_set, run_concurrently, v100


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
            raw.execute("INSERT INTO allocations (job_id, model, node, gpu_type, gpus, cpu_m, mem_mib, policy, share, "
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

    run_concurrently(worker, 8)
    assert problems == [] and alloc.cluster.check() == []
    assert {a.job_id for a in alloc.cluster.allocations()} == set().union(*held.values())
    alloc.close()




SCHEMA_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema', '1');
CREATE TABLE nodes (seq INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE, gpu_type TEXT NOT NULL,
    gpus INTEGER NOT NULL, cpus REAL NOT NULL, mem_gb REAL NOT NULL, labels TEXT NOT NULL);
CREATE TABLE allocations (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL UNIQUE, model TEXT NOT NULL,
    node TEXT NOT NULL, gpu_type TEXT NOT NULL, gpus INTEGER NOT NULL, cpu_m INTEGER NOT NULL, mem_mb INTEGER NOT NULL,
    hint_version TEXT, policy TEXT NOT NULL, share TEXT NOT NULL, rank INTEGER, created_at REAL NOT NULL);
INSERT INTO nodes (name, gpu_type, gpus, cpus, mem_gb, labels) VALUES ('v1', 'V100', 8, 64, 488, '{}');
INSERT INTO allocations (job_id, model, node, gpu_type, gpus, cpu_m, mem_mb, policy, share, created_at)
    VALUES ('a', 'res50', 'v1', 'V100', 1, 8000, 61000, 'proportional', 'proportional', 0);
"""


def test_a_schema_1_database_in_1000_mb_units_is_refused_in_one_line_and_left_as_it_was(tmp_path):
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as raw:
        raw.executescript(SCHEMA_1)
    before = db.read_bytes()
    with pytest.raises(StateError) as caught:
        DurableAllocator(db, "hint")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{db}: allocator database schema 1 (memory in 1000-MB")
    assert "move the file aside" in message and "schema 6" in message
    with pytest.raises(StateError, match="schema 1"):
        check_database(db)
    assert db.read_bytes() == before and not (tmp_path / "old.db-wal").exists()


def test_serve_refuses_an_old_database_in_one_line_before_starting(tmp_path):
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as raw:
        raw.executescript(SCHEMA_1)
    done = subprocess.run([sys.executable, "-c", "from hetplan.cli import main; main()", "serve", "--db", str(db),
                           "--port", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {db}: allocator database schema 1"), done.stderr


def test_a_new_database_records_schema_6_and_memory_in_mib(tmp_path):
    db = tmp_path / "new.db"
    with DurableAllocator(db, "proportional") as alloc:
        alloc.upsert_node(v100("v1"))  # 488 GiB, 8 GPUs: 61 GiB per GPU
        a = allocated(alloc.allocate(Job("a", "res50", 1)))
    check_database(db)
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("6",)
        assert raw.execute("SELECT cpu_m, mem_mib FROM allocations").fetchone() == (8000, 61 * 1024)
    assert a.mem_gb == 61.0


SCHEMA_2 = SCHEMA_1.replace("'schema', '1'", "'schema', '2'").replace("mem_mb", "mem_mib").replace("61000", "62464")


def test_a_schema_2_database_is_upgraded_in_place_and_keeps_its_allocations(tmp_path):
    db = tmp_path / "v2.db"
    with sqlite3.connect(db) as raw:
        raw.executescript(SCHEMA_2)
    check_database(db)  # upgradeable: serve's start-up check lets it through
    with DurableAllocator(db, "hint") as alloc:
        kept = alloc.cluster.allocation("a")
        assert kept is not None and (kept.cpu_m, kept.mem_mib, kept.gpu_milli, kept.request_cpu_m) == (8000, 62464, 0, None)
        share = allocated(alloc.allocate(Job.request("s", "bert", 0.25, cpus=2)))
        assert (share.gpu_milli, share.request_cpu_m) == (250, 2000)
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("6",)
    with DurableAllocator(db, "hint") as again:  # the share and its request survive a restart
        assert again.cluster.allocation("s") == share and again.cluster.check() == []


# --- one process per database (issue 30) ----------------------------------------------------------------------------

OPEN = textwrap.dedent("""
    import sys
    from hetplan.allocator import DurableAllocator
    from hetplan.allocator.dblock import DatabaseInUse
    try:
        DurableAllocator(sys.argv[1], "proportional").close()
    except DatabaseInUse as exc:
        print("refused:", exc)
    else:
        print("opened")
""")


def _open_elsewhere(db) -> str:
    """What another process gets when it opens `db`: `opened`, or `refused: <the one-line reason>`."""
    done = subprocess.run([sys.executable, "-c", OPEN, str(db)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_database_open_in_one_process_is_refused_to_another_naming_it_and_the_holder(tmp_path):
    """Issue 30: two processes on one database numbered their actions from one counter (the second one's every write
    failed). The second is refused, in one line naming the database and the holder's pid; once the holder closes
    it (or dies: test_a_second_serve_on_the_same_database_refuses_to_start_in_one_line), the other opens it."""
    db = tmp_path / "a.db"
    with DurableAllocator(db, "proportional") as alloc:
        alloc.upsert_node(v100("v1"))
        refused = _open_elsewhere(db)
        assert refused.startswith(f"refused: {db} is in use by another process (pid {os.getpid()},"), refused
        assert "\n" not in refused
        allocated(alloc.allocate(Job("a", "res50", 1)))  # the holder is untouched
    assert _open_elsewhere(db) == "opened"


def test_the_lock_is_counted_within_a_process_and_released_by_the_last_holder(tmp_path):
    """`hetplan serve` holds the lock for its life while the allocator it opens takes it too: in one process the
    lock is counted; another process gets it only when every holder here let go, and a refused open holds nothing."""
    db = tmp_path / "a.db"
    outer = DatabaseLock(db)
    with DurableAllocator(db, "proportional") as alloc:
        alloc.upsert_node(v100("v1"))
    assert _open_elsewhere(db).startswith("refused:")  # `outer` still holds it
    outer.release()
    outer.release()  # twice: harmless
    assert _open_elsewhere(db) == "opened"
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    with pytest.raises(StateError, match="schema 1"):
        DurableAllocator(db, "hint")  # refused after taking the lock: it lets it go
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE meta SET value = '4' WHERE key = 'schema'")
    assert _open_elsewhere(db) == "opened"
