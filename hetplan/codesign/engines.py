"""Where replay runs execute: one process, a local pool of spawned processes, or a Dask cluster.

A replay run is a pure function of its inputs (`Runs.summary`: candidate i on draw d -> a summary dict), so an
engine only fans the runs out and collects the summaries; every engine returns the same dicts, bit for bit.

- `Serial`: one after the other in this process;
- `ProcessPool(workers)`: the default, `workers` spawned processes on this machine (`START_METHOD`);
- `Dask(address)`: the workers of a Dask distributed scheduler (`tcp://host:8786`), or a `LocalCluster`
  started for the call when no address is given. The runs' inputs are scattered to every worker once.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from hetplan.progress import Progress

log = logging.getLogger(__name__)

Run = tuple[int, int]
ENGINES = ("local", "dask")

START_METHOD = "spawn"
"""How replay workers start. Not "fork": replays run inside Airflow tasks, whose runner holds threads (its
supervisor's comms, logging, heartbeats) that a forked child inherits mid-state and can deadlock on. A spawned
worker is a fresh interpreter that imports hetplan and unpickles each call's runs once (`_summary`)."""


class Runs(Protocol):
    """What an engine runs: `summary(run)` is a pure function of the run and the object's (picklable) state."""

    def summary(self, run: Run) -> dict: ...

    def label(self, run: Run) -> str: ...


class Engine(Protocol):
    def summaries(self, runs: Runs, which: Sequence[Run], progress: Progress | None = None) -> dict[Run, dict]:
        """Each run's summary, keyed by run."""
        ...


def usable_cpus() -> int:
    """The CPUs this process may run on: the default number of replay workers."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class Serial:
    """Every run in this process, one after the other."""

    def summaries(self, runs: Runs, which: Sequence[Run], progress: Progress | None = None) -> dict[Run, dict]:
        out = {}
        for k, run in enumerate(which):
            if progress:
                progress(k, len(which), runs.label(run))
            out[run] = runs.summary(run)
        return out


class ProcessPool:
    """Runs in up to `workers` spawned processes (default: the usable CPUs); only the summaries come back. One
    worker (or one run) runs in this process. Each call's `runs` are pickled once and unpickled once per worker.

    Held open (`with ProcessPool() as engine:`, or `held_open`), the workers started by the first call (or by
    `warm`, to get ready while the caller works on) serve every call until the block ends; otherwise each call
    starts its own (a spawned worker takes about 2.5 s to be ready on 2 cores)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._held = 0  # blocks holding it open (nested: the outermost closes it)

    def __repr__(self) -> str:
        return f"ProcessPool(workers={self.workers})"

    def __enter__(self) -> ProcessPool:
        self._held += 1
        return self

    def warm(self) -> None:
        """Start a held pool's workers now: they import hetplan while the caller goes on (the MILP proposing)."""
        if self._held and self._pool is None and self._count() > 1:
            self._pool = self._start(self._count())

    def __exit__(self, *exc: object) -> None:
        self._held -= 1
        if self._held == 0 and self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    @property
    def started(self) -> bool:
        """Whether a held pool's workers are up (a call costs them no start)."""
        return self._pool is not None

    def _count(self) -> int:
        return usable_cpus() if self.workers is None else self.workers

    @staticmethod
    def _start(workers: int) -> ProcessPoolExecutor:
        pool = ProcessPoolExecutor(workers, mp_context=mp.get_context(START_METHOD), initializer=_exit_with,
                                   initargs=(os.getpid(),))
        for _ in range(workers):  # a spawning pool starts a worker per task submitted while none is idle: all now
            pool.submit(os.getpid)
        return pool

    def summaries(self, runs: Runs, which: Sequence[Run], progress: Progress | None = None) -> dict[Run, dict]:
        workers = min(self._count(), len(which))
        if workers <= 1:
            return Serial().summaries(runs, which, progress)
        shared = (uuid.uuid4().hex, pickle.dumps(runs, protocol=pickle.HIGHEST_PROTOCOL))
        if self._held:
            self.warm()
            assert self._pool is not None  # more than one worker: `warm` started them
            return _collect(self._pool, shared, runs, which, progress)
        with self._start(workers) as pool:
            return _collect(pool, shared, runs, which, progress)


def _collect(pool: ProcessPoolExecutor, shared: tuple[str, bytes], runs: Runs, which: Sequence[Run],
             progress: Progress | None) -> dict[Run, dict]:
    futures = {pool.submit(_summary, shared, run): run for run in which}
    try:
        for done, future in enumerate(as_completed(futures)):
            if progress:
                progress(done + 1, len(which), runs.label(futures[future]))
        return {run: future.result() for future, run in futures.items()}
    finally:
        for future in futures:
            future.cancel()  # after a failed run, the rest are not left to run in a pool held open


_ADOPTED: tuple[str, Runs] | None = None
"""A pool worker's runs of the latest call it served: (the call's token, the runs unpickled)."""


def _exit_with(parent: int, every_s: float = 1.0) -> None:
    """End this worker when `parent` is gone (killed, say): a replay can run for minutes, and a pool's workers
    otherwise finish it for nobody."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _summary(shared: tuple[str, bytes], run: Run) -> dict:
    global _ADOPTED
    token, payload = shared
    if _ADOPTED is None or _ADOPTED[0] != token:
        _ADOPTED = (token, pickle.loads(payload))
    return _ADOPTED[1].summary(run)


@dataclass(frozen=True)
class Dask:
    """Runs on a Dask distributed cluster: the scheduler at `address`, or, without one, a `LocalCluster` on
    127.0.0.1 with `workers` single-threaded worker processes (`processes=False`: worker threads in this
    process, which the runs still reach through the scheduler)."""

    address: str | None = None
    workers: int | None = None
    processes: bool = True

    def summaries(self, runs: Runs, which: Sequence[Run], progress: Progress | None = None) -> dict[Run, dict]:
        from distributed import Client, LocalCluster, as_completed as completed

        if self.address:
            client, cluster = Client(self.address), None
        else:
            workers = usable_cpus() if self.workers is None else self.workers
            where = {"host": "127.0.0.1"} if self.processes else {}  # threads talk in process (inproc://)
            cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=self.processes,
                                   dashboard_address=None, **where)
            client = Client(cluster)
        try:
            shared = client.scatter(runs, broadcast=True)
            futures = {client.submit(_run_summary, shared, run, key=f"hetplan-replay-{run[0]}-{run[1]}-"
                                     f"{id(runs):x}", pure=False): run for run in which}
            for done, future in enumerate(completed(list(futures))):
                if progress:
                    progress(done + 1, len(which), runs.label(futures[future]))
            return {run: future.result() for future, run in futures.items()}
        finally:
            client.close()
            if cluster is not None:
                cluster.close()


def _run_summary(runs: Runs, run: Run) -> dict:
    return runs.summary(run)


@contextmanager
def held_open(engine: Engine, warm: bool = False) -> Iterator[Engine]:
    """`engine` held open for a block of calls where it can be (a process pool: its workers started once, now if
    `warm`)."""
    if not isinstance(engine, ProcessPool):
        yield engine
        return
    with engine:
        if warm:
            engine.warm()
        yield engine


def engine_from(name: str = "local", *, address: str | None = None, workers: int | None = None) -> Engine:
    """The engine a CLI option names: `local` (a process pool of `workers`) or `dask` (at `address`, or a
    LocalCluster of `workers` processes); ValueError for anything else."""
    if name == "local":
        if address:
            raise ValueError("--dask-address needs --engine dask")
        return ProcessPool(workers)
    if name == "dask":
        return Dask(address, workers)
    raise ValueError(f"unknown replay engine {name!r}: one of {', '.join(ENGINES)}")
