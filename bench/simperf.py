"""Co-adaptive replay speed (issue 23): the same replays on two source trees, side by side, same results checked.

Cases (each one simulation with the `hint` policy, co-adaptive rounds, LAS):

- `gavel`: Gavel's setting as `bench/anchors.py` builds it (36 V100 + 36 P100 + 36 K80, published throughputs,
  oracle hints, 360 s rounds), `--gavel-rate` jobs/h (default 5: 86 % of its fluid capacity), 6,500 jobs, seed 0.
- `codesign`: `bench/codesign.py`'s **synthetic** 10,000-job workload (resampled from Gavel's Philly-derived trace,
  400 $/h, `--codesign-rho` 0.8 by default, arrival draw 0), replayed on the co-adaptive candidate the MILP proposes with the highest fluid
  load not pruned (the busiest: `--candidate` names another), with the planner's truth, as `plan_workload` does.
- `philly80k`: `bench/simulator.py`'s **synthetic** 80,000-job Philly-format trace (20 jobs/h) on 200 p3.16xlarge
  nodes (one GPU type) with knee hints.

`--trees NAME=PATH ...` runs every case on each tree (a checkout whose `hetplan/` is imported), in a fresh process
per run, alternating trees, `--repeats` times; it prints the medians and whether the job tables (every column,
as CSV) and event counts are byte-identical across trees and repeats. `--profile CASE` runs one case under cProfile
on this tree instead. Prints only; the caller records the figures in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = ("gavel", "codesign", "philly80k")


def gavel_case(rate: float):
    from anchors import gavel_jobs, gavel_setting

    from hetplan.sim.engine import SimConfig

    truth, hints, nodes, _ = gavel_setting()
    jobs = gavel_jobs(rate, 6_500, sorted(truth.models), 0)
    return jobs, nodes, truth, "hint", hints, SimConfig("las", 360.0, migration_s=30.0, resize_s=5.0, seed=0)


def codesign_case(jobs_n: int, candidate: str | None, rho: float = 0.8):
    from codesign import problem_and_workload
    from common import fitted_curves

    from hetplan.catalog import load_default_catalog
    from hetplan.codesign import propose
    from hetplan.codesign.plan import PRUNE_LOAD, fluid_load
    from hetplan.codesign.replay import candidate_nodes, planner_truth
    from hetplan.hints import HintSet
    from hetplan.reference import default_profiles
    from hetplan.sim.engine import SimConfig
    from hetplan.sim.truth import TruthCurves

    curves, _ = fitted_curves()
    truth = TruthCurves.from_profiles(default_profiles(), fallback=curves)
    problem, workload = problem_and_workload(jobs_n, curves, truth, load_default_catalog(), 400.0, rho)
    config = SimConfig("las", 300.0)
    found = [(fluid_load(workload, c), c) for c in propose(problem) if config.policy(c.policy).rounds is not None]
    if candidate is not None:
        load, chosen = next((load, c) for load, c in found if c.name == candidate)
    else:
        load, chosen = max(((load, c) for load, c in found if not load > PRUNE_LOAD), key=lambda x: x[0])
    print(f"codesign candidate {chosen.name!r}, fluid load {load:.2f}", file=sys.stderr, flush=True)
    hints = HintSet.from_frame(chosen.result.hints) if len(chosen.result.hints) else HintSet.empty()
    return (workload.draws[0], candidate_nodes(problem, chosen), planner_truth(problem), chosen.policy, hints,
            config)


def philly_case():
    from common import fitted_curves
    from simulator import SHAPE, nodes, synthetic_philly

    from hetplan.reference import default_profiles
    from hetplan.sim.engine import SimConfig
    from hetplan.sim.setups import knee_hints
    from hetplan.sim.truth import TruthCurves
    from hetplan.sim.workload import prepare_workload
    from hetplan.traces import import_trace

    truth = TruthCurves.from_profiles(default_profiles())
    curves, _ = fitted_curves()
    with tempfile.TemporaryDirectory() as tmp:
        path = synthetic_philly(Path(tmp) / "synthetic_philly_80000_seed0.csv", 80_000, 20.0, 0)
        trace = import_trace(path, "philly").trace
    jobs = prepare_workload(trace, truth.models, "mix", 0).jobs
    classes = jobs[["sim_model", "num_gpus"]].drop_duplicates().rename(columns={"sim_model": "model"})
    hints = knee_hints(curves, classes, [SHAPE[1]])
    return jobs, nodes(200), truth, "hint", hints, SimConfig("las")


def build(args: argparse.Namespace, case: str):
    if case == "gavel":
        return gavel_case(args.gavel_rate)
    if case == "codesign":
        return codesign_case(args.codesign_jobs, args.candidate, args.codesign_rho)
    return philly_case()


def child(args: argparse.Namespace) -> None:
    """One timed simulation of `args.child`; prints a JSON line: seconds, the job table's hash and the counts."""
    from hetplan.sim.engine import simulate

    jobs, nodes, truth, policy, hints, config = build(args, args.child)
    start, cpu = time.perf_counter(), time.process_time()
    result = simulate(jobs, nodes, truth, policy, hints, config)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    table = result.jobs.to_csv(index=False).encode()
    if args.dump:
        Path(args.dump).write_bytes(table)
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "jobs_sha256": hashlib.sha256(table).hexdigest()[:16],
                      "timeline_sha256": hashlib.sha256(result.timeline.to_csv(index=False).encode()).hexdigest()[:16],
                      "counts": result.counts, "avg_jct_h": float(result.jobs["jct_s"].mean() / 3600)}))


def profile(args: argparse.Namespace) -> None:
    from hetplan.sim.engine import simulate

    jobs, nodes, truth, policy, hints, config = build(args, args.profile)
    profiler = cProfile.Profile()
    profiler.enable()
    simulate(jobs, nodes, truth, policy, hints, config)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats(args.sort).print_stats(args.top)
    print(out.getvalue())


def drive(args: argparse.Namespace) -> None:
    trees = dict(t.split("=", 1) for t in args.trees)
    results: dict[tuple[str, str], list[dict]] = {}
    for case in args.cases:
        for r in range(args.repeats):
            for name, path in trees.items():
                env = {**os.environ, "PYTHONPATH": f"{Path(path).resolve()}{os.pathsep}{HERE}"}
                cmd = [sys.executable, str(HERE / "simperf.py"), "--child", case, "--gavel-rate", str(args.gavel_rate),
                       "--codesign-jobs", str(args.codesign_jobs), "--codesign-rho", str(args.codesign_rho)] + (["--candidate", args.candidate]
                                                                      if args.candidate else [])
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
                results.setdefault((case, name), []).append(row)
                print(f"{case} {name} run {r + 1}: {row['seconds']:.1f} s (CPU {row['cpu_seconds']:.1f} s) jobs {row['jobs_sha256']} "
                      f"timeline {row['timeline_sha256']} avg JCT {row['avg_jct_h']:.4f} h load "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
    print("| case | " + " | ".join(f"{name} (median wall / CPU)" for name in trees) + " | ratio (wall / CPU) | "
          "identical |")
    for case in args.cases:
        medians = [statistics.median(r["seconds"] for r in results[(case, name)]) for name in trees]
        cpus = [statistics.median(r["cpu_seconds"] for r in results[(case, name)]) for name in trees]
        digests = {(r["jobs_sha256"], r["timeline_sha256"], json.dumps(r["counts"], sort_keys=True))
                   for name in trees for r in results[(case, name)]}
        ratio = f"{medians[0] / medians[-1]:.2f}x / {cpus[0] / cpus[-1]:.2f}x"
        print(f"| {case} | " + " | ".join(f"{m:.1f} s / {c:.1f} s" for m, c in zip(medians, cpus)) + f" | {ratio} | "
              f"{'yes' if len(digests) == 1 else 'NO'} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", default=[f"this={HERE.parent}"], help="NAME=PATH, compared in order")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=["gavel", "codesign"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gavel-rate", type=float, default=5.0)
    parser.add_argument("--codesign-jobs", type=int, default=10_000)
    parser.add_argument("--codesign-rho", type=float, default=0.8,
                        help="codesign: the load (above 1: overloaded, queues grow for the whole replay)")
    parser.add_argument("--candidate", default=None, help="codesign: the candidate to replay (default: the busiest)")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--dump", default=None, help="with --child: write the job table (CSV) here")
    parser.add_argument("--profile", choices=CASES, default=None, help="cProfile one case on this tree")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    if args.child:
        child(args)
    elif args.profile:
        profile(args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
