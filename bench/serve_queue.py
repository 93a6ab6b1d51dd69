"""The service's queue over HTTP (issue 30): 1,000 nodes, 10,000 jobs queued; submit latency and stalls by a round.

`bench/sched_queue.py` measures the loop in process; this measures what a client of `hetplan serve` sees. The
service (`--tick 0`, rounds on `POST /v1/actions/tick`; SQLite `--synchronous` as given) gets `--nodes` 8-GPU
nodes (V100/T4/A100 in turn), the cluster is filled with 8-GPU jobs, then `--queued` more are submitted (they wait:
the last `--sample` submissions give the submit latency with the queue that long). Then, for `--rounds` rounds, a
probe sends `GET /healthz` and `POST /v1/allocate` (1 GPU: queued) back to back while an admin client runs a round
(LAS: running jobs that attained the most give way to those that waited): the round's own time and the longest any
probe request waited while it ran. Jobs are **synthetic** (12 models, hints derived from the shipped test hints).
Targets: submit p99 <= 10 ms with 10,000 queued, one round <= 200 ms, no request stalled > 100 ms by a round.

    PYTHONPATH=.:bench .venv/bin/python bench/serve_queue.py [--nodes 1000] [--queued 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from common import commit, machine, record, served

TOKEN = "bench-admin"
TYPES = [("V100", 8, 64, 488), ("T4", 8, 64, 384), ("A100", 8, 96, 1152)]


def node_file(path: Path, n: int) -> Path:
    rows = [dict(zip(("gpu_type", "gpus", "vcpus", "mem_gb"), TYPES[i % 3]), name=f"node-{i:05d}") for i in range(n)]
    path.write_text(json.dumps(rows))
    return path


def submit_all(url: str, jobs: list[dict], workers: int = 4) -> list[float]:
    """Submit `jobs` from `workers` clients; each submission's latency (s), in order of completion."""
    times: list[float] = []
    lock = threading.Lock()
    chunks = [jobs[i::workers] for i in range(workers)]

    def run(chunk: list[dict]) -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            for body in chunk:
                start = time.perf_counter()
                answer = client.post("/v1/allocate", json=body)
                took = time.perf_counter() - start
                assert answer.status_code == 200 and answer.json()["status"] in ("allocated", "queued"), answer.text
                with lock:
                    times.append(took)

    threads = [threading.Thread(target=run, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def probe_during(url: str, stop: threading.Event, out: list[tuple[str, float, float]], prefix: str) -> None:
    """`GET /healthz` and a queued `POST /v1/allocate`, back to back, until `stop`: (route, start, latency)."""
    i = 0
    with httpx.Client(base_url=url, timeout=60) as client:
        while not stop.is_set():
            for route, send in (("healthz", lambda: client.get("/healthz")),
                                ("allocate", lambda: client.post("/v1/allocate", json={
                                    "job_id": f"{prefix}-{i}", "model": "m0", "num_gpus": 1}))):
                start = time.perf_counter()
                assert send().status_code == 200
                out.append((route, start, time.perf_counter() - start))
            i += 1
            time.sleep(0.002)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--sample", type=int, default=2000, help="submissions timed at the end of the queue's fill")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--policy", default="hint")
    parser.add_argument("--synchronous", default="full")
    parser.add_argument("--tree", type=Path, default=None,
                        help="serve the hetplan of this source tree (a `git archive` of another commit), else this one")
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    models = [f"m{i}" for i in range(12)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        serve = ["--db", str(root / "q.db"), "--store", str(root / "store"), "--synchronous", args.synchronous,
                 "--tick", "0", "--nodes", str(node_file(root / "nodes.json", args.nodes)), "--policy", args.policy,
                 "--token", TOKEN]
        with served(serve, root / "serve.log", args.tree) as server:
            fill = [{"job_id": f"run-{i}", "model": models[i % 12], "num_gpus": 8} for i in range(args.nodes)]
            started = time.perf_counter()
            submit_all(server.url, fill)
            waiting = [{"job_id": f"wait-{i}", "model": models[i % 12], "num_gpus": (1, 2, 4, 8)[i % 4]}
                       for i in range(args.queued)]
            submit_all(server.url, waiting[:-args.sample])
            sample = submit_all(server.url, waiting[-args.sample:], workers=1)
            setup_s = time.perf_counter() - started
            with httpx.Client(base_url=server.url, timeout=600) as admin:
                queued = len(admin.get("/v1/queue").json()["jobs"])
                rounds, acted = [], []
                stalls: dict[str, list[float]] = {"healthz": [], "allocate": []}
                for r in range(args.rounds):
                    stop, probes = threading.Event(), []
                    prober = threading.Thread(target=probe_during, args=(server.url, stop, probes, f"probe{r}"))
                    prober.start()
                    time.sleep(0.3)
                    start = time.perf_counter()
                    answer = admin.post("/v1/actions/tick", headers={"Authorization": f"Bearer {TOKEN}"})
                    end = time.perf_counter()
                    assert answer.status_code == 200, answer.text
                    time.sleep(0.3)
                    stop.set()
                    prober.join()
                    rounds.append(end - start)
                    acted.append(len(answer.json()["actions"]))
                    for route, waits in stalls.items():
                        waits.append(max((took for what, at, took in probes
                                          if what == route and at + took >= start and at <= end), default=0.0))
                    print(f"round {r}: {end - start:.3f} s, {acted[-1]} actions, longest wait: healthz "
                          f"{stalls['healthz'][-1] * 1000:.1f} ms, allocate {stalls['allocate'][-1] * 1000:.1f} ms",
                          flush=True)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["", f"## The service's queue over HTTP (`bench/serve_queue.py`, issue 30), {when}", "",
             f"Run: `PYTHONPATH=.:bench .venv/bin/python bench/serve_queue.py --nodes {args.nodes} --queued "
             f"{args.queued} --rounds {args.rounds} --policy {args.policy} --synchronous {args.synchronous}"
             + (f" --tree {args.tree}" if args.tree else "") + f"` at commit {commit()}; {machine()}. **Synthetic** jobs (12 models, 1-8 GPUs) on {args.nodes:,} 8-GPU "
             f"nodes, the cluster full, {queued:,} waiting (set-up {setup_s:.0f} s).", "",
             "| measure | median | p99 | max | target |", "|---|---:|---:|---:|---|",
             f"| submit (queued), last {len(sample):,} of the fill, one client | {statistics.median(sample) * 1000:.1f} ms"
             f" | {pct(sample, 0.99) * 1000:.1f} ms | {max(sample) * 1000:.1f} ms | p99 <= 10 ms |",
             f"| one round (`POST /v1/actions/tick`, {statistics.median(acted):.0f} actions median) | "
             f"{statistics.median(rounds) * 1000:.0f} ms | - | {max(rounds) * 1000:.0f} ms | <= 200 ms |",
             *(f"| longest `{route}` wait while a round ran | {statistics.median(waits) * 1000:.1f} ms | - | "
               f"{max(waits) * 1000:.1f} ms | <= 100 ms |" for route, waits in stalls.items())]
    print("\n".join(lines))
    if args.record:
        record(lines + [""])


if __name__ == "__main__":
    main()
