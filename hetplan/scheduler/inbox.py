"""Submissions taken while the scheduler is busy: a durable first-in first-out file, so no request waits for a round.

A round over 10,000 queued jobs on 1,000 nodes holds the allocator's lock for 0.1-0.5 s (bench/RESULTS.md, "The
service's queue over HTTP"). A submission that cannot take the lock within a few milliseconds is written here instead
(its own SQLite file, `<db>-inbox`, with its own connection and lock, committed before it is answered) and answered
`queued` (why `busy`). Whoever takes the allocator's lock next (`OnlineScheduler`) submits what waits here first, in
the order it came and with the time it came (so a job's place in a FIFO or LAS order is the one it would have had),
then deletes it. A restart does the same before anything else, so a `kill -9` between the answer and the hand-over
loses nothing: a submission handed over twice (killed between the journal's commit and the delete here) is
recognised by its job id and changes nothing the second time.

A submission the scheduler refuses when it is handed over (no node could ever hold it) stays here as `rejected`,
with why (logged), until it is asked for again: then it is dropped and judged anew under the lock, so the answer is
the cluster's of now, never a stale refusal.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from hetplan.allocator.spec import Job

_SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL UNIQUE,
                                  arrival REAL NOT NULL, job TEXT NOT NULL, rejected TEXT);
"""


@dataclass(frozen=True)
class Parked:
    """A submission waiting to be handed over (`rejected`: refused when it was, with why)."""

    seq: int
    job: Job
    arrival: float
    rejected: str | None = None


def inbox_path(db: str | os.PathLike[str]) -> Path:
    """The inbox of allocator database `db`: `<db>-inbox`, next to it (covered by the database's lock)."""
    db = Path(db)
    return db.with_name(db.name + "-inbox")


class Inbox:
    """The durable first-in first-out of parked submissions (module docstring). Thread-safe: one short lock per
    call, never the allocator's."""

    def __init__(self, path: str | os.PathLike[str], synchronous: str = "FULL") -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._db.executescript(_SCHEMA)
        self._waiting = self._count()

    def put(self, job: Job, arrival: float) -> Parked:
        """Park `job` (committed when this returns). A known job id answers what is parked under it: the caller
        compares the requests."""
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO inbox (job_id, arrival, job) VALUES (?, ?, ?)",
                             (job.job_id, arrival, json.dumps(asdict(job))))
            self._waiting = self._count()
            found = self._get(job.job_id)
            assert found is not None
            return found

    def get(self, job_id: str) -> Parked | None:
        with self._lock:
            return self._get(job_id)

    def pending(self) -> list[Parked]:
        """The submissions not handed over yet, first come first."""
        if not self._waiting:  # read without the lock: a put that races it is handed over at the next call
            return []
        with self._lock:
            rows = self._db.execute("SELECT seq, job_id, arrival, job, rejected FROM inbox WHERE rejected IS NULL "
                                    "ORDER BY seq").fetchall()
        return [_parked(row) for row in rows]

    def handed_over(self, seq: int, rejected: str | None = None) -> None:
        """`seq` is the scheduler's now (deleted), or was refused (kept, with why)."""
        with self._lock:
            if rejected is None:
                self._db.execute("DELETE FROM inbox WHERE seq = ?", (seq,))
            else:
                self._db.execute("UPDATE inbox SET rejected = ? WHERE seq = ?", (rejected, seq))
            self._waiting = self._count()

    def forget(self, job_id: str) -> None:
        """Drop what is kept under `job_id` (a refused submission asked again: it is judged anew)."""
        with self._lock:
            self._db.execute("DELETE FROM inbox WHERE job_id = ?", (job_id,))
            self._waiting = self._count()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM inbox WHERE rejected IS NULL").fetchone()[0])

    def _get(self, job_id: str) -> Parked | None:
        row = self._db.execute("SELECT seq, job_id, arrival, job, rejected FROM inbox WHERE job_id = ?",
                               (job_id,)).fetchone()
        return None if row is None else _parked(row)


def _parked(row: tuple) -> Parked:
    seq, _, arrival, job, rejected = row
    return Parked(int(seq), Job(**json.loads(job)), float(arrival), rejected)
