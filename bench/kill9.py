"""kill -9 in the middle of a burst, over and over: nothing acknowledged is lost, no action is renumbered (issue 21).

    .venv/bin/python bench/kill9.py [--kills 5] [--nodes 40] [--no-record]

`hetplan serve` (SQLite synchronous=FULL, the co-adaptive `hint` policy with the shipped test hints, the tick
every 0.2 s) on `--nodes` 4-GPU V100 nodes. Two clients allocate (whole GPUs, gangs of 8 over two nodes) and
release as fast as the service answers; a third follows `GET /v1/actions?since=N` as a controller would. At a
random moment the service gets SIGKILL and is started again on the same database, `--kills` times. After each
restart: every submission (allocated or queued: with the scheduler's queue, issue 30, a submission that does not fit
waits its turn, and a LAS round may preempt a running job back into the queue) and every release the clients saw
acknowledged is in the state (running or queued; released jobs in neither), the log's numbers run 1..latest
without a gap, every action the reader saw is still there unchanged, and `since=<the reader's last>` continues
from it; no node is overcommitted. Reported: what was checked and how long a restart took to serve again.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from common import Served, machine, record

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from allocator_helpers import hints_frame, make_plan  # noqa: E402  (the literal test hints, not code to ship)


def burst(url: str, worker: int, held: dict, seen: dict, stop: threading.Event, rng: random.Random) -> None:
    with httpx.Client(base_url=url, timeout=5) as c:
        k = 0
        while not stop.is_set():
            k += 1
            try:
                if worker == 2:  # the reader
                    for a in c.get("/v1/actions", params={"since": max(seen, default=0)}).json()["actions"]:
                        seen[a["seq"]] = a
                    continue
                mine = [j for j, on in held.items() if on and j.startswith(f"w{worker}-")]
                if mine and rng.random() < 0.45:
                    job = rng.choice(mine)
                    held[job] = None  # in flight
                    answer = c.post("/v1/release", json={"job_id": job}).json()
                    if answer["released"] or answer.get("dequeued"):
                        held[job] = False
                else:
                    job = f"w{worker}-{time.monotonic_ns()}-{k}"
                    body = {"job_id": job, "model": rng.choice(["res50", "transformer", "vgg"]),
                            "num_gpus": rng.choice([1, 1, 2, 4, 8])}
                    if c.post("/v1/allocate", json=body).json()["status"] in ("allocated", "queued"):
                        held[job] = True
            except (httpx.HTTPError, ValueError, KeyError):
                return  # the service is gone


def check(url: str, held: dict, seen: dict) -> dict:
    with httpx.Client(base_url=url, timeout=30) as c:
        running = {a["part_of"] or a["job_id"] for a in c.get("/v1/allocations").json()}
        running |= {j["job_id"] for j in c.get("/v1/queue").json()["jobs"]}  # submitted and waiting: not lost
        log = c.get("/v1/actions", params={"since": 0}).json()
        seqs = [a["seq"] for a in log["actions"]]
        last = max(seen, default=0)
        after = c.get("/v1/actions", params={"since": last}).json()["actions"]
        nodes = c.get("/v1/nodes").json()["nodes"]
    by_seq = {a["seq"]: a for a in log["actions"]}
    return {"lost_allocations": len({j for j, on in held.items() if on} - running),
            "lost_releases": len({j for j, on in held.items() if on is False} & running),
            "gaps": int(seqs != list(range(seqs[0], log["latest"] + 1))) if seqs else 0,
            "renumbered": sum(by_seq.get(s) != a for s, a in seen.items() if s >= (seqs[0] if seqs else 1)),
            # the rounds go on meanwhile: `since` answers at least up to the latest listed before it, without a gap
            "continues": [a["seq"] for a in after] == list(range(last + 1, last + 1 + len(after)))
                         and len(after) >= log["latest"] - last,
            "overcommitted": sum(min(n["free_gpus"], n["free_cpus"], n["free_mem_gb"]) < 0 for n in nodes),
            "acked": sum(on is not None for on in held.values()), "seen": len(seen), "latest": log["latest"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows, restarts = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        from hetplan.hints import HintStore
        HintStore(root / "store").publish(make_plan("k9"), hints_frame("k9"))
        (root / "nodes.json").write_text(json.dumps([{"name": f"v{i}", "gpu_type": "V100", "gpus": 4, "cpus": 48,
                                                      "mem_gb": 480} for i in range(args.nodes)]))
        server = Served(["--db", str(root / "a.db"), "--store", str(root / "store"), "--nodes",
                         str(root / "nodes.json"), "--tick", "0.2", "--synchronous", "FULL"], root / "serve.log")
        server.start()
        held: dict[str, bool | None] = {}
        seen: dict[int, dict] = {}
        try:
            for kill in range(args.kills):
                stop = threading.Event()
                threads = [threading.Thread(target=burst, args=(server.url, w, held, seen, stop,
                                                                random.Random(rng.random()))) for w in range(3)]
                for t in threads:
                    t.start()
                time.sleep(rng.uniform(1.0, 3.0))
                server.stop(signal.SIGKILL)
                stop.set()
                for t in threads:
                    t.join()
                t0 = time.perf_counter()
                server.start()
                restarts.append(time.perf_counter() - t0)
                rows.append(check(server.url, held, seen))
                print(kill + 1, rows[-1], flush=True)
        finally:
            server.stop()
    total = {k: sum(r[k] for r in rows) for k in ("lost_allocations", "lost_releases", "gaps", "renumbered",
                                                 "overcommitted")}
    lines = [f"\n## kill -9 mid-burst, {args.kills} times (`bench/kill9.py`, issue 21), "
             f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC\n",
             f"Run: `.venv/bin/python bench/kill9.py --kills {args.kills} --nodes {args.nodes}`; {machine()}. "
             f"`hetplan serve` (synchronous=FULL, `hint`, tick 0.2 s) on {args.nodes} 4-GPU nodes; two clients "
             "allocating (gangs of 8 too) and releasing, a third following the action log; SIGKILL at a random "
             "moment, restart on the same database.\n",
             "| kills | changes acknowledged | actions the reader saw | latest action | acknowledged submissions lost | "
             "acknowledged releases undone | gaps in the numbering | actions renumbered | `since` continues after "
             "each restart | overcommitted nodes | restart to healthy (median, max) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
             f"| {len(rows)} | {rows[-1]['acked']:,} | {rows[-1]['seen']:,} | {rows[-1]['latest']:,} | "
             f"{total['lost_allocations']} | {total['lost_releases']} | {total['gaps']} | {total['renumbered']} | "
             f"{'yes' if all(r['continues'] for r in rows) else 'NO'} | {total['overcommitted']} | "
             f"{statistics.median(restarts):.2f} s, {max(restarts):.2f} s |", ""]
    print("\n".join(lines))
    if not args.no_record:
        record(lines)


if __name__ == "__main__":
    main()
