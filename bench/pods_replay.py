"""A real public GPU fleet and its pod list, replayed over HTTP (issue 15). Run from the repository root:

    .venv/bin/python bench/pods_replay.py [--policies hint,first-fit,proportional] [--limit N] [--no-record]

Fleet and pods: Alibaba's cluster-trace-gpu-v2023 (`bench/data/openb/`, exact copies, see PROVENANCE.md):
1,213 GPU nodes, most of them of GPU types hetplan's catalog does not know (G2, G3, V100M16, ...), and the
default pod list with whole-GPU, GPU-sharing (`gpu_milli` < 1000) and CPU-only pods, each with its own CPU
and memory request. For each policy: `hetplan serve --nodes <the trace's node list>` (SQLite
synchronous=NORMAL, no tick), then every pod asks `/v1/allocate` when it was created and `/v1/release` when it
was deleted, in trace order, one request at a time over one keep-alive connection (`hetplan.allocator.replay`).
Checked along the way: every node joined; no request refused (HTTP 4xx/5xx); every 1,000 events and at the
end, no node overcommitted (GPUs, cores, RAM, and no shared device over one GPU, recomputed from
`/v1/allocations`); every placed pod got at least its own CPU/RAM. The `hint` run is SIGKILLed halfway
and restarted on the same database: nothing may be lost. Pods carry no model name, so no hint applies: this
measures the mechanism (shares, CPU-only, own requests, packing) on a real fleet, not hint quality.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import signal
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pandas as pd
from rich.progress import Progress

from hetplan.allocator.nodes_io import load_nodes
from hetplan.allocator.replay import PodEvent, ReplayReport, filling, pod_events, replay

from common import machine, record, served

DATA = Path(__file__).with_name("data") / "openb"
NODES = DATA / "openb_node_list_gpu_node.csv"
PODS = DATA / "openb_pod_list_default.csv"


def overcommitted(client: httpx.Client) -> list[str]:
    """Nodes whose allocations (recomputed from `/v1/allocations`) exceed their capacity, or whose free
    capacity as the service reports it is negative, or with a shared device over one GPU."""
    nodes = {n["name"]: n for n in client.get("/v1/nodes").json()["nodes"]}
    used: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    devices: dict[tuple[str, int], float] = defaultdict(float)
    shared: dict[str, set[int]] = defaultdict(set)
    for a in client.get("/v1/allocations").json():
        u = used[a["node"]]
        u[0] += a["gpus"]
        u[1] += a["cpus"]
        u[2] += a["mem_gb"]
        if a["gpu_share"]:
            devices[(a["node"], a["device"])] += a["gpu_share"]
            shared[a["node"]].add(a["device"])
    problems = [f"{node}: device {d} holds {v:g} GPUs" for (node, d), v in devices.items() if v > 1 + 1e-9]
    for name, n in nodes.items():
        g, c, m = used[name]
        g += len(shared[name])
        if g > n["gpus"] or c > n["cpus"] + 1e-6 or m > n["mem_gb"] + 1e-6 or min(
                n["free_gpus"], n["free_cpus"], n["free_mem_gb"]) < 0:
            problems.append(f"{name}: {g} GPUs, {c:g} cores, {m:g} GiB in use of {n['gpus']}, {n['cpus']}, "
                            f"{n['mem_gb']}")
    return problems


def run_policy(policy: str, events: list[PodEvent], root: Path, kill_at: int | None, tag: str) -> dict:
    args = ["--nodes", str(NODES), "--db", str(root / f"{tag}-{policy}.db"), "--policy", policy, "--tick", "0",
            "--synchronous", "NORMAL", "--store", str(root / "empty-store")]
    latencies: list[float] = []
    problems: list[str] = []
    lost: list[str] = []
    with served(args, root / f"{tag}-{policy}.log") as server:
        client = httpx.Client(base_url=server.url, timeout=30)
        joined = len(client.get("/v1/nodes").json()["nodes"])

        def send(path: str, body: dict) -> tuple[int, dict]:
            t0 = time.perf_counter()
            response = client.post(path, json=body)
            latencies.append(time.perf_counter() - t0)
            return response.status_code, response.json()

        report = ReplayReport()
        with Progress(transient=True) as bar:
            task = bar.add_task(f"{policy}: {len(events):,} pod events", total=len(events))
            for start in range(0, len(events), 1000):
                part = replay(events[start:start + 1000], send)
                report.add(part)
                problems += overcommitted(client)
                bar.update(task, completed=start + len(events[start:start + 1000]))
                if kill_at is not None and start <= kill_at < start + 1000:
                    before = client.get("/v1/allocations").json()
                    client.close()
                    server.stop(signal.SIGKILL)
                    server.start()
                    client = httpx.Client(base_url=server.url, timeout=30)
                    after = client.get("/v1/allocations").json()
                    lost = sorted({a["job_id"] for a in before} ^ {a["job_id"] for a in after})
                    lost += ["(allocations differ)"] if before != after else []
        held = client.get("/v1/allocations").json()
        gpus_held = sum(a["gpus"] + (a["gpu_share"] or 0) for a in held)
        client.close()
    ms = sorted(x * 1000 for x in latencies)
    return {"policy": policy, "joined": joined, "report": report, "problems": problems, "lost": lost,
            "p50": statistics.median(ms), "p99": ms[int(0.99 * (len(ms) - 1))], "requests": len(ms),
            "gpus_held": gpus_held}


def table(rows: list[dict], gpus: int, killed_at: int | None) -> list[str]:
    lines = ["| policy | nodes joined | pods asked | placed | whole / share / CPU-only placed | rejected (reason) | "
             "refused (4xx/5xx) | below own request | overcommitted | lost on SIGKILL | GPUs held at the end | "
             "p50 | p99 |",
             "|---|---:|---:|---:|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        rep: ReplayReport = r["report"]
        placed = " / ".join(f"{rep.placed_by_kind[k]:,}" for k in ("whole", "share", "cpu-only"))
        rejected = ", ".join(f"{n:,} {reason}" for reason, n in sorted(rep.rejected.items())) or "0"
        killed = "-" if killed_at is None or r["policy"] != "hint" else f"{len(r['lost'])} (killed at event " \
                                                                          f"{killed_at:,})"
        lines.append(f"| {r['policy']} | {r['joined']:,} | {rep.asked:,} | **{rep.placed:,}** | {placed} | "
                     f"{rejected} | {sum(rep.refused.values())} | {len(rep.below_request)} | {len(r['problems'])} | "
                     f"{killed} | {r['gpus_held']:,.1f} ({r['gpus_held'] / gpus:.1%}) | {r['p50']:.2f} ms | "
                     f"{r['p99']:.2f} ms |")
    first_fit = next((r["report"].placed for r in rows if r["policy"] == "first-fit"), None)
    if first_fit is not None:
        lines.append("")
        lines += [f"- {r['policy']}: {r['report'].placed - first_fit:+,} pods placed against first-fit."
                  for r in rows if r["policy"] != "first-fit"]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="hint,first-fit,proportional")
    parser.add_argument("--limit", type=int, default=None, help="only the first N events (a quick look)")
    parser.add_argument("--fill", type=float, default=1.5,
                        help="the filling run asks for this many times the fleet's GPUs (0: skip it)")
    parser.add_argument("--no-record", action="store_true", help="print, do not append to RESULTS.md")
    args = parser.parse_args()
    info = machine()
    nodes = load_nodes(NODES)
    gpus = sum(n.gpus for n in nodes)
    events = pod_events(PODS)[:args.limit]
    asked = sum(e.body["num_gpus"] for e in events if not e.release)
    times = math.ceil(args.fill * gpus / asked) if args.fill > 0 else 0
    pods = pd.read_csv(PODS)
    by_alibaba = int(pods["scheduled_time"].notna().sum())
    policies = args.policies.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "empty-store").mkdir()
        as_ran = [run_policy(p, events, root, len(events) // 2 if p == "hint" else None, "trace") for p in policies]
        fill = filling(events, times)
        filled = [run_policy(p, fill, root, None, "fill") for p in policies] if times else []
    kinds = as_ran[0]["report"].asked_by_kind
    lines = [
        f"\n## A real fleet and its pods over HTTP (`bench/pods_replay.py`, issue 15), "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC\n",
        f"Run: `.venv/bin/python bench/pods_replay.py{' --limit ' + str(args.limit) if args.limit else ''}`; "
        f"{info}. Fleet: Alibaba cluster-trace-gpu-v2023 `openb_node_list_gpu_node.csv`, {len(nodes):,} GPU nodes, "
        f"{gpus:,} GPUs; pods: `openb_pod_list_default.csv`, {len(pods):,} pods ({kinds['whole']:,} whole-GPU, "
        f"{kinds['share']:,} GPU-sharing, {kinds['cpu-only']:,} CPU-only in the replay), each with its own CPU "
        f"and memory request. Alibaba's own scheduler placed {by_alibaba:,} of them (`scheduled_time` set). No pod "
        "names a model, so no hint applies: every policy gives each pod its own request; they differ in where "
        "they put it. `gpu_spec` (allowed GPU models) is not enforced.\n",
        f"**As the trace ran** ({len(events):,} events, creations and deletions in trace order; the `hint` "
        "server is SIGKILLed halfway and restarted on its database):\n",
        *table(as_ran, gpus, len(events) // 2),
    ]
    if filled:
        lines += ["", f"**Filling the fleet** (creations only, the list {times} times over, {len(fill):,} pods asking "
                      f"{asked * times:,.0f} GPUs, {asked * times / gpus:.1f}x the fleet; nothing leaves):\n",
                  *table(filled, gpus, None)]
    print("\n".join(lines))
    if not args.no_record:
        record(lines + [""])


if __name__ == "__main__":
    main()
