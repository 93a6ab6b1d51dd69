"""Hostile and heavy requests against a 10,000-node allocator (issues 21 and 30): how long do other requests wait?

    PYTHONPATH=$PWD .venv/bin/python bench/hostile.py [--nodes 10000] [--seconds 6] [--tree LABEL=PATH] [--record]

`hetplan serve` (policy `hint`, SQLite synchronous=NORMAL, no tick) on 127.0.0.1 with `--nodes` V100/T4/A100
nodes. A probe client sends `GET /healthz` and `POST /v1/allocate` (then `/v1/release`) back to back, one at a
time, for `--seconds` per phase, and records each request's latency (send to last byte). Phases: idle; while
another process posts `/filter` bodies of 150,000 `NodeNames` (4.5 MB, the body of issue 21's 2.2 s stall)
in a loop; the same with 1,000,000 names (31 MB, just under the 32 MiB body limit); `/filter` in Nodes mode, a
v1.NodeList of 4 KB Nodes just under 32 MiB (issue 30: 4.7-12 s stalls); and `GET /v1/nodes` of all the nodes in a
loop (issue 30: the lock held 0.4-0.6 s). The hostile sender runs in its own process, so the probe's figures are
the server's (status 0: the server closed the connection on a Content-Length over the limit, before reading the
body). Target: no probe request waits over 100 ms.

`--tree LABEL=PATH` (repeatable) runs every phase against the hetplan of each source tree in turn (a checkout of
another commit: `git archive <commit> | tar -x -C PATH`), in one run, for a side-by-side table; default: this tree.
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


def v1_node(i: int) -> dict:
    """A v1.Node of about 4 KB, as a kubelet reports one: labels, annotations, conditions, images (synthetic)."""
    digest = f"{i:064x}"
    return {"metadata": {"name": f"node-{i:05d}", "uid": f"{i:032x}", "labels": {
                "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB", "nvidia.com/gpu.memory": "16384",
                **{f"feature.node.kubernetes.io/label-{k}": "true" for k in range(24)}},
            "annotations": {f"node.alpha.kubernetes.io/annotation-{k}": "a" * 40 for k in range(8)}},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "488Gi"},
                       "capacity": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "500Gi"},
                       "conditions": [{"type": f"Condition{k}", "status": "False", "reason": "KubeletHasNoProblem",
                                       "lastHeartbeatTime": "2026-12-04T00:00:00Z", "message": "m" * 60}
                                      for k in range(5)],
                       "images": [{"names": [f"registry.example.com/image-{k}@sha256:{digest}"],
                                   "sizeBytes": 123456789 + k} for k in range(6)]}}


def hostile_body(kind: str, limit: int) -> tuple[str, bytes]:
    """The request a hostile phase repeats: ("GET /v1/nodes", b"") or a /filter body (NodeNames or Nodes)."""
    if kind == "list":
        return "GET /v1/nodes", b""
    if kind == "nodes":
        items, size = [], 200
        while True:
            item = json.dumps(v1_node(len(items)))
            if size + len(item) + 2 > limit:
                break
            items.append(item)
            size += len(item) + 2
        return "POST /filter", (f'{{"Pod": {json.dumps(POD)}, "Nodes": {{"items": [' + ", ".join(items)
                                + "]}}").encode()
    names = int(kind)
    return "POST /filter", json.dumps({"Pod": POD, "NodeNames": [f"node-{i:07d}.hostile.example"
                                                                 for i in range(names)]}).encode()


def hostile(url: str, kind: str, limit: int, stop: multiprocessing.Event, answers: multiprocessing.Queue) -> None:
    request, body = hostile_body(kind, limit)
    method, path = request.split()
    while not stop.is_set():
        with httpx.Client(base_url=url, timeout=120) as client:
            start = time.perf_counter()
            try:
                status = client.request(method, path, content=body or None,
                                        headers={"content-type": "application/json"}).status_code
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


def phase(url: str, kind: str | None, limit: int, seconds: float
          ) -> tuple[dict[str, list[float]], list[tuple[int, float, int]]]:
    if kind is None:
        return probe(url, seconds), []
    ctx = multiprocessing.get_context("spawn")
    stop, answers = ctx.Event(), ctx.Queue()
    sender = ctx.Process(target=hostile, args=(url, kind, limit, stop, answers))
    sender.start()
    time.sleep(0.5 if kind != "nodes" else 3.0)  # the first hostile request on its way (a Nodes body takes ~2 s)
    figures = probe(url, seconds)
    stop.set()
    sender.join(timeout=180)
    got = []
    while True:
        try:
            got.append(answers.get(timeout=1))
        except queue.Empty:
            return figures, got


PHASES = [("idle", None), ("150,000 NodeNames", "150000"), ("1,000,000 NodeNames", "1000000"),
          ("Nodes mode, v1.NodeList under 32 MiB", "nodes"), ("GET /v1/nodes", "list")]


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--max-extender-body", type=int, default=None,
                        help="`hetplan serve --max-extender-body` (default: the service's, 32 MiB)")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                        help="serve the hetplan of this source tree (repeatable: side by side); default: this one")
    parser.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    args = parser.parse_args()
    head = commit()
    when, where = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), machine()
    trees = [(label, Path(path)) for label, _, path in (t.partition("=") for t in args.tree)] or [(head, None)]
    limit = args.max_extender_body or 32 * 2**20
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        nodes = node_file(root / "nodes.json", args.nodes)
        for tree, path in trees:
            serve = ["--db", str(root / f"{tree}.db"), "--store", str(root / "store"), "--synchronous", "normal",
                     "--tick", "0", "--nodes", str(nodes)]
            if args.max_extender_body is not None:
                serve += ["--max-extender-body", str(args.max_extender_body)]
            with served(serve, root / "serve.log", path) as server:
                for label, kind in PHASES:
                    figures, answers = phase(server.url, kind, limit, args.seconds)
                    statuses = sorted({s for s, _, _ in answers})
                    hostile_ms = statistics.median(t for _, t, _ in answers) if answers else None
                    for route, times in figures.items():
                        times.sort()
                        rows.append((tree, label, route, len(times), statistics.median(times),
                                     times[min(len(times) - 1, int(0.99 * len(times)))], times[-1],
                                     f"{len(answers)} x {statuses} in {ms(hostile_ms)}" if answers else "-"))
                        print(rows[-1], flush=True)
    lines = ["", f"## Hostile and heavy requests at {args.nodes:,} nodes (`bench/hostile.py`, issues 21 and 30), "
             f"{when}", "",
             f"Run: `PYTHONPATH=$PWD .venv/bin/python bench/hostile.py --nodes {args.nodes} --seconds "
             f"{args.seconds:g}" + (f" --max-extender-body {args.max_extender_body}" if args.max_extender_body else "")
             + "".join(f" --tree {t}" for t in args.tree) + f"` at commit {head}; {where}. A probe sends "
             "`GET /healthz` and `POST /v1/allocate` (+ release) one at a time while another process sends the "
             "hostile request in a loop.", "",
             "| tree | hostile load | probe request | n | median | p99 | max | hostile answers (status, median time) |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    lines += [f"| {t} | {a} | {b} | {n} | {ms(m)} | {ms(p)} | {ms(x)} | {h} |" for t, a, b, n, m, p, x, h in rows]
    print("\n".join(lines))
    if args.record:
        record(lines + [""])


if __name__ == "__main__":
    main()
