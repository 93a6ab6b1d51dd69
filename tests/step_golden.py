"""Golden decisions of the co-adaptive step: small workloads whose every decision is written down as text lines.

`records()` runs them: simulator replays with the `hint` policy (rounds with preemption and moves, admission
between rounds, gangs, TUNE, re-sizing; one strict) and an in-process allocator churn (`allocate` and `release`,
jobs with their own requests, a `tick` now and then). `tests/test_step_golden.py` compares them with
`tests/fixtures/step_golden.json`, recorded before the step was split into its stages (commit c75018c). The file
keeps, per workload, the line count and a digest of each block of `BLOCK` lines (a few KB, not the lines); to see
the lines themselves, on any commit:

    PYTHONPATH=$PWD .venv/bin/python tests/step_golden.py --print NAME

and diff two commits' output. Regenerate the file (no argument) only when a decision is meant to change.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from hetplan.allocator import Allocator, NodeChanges
from hetplan.allocator.policies import get_policy
from hetplan.allocator.spec import CLOSED_LABEL, Allocation, Job, Node
from hetplan.hints import HintSet
from hetplan.hints.index import HintEntry
from hetplan.reference import build_reference
from hetplan.sim.engine import SimConfig, simulate
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import prepare_workload

GOLDEN = Path(__file__).parent / "fixtures" / "step_golden.json"

NODES = [Node("v-0", "V100", 4, 12, 250), Node("v-1", "V100", 8, 24, 500), Node("t-0", "T4", 4, 48, 192),
         Node("a-0", "A100", 2, 32, 250), Node("v-2", "V100", 8, 24, 500), Node("k-0", "K80", 4, 16, 96),
         Node("k-1", "K80", 4, 16, 96)]
JOB_COLUMNS = ["job_id", "status", "start_s", "finish_s", "gpu_types", "migrations", "resizes", "share"]


def _hints(models: list[str], seed: int) -> HintSet:
    """Per model, three hinted GPU types with seeded throughputs (so classes differ in what they gain where)."""
    rng = random.Random(seed)
    table = {}
    for m in models:
        tput = {t: rng.uniform(0.3, 3.0) for t in ("V100", "T4", "K80")}
        ranked = sorted(tput, key=lambda t: -tput[t])
        for g in (1, 2, 4, 8):
            table[(m, g)] = tuple(HintEntry(t, r, rng.choice([2.0, 4.0, 6.0, 9.0]), rng.choice([20.0, 40.0, 62.5]),
                                            tput[t] * g) for r, t in enumerate(ranked, start=1))
    return HintSet(f"golden-{seed}", table)


def _trace(models: list[str], n: int, seed: int, hours: float) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"job_id": [f"j{i}" for i in range(n)], "model": rng.choice(models, n),
                         "num_gpus": rng.choice([1, 1, 2, 4, 8, 16], n),
                         "arrival_s": np.sort(rng.uniform(0, hours * 3600, n)),
                         "duration_s": rng.exponential(3600, n)})


def _fmt(x: object) -> str:
    return f"{x:.6f}" if isinstance(x, float) else str(x)


def sim_records(seed: int, scheduler: str, strict: bool = False, n: int = 90, nodes: list[Node] = NODES
                ) -> list[str]:
    truth = TruthCurves.from_profiles(build_reference().derived)
    models = sorted(truth.models)
    hints = _hints(models, seed)
    config = SimConfig(scheduler, 300.0, migration_s=30.0, resize_s=5.0)
    policy = get_policy("hint", strict=strict, migration_s=30.0, horizon_s=300.0, stability=config.stability) \
        if strict else "hint"
    workload = prepare_workload(_trace(models, n, seed, 3.0), truth.models)
    result = simulate(workload.jobs, nodes, truth, policy, hints, config)
    rows = result.jobs[JOB_COLUMNS].itertuples(index=False)
    # `rescales` (elastic count changes) came after the recording; these rigid workloads never rescale
    counts = sorted((k, v) for k, v in result.counts.items() if k != "rescales" or v)
    return [" ".join(_fmt(x) for x in row) for row in rows] + [f"counts {counts}"]


def _alloc_line(a: Allocation) -> str:
    return f"{a.job_id}@{a.node}:{a.gpu_type}x{a.gpus}/{a.cpu_m}m/{a.mem_mib}Mi/{a.share}/{a.rank}"


def churn_records(seed: int, steps: int = 250) -> list[str]:
    """`allocate` one job (some with their own request), `release` one, a `tick` every 40 steps; every action."""
    rng = random.Random(seed)
    models = ["res18", "res50", "transformer", "lm", "a3c"]
    hints = _hints(models[:3], seed)  # lm and a3c: no hints
    nodes = [Node(f"{t.lower()}-{i}", t, g, c, m) for i, (t, g, c, m) in
             enumerate(rng.choice([("V100", 8, 64, 488), ("V100", 4, 32, 244), ("T4", 4, 48, 192),
                                   ("K80", 8, 32, 480), ("A100", 8, 96, 1152)]) for _ in range(24))]
    alloc = Allocator(nodes, "hint", hints, clock=lambda: 0.0)
    clock = [0.0]
    alloc.clock = lambda: clock[0]
    running: list[str] = []
    lines = []
    for i in range(steps):
        clock[0] += 60.0
        own = rng.random() < 0.25
        job = Job(f"c{i}", rng.choice(models), rng.choice([1, 1, 2, 4, 8, 16]),
                  cpu_m=rng.choice([2000, 8000, 30000]) if own else None,
                  mem_mib=rng.choice([8000, 64000]) if own and rng.random() < 0.5 else None)
        before = alloc.log.latest
        d = alloc.allocate(job)
        lines.append(f"allocate {job.job_id} -> " + (_alloc_line(d) if isinstance(d, Allocation)
                                                      else f"{d.reason.value}: {d.message}"))
        if isinstance(d, Allocation):
            running.append(job.job_id)
        if rng.random() < 0.45 and running:
            alloc.release(running.pop(rng.randrange(len(running))))
        if i % 40 == 39:
            alloc.tick()
        if i == 100:  # cordon two nodes: they keep their jobs, take no new ones
            alloc.change_nodes(NodeChanges(upsert=[replace(n, labels={CLOSED_LABEL: "true"}) for n in nodes[:2]]))
        if i % 60 == 59:  # a round with preemption and moves over every running job, newest first
            alloc.rebalance(alloc.running_jobs()[::-1], preempt=True, move=True)
        for x in alloc.log.since(before):
            a = x.action
            lines.append(f"  {a.kind} {a.job_id} {[_alloc_line(p) for p in a.before]} -> "
                         f"{[_alloc_line(p) for p in a.after]}")
        assert alloc.cluster.check() == []
    return lines


WORKLOADS = {
    "sim-las-seed7": lambda: sim_records(7, "las"),
    "sim-fifo-seed3": lambda: sim_records(3, "fifo"),
    "sim-las-strict-seed5": lambda: sim_records(5, "las", strict=True),
    "sim-srtf-one-type-seed4": lambda: sim_records(4, "srtf", nodes=[n for n in NODES if n.gpu_type == "V100"]),
    "churn-seed1": lambda: churn_records(1),
    "churn-seed2": lambda: churn_records(2),
}


BLOCK = 20


def digests(lines: list[str]) -> list[str]:
    """A short digest of each block of `BLOCK` lines (the first differing block says where decisions part)."""
    return [hashlib.sha256("\n".join(lines[k:k + BLOCK]).encode()).hexdigest()[:16]
            for k in range(0, len(lines), BLOCK)]


def records() -> dict[str, list[str]]:
    return {name: make() for name, make in WORKLOADS.items()}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--print":
        print("\n".join(WORKLOADS[sys.argv[2]]()))
    else:
        out = {name: {"lines": len(lines), "blocks": digests(lines)} for name, lines in records().items()}
        GOLDEN.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {GOLDEN}: {sum(v['lines'] for v in out.values())} lines digested, "
              f"{GOLDEN.stat().st_size:,} bytes", file=sys.stderr)
