"""Moves that pay on Gavel's setting (issue 30): the stability rule against the unconstrained co-adaptive run.

Gavel's setting as `bench/anchors.py` runs it (36 V100 + 36 P100 + 36 K80 one-GPU servers, Gavel's **published**
throughputs as truth, jobs drawn like Gavel's generator: **synthetic**, seeded; LAS, 360 s rounds, moves 30 s),
one rate (5 jobs/h by default), `hint` under several stability rules (`RULES`), each (seed, rule) in its own
process, two at a time. Reported per run: the average JCT of jobs 4000-4999, its ratio to the unconstrained run of
the same seed, moves per job p50 / p99 / max over all jobs, and wall time. Prints a Markdown table; records nothing
(the section in RESULTS.md is written by hand around it).

    PYTHONPATH=$PWD python bench/gavel_moves.py --seeds 0 1 2 3 --rules unconstrained default
"""

from __future__ import annotations

import argparse
import logging
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from anchors import gavel_jobs, gavel_setting
from hetplan.allocator.stability import Stability
from hetplan.sim.engine import SimConfig, simulate

log = logging.getLogger("gavel_moves")

RULES: dict[str, dict] = {
    # the rule off: any gain moves, no return rule, no budget, the least speed lost goes down in a swap (this
    # reproduces the co-adaptive run before issue 21's rule: 17.10 / 16.11 h at seeds 0 / 1 against 17.18 / 16.11)
    "unconstrained": {"margin": 0.0, "return_window_s": 0.0, "budget": 10**6, "spread": False},
    "default": {},
    # no budget and no return rule, but a move must pay back its own cost over the job's age (margin 1)
    "no-budget-margin-1": {"margin": 1.0, "return_window_s": 0.0, "budget": 10**6},
}
"""Named rules: keyword arguments of `Stability` (the rest its defaults)."""


def run_one(rate: float, n: int, seed: int, rule: str) -> dict:
    """One simulation of Gavel's setting under `rule`: window JCT, moves per job, wall time."""
    truth, hints, nodes, _ = gavel_setting()
    jobs = gavel_jobs(rate, n, sorted(truth.models), seed)
    config = SimConfig("las", 360.0, migration_s=30.0, resize_s=5.0, seed=seed,  # type: ignore[arg-type]
                       stability=Stability(**RULES[rule]))
    started = time.perf_counter()
    result = simulate(jobs, nodes, truth, "hint", hints, config)
    moves = result.jobs["migrations"].to_numpy()
    return {"seed": seed, "rule": rule, "jct_h": result.jobs["jct_s"].iloc[4000:5000].mean() / 3600,
            "p50": float(np.percentile(moves, 50)), "p99": float(np.percentile(moves, 99)), "max": int(moves.max()),
            "moves": int(moves.sum()), "preemptions": int(result.counts["preemptions"]),
            "wall_s": time.perf_counter() - started}


def table(rows: list[dict]) -> str:
    """Markdown: one line per (seed, rule), the ratio to the same seed's unconstrained run; a mean line per rule."""
    base = {r["seed"]: r["jct_h"] for r in rows if r["rule"] == "unconstrained"}
    out = ["| seed | rule | window JCT | / unconstrained | moves p50 / p99 / max | moves | preemptions | wall |",
           "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = f"{r['jct_h'] / base[r['seed']]:.3f}" if r["seed"] in base else "-"
        out.append(f"| {r['seed']} | {r['rule']} | {r['jct_h']:.2f} h | {ratio} | {r['p50']:g} / {r['p99']:g} / "
                   f"{r['max']} | {r['moves']:,} | {r['preemptions']:,} | {r['wall_s']:.0f} s |")
    for rule in dict.fromkeys(r["rule"] for r in rows):
        ratios = [r["jct_h"] / base[r["seed"]] for r in rows if r["rule"] == rule and r["seed"] in base]
        p99 = max(r["p99"] for r in rows if r["rule"] == rule)
        if ratios:
            out.append(f"| mean | {rule} | | **{np.mean(ratios):.3f}** (max {max(ratios):.3f}) | p99 max {p99:g} | | "
                       "| |")
    return "\n".join(out)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--jobs", type=int, default=6_500)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=list(RULES))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    tasks = [(args.rate, args.jobs, seed, rule) for seed in args.seeds for rule in args.rules]
    with ProcessPoolExecutor(args.workers) as pool:
        rows = []
        for row in pool.map(run_one, *zip(*tasks)):
            log.info("seed %d %-14s %.2f h p99 %g max %d %.0f s", row["seed"], row["rule"], row["jct_h"], row["p99"],
                     row["max"], row["wall_s"])
            rows.append(row)
    print(table(rows))


if __name__ == "__main__":
    main()
