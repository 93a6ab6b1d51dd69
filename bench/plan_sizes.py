"""Planning time against fidelity (issue 23): the default replay sizes beside smaller ones, side by side.

The workload is bench/codesign.py's **synthetic** one (`--jobs` resampled from Gavel's Philly-derived trace,
`--budget` 400 $/h, `--rho` 0.8 of the status quo's GPU time, two arrival draws); the planner's curves are fitted from the
derived profiles. Each configuration plans with `plan_workload` (`--shortlist`, `--screen-jobs`,
`--replay-jobs` as `hetplan plan` takes them), in turn, `--repeats` times; the table gives the median wall and
CPU seconds (this process and its replay workers) and the winner. Regret: how much worse the winner's average
JCT is, replayed as the default replays it (every draw, the default sample), than the default winner's; a
winner the default did not replay is replayed for it. Prints only; the caller records the figures.
"""

from __future__ import annotations

import argparse
import statistics
import time

from codesign import problem_and_workload
from common import fitted_curves, machine
from screening import cpu_s

from hetplan.catalog import load_default_catalog
from hetplan.codesign import plan_workload
from hetplan.codesign.replay import replay
from hetplan.codesign.screen import REPLAY_JOBS, sampled
from hetplan.planning import ReplaySizes
from hetplan.reference import default_profiles
from hetplan.sim.engine import SimConfig
from hetplan.sim.truth import TruthCurves


def sizes(text: str) -> ReplaySizes:
    """SHORTLIST,SCREEN_JOBS,REPLAY_JOBS (a blank keeps the default)."""
    parts = [int(p) if p.strip() else None for p in text.split(",")]
    return ReplaySizes(*(parts + [None] * 3)[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--variants", type=sizes, nargs="+", default=[sizes("2,1000,4000")],
                        help="SHORTLIST,SCREEN_JOBS,REPLAY_JOBS each, beside the default")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rho", type=float, default=0.8, help="the load, as a share of the status quo's GPU time")
    parser.add_argument("--budget", type=float, default=400.0)
    args = parser.parse_args()
    print(f"{machine()}; {args.jobs:,} jobs, rho {args.rho:g}, {args.budget:g} $/h", flush=True)
    curves, _ = fitted_curves()
    truth = TruthCurves.from_profiles(default_profiles(), fallback=curves)
    problem, workload = problem_and_workload(args.jobs, curves, truth, load_default_catalog(), args.budget, args.rho)
    configs = [ReplaySizes(), *args.variants]
    times: dict[int, list[tuple[float, float]]] = {k: [] for k in range(len(configs))}
    plans = {}
    for _ in range(args.repeats):
        for k, config in enumerate(configs):
            wall, cpu = time.perf_counter(), cpu_s()
            plans[k] = plan_workload(problem, workload, **config.options())
            times[k].append((time.perf_counter() - wall, cpu_s() - cpu))
            print(f"{config}: {times[k][-1][0]:.1f} s wall, {times[k][-1][1]:.1f} CPU s, {plans[k].winner}", flush=True)
    default = plans[0]
    best = float(default.row(default.winner)["avg_jct_h"])
    print("| shortlist, screen jobs, replay jobs | wall s (median) | CPU s (median) | winner | its avg JCT h, "
          "replayed as the default does | regret |\n|---|---:|---:|---|---:|---:|")
    for k, config in enumerate(configs):
        winner = plans[k].winner
        row = default.row(winner)
        if row is not None and row["avg_jct_h"] == row["avg_jct_h"]:
            jct = float(row["avg_jct_h"])
        else:
            candidate = plans[k].candidate(winner)
            draws, _ = sampled(workload.draws, REPLAY_JOBS, int(workload.summary["stressed_draws"]))
            jct = replay(problem, [candidate], draws, SimConfig("las", 300.0))[0].metrics["avg_jct_h"]
        label = "default" if k == 0 else f"{config.shortlist}, {config.screen_jobs}, {config.replay_jobs}"
        print(f"| {label} | {statistics.median(t for t, _ in times[k]):.1f} | "
              f"{statistics.median(c for _, c in times[k]):.1f} | {winner} | {jct:.3g} | {jct / best - 1:+.1%} |",
              flush=True)


if __name__ == "__main__":
    main()
