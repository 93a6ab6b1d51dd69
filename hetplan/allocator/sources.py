"""Where the allocator's hints come from: a fixed `HintSet`, or a hint store followed as its `LATEST` changes.

`StoreHints` checks the store's `LATEST` at most every `poll_seconds` (a `stat`, cheap), loads a new version
completely, and only then swaps the reference the allocator reads: a decision sees either the old table or the
new one, never a mix, and names the version it used. A version that fails to load, for whatever reason (a `LATEST`
that is no UTF-8 text, a corrupt file...), is logged in one line and skipped (`last_error` says why); the previous
table stays in force.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol

from hetplan.contracts.table import ContractError
from hetplan.hints import HintSet, HintStore

log = logging.getLogger(__name__)


class HintSource(Protocol):
    last_error: str | None
    """Why the newest table could not be loaded (the previous one stays in force); None when it could."""

    def current(self) -> HintSet:
        """The hint table in force now (cheap: called on every decision)."""
        ...

    def reload(self) -> HintSet:
        """Look for a new table now; return the one in force afterwards."""
        ...


class StaticHints:
    """A fixed hint table (the simulator, tests, benchmarks)."""

    def __init__(self, hints: HintSet | None = None) -> None:
        self._hints = hints if hints is not None else HintSet.empty()
        self.last_error: str | None = None  # a fixed table never fails to load

    def current(self) -> HintSet:
        return self._hints

    def reload(self) -> HintSet:
        return self._hints

    def set(self, hints: HintSet) -> None:
        self._hints = hints


class StoreHints:
    """Follow a `HintStore`'s LATEST: hot reload with an atomic swap."""

    def __init__(self, store: HintStore, poll_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.poll_seconds = poll_seconds
        self._clock = clock
        self._hints = HintSet.empty()
        self._signature: tuple[int, int, int] | None = None
        self._checked_at = float("-inf")
        self._lock = threading.Lock()
        self.last_error: str | None = None
        self.reload()

    def current(self) -> HintSet:
        if self._clock() - self._checked_at >= self.poll_seconds:
            self._refresh(force=False)
        return self._hints

    def reload(self) -> HintSet:
        self._refresh(force=True)
        return self._hints

    def _refresh(self, force: bool) -> None:
        if not self._lock.acquire(blocking=force):
            return  # another thread is checking right now; use the table in force
        try:
            self._checked_at = self._clock()
            try:
                st = os.stat(self.store.latest_path)
                signature = (st.st_ino, st.st_mtime_ns, st.st_size)
            except FileNotFoundError:
                signature = None
            if signature == self._signature and not force:
                return
            version = self.store.latest_version()
            if version is None:
                self._signature = signature
                self.last_error = None
                return
            if version != self._hints.version:
                published = self.store.load(version)
                self._hints = HintSet.from_published(published)  # the swap: one reference assignment
                log.info("hints now %s (%d rows)", version, len(self._hints))
            self._signature = signature
            self.last_error = None
        except Exception as exc:  # noqa: BLE001 - a fault barrier: a bad store never fails a decision
            error, self.last_error = self.last_error, one_line(exc)
            if self.last_error != error:  # once per fault, not once per poll
                log.warning("keeping hints %s: cannot load the store's LATEST: %s", self._hints.version,
                            self.last_error)
        finally:
            self._lock.release()


def one_line(exc: Exception) -> str:
    """What went wrong, on one line: a `ContractError`'s problems (each names its file) joined by "; "; any other
    error (not expected from a store: a bug, or a file no check covers) with its type."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = "; ".join(lines) or "no message"
    return text if isinstance(exc, (ContractError, OSError)) else f"{type(exc).__name__}: {text}"
