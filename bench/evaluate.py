"""Four-way comparison (issue 7): status quo, status quo + sensitivity-aware, GPU-only mix and hetplan, simulated.

For each shipped trace (Synergy's 100-job trace, Gavel's Philly-derived `gavel_philly_0e4a51`), each catalog
(the shipped default catalog with all clouds, and without Lambda, whose GH200 shape dominates the full
catalog) and each budget, `hetplan.sim.evaluate.evaluate` plans the four setups and replays the trace on each
(LAS, round 300 s) at two Poisson loads. The loads are set per (trace, catalog, budget) from the status quo
cluster: the arrival rate at which the jobs ask for `--rho` of its GPU time, each job counting its GPUs x its
duration on the status quo's (single) shape at the GPU-proportional share, speed from the truth (jobs too big for
that shape count zero). With `--rho` 0.5 and 1.3 the status quo is moderately loaded and overloaded, as far
as the trace's length lets it be (see RESULTS.md).

Every figure is a simulation on DERIVED data: the planner sees the fitted curve table of the default workspace
(`.hetplan/runs/*/curves.parquet`, fitted from the derived profiles; refitted if absent) and the simulator
advances jobs by the derived default profiles (fitted curves as fallback). Jobs of models without truth curves
run as a truth model drawn at random (seeded). Appends a dated section to bench/RESULTS.md unless `--no-record`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

import pandas as pd

from hetplan.allocator.spec import to_milli
from hetplan.catalog import load_default_catalog
from hetplan.planner.baselines import STATUS_QUO
from hetplan.reference import default_profiles
from hetplan.resources import upstream_path
from hetplan.sim.evaluate import evaluate, plan_setups
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import prepare_workload
from hetplan.traces import import_trace
from common import fitted_curves, machine, record, sim_fingerprint

TRACES = (("synergy_static_100job.csv", "synergy"), ("gavel_philly_0e4a51.trace", "gavel"))






def loads_for(trace: pd.DataFrame, truth: TruthCurves, catalog: pd.DataFrame, curves: pd.DataFrame, budget: float,
              rhos: list[float], seed: int) -> list[float]:
    """Jobs/h at which the status quo's GPUs are offered `rho` of their time: each job's GPU-hours on the status
    quo's (single) shape at the GPU-proportional share, speed from the truth; jobs too big for it offer none."""
    jobs = prepare_workload(trace, truth.models, "mix", seed).jobs
    setups, _, _ = plan_setups(jobs, catalog, curves, budget)
    status_quo = next(s for s in setups if s.name == STATUS_QUO)
    node = status_quo.nodes[0]
    cpu_m, mem_mb = to_milli(node.cpus) // node.gpus, to_milli(node.mem_gb) // node.gpus
    fits = jobs[jobs["num_gpus"] <= node.gpus]
    speed = fits["sim_model"].map(lambda m: truth.speed(m, node.gpu_type, 1, cpu_m, mem_mb))
    gpu_h_per_job = float((fits["num_gpus"] * fits["duration_s"] / speed).sum()) / 3600 / len(jobs)
    return [round(rho * status_quo.gpus / gpu_h_per_job, 3) for rho in rhos]




def nodes_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} x {shape}" for shape, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=float, nargs="+", default=[100.0, 400.0])
    parser.add_argument("--rho", type=float, nargs=2, default=[0.5, 1.3], help="status quo load fractions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}", flush=True)
    curves, curves_from = fitted_curves()
    truth = TruthCurves.from_profiles(default_profiles(), fallback=curves)
    full = load_default_catalog()
    catalogs = (("all clouds", full), ("AWS + GCP + Azure", full[full["cloud"] != "lambda"]))
    header = ["| catalog | budget $/h | load jobs/h (ρ) | setup | GPUs | $/h | avg JCT h | p99 JCT h | makespan h | "
              "GPU util | work per $ | JCT speedup | work/$ ratio | too big |",
              "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    sections: list[str] = []
    for file, fmt in TRACES:
        trace = import_trace(upstream_path("traces", file), fmt).trace
        rows, mixes, notes = list(header), [], set()
        trace_started = time.perf_counter()
        for label, catalog in catalogs:
            for budget in args.budgets:
                loads = loads_for(trace, truth, catalog, curves, budget, args.rho, args.seed)
                result = evaluate(trace, catalog, curves, truth, budget, schedulers=("las",), loads=loads,
                                  seed=args.seed)
                notes.update(w for w in result.warnings if not w.startswith("arrivals redrawn"))
                mixes.append(f"- {label}, {budget:g} $/h: " + "; ".join(
                    f"{s.name}: {nodes_text(s.node_counts)} ({s.gpus} GPUs, {s.policy})" for s in result.setups))
                for r in result.summary.itertuples():
                    rho = args.rho[loads.index(r.load_jobs_per_h)]
                    rows.append(f"| {label} | {budget:g} | {r.load_jobs_per_h:g} ({rho:g}) | {r.setup} | {r.gpus} | "
                                f"{r.cost_per_hour:.1f} | {r.avg_jct_h:.3g} | {r.p99_jct_h:.3g} | {r.makespan_h:.4g} | "
                                f"{r.gpu_util:.0%} | {r.work_per_dollar:.3g} | {r.jct_speedup:.2f}x | "
                                f"{r.work_per_dollar_ratio:.2f}x | {r.rejected_too_big} |")
                    print(f"{file} {rows[-1]}", flush=True)
        elapsed = time.perf_counter() - trace_started
        sections += [f"\n**{file}** ({len(trace):,} jobs; {elapsed:.0f} s for its 8 evaluations)\n", *rows, "",
                     "Setups (node counts):", *mixes, "", *(f"- note: {n}" for n in sorted(notes))]
    total = time.perf_counter() - started
    print(f"total {total:.0f} s", flush=True)
    if args.no_record:
        return
    text = [
        "\n## Four-way comparison in simulation (`bench/evaluate.py`, issue 7)\n",
        f"Run: `.venv/bin/python bench/evaluate.py` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}; "
        f"{total:.0f} s in all; hetplan/sim sha256 `{sim_fingerprint()}`. `hetplan.sim.evaluate.evaluate` per trace, "
        f"catalog and budget: LAS, round 300 s, Poisson arrivals (seed {args.seed}) at two loads per row group: "
        f"ρ = {args.rho[0]:g} and {args.rho[1]:g} is the share of the status quo's GPU time the arrivals ask for "
        "(each job's GPUs x its duration on the status quo's shape at the GPU-proportional share, speed from the "
        "truth; jobs too big for that shape count zero).\n",
        f"**Every figure is a simulation on derived data**: the planner and the knee hints read the fitted curves "
        f"({curves_from}, fitted from the **derived** profiles), and jobs advance at speeds read off the **derived** "
        "default profiles (fitted curves as fallback). Nothing here is measured on hardware. JCT speedup = status quo "
        "avg JCT / setup avg JCT; work per $ = reference GPU-hours completed per US$ over the makespan; "
        "\"too big\" = jobs needing more GPUs than the setup's largest node (rejected there, so not in its JCTs).\n",
        *sections,
        "",
    ]
    record(text)


if __name__ == "__main__":
    main()
