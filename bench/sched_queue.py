"""The scheduler's queue under load, in process: 1,000 nodes, 10,000 jobs waiting (synthetic jobs, derived hints).

Measures what issue 30 targets for the service's loop: a submission's latency with 10,000 jobs queued (p50/p99),
a release that starts the head of the queue, and one preemptive round (LAS) over the whole queue, for the
placement-only `first-fit` and the co-adaptive `hint` policies. In process (no HTTP, no SQLite fsync): the loop's own
cost; the HTTP path adds the service's (bench/hostile.py). Run: `PYTHONPATH=.:bench python bench/sched_queue.py`.
"""

from __future__ import annotations

import random
import statistics
import time
from datetime import datetime, timezone

from common import commit, machine, record

from hetplan.allocator import Allocator, Node
from hetplan.allocator.spec import Job
from hetplan.hints import HintSet
from hetplan.hints.index import HintEntry
from hetplan.scheduler.online import OnlineScheduler

MODELS = [f"m{i}" for i in range(12)]
TYPES = ["V100", "T4", "A100"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(policy: str, nodes: int = 1000, queued: int = 10_000) -> dict[str, float]:
    rng = random.Random(1)
    clock = Clock()
    hints = HintSet("bench", {(m, g): tuple(HintEntry(t, r + 1, 4.0 + 2 * r, 30.0 + 10 * r, 1.0 + r)
                                           for r, t in enumerate(rng.sample(TYPES, 3)))
                             for m in MODELS for g in (1, 2, 4, 8)})
    cluster = [Node(f"n{i}", TYPES[i % 3], 8, 64, 512) for i in range(nodes)]
    s = OnlineScheduler(Allocator(cluster, policy, hints, clock=clock), "las")
    k = 0
    while s.allocator.cluster.free_gpus_total() > 0:  # fill the cluster
        s.submit(Job(f"r{k}", rng.choice(MODELS), rng.choice([1, 2, 4, 8])))
        k += 1
    for i in range(queued):
        clock.now += 0.01
        s.submit(Job(f"q{i}", rng.choice(MODELS), rng.choice([1, 2, 4, 8])))
    waits = len(s.loop.queue)
    submit_ms = []
    for i in range(500):
        clock.now += 0.01
        t = time.perf_counter()
        s.submit(Job(f"x{i}", rng.choice(MODELS), rng.choice([1, 2, 4, 8])))
        submit_ms.append((time.perf_counter() - t) * 1000)
    release_ms = []
    for job_id in list(s.allocator.running())[:200]:
        t = time.perf_counter()
        s.release(job_id)
        release_ms.append((time.perf_counter() - t) * 1000)
    clock.now += 600.0
    t = time.perf_counter()
    s.round()
    round_ms = (time.perf_counter() - t) * 1000
    submit_ms.sort()
    release_ms.sort()
    return {"waiting": waits, "submit_p50": statistics.median(submit_ms), "submit_p99": submit_ms[494],
            "release_p50": statistics.median(release_ms), "release_p99": release_ms[197], "round": round_ms,
            "preempted": sum(1 for x in s.allocator.log.entries()[-5000:] if x.preempted)}


def main() -> None:
    lines = [f"\n## The scheduler's queue under load (bench/sched_queue.py), {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
             "", f"Machine: {machine()}; commit {commit()}. In process, synthetic jobs and hints (derived), 1,000 "
             "nodes of 8 GPUs, the cluster full and 10,000 jobs waiting (LAS).", "",
             "| policy | waiting | submit p50 ms | submit p99 ms | release p50 ms | release p99 ms | one round ms | "
             "preempted in the round |", "|---|---|---|---|---|---|---|---|"]
    for policy in ("first-fit", "hint"):
        r = run(policy)
        print(policy, r)
        lines.append(f"| {policy} | {r['waiting']:,} | {r['submit_p50']:.2f} | {r['submit_p99']:.2f} | "
                     f"{r['release_p50']:.2f} | {r['release_p99']:.2f} | {r['round']:.0f} | {r['preempted']} |")
    record(lines + [""])


if __name__ == "__main__":
    main()
