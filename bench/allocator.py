"""Benchmarks of the online allocator (issue 6). Run from the repository root:

    .venv/bin/python bench/allocator.py [inprocess|placement|http|all] [--repeats 5]

- inprocess: decisions per second on a 10,000-node cluster, steady-state churn at ~85 % GPU occupancy
  (allocate a new job, release a random running one), per policy; plus the SQLite-backed `DurableAllocator`.
- placement: hint-based vs GPU-proportional vs first-fit placement rate on a 1,000-node cluster: Poisson
  arrivals, exponential durations, no queue (a job that does not fit is counted as not placed).
- http: `hetplan serve` on 127.0.0.1 (1,000 nodes, SQLite synchronous=FULL), an open-loop client at a fixed
  rate (500 requests/s, 5,000 requests, alternating allocate and release) over keep-alive connections;
  latency from the request's scheduled send time to the last byte of the answer (so queueing counts); the
  co-adaptive policy's rebalancing tick runs every `--tick` seconds (1 by default) all the while, and every
  release re-sizes the freed node's jobs.

Inputs are real where they can be: node shapes from the shipped catalog (AWS p3, p4d, g4dn, g5, g6), the job
mix (models, GPUs per job) from Gavel's Philly-derived trace. The hint table is DERIVED from hetplan's derived
profile set (knee = fewest cores/RAM within 5 % of the best throughput per GPU type; types ranked by
throughput per dollar); classes the profiles lack (recommendation, lm, cyclegan, a3c) have no hints and fall
back to the GPU-proportional share, as they would in production.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from hetplan.allocator import Allocation, Allocator, DurableAllocator, Job, Node, NodeChanges
from hetplan.catalog import load_default_catalog
from hetplan.contracts import Plan
from hetplan.hints import HintSet, HintStore
from hetplan.reference import default_profiles
from hetplan.resources import upstream_path
from hetplan.traces import import_trace

from common import served

SHAPES = {  # catalog shape -> share of the nodes
    "aws:p3.16xlarge": 0.25, "aws:p3.8xlarge": 0.10, "aws:p4d.24xlarge": 0.15, "aws:g4dn.12xlarge": 0.25,
    "aws:g5.12xlarge": 0.15, "aws:g6.12xlarge": 0.10,
}
GPU_COUNTS = (1, 2, 4, 8)


def cluster_nodes(n: int, seed: int = 0) -> list[Node]:
    catalog = load_default_catalog().set_index("name")
    rng = random.Random(seed)
    names = list(SHAPES)
    picks = rng.choices(names, weights=[SHAPES[s] for s in names], k=n)
    nodes = []
    for i, shape in enumerate(picks):
        row = catalog.loc[shape]
        nodes.append(Node(f"node-{i:05d}", str(row["gpu_type"]), int(row["gpus"]), float(row["vcpus"]),
                          float(row["mem_gb"]), {"shape": shape}))
    return nodes


def job_mix() -> pd.DataFrame:
    trace = import_trace(upstream_path("traces", "gavel_philly_0e4a51.trace"), "gavel").trace
    return trace[["model", "num_gpus"]].astype({"num_gpus": int}).reset_index(drop=True)


def derived_hints(plan_id: str = "bench-derived") -> pd.DataFrame:
    """A hint table derived from the derived profiles (see the module docstring); labelled as such."""
    profiles = default_profiles()
    catalog = load_default_catalog().set_index("name")
    price_per_gpu = {str(catalog.loc[s, "gpu_type"]): float(catalog.loc[s, "price_per_hour"])
                     / int(catalog.loc[s, "gpus"]) for s in SHAPES}
    mix = job_mix()
    rows = []
    for model in sorted(set(mix["model"]) & set(profiles["model"])):
        per_type = []
        for gpu_type, price in price_per_gpu.items():
            p = profiles[(profiles["model"] == model) & (profiles["gpu_type"] == gpu_type)]
            if p.empty:
                continue
            best = p["throughput"].max()
            knee = p[p["throughput"] >= 0.95 * best].sort_values(["cpus_per_gpu", "mem_gb_per_gpu"]).iloc[0]
            per_type.append((gpu_type, float(knee["cpus_per_gpu"]), float(knee["mem_gb_per_gpu"]),
                             float(knee["throughput"]), float(knee["throughput"]) / price))
        per_type.sort(key=lambda t: -t[4])
        top = max(t[3] for t in per_type)
        for gpus in GPU_COUNTS:
            for rank, (gpu_type, cpus, mem, tput, per_dollar) in enumerate(per_type, start=1):
                rows.append({"model": model, "num_gpus": gpus, "gpu_type": gpu_type, "rank": rank,
                             "cpus_per_gpu": cpus, "mem_gb_per_gpu": mem, "expected_throughput": tput * gpus,
                             "normalized_throughput": tput / top, "throughput_per_dollar": per_dollar,
                             "plan_id": plan_id})
    return pd.DataFrame(rows)


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "nproc": str(os.cpu_count()),
            "cpu": model, "python": platform.python_version()}


# ------------------------------------------------------------------ in-process


def churn(alloc, jobs: pd.DataFrame, warm: int, steps: int, seed: int) -> tuple[float, dict[str, int]]:
    """Fill to ~85 % of GPUs, then `steps` x (allocate one, release one). Returns allocate decisions/s and outcomes."""
    rng = random.Random(seed)
    models, gpus = jobs["model"].tolist(), jobs["num_gpus"].tolist()
    total_gpus = sum(n.gpus for n in alloc.cluster.nodes())
    running: list[str] = []
    used = 0
    i = 0
    while used < 0.85 * total_gpus and i < warm:
        k = rng.randrange(len(models))
        d = alloc.allocate(Job(f"w{i}", models[k], gpus[k]))
        i += 1
        if isinstance(d, Allocation):
            running.append(d.job_id)
            used += d.gpus
    requests = [Job(f"s{j}", models[k], gpus[k]) for j, k in enumerate(rng.choices(range(len(models)), k=steps))]
    victims = [rng.random() for _ in range(steps)]
    outcomes = {"allocated": 0, "rejected": 0}
    spent = 0.0
    clock = time.perf_counter
    for job, r in zip(requests, victims):
        t0 = clock()
        d = alloc.allocate(job)
        spent += clock() - t0
        if isinstance(d, Allocation):
            outcomes["allocated"] += 1
            running.append(d.job_id)
        else:
            outcomes["rejected"] += 1
        if running:
            idx = int(r * len(running))
            running[idx], running[-1] = running[-1], running[idx]
            alloc.release(running.pop())
    return steps / spent, outcomes


def bench_inprocess(repeats: int, policies: tuple[str, ...] = ("hint", "proportional", "first-fit", "durable")
                    ) -> list[str]:
    nodes = cluster_nodes(10_000)
    jobs = job_mix()
    hints = HintSet.from_frame(derived_hints())
    lines = [f"| policy | cluster | decisions/s (median of {repeats}) | min – max | "
             "allocated / rejected in the measured loop |", "|---|---|---:|---:|---|"]
    for policy, steps in [("hint", 50_000), ("proportional", 50_000), ("first-fit", 5_000)]:
        if policy not in policies:
            continue
        rates, outcome = [], {}
        for r in range(repeats):
            alloc = Allocator(nodes, policy, hints)
            rate, outcome = churn(alloc, jobs, warm=60_000, steps=steps, seed=r)
            assert alloc.cluster.check() == []
            rates.append(rate)
        lines.append(f"| {policy} | 10,000 nodes, in memory | {statistics.median(rates):,.0f} | "
                     f"{min(rates):,.0f} – {max(rates):,.0f} | {outcome['allocated']:,} / {outcome['rejected']:,} |")
        print(lines[-1], flush=True)
    if "durable" not in policies:
        return lines
    rates = []
    for r in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            durable = DurableAllocator(Path(tmp) / "b.db", "hint", hints)
            durable.change_nodes(NodeChanges(upsert=nodes))
            rate, outcome = churn(durable, jobs, warm=60_000, steps=3_000, seed=r)
            durable.close()
            rates.append(rate)
    lines.append(f"| hint | 10,000 nodes, DurableAllocator (SQLite WAL, synchronous=FULL; each allocate and release "
                 f"commits) | {statistics.median(rates):,.0f} | {min(rates):,.0f} – {max(rates):,.0f} | "
                 f"{outcome['allocated']:,} / {outcome['rejected']:,} |")
    print(lines[-1], flush=True)
    return lines


# ------------------------------------------------------------------ placement rate


class Throughput:
    """Per-GPU throughput of a model at a share, read off the DERIVED profiles (step function, grid point below),
    normalised by the model's best throughput on any GPU type of the cluster. None for unprofiled models."""

    def __init__(self, gpu_types: set[str]) -> None:
        p = default_profiles()
        p = p[p["gpu_type"].isin(gpu_types)]
        self.grid = {key: g[["cpus_per_gpu", "mem_gb_per_gpu", "throughput"]].to_numpy()
                     for key, g in p.groupby(["model", "gpu_type"])}
        self.best = p.groupby("model")["throughput"].max().to_dict()

    def __call__(self, a: Allocation) -> float | None:
        grid = self.grid.get((a.model, a.gpu_type))
        if grid is None:
            return None
        cpus, mem = a.cpus / a.gpus, a.mem_gb / a.gpus
        ok = (grid[:, 0] <= cpus + 1e-9) & (grid[:, 1] <= mem + 1e-9)
        value = grid[ok, 2].max() if ok.any() else grid[:, 2].min()
        return float(value) / self.best[a.model]


def simulate(policy: str, nodes: list[Node], hints: HintSet, jobs: pd.DataFrame, load: float, arrivals: int,
             seed: int) -> dict[str, float]:
    """Poisson arrivals, exponential durations (mean 1), offered GPU load `load` x capacity; no queue."""
    import heapq

    rng = np.random.default_rng(seed)
    alloc = Allocator(nodes, policy, hints)
    throughput = Throughput({n.gpu_type for n in nodes})
    capacity = sum(n.gpus for n in nodes)
    mean_gpus = float(jobs["num_gpus"].mean())
    rate = load * capacity / mean_gpus  # arrivals per unit time so that GPU demand = load x capacity
    picks = rng.integers(0, len(jobs), arrivals)
    gaps = rng.exponential(1 / rate, arrivals)
    durations = rng.exponential(1.0, arrivals)
    models, gpus = jobs["model"].tolist(), jobs["num_gpus"].tolist()
    ends: list[tuple[float, str]] = []
    now = 0.0
    placed = placed_gpus = asked_gpus = hinted = 0
    profiled: list[float] = []
    for i in range(arrivals):
        now += gaps[i]
        while ends and ends[0][0] <= now:
            alloc.release(heapq.heappop(ends)[1])
        k = picks[i]
        d = alloc.allocate(Job(f"j{i}", models[k], gpus[k]))
        asked_gpus += gpus[k]
        if isinstance(d, Allocation):
            placed += 1
            placed_gpus += d.gpus
            hinted += d.share == "hinted"
            value = throughput(d)
            if value is not None:
                profiled.append(value)
            heapq.heappush(ends, (now + durations[i], d.job_id))
    assert alloc.cluster.check() == []
    return {"placed": placed / arrivals, "placed_gpus": placed_gpus / asked_gpus, "hinted": hinted / max(placed, 1),
            "throughput": float(np.mean(profiled)) if profiled else 0.0}


def bench_placement(repeats: int) -> list[str]:
    nodes = cluster_nodes(1_000, seed=1)
    jobs = job_mix()
    hints = HintSet.from_frame(derived_hints())
    lines = ["| offered GPU load | policy | jobs placed | GPUs placed | placed jobs with the full hinted share | "
             "normalised per-GPU throughput of placed profiled jobs (derived) |",
             "|---:|---|---:|---:|---:|---:|"]
    for load in (0.8, 1.0, 1.2):
        for policy in ("hint", "proportional", "first-fit"):
            runs = [simulate(policy, nodes, hints, jobs, load, 20_000, seed) for seed in range(repeats)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            lines.append(f"| {load:.1f} | {policy} | {med['placed']:.1%} | {med['placed_gpus']:.1%} | "
                         f"{med['hinted']:.1%} | {med['throughput']:.3f} |")
            print(lines[-1], flush=True)
    return lines


# ------------------------------------------------------------------ HTTP


async def _load(port: int, total: int, rate: float, connections: int, jobs: pd.DataFrame) -> list[float]:
    pool: asyncio.Queue = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    rng = random.Random(7)
    running: list[str] = []
    latencies: list[float] = []
    models, gpus = jobs["model"].tolist(), jobs["num_gpus"].tolist()

    async def one(i: int, due: float) -> None:
        if i % 2 == 0 or not running:
            k = rng.randrange(len(models))
            path, body = "/v1/allocate", {"job_id": f"h{i}", "model": models[k], "num_gpus": gpus[k]}
        else:
            job = running.pop(rng.randrange(len(running)))
            path, body = "/v1/release", {"job_id": job}
        payload = json.dumps(body).encode()
        reader, writer = await pool.get()
        try:
            writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: " + str(len(payload)).encode()
                         + b"\r\n\r\n" + payload)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            answer = json.loads(await reader.readexactly(length))
        finally:
            pool.put_nowait((reader, writer))
        latencies.append(time.perf_counter() - due)
        if path == "/v1/allocate" and answer.get("status") == "allocated":
            running.append(body["job_id"])

    start = time.perf_counter() + 0.05
    tasks = []
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    while not pool.empty():
        _, writer = pool.get_nowait()
        writer.close()
    return latencies


def bench_http(repeats: int, rate: float = 500, total: int = 5_000) -> list[str]:
    jobs = job_mix()
    lines = ["| SQLite synchronous | run | requests | target rate | achieved rate | p50 | p90 | p99 | max |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = root / "store"
        plan = Plan(plan_id="bench-derived", created_at=datetime.now(timezone.utc), budget_per_hour=None,
                    cost_per_hour=0.0, node_counts={}, objective=0.0, lp_bound=0.0, gap=0.0, solver="none",
                    solve_seconds=0.0)
        HintStore(store).publish(plan, derived_hints())
        nodes_file = root / "nodes.json"
        nodes_file.write_text(json.dumps([n.to_dict() for n in cluster_nodes(1_000, seed=2)]))
        summary = []
        for mode in ("NORMAL", "FULL"):
            p50s, p99s = [], []
            for r in range(repeats):
                ms, elapsed = _http_run(root, store, nodes_file, mode, f"{mode}{r}", total, rate, jobs)
                p50, p90, p99 = np.percentile(ms, [50, 90, 99])
                p50s.append(p50)
                p99s.append(p99)
                lines.append(f"| {mode} | {r + 1} | {len(ms):,} | {rate:.0f}/s | {len(ms) / elapsed:,.0f}/s | "
                             f"{p50:.2f} ms | {p90:.2f} ms | {p99:.2f} ms | {ms.max():.2f} ms |")
                print(lines[-1], flush=True)
            summary.append(f"| {mode} | **median of {repeats}** | | | | **{statistics.median(p50s):.2f} ms** | | "
                           f"**{statistics.median(p99s):.2f} ms** | |")
        lines.extend(summary)
        print("\n".join(summary), flush=True)
    return lines


TICK_S = 1.0


def _http_run(root: Path, store: Path, nodes_file: Path, mode: str, tag: str, total: int, rate: float,
              jobs: pd.DataFrame) -> tuple[np.ndarray, float]:
    args = ["--db", str(root / f"{tag}.db"), "--store", str(store), "--nodes", str(nodes_file), "--synchronous", mode,
            "--tick", str(TICK_S)]
    with served(args, root / f"{tag}.log") as server:
        t0 = time.perf_counter()
        latencies = asyncio.run(_load(int(server.url.rsplit(":", 1)[1]), total, rate, 32, jobs))
        elapsed = time.perf_counter() - t0
    return np.array(latencies) * 1000, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="?", default="all", choices=["inprocess", "placement", "http", "all"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--policies", default="hint,proportional,first-fit,durable",
                        help="inprocess: which rows (comma-separated; durable is hint with SQLite)")
    parser.add_argument("--tick", type=float, default=1.0, help="the service's rebalancing tick (s) during http")
    args = parser.parse_args()
    global TICK_S
    TICK_S = args.tick
    info = machine()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{info['date']} · nproc {info['nproc']} · {info['cpu']} · Python {info['python']} · "
          f"load average before: {load}", flush=True)
    if args.what in ("inprocess", "all"):
        bench_inprocess(args.repeats, tuple(args.policies.split(",")))
    if args.what in ("placement", "all"):
        bench_placement(args.repeats)
    if args.what in ("http", "all"):
        bench_http(args.repeats)


if __name__ == "__main__":
    main()
