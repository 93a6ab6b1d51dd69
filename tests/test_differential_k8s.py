"""One loop, the whole cluster path: a trace replayed by the simulator and through `hetplan serve` + `hetplan
controller` (+ its admission webhook) on the STAND-IN API server (`standin_apiserver.py`; not a real
kube-apiserver) gives the same decisions.

The simulator drives `hetplan.scheduler.Scheduler` in process and writes down each call it makes of it (submit,
finish, round) at its simulated time. The cluster path gets the same calls as Kubernetes would: an arrival is a pod
created (the webhook submits it: placed, or queued behind the scheduling gate `hetplan.io/queued`), a completion is
the job's pod ending (the controller releases it), a round is `POST /v1/actions/tick`; the service's allocator runs
on a virtual clock set to each event's time, and the replay waits for the cluster to be quiet (`ClusterPath.settle`:
the controller at the log's end, every pod where and as its allocation says, actuated) before the clock moves on.
Single-pod jobs only (the controller manages no multi-pod gang yet).
"""

from __future__ import annotations

import logging
import time
import zlib

import pandas as pd
import pytest

from hetplan.allocator import Allocator
from hetplan.allocator.k8s.nodes import to_node
from hetplan.allocator.service.bodies import action_out
from hetplan.reference import build_reference
from hetplan.sim import TruthCurves, prepare_workload
from hetplan.sim.engine import SimConfig, Simulator
from k8s_rig import ClusterPath
from standin_apiserver import k8s_node
from test_differential import Recording, hints, trace

log = logging.getLogger(__name__)
ROUND_S = 300.0


def k8s_nodes() -> dict[str, dict]:
    """Three 4-GPU V100 nodes, three 4-GPU T4 nodes and one 8-GPU V100 node, as GPU feature discovery labels them; by
    name, the order in which the API server lists them (and the node sync adds them: first-fit reads that order)."""
    shapes = [(f"v{i}", "Tesla-V100-SXM2-16GB", 4, "32", "244Gi") for i in range(3)] + \
        [(f"t{i}", "Tesla-T4", 4, "48", "192Gi") for i in range(3)] + \
        [("big", "Tesla-V100-SXM2-16GB", 8, "64", "488Gi")]
    return {name: k8s_node(name, product=product, gpus=str(gpus), cpu=cpu, memory=memory)
            for name, product, gpus, cpu, memory in sorted(shapes)}


def _trace(n: int, seed: int, models: list[str], namespace: str = "ml") -> pd.DataFrame:
    """Single-pod jobs of 1-8 GPUs (8: the big node only), job ids as the webhook names a bare pod's
    (`<namespace>/<pod>`)."""
    return trace(n, seed, models, sizes=(1, 1, 2, 4, 4, 8), prefix=f"{namespace}/j")


def decisions(actions: list[dict]) -> list[tuple]:
    """Each action as what was decided: kind, job, preempted, and (node, GPUs, cores, RAM) of each part. The notes
    the controller adds (`checkpoint-timeout`: a preempted pod here never answers) are no decisions: left out."""
    return [(x["kind"], x["job_id"], bool(x.get("preempted", False)),
             tuple((a["node"], a["gpus"], a["cpus"], a["mem_gb"]) for a in x["after"])) for x in actions
            if x["kind"] != "checkpoint-timeout"]


def finish_times(actions: list[dict]) -> dict[str, float]:
    """Each job's end: the time of its last `stop` not made by a preemption (its release)."""
    return {x["job_id"]: float(x["at"]) for x in actions if x["kind"] == "stop" and not x.get("preempted")}


def simulate(n: int, seed: int, policy: str, order: str):
    """The trace through the simulator: (the recording simulator, its result, the workload, the hints)."""
    truth = TruthCurves.from_profiles(build_reference().derived)
    models = sorted(truth.models)
    workload = prepare_workload(_trace(n, seed, models), truth.models)
    hint_set = hints(models, "h-diff-k8s")
    config = SimConfig(order, ROUND_S)
    nodes = [to_node(obj) for obj in k8s_nodes().values()]
    simulator = Recording(workload.jobs, Allocator(nodes, config.policy(policy), hint_set, retain=10**7), truth, config)
    return simulator, simulator.run(), workload, hint_set


def replay(path: ClusterPath, simulator: Simulator, workload) -> dict[str, float]:
    """The simulator's calls through the cluster path, each at its simulated time, the cluster quiet after each.
    Returns counts (events by kind, the webhook's answers) and the wall time."""
    rows = {row.job_id: row for row in workload.jobs.itertuples()}
    counts: dict[str, float] = {"queued": 0, "allocated": 0}
    start = time.monotonic()
    for kind, now, job_id in simulator.events:
        path.clock.now = now
        if kind == "submit":
            row = rows[job_id]
            counts[path.submit(job_id, str(row.model), int(row.num_gpus))] += 1
        elif kind == "finish":
            path.finish(job_id)
        else:
            path.tick()
        counts[kind] = counts.get(kind, 0) + 1
        path.settle()
    counts["wall_s"] = time.monotonic() - start
    return counts


def compare(path: ClusterPath, simulator: Simulator, result) -> dict:
    """What the two runs decided, side by side: both action logs as decisions, the first difference, per-job JCTs."""
    simulated = [action_out(x).model_dump() for x in simulator.allocator.log.entries()]
    served = [action_out(x).model_dump() for x in path.allocator.log.entries()]
    a, b = decisions(simulated), decisions(served)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
    jobs = result.jobs.set_index("job_id")
    ends = finish_times(served)
    jct = {j: ends[j] - float(jobs.loc[j, "arrival_s"]) for j in ends}
    return {"simulated": a, "served": b, "first_difference": first,
            "sim_jct": {j: float(jobs.loc[j, "jct_s"]) for j in jobs.index}, "served_jct": jct,
            "starts": ([x[1] for x in a if x[0] == "start"], [x[1] for x in b if x[0] == "start"])}


@pytest.mark.parametrize("policy,order", [("hint", "las"), ("first-fit", "fifo")])
def test_the_cluster_path_decides_as_the_simulator_does(tmp_path, policy, order):
    simulator, result, workload, hint_set = simulate(72, zlib.crc32(f"k8s/{policy}/{order}".encode()), policy, order)
    assert result.timeline["waiting"].max() > 5  # jobs queued: pods wait behind the gate
    path = ClusterPath(tmp_path, k8s_nodes(), policy, hint_set, order)
    try:
        synced = [(n.name, n.gpu_type, n.gpus, n.cpus, n.mem_gb) for n in path.allocator.cluster.nodes()]
        assert synced == [(n.name, n.gpu_type, n.gpus, n.cpus, n.mem_gb) for n in simulator.allocator.cluster.nodes()]
        counts = replay(path, simulator, workload)
        log.info("replayed: %s", counts)
        out = compare(path, simulator, result)
        assert path.api.overcommits == []
        assert counts["queued"] > 0 and path.controller.stats.counts["admitted"] > 0
    finally:
        path.close()
    i = out["first_difference"]
    assert i is None, f"action {i}: simulated {out['simulated'][i:i + 3]}, served {out['served'][i:i + 3]}"
    assert out["starts"][0] == out["starts"][1]  # the same admission order
    assert set(out["served_jct"]) == set(out["sim_jct"])
    for job, jct in out["sim_jct"].items():
        assert out["served_jct"][job] == pytest.approx(jct, rel=0.01), job
