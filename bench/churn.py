"""Preemption churn of placement-only rounds (issue 30): preempting stops, starts and average JCT per policy and order.

Replays the shipped traces as `hetplan simulate` does (same import, workload preparation and oracle hints read off
the truth), on a small mixed fleet with 8-GPU nodes (so gangs happen), and counts from the allocator's action log:
the preempting stops (`stop` entries marked preempted), the starts, the moves. Each run writes one JSON file of rows;
`--compare BEFORE AFTER` prints the two side by side (ratios after / before), as Markdown for bench/RESULTS.md.

    PYTHONPATH=$PWD python bench/churn.py --out /tmp/before.json        # on the commit before the change
    PYTHONPATH=$PWD python bench/churn.py --out /tmp/after.json         # on the change
    PYTHONPATH=$PWD python bench/churn.py --compare /tmp/before.json /tmp/after.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

from hetplan.allocator import Allocator, Node
from hetplan.cli.common import read_trace
from hetplan.contracts import PROFILES
from hetplan.contracts.trace import gpu_totals
from hetplan.resources import upstream_path
from hetplan.sim.engine import SimConfig, Simulator
from hetplan.sim.setups import truth_hints
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import prepare_workload
from common import REPO, commit, machine

log = logging.getLogger("bench.churn")

TRACES = {"synergy_static_100job": "synergy", "gavel_philly_2869ce": "gavel"}
"""Shipped traces (hetplan/data/upstream/traces) and their formats."""
FLEET = [*(Node(f"v100-8x-{i}", "V100", 8, 64, 488) for i in range(3)),
         *(Node(f"t4-4x-{i}", "T4", 4, 48, 192) for i in range(4)),
         *(Node(f"v100-1x-{i}", "V100", 1, 8, 61) for i in range(4))]
"""44 GPUs: 28 V100 (three 8-GPU nodes, four 1-GPU), 16 T4."""
TRUTH = REPO / "hetplan" / "data" / "profiles" / "derived_multi_gpu.csv"
POLICIES = ("first-fit", "proportional", "hint-static")
ORDERS = ("fifo", "las")


def run_one(trace: str, policy: str, order: str, truth: TruthCurves, repeats: int) -> dict:
    """One replay (the median wall of `repeats`): counts read off the allocator's action log."""
    jobs, _, _ = read_trace(upstream_path("traces", f"{trace}.{'csv' if TRACES[trace] == 'synergy' else 'trace'}"),
                            TRACES[trace], gpu_totals(FLEET))
    workload = prepare_workload(jobs, truth.models, seed=0)
    classes = workload.jobs[["model", "sim_model", "num_gpus"]].drop_duplicates(["model", "num_gpus"])
    hints = truth_hints(truth, classes, sorted({n.gpu_type for n in FLEET}))
    walls = []
    for _ in range(repeats):
        config = SimConfig(order, 300.0, migration_s=30.0, resize_s=5.0, seed=0)
        allocator = Allocator(list(FLEET), config.policy(policy), hints, retain=10**9)
        started = time.perf_counter()
        result = Simulator(workload.jobs, allocator, truth, config).run()
        walls.append(time.perf_counter() - started)
    entries = allocator.log.entries()
    kinds = [x.action.kind for x in entries]
    done = result.jobs[result.jobs["jct_s"].notna()]
    return {"trace": trace, "policy": policy, "order": order, "jobs": len(result.jobs), "completed": len(done),
            "preempting_stops": sum(x.action.kind == "stop" and x.preempted for x in entries),
            "starts": kinds.count("start"), "migrations": kinds.count("migrate"),
            "preempted_jobs": result.counts["preemptions"], "kept": result.counts["kept"],
            "avg_jct_h": float(done["jct_s"].mean()) / 3600, "wall_s": statistics.median(walls)}


def compare(before: list[dict], after: list[dict]) -> str:
    """The two runs side by side, as Markdown."""
    key = lambda r: (r["trace"], r["policy"], r["order"])  # noqa: E731
    old = {key(r): r for r in before}
    lines = ["| trace | policy/order | jobs | preempting stops before / after | starts before / after | "
             "migrations before / after | avg JCT h before / after (ratio) | wall s before / after |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in after:
        b = old.get(key(r))
        if b is None:
            continue
        ratio = r["avg_jct_h"] / b["avg_jct_h"] if b["avg_jct_h"] else float("nan")
        lines.append(f"| {r['trace']} | {r['policy']}/{r['order']} | {r['jobs']} | {b['preempting_stops']:,} / "
                     f"{r['preempting_stops']:,} | {b['starts']:,} / {r['starts']:,} | {b['migrations']:,} / "
                     f"{r['migrations']:,} | {b['avg_jct_h']:.3f} / {r['avg_jct_h']:.3f} ({ratio:.3f}) | "
                     f"{b['wall_s']:.2f} / {r['wall_s']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the rows (JSON) here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        print(compare(before["rows"], after["rows"]))
        print(f"\nbefore: {before['commit']} ({before['machine']}); after: {after['commit']} ({after['machine']})")
        return
    truth = TruthCurves.from_profiles(PROFILES.load(TRUTH))
    rows = []
    for trace in args.traces:
        for policy in POLICIES:
            for order in ORDERS:
                rows.append(run_one(trace, policy, order, truth, args.repeats))
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"commit": commit(), "machine": machine(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
