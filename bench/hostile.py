"""Hostile `/filter` bodies against a 10,000-node allocator (issue 21): how long do other requests wait?

    PYTHONPATH=$PWD .venv/bin/python bench/hostile.py [--nodes 10000] [--seconds 6] [--record]

`hetplan serve` (policy `hint`, SQLite synchronous=NORMAL, no tick) on 127.0.0.1 with `--nodes` V100/T4/A100
nodes. A probe client sends `GET /healthz` and `POST /v1/allocate` (then `/v1/release`) back to back, one at a
time, for `--seconds` per phase, and records each request's latency (send to last byte). Phases: idle; while
another process posts `/filter` bodies of 150,000 `NodeNames` (4.5 MB, the body of issue 21's 2.2 s stall)
in a loop; and the same with 1,000,000 names (31 MB, just under the 32 MiB body limit). The hostile sender runs
in its own process, so the probe's figures are the server's (status 0: the server closed the connection on a
Content-Length over the limit, before reading the body). Target: no probe request waits over 100 ms.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from common import commit, machine, record, served

POD = {"metadata": {"name": "p", "namespace": "default", "labels": {"hetplan.io/model": "res50"}},
       "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "4"}}}]}}


def node_file(path: Path, n: int) -> Path:
    shapes = [("V100", 8, 64, 488), ("T4", 4, 48, 192), ("A100", 8, 96, 1152)]
    rows = [dict(zip(("gpu_type", "gpus", "vcpus", "mem_gb"), shapes[i % 3]), name=f"node-{i:05d}") for i in range(n)]
    path.write_text(json.dumps(rows))
    return path


def hostile(url: str, names: int, stop: multiprocessing.Event, answers: multiprocessing.Queue) -> None:
    body = json.dumps({"Pod": POD, "NodeNames": [f"node-{i:07d}.hostile.example" for i in range(names)]}).encode()
    while not stop.is_set():
        with httpx.Client(base_url=url, timeout=120) as client:
            start = time.perf_counter()
            try:
                status = client.post("/filter", content=body, headers={"content-type": "application/json"}).status_code
            except httpx.HTTPError:  # refused before the body was read (Content-Length over the limit): closed
                status = 0
            answers.put((status, time.perf_counter() - start, len(body)))


def probe(url: str, seconds: float) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"GET /healthz": [], "POST /v1/allocate": []}
    deadline = time.perf_counter() + seconds
    i = 0
    with httpx.Client(base_url=url, timeout=120) as client:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            out["GET /healthz"].append(time.perf_counter() - start)
            start = time.perf_counter()
            answer = client.post("/v1/allocate", json={"job_id": f"probe-{i}", "model": "res50", "num_gpus": 1})
            out["POST /v1/allocate"].append(time.perf_counter() - start)
            assert answer.status_code == 200 and answer.json()["status"] == "allocated", answer.text
            client.post("/v1/release", json={"job_id": f"probe-{i}"})
            i += 1
            time.sleep(0.005)
    return out


def phase(url: str, names: int, seconds: float) -> tuple[dict[str, list[float]], list[tuple[int, float, int]]]:
    if not names:
        return probe(url, seconds), []
    ctx = multiprocessing.get_context("spawn")
    stop, answers = ctx.Event(), ctx.Queue()
    sender = ctx.Process(target=hostile, args=(url, names, stop, answers))
    sender.start()
    time.sleep(0.5)  # the first hostile body on its way
    figures = probe(url, seconds)
    stop.set()
    sender.join(timeout=180)
    got = []
    while True:
        try:
            got.append(answers.get(timeout=1))
        except queue.Empty:
            return figures, got


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--max-extender-body", type=int, default=None,
                        help="`hetplan serve --max-extender-body` (default: the service's, 32 MiB)")
    parser.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    args = parser.parse_args()
    head = commit()
    when, where = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), machine()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        serve = ["--db", str(root / "a.db"), "--store", str(root / "store"), "--synchronous", "normal",
                 "--tick", "0", "--nodes", str(node_file(root / "nodes.json", args.nodes))]
        if args.max_extender_body is not None:
            serve += ["--max-extender-body", str(args.max_extender_body)]
        with served(serve, root / "serve.log") as server:
            for label, names in [("idle", 0), ("150,000 NodeNames", 150_000), ("1,000,000 NodeNames", 1_000_000)]:
                figures, answers = phase(server.url, names, args.seconds)
                statuses = sorted({s for s, _, _ in answers})
                hostile_ms = statistics.median(t for _, t, _ in answers) if answers else None
                for route, times in figures.items():
                    times.sort()
                    rows.append((label, route, len(times), statistics.median(times),
                                 times[min(len(times) - 1, int(0.99 * len(times)))], times[-1],
                                 f"{len(answers)} x {statuses} in {ms(hostile_ms)}" if answers else "-"))
                    print(rows[-1], flush=True)
    lines = ["", f"## Hostile `/filter` bodies at {args.nodes:,} nodes (`bench/hostile.py`, issue 21), {when}", "",
             f"Run: `PYTHONPATH=$PWD .venv/bin/python bench/hostile.py --nodes {args.nodes} --seconds "
             f"{args.seconds:g}" + (f" --max-extender-body {args.max_extender_body}" if args.max_extender_body else "")
             + f"` at commit {head}; {where}. A probe sends `GET /healthz` and `POST /v1/allocate` "
             "(+ release) one at a time while another process posts `/filter` bodies in a loop.", "",
             "| hostile load | probe request | n | median | p99 | max | hostile answers (status, median time) |",
             "|---|---|---:|---:|---:|---:|---|"]
    lines += [f"| {a} | {b} | {n} | {ms(m)} | {ms(p)} | {ms(x)} | {h} |" for a, b, n, m, p, x, h in rows]
    print("\n".join(lines))
    if args.record:
        record(lines + [""])


if __name__ == "__main__":
    main()
