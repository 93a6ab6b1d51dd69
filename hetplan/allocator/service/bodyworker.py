"""A worker process for the heaviest request bodies: JSON parsing and pydantic-core validation hold the GIL, so a
32 MiB `/filter` body parsed in a worker *thread* still makes the event loop (every other request) wait 0.2-0.3 s.

`BodyWorker` runs a function on a body in one long-lived process (spawned, never forked from the threaded server;
started on first use), awaited from the event loop without blocking it. The function returns something compact
(small tuples, bytes), not the parsed body. A worker that dies (killed, out of memory) is replaced: the call is
tried once more on a fresh one, and a second death is `WorkerDied` (the caller's clean 4xx). `close` stops it with
the service; a worker whose parent is gone (the service killed with -9) exits by itself within a second.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context, popen_spawn_posix, resource_tracker, synchronize  # noqa: F401
from typing import Any, TypeVar

log = logging.getLogger(__name__)
# popen_spawn_posix, resource_tracker, synchronize: imported with the service, not by the first large body (their
# import, in whatever thread, held the GIL for ~40 ms: the event loop waited)

T = TypeVar("T")

ATTEMPTS = 2
"""Tries of one call: a worker killed under it is replaced and the call sent again once."""

WORKER_NICE = 10
"""How much lower the worker's CPU priority is than the service's: on a busy machine a large body's read waits,
not the event loop (at +10 the worker gets about a tenth of a core the two contend for)."""

PARENT_POLL_S = 0.5
"""How often a worker checks that the service that started it still runs."""


class WorkerDied(Exception):
    """The worker process died under the call on every attempt."""


def _worker_init(parent: int) -> None:
    """Worker initializer: yield the CPU to the service (`WORKER_NICE`), leave SIGINT to it (a terminal's Ctrl-C
    reaches the whole process group; the service stops the worker itself), and exit when the service is gone (its
    pid is no longer the parent's)."""
    try:
        os.nice(WORKER_NICE)
    except OSError:  # not on this platform: the worker runs at the service's priority
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class BodyWorker:
    """One worker process (`ProcessPoolExecutor` of one, `spawn` context), started lazily, restarted after a
    death, stopped by `close`. Safe to use from several event loops and threads."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=_worker_init,
                                                 initargs=(os.getpid(),))
                log.info("body worker process starting")
            return self._pool

    def _submit(self, fn: Callable[..., T], args: tuple[Any, ...]) -> tuple[ProcessPoolExecutor, Future[T]]:
        pool = self._executor()
        try:
            return pool, pool.submit(fn, *args)
        except BrokenProcessPool:  # it died since the last call: the future says so, as for a death under a call
            future: Future[T] = Future()
            future.set_exception(BrokenProcessPool("the worker process died"))
            return pool, future

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the worker process (`fn` and `args` picklable); `WorkerDied` when it died every try."""
        for attempt in range(1, ATTEMPTS + 1):
            # from a thread: making the pool (its queues start multiprocessing's resource tracker) and the first
            # submit (which starts the process) take tens of ms, never on the event loop
            pool, future = await asyncio.to_thread(self._submit, fn, args)
            try:
                return await asyncio.wrap_future(future)
            except BrokenProcessPool:
                log.warning("body worker process died (attempt %d of %d); starting a fresh one", attempt, ATTEMPTS)
                self._discard(pool)
        raise WorkerDied(f"the worker process died {ATTEMPTS} times on this body")

    def pids(self) -> list[int]:
        """The worker's process id(s), [] when none is running (for tests and diagnostics)."""
        with self._lock:
            pool = self._pool
        return sorted(getattr(pool, "_processes", None) or {}) if pool is not None else []

    def close(self) -> None:
        """Stop the worker and wait for it to exit (a later `run` would start a fresh one)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
