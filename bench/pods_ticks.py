"""Alibaba's pods on Alibaba's fleet with the rebalancing tick running, through the service's own code (issue 21).

    .venv/bin/python bench/pods_ticks.py [--stretch 3000] [--tick-s 3600] [--limit N] [--no-record]

Fleet and pods: cluster-trace-gpu-v2023 (`bench/data/openb/`, see PROVENANCE.md), each pod's lifetime
multiplied by `--stretch` (a denser cluster, so that re-sizes and moves have something to do). The events run in
trace order through the service's own functions (`service.allocation.allocate_job`, `release_job`,
`rebalance_tick`: what `POST /v1/allocate`, `/v1/release` and the periodic tick call, without HTTP) on a
`DurableAllocator` (SQLite, synchronous=NORMAL) whose clock is the trace's. The tick runs at every `--tick-s` of
trace time while something may change (a tick that changed nothing is not repeated until the next event). Halfway
the allocator is abandoned mid-flight (its connection never closed, as a kill -9 leaves it) and reopened from its
file: the state must be exactly as it was. Counted: moves (`migrate` actions) per whole-GPU pod, overcommitted
nodes (`Cluster.check`), pods below their own request. Pods carry no model name, so no hint applies.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from rich.progress import Progress

from hetplan.allocator import DurableAllocator, Job
from hetplan.allocator.nodes_io import load_nodes
from hetplan.allocator.core import NodeChanges
from hetplan.allocator.replay import pod_events
from hetplan.allocator.service.allocation import allocate_job, rebalance_tick, release_job
from hetplan.allocator.service.context import ServiceContext
from hetplan.allocator.service.settings import ServiceSettings

from common import machine, record

DATA = Path(__file__).with_name("data") / "openb"
NODES = DATA / "openb_node_list_gpu_node.csv"
PODS = DATA / "openb_pod_list_default.csv"


def run(stretch: float, tick_s: float, limit: int | None, root: Path, hinted: bool) -> dict:
    events = pod_events(PODS, stretch=stretch)[:limit]
    hints = None
    if hinted:  # each pod gets a model of the DERIVED hint table, drawn at random (seeded): synthetic
        from allocator import derived_hints
        from hetplan.hints import HintSet
        frame = derived_hints()
        hints = HintSet.from_frame(frame)
        models = sorted(set(frame["model"]))
        rng = random.Random(0)
        named = {e.body["job_id"]: rng.choice(models) for e in events if not e.release}
        events = [e if e.release else replace(e, body={**e.body, "model": named[e.body["job_id"]]}) for e in events]
    clock = [0.0]
    db = root / "ticks.db"

    def open_allocator() -> DurableAllocator:
        return DurableAllocator(db, "hint", hints, synchronous="NORMAL", clock=lambda: clock[0])

    ctx = ServiceContext(ServiceSettings(tick_seconds=0))
    ctx.allocator = open_allocator()
    ctx.allocator.change_nodes(NodeChanges(upsert=load_nodes(NODES)))
    moves: Counter[str] = Counter()
    counts = Counter()
    below: list[str] = []
    problems: list[str] = []
    kill_at, lost = len(events) // 2, None
    next_tick, idle = tick_s, False
    t0 = time.perf_counter()
    with Progress(transient=True) as bar:
        task = bar.add_task(f"{len(events):,} pod events, ticks every {tick_s:g} s", total=len(events))
        for k, event in enumerate(events):
            while next_tick <= event.at and not idle:
                clock[0] = next_tick
                actions = rebalance_tick(ctx)
                counts["ticks"] += 1
                for a in actions:
                    counts[a.kind] += 1
                    if a.kind == "migrate":
                        moves[a.job_id] += 1
                        counts["across types"] += a.before[0].gpu_type != a.after[0].gpu_type
                idle = not actions
                next_tick += tick_s
            if idle:  # nothing changed since the last tick: the next one that can change anything follows this event
                next_tick = max(next_tick, event.at - event.at % tick_s + tick_s)
            clock[0] = event.at
            body = event.body
            if event.release:
                _, actions = release_job(ctx, body["job_id"])
            else:
                job = Job.request(body["job_id"], body["model"], body["num_gpus"], body["cpus"], body["mem_gb"])
                decision, _, parts, actions = allocate_job(ctx, job)
                counts["asked"] += 1
                if parts:
                    counts["placed"] += 1
                    counts["placed whole"] += job.whole
                    if sum(p.cpu_m for p in parts) < (job.cpu_m or 0) or sum(p.mem_mib for p in parts) < (job.mem_mib or 0):
                        below.append(job.job_id)
            for a in actions:
                counts[a.kind] += 1
            idle = False
            if k % 1000 == 0 or k == len(events) - 1:
                problems += ctx.allocator.cluster.check()
            if k == kill_at:  # abandon it mid-flight and reopen from the file
                before = ctx.allocator.cluster.snapshot(), ctx.allocator.log.latest
                ctx.allocator = open_allocator()
                lost = (ctx.allocator.cluster.snapshot(), ctx.allocator.log.latest) != before
            bar.update(task, completed=k + 1)
    whole = sum(1 for e in events if not e.release and e.body["num_gpus"] >= 1)
    per_pod = sorted(moves.values())
    ctx.allocator.close()
    return {"events": len(events), "whole": whole, "moves": sum(per_pod), "moved": len(per_pod),
            "max": max(per_pod, default=0), "p99": per_pod[int(0.99 * (len(per_pod) - 1))] if per_pod else 0,
            "counts": counts, "below": len(below), "problems": problems, "lost": lost,
            "wall_s": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stretch", type=float, default=3000.0)
    parser.add_argument("--tick-s", type=float, default=3600.0)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--hinted", action="store_true", help="give each pod a model of the derived hint table "
                        "(seeded draw; synthetic) and serve those hints, so that moves can gain something")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = run(args.stretch, args.tick_s, args.limit, Path(tmp), args.hinted)
    c = r["counts"]
    lines = [f"\n## Alibaba's pods with the tick running, through the service's code (`bench/pods_ticks.py`, issue 21), "
             f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC\n",
             f"Run: `.venv/bin/python bench/pods_ticks.py --stretch {args.stretch:g} --tick-s {args.tick_s:g}"
             f"{f' --limit {args.limit}' if args.limit else ''}{' --hinted' if args.hinted else ''}`; {machine()}; "
             f"{r['wall_s']:.0f} s. Pods' lifetimes x{args.stretch:g} (**synthetic density**; the trace's own "
             "arrivals), " + ("each pod a model of the **derived** hint table drawn at random (seeded; **synthetic**), "
                              "those hints served" if args.hinted else "no hints (pods carry no model)") + ".\n",
             "| pod events | pods asked / placed | whole-GPU pods | moves | moves per whole-GPU pod | pods moved | "
             "most moves of one pod (p99 / max) | re-sizes | ticks | overcommitted checks | below own request | "
             "state lost on kill and reopen |",
             "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
             f"| {r['events']:,} | {c['asked']:,} / {c['placed']:,} | {r['whole']:,} | {r['moves']:,} | "
             f"{r['moves'] / max(r['whole'], 1):.3f} | {r['moved']:,} | {r['p99']} / {r['max']} | {c['resize']:,} | "
             f"{c['ticks']:,} | {len(r['problems'])} | {r['below']} | {'yes' if r['lost'] else 'no'} |", ""]
    print("\n".join(lines))
    if r["problems"]:
        print("problems:", r["problems"][:5])
    if not args.no_record:
        record(lines)


if __name__ == "__main__":
    main()
