"""Durability: the allocator's nodes and allocations in SQLite (WAL), so a restart or a crash loses nothing.

Write-ahead order: a decision is made in memory (pure), committed to the database, and only then applied in
memory and returned. A crash before the commit loses a decision nobody was told about; a crash after it
loses nothing, and the restart re-applies every committed allocation through `Cluster.apply`, so a database
that would overcommit a node is refused at start-up rather than served. `synchronous=FULL` (the default)
makes each commit survive power loss, not only a process crash.

Units: a node's `cpus` (cores) and `mem_gb` (GiB) as given; an allocation's `cpu_m` (millicores) and `mem_mib`
(MiB, 1 GiB = 1024 MiB). Schema 1 counted allocations' memory in 1000-MB units and is refused, not converted;
schema 2 (no GPU shares, no own requests) is upgraded in place on open.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from pathlib import Path

from hetplan.allocator.cluster import Cluster, StateError
from hetplan.allocator.core import Allocator, NodeChanges
from hetplan.allocator.policies import Policy
from hetplan.allocator.rebalance import Action
from hetplan.allocator.sources import HintSource
from hetplan.allocator.spec import Allocation, Decision, Job, Node
from hetplan.hints import HintSet

log = logging.getLogger(__name__)

SCHEMA_VERSION = "3"  # 3: + GPU shares and own requests; 2: memory in MiB, nodes' mem_gb in GiB; 1: 1000-MB units
_UPGRADES = {  # from schema -> the statements that take it to SCHEMA_VERSION
    "2": ["ALTER TABLE allocations ADD COLUMN gpu_milli INTEGER NOT NULL DEFAULT 0",
          "ALTER TABLE allocations ADD COLUMN device INTEGER",
          "ALTER TABLE allocations ADD COLUMN request_cpu_m INTEGER",
          "ALTER TABLE allocations ADD COLUMN request_mem_mib INTEGER",
          f"UPDATE meta SET value = '{SCHEMA_VERSION}' WHERE key = 'schema'"],
}
_COLUMNS = ("job_id, model, node, gpu_type, gpus, cpu_m, mem_mib, hint_version, policy, share, rank, gpu_milli, "
            "device, request_cpu_m, request_mem_mib")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    gpu_type TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    cpus REAL NOT NULL,
    mem_gb REAL NOT NULL,
    labels TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS allocations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    node TEXT NOT NULL,
    gpu_type TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    cpu_m INTEGER NOT NULL,
    mem_mib INTEGER NOT NULL,
    hint_version TEXT,
    policy TEXT NOT NULL,
    share TEXT NOT NULL,
    rank INTEGER,
    created_at REAL NOT NULL,
    gpu_milli INTEGER NOT NULL DEFAULT 0,
    device INTEGER,
    request_cpu_m INTEGER,
    request_mem_mib INTEGER
);
"""


class DurableAllocator:
    """An `Allocator` whose every change is committed to SQLite before it is applied and returned; the same
    `AllocatorAPI` (`hetplan.allocator.protocol`)."""

    def __init__(self, path: str | os.PathLike[str], policy: Policy | str = "hint",
                 hints: HintSet | HintSource | None = None, synchronous: str = "FULL") -> None:
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"synchronous must be FULL, NORMAL or EXTRA, got {synchronous!r}")
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            found = _check_schema(self._db, self.path)  # before anything is written to it
            if found in _UPGRADES:
                self._db.executescript("BEGIN IMMEDIATE;\n" + ";\n".join(_UPGRADES[found]) + ";\nCOMMIT;")
                log.info("%s: allocator database upgraded from schema %s to %s", self.path, found, SCHEMA_VERSION)
        except BaseException:
            self._db.close()
            raise
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        self.core = Allocator(Cluster(), policy, hints)
        self._restore()

    # the same surface as Allocator
    @property
    def cluster(self) -> Cluster:
        return self.core.cluster

    @property
    def lock(self):  # noqa: ANN201 - threading.RLock has no public type
        return self.core.lock

    @property
    def policy(self) -> Policy:
        return self.core.policy

    @property
    def hints(self) -> HintSet:
        return self.core.hints

    @property
    def hint_source(self) -> HintSource:
        return self.core.hint_source

    def reload_hints(self) -> HintSet:
        return self.core.reload_hints()

    def _restore(self) -> None:
        cluster = self.core.cluster
        for name, gpu_type, gpus, cpus, mem_gb, labels in self._db.execute(
                "SELECT name, gpu_type, gpus, cpus, mem_gb, labels FROM nodes ORDER BY seq"):
            cluster.add_node(Node(name, gpu_type, int(gpus), cpus, mem_gb, json.loads(labels)))
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM allocations ORDER BY seq").fetchall()
        for row in rows:
            cluster.apply(Allocation(*row))  # refuses (OvercommitError) a database that would overcommit
        log.info("restored %d nodes and %d allocations from %s", len(cluster), len(rows), self.path)

    def allocate(self, job: Job) -> Decision:
        with self.core.lock:
            decision = self.core.decide(job)
            if isinstance(decision, Allocation) and self.core.cluster.allocation(job.job_id) is None:
                self._write([_insert(decision)])
                self.core.cluster.apply(decision)
                self.core.touch(decision.node)
            return decision

    def running_jobs(self) -> list[Job]:
        return self.core.running_jobs()

    def rebalance(self, order: list[Job], preempt: bool = False, move: bool = True,
                  nodes: list[str] | None = None) -> list[Action]:
        """`Allocator.rebalance`, each action committed before it is applied (all of them in one transaction)."""
        with self.core.lock:
            actions = self.core.plan_rebalance(order, preempt, move, nodes)
            statements = [("DELETE FROM allocations WHERE job_id = ?", (a.job_id,))
                          for action in actions for a in action.before]
            statements += [_insert(a) for action in actions for a in action.after]
            if statements:
                self._write(statements)
            self.core.apply_actions(actions, clear_touched=nodes is None)
            return actions

    def release(self, job_id: str) -> Allocation | None:
        with self.core.lock:
            if self.core.cluster.allocation(job_id) is None:
                return None
            self._write([("DELETE FROM allocations WHERE job_id = ?", (job_id,))])
            return self.core.release(job_id)

    def change_nodes(self, changes: NodeChanges) -> list[Allocation]:
        with self.core.lock:
            self.core.check_node_changes(changes)
            statements: list[tuple[str, tuple]] = []
            for name in changes.remove:
                statements.append(("DELETE FROM allocations WHERE node = ?", (name,)))
                statements.append(("DELETE FROM nodes WHERE name = ?", (name,)))
            for n in changes.upsert:
                statements.append((
                    "INSERT INTO nodes (name, gpu_type, gpus, cpus, mem_gb, labels) VALUES (?,?,?,?,?,?) "
                    "ON CONFLICT(name) DO UPDATE SET gpu_type=excluded.gpu_type, gpus=excluded.gpus, "
                    "cpus=excluded.cpus, mem_gb=excluded.mem_gb, labels=excluded.labels",
                    (n.name, n.gpu_type, n.gpus, float(n.cpus), float(n.mem_gb),
                     json.dumps(dict(n.labels), sort_keys=True))))
            self._write(statements)
            return self.core.change_nodes(changes)  # checked above: cannot fail

    def upsert_node(self, node: Node) -> None:
        self.change_nodes(NodeChanges(upsert=[node]))

    def remove_node(self, name: str, force: bool = False) -> list[Allocation]:
        return self.change_nodes(NodeChanges(remove=[name], force=force))

    def _write(self, statements: list[tuple[str, tuple]]) -> None:
        """Run statements in one transaction; on any error roll back and re-raise (memory is untouched)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in statements:
                db.execute(sql, params)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self.core.lock:
            self._db.close()

    def __enter__(self) -> DurableAllocator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_database(path: str | os.PathLike[str]) -> None:
    """Raise `StateError` (one line: the file and what to do) if `path` holds an allocator database of another
    schema; a missing file or a new database passes. Reads only."""
    path = Path(path)
    if not path.exists():
        return
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        _check_schema(db, path)
    finally:
        db.close()


def _check_schema(db: sqlite3.Connection, path: Path) -> str | None:
    """The database's schema (None: a new one); `StateError` for one this hetplan can neither read nor upgrade."""
    has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
    found = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone() if has_meta else None
    if found is not None and found[0] != SCHEMA_VERSION and found[0] not in _UPGRADES:
        units = " (memory in 1000-MB units, not GiB)" if found[0] == "1" else ""
        raise StateError(f"{path}: allocator database schema {found[0]}{units}, this hetplan reads schema "
                         f"{SCHEMA_VERSION}; move the file aside (or pass another --db) and re-add the nodes "
                         f"(hetplan serve --nodes/--from-plan or POST /v1/nodes); running jobs must allocate again")
    return None if found is None else found[0]


def _insert(a: Allocation) -> tuple[str, tuple]:
    return (f"INSERT INTO allocations ({_COLUMNS}, created_at) VALUES ({', '.join('?' * 16)})",
            (a.job_id, a.model, a.node, a.gpu_type, a.gpus, a.cpu_m, a.mem_mib, a.hint_version, a.policy, a.share,
             a.rank, a.gpu_milli, a.device, a.request_cpu_m, a.request_mem_mib, time.time()))
