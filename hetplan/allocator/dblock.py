"""One process per allocator database: an exclusive `flock` on `<db>.lock`, held while the database is open.

Two processes writing one database number their actions from the same counter, so the second one's every commit
fails (a duplicate `actions.seq`) while it serves the state it read at start. `DatabaseLock` refuses it instead:
the first process to open a database locks `<db>.lock` and writes its pid there; another process gets
`DatabaseInUse` naming the database and that pid. The operating system releases the lock when the holder exits,
however it exits (`kill -9` included), so a stale lock file never blocks a restart.

Within one process the lock is counted, not exclusive: `hetplan serve` holds it for its whole life while the
allocator it opens (`SqliteJournal`) takes it again; it is released when the last holder lets go.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from hetplan.allocator.cluster import StateError

_held: dict[str, list[int]] = {}  # the lock file's real path -> [its descriptor, holders in this process]
_guard = threading.Lock()


class DatabaseInUse(StateError):
    """Another process holds the database's lock (`DatabaseLock`)."""


def lock_path(db: str | os.PathLike[str]) -> Path:
    """The lock file of database `db`: `<db>.lock`, next to it."""
    db = Path(db)
    return db.with_name(db.name + ".lock")


class DatabaseLock:
    """Holds database `db`'s lock until `release` (or the process ends); `DatabaseInUse` if another process does."""

    def __init__(self, db: str | os.PathLike[str]) -> None:
        self.db = Path(db)
        self.path = lock_path(self.db)
        self._key: str | None = os.path.realpath(self.path)
        with _guard:
            entry = _held.get(self._key)
            if entry is None:
                entry = _held[self._key] = [_acquire(self.db, self.path), 0]
            entry[1] += 1

    def release(self) -> None:
        """Let go of the lock (once; the file stays: removing it would race a process that just opened it)."""
        with _guard:
            if self._key is None:
                return
            entry = _held[self._key]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[self._key]
                os.close(entry[0])  # closing the descriptor releases the flock
            self._key = None

    def __enter__(self) -> DatabaseLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _acquire(db: Path, path: Path) -> int:
    """Open and lock `path` (without waiting), write this process's pid in it; its descriptor."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise DatabaseInUse(f"{db} is in use by another process (pid {holder}, lock {path}): one hetplan serve per "
                            "database; stop that one or use another --db") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _holder(fd: int) -> str:
    """The pid the lock's holder wrote ("unknown" while it has not yet, or if the file holds anything else)."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return text if text.isascii() and text.isdigit() else "unknown"
