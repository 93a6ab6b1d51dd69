"""Durability: the allocator's journal in SQLite (WAL), so a restart or a crash loses nothing and renumbers nothing.

`SqliteJournal` commits each `Change` an `Allocator` applies (allocations taken and given, node changes, gangs,
the nodes to re-size next, move histories and the numbered actions) in one transaction before the allocator
answers; if the commit fails the allocator undoes the change in memory. `load` rebuilds all of it, and the
restart re-applies every allocation through `Cluster.apply`, so a database that would overcommit a node is
refused at start-up rather than served. `synchronous=FULL` (the default) makes each commit survive power loss,
not only a process crash. `DurableAllocator` is an `Allocator` with this journal: the same surface, nothing
re-written.

Units: a node's `cpus` (cores) and `mem_gb` (GiB) as given; an allocation's `cpu_m` (millicores) and `mem_mib`
(MiB, 1 GiB = 1024 MiB). Schema 1 counted allocations' memory in 1000-MB units and is refused, not converted;
schemas 2 (no GPU shares, no own requests) and 3 (no gangs, no action log) are upgraded in place on open.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from hetplan.allocator.cluster import StateError
from hetplan.allocator.core import Allocator
from hetplan.allocator.dblock import DatabaseLock
from hetplan.allocator.journal import RETAIN, Change, LoggedAction, Note, Restored, Synchronous
from hetplan.allocator.policies import Policy
from hetplan.allocator.actions import Action
from hetplan.allocator.sources import HintSource
from hetplan.allocator.spec import Allocation, Node
from hetplan.hints import HintSet

log = logging.getLogger(__name__)
RESTART = "restart"  # the `kind` an action log row has for a restart (`LoggedAction.restart`), else the action's
PREEMPT = "preempt"  # the `kind` an action log row has for a preemption (`LoggedAction.preempted`)

SCHEMA_VERSION = "6"  # 6: + gangs of fixed parts (`part_gpus`); 5: + the scheduler's submissions, preemptions marked; 4: + gangs, the action log, re-size marks, move histories; 3: + GPU shares and own requests;
# 2: memory in MiB, nodes' mem_gb in GiB; 1: 1000-MB units
_ADD = "ALTER TABLE allocations ADD COLUMN "  # an upgrade skips a column the table has (`SqliteJournal`)
_TO_6 = ["ALTER TABLE allocations ADD COLUMN part_gpus INTEGER"]
_TO_4 = ["ALTER TABLE allocations ADD COLUMN owner TEXT", *_TO_6]
_UPGRADES = {  # from schema -> the statements that take it to SCHEMA_VERSION
    "2": ["ALTER TABLE allocations ADD COLUMN gpu_milli INTEGER NOT NULL DEFAULT 0",
          "ALTER TABLE allocations ADD COLUMN device INTEGER",
          "ALTER TABLE allocations ADD COLUMN request_cpu_m INTEGER",
          "ALTER TABLE allocations ADD COLUMN request_mem_mib INTEGER", *_TO_4],
    "3": _TO_4,
    "4": _TO_6,  # the `jobs` table is created with the others
    "5": _TO_6,
}
_COLUMNS = ("job_id, model, node, gpu_type, gpus, cpu_m, mem_mib, hint_version, policy, share, rank, gpu_milli, "
            "device, request_cpu_m, request_mem_mib, part_gpus")
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
    request_mem_mib INTEGER,
    owner TEXT,
    part_gpus INTEGER
);
CREATE TABLE IF NOT EXISTS actions (
    seq INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    job_id TEXT NOT NULL,
    parts TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS touched (node TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS history (job_id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL UNIQUE,
                                 body TEXT NOT NULL);
"""


class SqliteJournal:
    """An allocator's journal in one SQLite file (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], synchronous: str = "FULL") -> None:
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"synchronous must be FULL, NORMAL or EXTRA, got {synchronous!r}")
        self.path = Path(path)
        self.synchronous: Synchronous = synchronous.upper()  # type: ignore[assignment]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # one process per database (DatabaseInUse otherwise), taken before anything is read or written
        self._lock = DatabaseLock(self.path) if str(path) not in ("", ":memory:") else None
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except BaseException:
            self._unlock()
            raise
        try:
            found = _check_schema(self._db, self.path)  # before anything is written to it
            if found in _UPGRADES:
                has = {row[1] for row in self._db.execute("PRAGMA table_info(allocations)")}
                steps = [x for x in _UPGRADES[found] if not x.startswith(_ADD) or x[len(_ADD):].split()[0] not in has]
                self._db.executescript("BEGIN IMMEDIATE;\n" + "".join(f"{x};\n" for x in steps) +
                                       f"UPDATE meta SET value = '{SCHEMA_VERSION}' WHERE key = 'schema';\nCOMMIT;")
                log.info("%s: allocator database upgraded from schema %s to %s", self.path, found, SCHEMA_VERSION)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={self.synchronous}")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.executescript(_SCHEMA)
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        except BaseException:
            self._db.close()
            self._unlock()
            raise

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def load(self, retain: int) -> Restored:
        db = self._db
        out = Restored()
        for name, gpu_type, gpus, cpus, mem_gb, labels in db.execute(
                "SELECT name, gpu_type, gpus, cpus, mem_gb, labels FROM nodes ORDER BY seq"):
            out.nodes.append(Node(name, gpu_type, int(gpus), cpus, mem_gb, json.loads(labels)))
        for row in db.execute(f"SELECT owner, {_COLUMNS} FROM allocations ORDER BY seq"):
            out.allocations.append((row[0], Allocation(*row[1:])))
        out.touched = {node for (node,) in db.execute("SELECT node FROM touched")}
        out.history = {job: json.loads(body) for job, body in db.execute("SELECT job_id, body FROM history")}
        out.jobs = {job: json.loads(body) for job, body in db.execute("SELECT job_id, body FROM jobs ORDER BY seq")}
        latest = db.execute("SELECT value FROM meta WHERE key = 'latest'").fetchone()
        out.latest = int(latest[0]) if latest else 0
        rows = db.execute("SELECT seq, at, kind, job_id, parts FROM actions WHERE seq > ? ORDER BY seq",
                          (out.latest - retain,)).fetchall()
        out.logged = _logged_rows(rows, self.path)
        log.info("restored %d nodes, %d allocations and actions up to %d from %s", len(out.nodes),
                 len(out.allocations), out.latest, self.path)
        return out

    def commit(self, change: Change, retain: int) -> None:
        """Write `change` in one transaction; on any error roll back and re-raise (nothing of it is kept)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("DELETE FROM allocations WHERE job_id = ?", [(j,) for j in change.taken])
            now = time.time()
            db.executemany(f"INSERT INTO allocations ({_COLUMNS}, owner, created_at) VALUES ({', '.join('?' * 18)})",
                           [(*_row(a), owner, now) for owner, a in change.given])
            for name in change.remove:
                db.execute("DELETE FROM allocations WHERE node = ?", (name,))
                db.execute("DELETE FROM nodes WHERE name = ?", (name,))
                db.execute("DELETE FROM touched WHERE node = ?", (name,))
            db.executemany(
                "INSERT INTO nodes (name, gpu_type, gpus, cpus, mem_gb, labels) VALUES (?,?,?,?,?,?) "
                "ON CONFLICT(name) DO UPDATE SET gpu_type=excluded.gpu_type, gpus=excluded.gpus, "
                "cpus=excluded.cpus, mem_gb=excluded.mem_gb, labels=excluded.labels",
                [(n.name, n.gpu_type, n.gpus, float(n.cpus), float(n.mem_gb),
                  json.dumps(dict(n.labels), sort_keys=True)) for n in change.upsert])
            if change.touched_clear:
                db.execute("DELETE FROM touched")
            db.executemany("INSERT OR IGNORE INTO touched VALUES (?)", [(n,) for n in sorted(change.touched_add)])
            for job, history in change.history.items():
                if history is None:
                    db.execute("DELETE FROM history WHERE job_id = ?", (job,))
                else:
                    db.execute("INSERT OR REPLACE INTO history VALUES (?, ?)", (job, json.dumps(history)))
            for job, body in change.jobs.items():
                if body is None:
                    db.execute("DELETE FROM jobs WHERE job_id = ?", (job,))
                else:
                    db.execute("INSERT INTO jobs (job_id, body) VALUES (?, ?) ON CONFLICT(job_id) DO UPDATE SET "
                               "body = excluded.body", (job, json.dumps(body)))
            if change.logged:
                db.executemany("INSERT INTO actions VALUES (?, ?, ?, ?, ?)",
                               [(x.seq, x.at, _kind(x), x.action.job_id,
                                 _parts(x.action, x.note)) for x in change.logged])
                latest = change.logged[-1].seq
                db.execute("DELETE FROM actions WHERE seq <= ?", (latest - retain,))
                db.execute("INSERT OR REPLACE INTO meta VALUES ('latest', ?)", (str(latest),))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()
        self._unlock()


class DurableAllocator(Allocator):
    """An `Allocator` whose every change is committed to SQLite (`SqliteJournal`) before it is answered."""

    def __init__(self, path: str | os.PathLike[str], policy: Policy | str = "hint",
                 hints: HintSet | HintSource | None = None, synchronous: str = "FULL",
                 clock: Callable[[], float] = time.time, retain: int = RETAIN) -> None:
        journal = SqliteJournal(path, synchronous)
        self.path = journal.path
        try:
            super().__init__(None, policy, hints, journal=journal, clock=clock, retain=retain)
        except BaseException:
            journal.close()
            raise


def _row(a: Allocation) -> tuple:
    """An allocation's fields in `_COLUMNS` order (what `dataclasses.astuple` gives, without its deep copies)."""
    return (a.job_id, a.model, a.node, a.gpu_type, a.gpus, a.cpu_m, a.mem_mib, a.hint_version, a.policy, a.share,
            a.rank, a.gpu_milli, a.device, a.request_cpu_m, a.request_mem_mib, a.part_gpus)


def _parts(action: Action, note: Note | None = None) -> str:
    """An action's allocations before and after as JSON; a note's (no allocations) with what it says third."""
    parts: list = [[_row(a) for a in action.before], [_row(a) for a in action.after]]
    return json.dumps(parts if note is None else [*parts, note.to_dict()])


def _kind(x: LoggedAction) -> str:
    """What an action log row says of `x`: its kind, or `restart` / `preempt` where it is one."""
    return RESTART if x.restart else PREEMPT if x.preempted else x.action.kind


def _logged(seq: int, at: float, kind: str, job_id: str, parts: str) -> LoggedAction:
    """A row of `actions` (kind `restart`: a `start` that is a restart, `preempt`: a `stop` that is a preemption;
    databases before them have none)."""
    before, after, *said = json.loads(parts)
    action = Action("start" if kind == RESTART else "stop" if kind == PREEMPT else kind,  # type: ignore[arg-type]
                    job_id, tuple(Allocation(*a) for a in before), tuple(Allocation(*a) for a in after))
    note = Note(int(said[0]["of"]), str(said[0]["pod"]), str(said[0].get("detail", ""))) if said else None
    return LoggedAction(seq, at, action, kind == RESTART, kind == PREEMPT, note)


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


def read_actions(path: str | os.PathLike[str]) -> list[LoggedAction]:
    """The action log an allocator database holds, oldest first, read without writing to it (the allocator may be
    running); `StateError` for a missing file or one of another schema."""
    path = Path(path)
    if not path.is_file():
        raise StateError(f"{path}: no such allocator database (made by `hetplan serve --db FILE`)")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        if _check_schema(db, path) is None:
            return []
        rows = db.execute("SELECT seq, at, kind, job_id, parts FROM actions ORDER BY seq").fetchall()
    except sqlite3.DatabaseError as exc:
        raise StateError(f"{path}: not an allocator database ({exc})") from None
    finally:
        db.close()
    return _logged_rows(rows, path)


def _logged_rows(rows: list[tuple], path: Path) -> list[LoggedAction]:
    """`_logged` of every row; `StateError` naming the database and the first row that is no action."""
    out = []
    for row in rows:
        try:
            out.append(_logged(*row))
        except (ValueError, TypeError) as exc:  # parts: not UTF-8, not JSON, not allocations
            raise StateError(f"{path}: action {row[0]} is unreadable ({type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:200]})") from None
    return out


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
