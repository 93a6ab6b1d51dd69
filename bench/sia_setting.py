"""Issue 31 on Sia's own setting: elastic GPU counts against fixed counts, and the round's solve time.

Sia's paper cluster (64 GPUs: 6 nodes of 4 T4, 3 nodes of 8 RTX 2080 Ti, 2 nodes of 8 A100), Sia's Philly-derived
160-job workloads (bench/data/sia/workloads/philly, 20 jobs/h), 60 s rounds, Sia's per-model restart costs. The
truth is Sia's measured multi-GPU step times (shipped table; `hetplan.sim.scaling_truth`): the RTX 2080 Ti has only
1-GPU measurements, so its multi-GPU truth is derived (T4's shape). Job work is **derived** (Sia's epochs per model
at a V100's measured 1-GPU rate, `hetplan.traces.sia`), so the JCTs are not Sia's published ones: compare setups
within a row, never with the paper's hours.

Setups, all on the one scheduling loop:
- `elastic`: every round chooses each job's GPU type and count (1 to 24 GPUs) by the integer program of
  `hetplan.scheduler.elastic`;
- `elastic-rigid`: the same rounds with each job's count fixed at Sia's `num_replicas` (type still chosen);
- `hint-las`: hetplan's co-adaptive allocator with fixed counts, LAS, 60 s rounds (the fixed-count baseline).

With `--hosts`, hetplan's own edge is tried on top: the truth gets host factors (hetplan's **derived** CPU/RAM
profiles of the network each Sia model is: cifar10 = ResNet-18 etc.; ncf and yolov3 have none) at the share each
allocation gives on Sia's node shapes, and `elastic` prices each type's hosts (`ElasticRule.price_host`) against
`elastic-blind`, which does not.

The solve part times `choose` alone at 2,048 GPUs with 1,000 active jobs (synthetic: Sia's six models at random
batches and counts on a cluster 32x Sia's), and reads the simulated rounds' own solve times at 64 GPUs.

With `--jitter 0,1,2`, each workload is also replayed once per seed with every arrival shifted by a uniform 0-30 s
(**derived** copies): one exact trace moves by as much as a rule change does (workload 6: 0.28 h exact, 0.31-0.49 h
jittered), so rules are ranked on the means over the copies too.

    PYTHONPATH=.:bench python bench/sia_setting.py [--workloads 2,3,4,5,6,7,8] [--solve-rounds 20] [--hosts]
        [--jitter 0,1,2]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from hetplan.allocator import Allocator
from hetplan.allocator.spec import Node
from hetplan.contracts import PROFILES
from hetplan.resources import data_path
from hetplan.scheduler.elastic import ElasticJob, ElasticRule, RoundStats, TypeShape, choose, configs
from hetplan.sim.engine import SimConfig, Simulator
from hetplan.sim.scaling_truth import ScalingTruth, host_factors, reference_rate
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import prepare_workload
from hetplan.traces.sia import import_sia

WORKLOADS = Path(__file__).parent / "data" / "sia" / "workloads" / "philly"
SHAPES = (("t4", "T4", 4, 48, 192, 6), ("rtx", "RTX2080Ti", 8, 64, 256, 3), ("a100", "A100", 8, 128, 1024, 2))


def sia_nodes(scale: int = 1) -> list[Node]:
    return [Node(f"{name}-{i}", gpu, gpus, cpus, mem) for name, gpu, gpus, cpus, mem, count in SHAPES
            for i in range(count * scale)]


def run(jobs: pd.DataFrame, truth: ScalingTruth, setup: str, rule: ElasticRule = ElasticRule()) -> dict[str, float]:
    if setup == "elastic-rigid":
        jobs = jobs.assign(min_gpus=jobs["num_gpus"], max_gpus=jobs["num_gpus"])
    policy = "hint" if setup == "hint-las" else "first-fit"
    config = SimConfig(scheduler="las", round_s=60.0, trace_restarts=True,
                       elastic=None if setup == "hint-las" else rule)
    allocator = Allocator(sia_nodes(), config.policy(policy))
    started = time.perf_counter()
    sim = Simulator(jobs, allocator, truth, config)
    result = sim.run()
    wall = time.perf_counter() - started
    j, tl = result.jobs, result.timeline
    held = float(np.sum(tl["gpus"].to_numpy()[:-1] * np.diff(tl["time_s"].to_numpy())))
    restarts = j["preemptions"] + j["migrations"] + j["rescales"]
    stats = sim.scheduler.elastic.stats if sim.scheduler.elastic else RoundStats()
    return {"avg_jct_h": j["jct_s"].mean() / 3600, "p99_jct_h": j["jct_s"].quantile(0.99) / 3600,
            "restarts_per_job": restarts.mean(), "max_restarts": int(restarts.max()),
            "waste_pct": 100 * j["restart_waste_gpu_s"].sum() / held, "gpu_h_per_job": held / 3600 / len(j),
            "solve_p95_s": float(np.percentile(stats.solve_s, 95)) if stats.solve_s else float("nan"),
            "short": stats.short, "wall_s": wall}


def jittered(jobs: pd.DataFrame, seed: int, max_s: float = 30.0) -> pd.DataFrame:
    """A derived copy of a workload: every arrival later by a uniform 0-`max_s` s (seeded)."""
    rng = np.random.default_rng(seed)
    return jobs.assign(arrival_s=jobs["arrival_s"] + rng.uniform(0.0, max_s, len(jobs)))


def solve_at_scale(truth: ScalingTruth, rounds: int, n_jobs: int = 1000, scale: int = 32) -> list[float]:
    """Seconds per `choose` with `n_jobs` active jobs on Sia's cluster x `scale` (synthetic jobs, seeded)."""
    rng = random.Random(0)
    types = {gpu: TypeShape(gpus * count * scale, gpus) for _, gpu, gpus, _, _, count in SHAPES}
    rates = truth.rates()
    batches = {"bert": [12, 24, 48], "cifar10": [128, 512, 2048], "deepspeech2": [20, 40, 80],
               "imagenet": [200, 800, 1600], "ncf": [1024, 8192], "yolov3": [8, 32, 64]}
    times = []
    for _ in range(rounds):
        jobs = []
        for i in range(n_jobs):
            model = rng.choice(sorted(batches))
            batch = float(rng.choice(batches[model]))
            asked = SimpleNamespace(truth_model=model, batch=batch,  # what `Rates` reads of a job
                                    reference_rate=reference_rate(model, rng.choice([1, 2, 4, 8]), batch))
            options = configs(types, 1, 64)
            job = ElasticJob(f"j{i}", rates(asked, options), restart_s=rng.choice([15.0, 50.0, 250.0]),
                             attained_gpu_s=rng.uniform(0, 3.6e5))
            if rng.random() < 0.6:
                job.current = rng.choice([c for c in options if c.gpus <= 8])
                job.age_s = job.since_s = rng.uniform(60, 3.6e4)
            jobs.append(job)
        stats = RoundStats()
        choose(jobs, types, ElasticRule(), stats)
        times.append(stats.solve_s[-1])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="2,3,4,5,6,7,8")
    parser.add_argument("--solve-rounds", type=int, default=20)
    parser.add_argument("--hosts", action="store_true", help="priced vs blind hosts on a truth with host factors")
    parser.add_argument("--jitter", default="", help="seeds of jittered copies of each workload (e.g. 0,1,2)")
    args = parser.parse_args()
    truth = ScalingTruth.from_placements()
    setups: dict[str, tuple[str, ElasticRule]] = {
        "elastic": ("elastic", ElasticRule()), "elastic-rigid": ("elastic-rigid", ElasticRule()),
        "hint-las": ("hint-las", ElasticRule())}
    if args.hosts:
        profiles = PROFILES.load(data_path("profiles", "derived_multi_gpu.csv"))
        truth = truth.with_hosts(host_factors(TruthCurves.from_profiles(profiles)))
        setups = {"elastic": ("elastic", ElasticRule(price_host=True)),
                  "elastic-blind": ("elastic", ElasticRule(price_host=False))}
    rows = []
    for w in args.workloads.split(","):
        trace = import_sia(WORKLOADS / f"workload-{w}.csv").trace
        exact = prepare_workload(trace, truth.model_names()).jobs
        copies = [(w, exact)] + [(f"{w}.{seed}", jittered(exact, int(seed))) for seed in args.jitter.split(",") if seed]
        for label, jobs in copies:
            for name, (setup, rule) in setups.items():
                rows.append({"workload": label, "setup": name, "copy": "exact" if label == w else "jittered",
                             **run(jobs, truth, setup, rule)})
                print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    pivot = table.pivot(index="workload", columns="setup", values="avg_jct_h")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"\n{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit}, {platform.processor() or 'cpu'}, "
          f"nproc {os.cpu_count()}\n")
    print("| workload | setup | avg JCT h | p99 JCT h | restarts/job (max) | restart waste % GPU-h | GPU-h/job | "
          "round solve p95 s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['setup']} | {r['avg_jct_h']:.3f} | {r['p99_jct_h']:.2f} | "
              f"{r['restarts_per_job']:.2f} ({r['max_restarts']}) | {r['waste_pct']:.1f} | {r['gpu_h_per_job']:.2f} | "
              f"{r['solve_p95_s']:.3f} |")
    for other in (s for s in setups if s != "elastic"):
        cut = 1 - pivot["elastic"] / pivot[other]
        print(f"\nelastic vs {other}, avg JCT cut per workload: {', '.join(f'{c:.0%}' for c in cut)}; "
              f"median {np.median(cut):.0%}")
    for (setup, copy), g in table.groupby(["setup", "copy"]):
        print(f"{setup}, {copy} ({len(g)} runs): mean avg JCT {g['avg_jct_h'].mean():.3f} h, restarts/job "
              f"{g['restarts_per_job'].mean():.2f} (max {g['max_restarts'].max()}), waste {g['waste_pct'].mean():.1f} %"
              f" (over 3 % in {int((g['waste_pct'] > 3).sum())})")
    if args.solve_rounds:
        times = solve_at_scale(truth, args.solve_rounds)
        print(f"\nsolve at 2,048 GPUs, 1,000 active jobs (synthetic), {len(times)} rounds: median "
              f"{np.median(times):.3f} s, p95 {np.percentile(times, 95):.3f} s, max {max(times):.3f} s")


if __name__ == "__main__":
    main()
