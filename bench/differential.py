"""The differential, large: one trace replayed by the simulator and through the service gives the same decisions.

    .venv/bin/python bench/differential.py [--http-jobs 2000] [--k8s-jobs 240] [--policies hint/las,first-fit/fifo]
                                           [--no-record]

Two paths, each against `simulate` on the same trace (single scheduling loop, `hetplan.scheduler`):
- **http**: `tests/test_differential.py`'s path, the trace's submits, finishes and rounds sent to a real uvicorn
  serving `create_app` over a durable allocator on a virtual clock (`POST /v1/allocate`, `/v1/release`,
  `/v1/actions/tick`); its mixed trace (1-16 GPUs, 16: gangs) on its 7 nodes.
- **k8s**: `tests/test_differential_k8s.py`'s path, the whole cluster path on the STAND-IN API server (not a real
  kube-apiserver): each arrival a pod created (the webhook submits it), each completion the pod ending (the
  controller releases it), each round a tick; the cluster quiet (controller caught up, every pod where and as its
  allocation says, actuated) before the virtual clock moves on. Single-pod jobs of 1-8 GPUs (synthetic trace,
  `hints` synthetic), the same 7 nodes as v1.Nodes, synced by the service.
Reported per run: actions, whether the decision logs are identical (else the first difference), starts,
preemptions, and the average JCT both ways; appended to bench/RESULTS.md unless `--no-record`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import httpx  # noqa: E402
import uvicorn  # noqa: E402

from common import commit, machine, record  # noqa: E402
from hetplan.allocator import Allocator  # noqa: E402
from hetplan.allocator.core import NodeChanges  # noqa: E402
from hetplan.allocator.durable import DurableAllocator  # noqa: E402
from hetplan.allocator.service import ServiceSettings, create_app  # noqa: E402
from hetplan.reference import build_reference  # noqa: E402
from hetplan.sim import TruthCurves, prepare_workload  # noqa: E402
from hetplan.sim.engine import SimConfig  # noqa: E402
from k8s_rig import ClusterPath, VirtualClock  # noqa: E402
from servers import TOKEN, free_port  # noqa: E402
import test_differential as http_diff  # noqa: E402
import test_differential_k8s as k8s_diff  # noqa: E402

log = logging.getLogger("bench.differential")


def summary(path: str, policy: str, order: str, jobs: int, simulated: list, served: list, sim_jct: dict,
            served_jct: dict, wall_s: float) -> dict:
    first = next((i for i, (x, y) in enumerate(zip(simulated, served)) if x != y),
                 None if len(simulated) == len(served) else min(len(simulated), len(served)))
    starts = sum(x[0] == "start" for x in simulated)
    preempted = sum(bool(x[2]) for x in simulated)
    same_jct = set(sim_jct) == set(served_jct) and all(abs(served_jct[j] - v) <= 0.01 * max(v, 1e-9)
                                                         for j, v in sim_jct.items())
    return {"path": path, "policy": f"{policy}/{order}", "jobs": jobs, "actions": (len(simulated), len(served)),
            "identical": first is None, "first": first, "starts": starts, "preempted": preempted,
            "jct": (sum(sim_jct.values()) / max(len(sim_jct), 1), sum(served_jct.values()) / max(len(served_jct), 1)),
            "jct_within_1pct": same_jct, "wall_s": wall_s}


def run_http(n: int, policy: str, order: str, root: Path) -> dict:
    """tests/test_differential.py's replay, `n` jobs."""
    truth = TruthCurves.from_profiles(build_reference().derived)
    models = sorted(truth.models)
    workload = prepare_workload(http_diff.trace(n, zlib.crc32(f"{policy}/{order}".encode()), models), truth.models)
    hints = http_diff.hints(models)
    config = SimConfig(order, http_diff.ROUND_S)
    simulator = http_diff.Recording(workload.jobs, Allocator(list(http_diff.NODES), config.policy(policy), hints,
                                              retain=10**7),
                                    truth, config)
    result = simulator.run()
    clock = VirtualClock()
    allocator = DurableAllocator(root / "allocator.db", config.policy(policy), hints, synchronous="NORMAL",
                                 clock=clock, retain=10**7)
    allocator.change_nodes(NodeChanges(upsert=list(http_diff.NODES)))
    settings = ServiceSettings(db=root / "allocator.db", store=root / "hints", policy=policy, token=TOKEN,
                               tick_seconds=0, order=order, regrow=False, action_log=10**6)
    server = uvicorn.Server(uvicorn.Config(create_app(settings, allocator), host="127.0.0.1", port=free_port(),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    start = time.monotonic()
    try:
        while not server.started:
            time.sleep(0.02)
        rows = {row.job_id: row for row in workload.jobs.itertuples()}
        admin = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{server.config.port}", timeout=60) as client:
            for kind, now, job_id in simulator.events:
                clock.now = now
                if kind == "submit":
                    row = rows[job_id]
                    client.post("/v1/allocate", json={"job_id": job_id, "model": row.model,
                                                      "num_gpus": int(row.num_gpus)}).raise_for_status()
                elif kind == "finish":
                    client.post("/v1/release", json={"job_id": job_id}).raise_for_status()
                else:
                    client.post("/v1/actions/tick", headers=admin).raise_for_status()
        wall = time.monotonic() - start
        served_log = [http_diff.action_out(x).model_dump() for x in allocator.log.entries()]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        allocator.close()
    jobs = result.jobs.set_index("job_id")
    ends = k8s_diff.finish_times(served_log)
    return summary("http", policy, order, n, http_diff._decisions(http_diff._sim_actions(simulator)),
                   http_diff._decisions(served_log), {j: float(jobs.loc[j, "jct_s"]) for j in jobs.index},
                   {j: t - float(jobs.loc[j, "arrival_s"]) for j, t in ends.items()}, wall)


def run_k8s(n: int, policy: str, order: str, root: Path) -> dict:
    """tests/test_differential_k8s.py's replay, `n` jobs."""
    simulator, result, workload, hints = k8s_diff.simulate(n, zlib.crc32(f"k8s/{policy}/{order}".encode()), policy,
                                                           order)
    path = ClusterPath(root, k8s_diff.k8s_nodes(), policy, hints, order)
    try:
        counts = k8s_diff.replay(path, simulator, workload)
        out = k8s_diff.compare(path, simulator, result)
        overcommits = len(path.api.overcommits)
    finally:
        path.close()
    s = summary("k8s", policy, order, n, out["simulated"], out["served"], out["sim_jct"], out["served_jct"],
                counts["wall_s"])
    s.update(overcommits=overcommits, queued=int(counts["queued"]), events=len(simulator.events))
    return s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--http-jobs", type=int, default=2000)
    parser.add_argument("--k8s-jobs", type=int, default=240)
    parser.add_argument("--policies", default="hint/las,first-fit/fifo")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in ("hetplan", "httpx", "uvicorn", "kubernetes", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR)
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    for spec in args.policies.split(","):
        policy, order = spec.split("/")
        for path, n, run in (("http", args.http_jobs, run_http), ("k8s", args.k8s_jobs, run_k8s)):
            if n <= 0:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(run(n, policy, order, Path(tmp)))
            log.info("%s", rows[-1])
    lines = [f"\n## The differential, simulate vs the service and vs the cluster path (`bench/differential.py "
             f"--http-jobs {args.http_jobs} --k8s-jobs {args.k8s_jobs}`), {when}\n",
             f"Commit {commit()}; {machine()}. Synthetic traces and hints (tests/test_differential*.py); the k8s path "
             "on the STAND-IN API server (not a real kube-apiserver), `hetplan serve` + webhook + one controller in "
             "process, the allocator on a virtual clock, the cluster quiet before each event.\n",
             "| path | policy/order | jobs | actions sim / served | identical | starts | preempting stops | "
             "avg JCT sim / served (s) | JCT within 1 % | overcommits | wall (s) |",
             "|---|---|---:|---|---|---:|---:|---|---|---:|---:|"]
    for r in rows:
        same = "yes" if r["identical"] else f"**no** (first at action {r['first']})"
        lines.append(f"| {r['path']} | {r['policy']} | {r['jobs']:,} | {r['actions'][0]:,} / {r['actions'][1]:,} | "
                     f"{same} | {r['starts']:,} | {r['preempted']:,} | {r['jct'][0]:,.0f} / {r['jct'][1]:,.0f} | "
                     f"{'yes' if r['jct_within_1pct'] else '**no**'} | {r.get('overcommits', '-')} | "
                     f"{r['wall_s']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_record:
        record(lines + [""])


if __name__ == "__main__":
    main()
