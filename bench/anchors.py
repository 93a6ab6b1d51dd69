"""Anchors (issue 14): hetplan's allocator policies on Gavel's and Synergy's own settings, against their figures.

**Gavel's setting** (OSDI 20, continuous single-GPU jobs): 36 V100 + 36 P100 + 36 K80 one-GPU servers; truth =
Gavel's **published** isolated throughputs (its 26 single-GPU job types, `gavel_isolated_throughputs_*.csv`), so a
job's speed on a type is its throughput there over its V100 throughput; jobs drawn like Gavel's generator (job
type uniform, 80 % of V100 durations 60*10^U(1.5,3) s, 20 % 60*10^U(3,4) s, Poisson arrivals at a rate, seeded);
the average JCT of jobs 4000-4999 (of `--gavel-jobs`). Hints: the oracle (read off the truth, as Gavel's policies
read its throughput table). Gavel's own heterogeneity-aware LAS figures (its paper) are quoted beside them.

**Synergy's setting** (OSDI 22): 16 servers x (8 V100, 24 cores, 500 GB); truth = Synergy's **published** V100
CPU/RAM table; one-GPU jobs in Synergy's default 30/60/10 image/language/speech split (image: alexnet, res18,
res50; language: gnmt, transformer; speech: deepspeech, m5; uniform inside a group); durations resampled from
Gavel's Philly-derived trace (seeded); knee hints from curves fitted on the table. ρ is the GPU load offered to
the proportional cluster. Window = the middle half of the jobs by arrival.

Policies: `proportional` (GPU-proportional share, a random fitting node), `hint-static` (hint placement, a job
keeps its place for life: hetplan before issue 14) and `hint` (co-adaptive rounds: re-sizing, moves across GPU
types, gangs). Moves and resumes cost `--migration-s` (30 s), re-sizes `--resize-s` (5 s): stated assumptions;
the anchors' published simulations charge nothing. Appends a dated section to bench/RESULTS.md unless `--no-record`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

import numpy as np
import pandas as pd
from scipy.optimize import linprog

from hetplan.allocator.spec import Node
from hetplan.allocator.stability import Stability
from hetplan.hints import HintSet
from hetplan.hints.index import HintEntry, class_key
from hetplan.reference.speed import gavel_table
from hetplan.reference.synergy import published_v100_profiles
from hetplan.resources import upstream_path
from hetplan.sensitivity import fit_profiles
from hetplan.sim.engine import SimConfig, SimResult, simulate
from hetplan.sim.metrics import summarize
from hetplan.sim.setups import knee_hints
from hetplan.sim.truth import TruthCurves, TruthGrid
from hetplan.sim.workload import with_load
from hetplan.traces import import_trace
from common import machine, record, sim_fingerprint

POLICIES = ("proportional", "hint-static", "hint")
GAVEL_TYPES = {"K80": "k80", "P100": "p100", "V100": "v100"}
GAVEL_PUBLISHED_LAS_H = {2.0: 17.02, 3.0: 16.31, 4.0: 17.07, 5.0: 20.45}  # Gavel's heterogeneity-aware LAS
SYNERGY_MIX = {"alexnet": 0.1, "res18": 0.1, "res50": 0.1, "gnmt": 0.3, "transformer": 0.3, "deepspeech": 0.05,
               "m5": 0.05}


# ---------------------------------------------------------------------- Gavel

def gavel_setting() -> tuple[TruthCurves, HintSet, list[Node], np.ndarray]:
    """Truth, oracle hints, the 108-server cluster, and the speed matrix (job type x K80/P100/V100, V100 = 1)."""
    table = gavel_table()
    table = table[table["scale_factor"] == 1].sort_values("job_type").reset_index(drop=True)
    grids = {(r.job_type, g): TruthGrid((1.0,), (1.0,), np.array([[getattr(r, col)]]), "published:gavel")
             for r in table.itertuples() for g, col in GAVEL_TYPES.items()}
    hints = HintSet("oracle", {class_key(m, 1): tuple(
        HintEntry(g, rank, 1.0, 1.0, thr) for rank, (g, thr) in enumerate(
            sorted(((g, grids[(m, g)].values[0, 0]) for g in GAVEL_TYPES), key=lambda x: -x[1]), start=1))
        for m in table["job_type"]})
    nodes = [Node(f"{g.lower()}-{i}", g, 1, 4, 32) for g in GAVEL_TYPES for i in range(36)]
    speeds = table[list(GAVEL_TYPES.values())].to_numpy() / table[["v100"]].to_numpy()
    return TruthCurves(grids), hints, nodes, speeds


def gavel_jobs(rate: float, n: int, models: list[str], seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    long = rng.random(n) < 0.2
    duration = np.where(long, 60 * 10 ** rng.uniform(3, 4, n), 60 * 10 ** rng.uniform(1.5, 3, n))
    arrival = np.cumsum(rng.exponential(3600 / rate, n))
    model = rng.choice(models, n)
    return pd.DataFrame({"job_id": [f"j{i:05d}" for i in range(n)], "model": model, "sim_model": model,
                         "num_gpus": 1, "arrival_s": arrival - arrival[0], "duration_s": duration})


def gavel_capacity(speeds: np.ndarray, mean_v100_h: float) -> float:
    """The largest arrival rate (jobs/h) any allocation can serve (a fluid LP over GPU-time per job type):
    above it no scheduler has a stable queue."""
    m, t = speeds.shape
    c = np.zeros(m * t + 1)
    c[-1] = -1.0
    rows, rhs = [], []
    for i in range(m):  # the GPU time given to type i serves its share of the arrivals
        row = np.zeros(m * t + 1)
        row[i * t:(i + 1) * t] = -speeds[i]
        row[-1] = mean_v100_h / m
        rows.append(row)
        rhs.append(0.0)
    for k in range(t):  # 36 GPUs of each type
        row = np.zeros(m * t + 1)
        row[[i * t + k for i in range(m)]] = 1.0
        rows.append(row)
        rhs.append(36.0)
    return float(-linprog(c, A_ub=rows, b_ub=rhs, bounds=[(0, None)] * (m * t + 1), method="highs").fun)


def in_system(jobs: pd.DataFrame, fractions: tuple[float, ...]) -> list[int]:
    """Jobs arrived and not finished at these fractions of the arrival period: a stable queue stays flat."""
    end = float(jobs["arrival_s"].max())
    return [int(((jobs["arrival_s"] <= f * end) & (jobs["finish_s"] > f * end)).sum()) for f in fractions]


def run_gavel(args: argparse.Namespace) -> list[dict]:
    truth, hints, nodes, speeds = gavel_setting()
    models = sorted(truth.models)
    mean_h = 0.8 * 60 * (10**3 - 10**1.5) / (1.5 * np.log(10)) / 3600 + 0.2 * 60 * (10**4 - 10**3) / np.log(10) / 3600
    bound = gavel_capacity(speeds, mean_h)
    print(f"Gavel: fluid capacity {bound:.2f} jobs/h (expected V100 hours per job {mean_h:.2f})", flush=True)
    rows = []
    for rate in args.gavel_rates:
        jobs = gavel_jobs(rate, args.gavel_jobs, models, args.seed)
        for policy in POLICIES:
            started = time.perf_counter()
            result = simulate(jobs, nodes, truth, policy, hints, _config(args, 360.0))
            window = result.jobs.iloc[4000:5000]
            rows.append({"rate": rate, "policy": policy, "window_jct_h": window["jct_s"].mean() / 3600,
                         "all_jct_h": result.jobs["jct_s"].mean() / 3600, "in_system": in_system(result.jobs, (
                             0.25, 0.5, 0.75, 1.0)), "seconds": time.perf_counter() - started, "bound": bound,
                         "k80_jobs": int(result.jobs["gpu_types"].eq("K80").sum()), **_counts(result)})
            print(f"Gavel {rate:g} jobs/h {policy:12s} window {rows[-1]['window_jct_h']:6.2f} h "
                  f"(Gavel {GAVEL_PUBLISHED_LAS_H.get(rate, float('nan')):.2f} h) in system {rows[-1]['in_system']} "
                  f"{rows[-1]['seconds']:.1f} s", flush=True)
    return rows


# ---------------------------------------------------------------------- Synergy

def run_synergy(args: argparse.Namespace) -> tuple[list[dict], float]:
    published = published_v100_profiles()
    truth = TruthCurves.from_profiles(published)
    curves = fit_profiles(published).curves
    nodes = [Node(f"v100-{i}", "V100", 8, 24, 500) for i in range(16)]
    source = import_trace(upstream_path("traces", "gavel_philly_0e4a51.trace"), "gavel").trace
    rng = np.random.default_rng(args.seed)
    n = args.synergy_jobs
    duration = source["duration_s"].to_numpy(float)[rng.integers(0, len(source), n)]
    model = rng.choice(list(SYNERGY_MIX), n, p=list(SYNERGY_MIX.values()))
    base = pd.DataFrame({"job_id": [f"j{i:05d}" for i in range(n)], "model": model, "sim_model": model,
                         "num_gpus": 1, "arrival_s": 0.0, "duration_s": duration})
    hints = knee_hints(curves, base[["model", "num_gpus"]].drop_duplicates(), ["V100"])
    knees = curves.drop_duplicates("model").set_index("model")
    at_knee = {m: truth.speed(m, "V100", 1, round(k.knee_cpus * 1000), round(k.knee_mem_gb * 1024))
               for m, k in knees.iterrows()}
    bound = 1 / sum(p / at_knee[m] for m, p in SYNERGY_MIX.items())  # every job at its knee, durations alike
    print(f"Synergy: capacity at the knees {bound:.2f}x the proportional cluster's", flush=True)
    rows = []
    for rho in args.synergy_rho:
        jobs = with_load(base, rho * 128 / (duration.mean() / 3600), args.seed)
        for scheduler in args.schedulers:
            for policy in POLICIES:
                result = simulate(jobs, nodes, truth, policy, None if policy == "proportional" else hints,
                                  _config(args, 300.0, scheduler))
                done = result.jobs.sort_values("arrival_s")
                window = done.iloc[n // 4: 3 * n // 4]
                s = summarize(result, 0.0)
                rows.append({"rho": rho, "scheduler": scheduler, "policy": policy,
                             "window_jct_h": window["jct_s"].mean() / 3600, "all_jct_h": s["avg_jct_h"],
                             "gpu_util": s["gpu_util"], "gpu_util_waiting": s["gpu_util_waiting"],
                             "cpu_util": s["cpu_util"], **_counts(result)})
            base_jct = rows[-3]["window_jct_h"]
            print(f"Synergy rho {rho:g} {scheduler}: " + ", ".join(
                f"{r['policy']} {base_jct / r['window_jct_h']:.2f}x" for r in rows[-3:]), flush=True)
    return rows, bound


# ---------------------------------------------------------------------- shared

def _config(args: argparse.Namespace, round_s: float, scheduler: str = "las") -> SimConfig:
    return SimConfig(scheduler, round_s, migration_s=args.migration_s, resize_s=args.resize_s,  # type: ignore[arg-type]
                     seed=args.seed, stability=_stability(args))


def _stability(args: argparse.Namespace) -> Stability:
    return Stability(args.move_margin, args.return_window_h * 3600, args.return_margin, args.move_budget,
                     args.spread_moves)


def _counts(result: SimResult) -> dict:
    moves = result.jobs["migrations"]
    return {**{k: result.counts[k] for k in ("preemptions", "migrations", "resizes")},
            "moves_p99": float(np.percentile(moves, 99)), "moves_max": int(moves.max()),
            "moved": float((moves > 0).mean())}


def _pct(value: float) -> str:
    return "no job waited" if value != value else f"{value:.0%}"


def _report(gavel: list[dict], synergy: list[dict], synergy_bound: float, args, total: float) -> str:
    lines = [
        "\n## Anchors: Gavel's and Synergy's settings, co-adaptive rounds (`bench/anchors.py`, issue 14)\n",
        f"Run: `.venv/bin/python bench/anchors.py` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}; "
        f"{total:.0f} s in all; hetplan/sim sha256 `{sim_fingerprint()}`. Moves and resumes cost "
        f"{args.migration_s:g} s, re-sizes {args.resize_s:g} s (stated assumptions; the anchors charge nothing); "
        f"stability {_stability(args).to_dict()}. "
        "Setups and truths as the script's docstring says: **truths are the anchors' published tables**, the "
        "**workloads are synthetic** (drawn like the anchors' generators, seed "
        f"{args.seed}).\n",
        f"### Gavel: 36 V100 + 36 P100 + 36 K80, LAS, rounds of 6 min, jobs 4000-4999 of {args.gavel_jobs:,}\n",
        f"Fluid capacity of this cluster for this job mix (an LP over GPU time per job type, perfect comparative "
        f"advantage): **{gavel[0]['bound']:.2f} jobs/h**; above it no scheduler's queue is stable.\n",
        "| jobs/h | Gavel's published LAS | proportional | hint-static | **hint (co-adaptive)** | "
        "hint: jobs in system at 1/4, 1/2, 3/4, end of arrivals | hint: migrations / preemptions | "
        "hint: jobs moved, moves per job p99 / max | sim time hint |",
        "|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for rate in sorted({r["rate"] for r in gavel}):
        by = {r["policy"]: r for r in gavel if r["rate"] == rate}
        h = by["hint"]
        published = GAVEL_PUBLISHED_LAS_H.get(rate)
        lines.append(f"| {rate:g} | {f'{published:.2f} h' if published else '-'} | "
                     f"{by['proportional']['window_jct_h']:.2f} h | {by['hint-static']['window_jct_h']:.2f} h | "
                     f"**{h['window_jct_h']:.2f} h** | {', '.join(map(str, h['in_system']))} | "
                     f"{h['migrations']:,} / {h['preemptions']:,} | {h['moved']:.0%}, {h['moves_p99']:g} / "
                     f"{h['moves_max']} | {h['seconds']:.1f} s |")
    lines += [
        "",
        f"### Synergy: 16 x (8 V100, 24 cores, 500 GB), 30/60/10 mix, one-GPU jobs ({args.synergy_jobs:,} per load)\n",
        f"Capacity if every job ran at its knee (durations alike across models): **{synergy_bound:.2f}x** the "
        "proportional cluster's: 60 % of this mix is language models that gain nothing from cores, which caps "
        "what any CPU/RAM allocation can win here. Ratio = proportional window JCT / the policy's.\n",
        "| ρ | scheduler | proportional JCT (window) | hint-static | **hint** | GPU util while jobs wait: "
        "prop / static / hint | migrations / re-sizes (hint) |",
        "|---:|---|---:|---:|---:|---|---:|",
    ]
    for i in range(0, len(synergy), 3):
        p, s, h = synergy[i:i + 3]
        lines.append(f"| {p['rho']:g} | {p['scheduler'].upper()} | {p['window_jct_h']:.1f} h | "
                     f"{p['window_jct_h'] / s['window_jct_h']:.2f}x | **{p['window_jct_h'] / h['window_jct_h']:.2f}x** | "
                     f"{' / '.join(_pct(r['gpu_util_waiting']) for r in (p, s, h))} | "
                     f"{h['migrations']:,} / {h['resizes']:,} |")
    best = max(synergy[2::3], key=lambda r: next(p for p in synergy if p['rho'] == r['rho'] and p['scheduler'] ==
                                                  r['scheduler'] and p['policy'] == 'proportional')['window_jct_h']
               / r['window_jct_h'])
    lines.append(f"\nBest hint ratio: ρ {best['rho']:g}, {best['scheduler'].upper()}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gavel-rates", type=float, nargs="+", default=[2.0, 3.0, 4.0, 5.0, 6.0])
    parser.add_argument("--gavel-jobs", type=int, default=6_500)
    parser.add_argument("--synergy-rho", type=float, nargs="+", default=[0.9, 1.0, 1.1, 1.2])
    parser.add_argument("--synergy-jobs", type=int, default=2_000)
    parser.add_argument("--schedulers", nargs="+", default=["las", "fifo", "srtf"])
    parser.add_argument("--migration-s", type=float, default=30.0)
    parser.add_argument("--resize-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--move-margin", type=float, default=Stability.margin)
    parser.add_argument("--return-window-h", type=float, default=Stability.return_window_s / 3600)
    parser.add_argument("--return-margin", type=float, default=Stability.return_margin)
    parser.add_argument("--move-budget", type=int, default=Stability.budget)
    parser.add_argument("--no-spread-moves", dest="spread_moves", action="store_false",
                        help="a swap sends down the least speed lost first (before issue 21's tuning)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}", flush=True)
    gavel = run_gavel(args)
    synergy, bound = run_synergy(args)
    text = _report(gavel, synergy, bound, args, time.perf_counter() - started)
    print(text)
    if not args.no_record:
        record([text])


if __name__ == "__main__":
    main()
