"""Out-of-sample evaluation (issue 13): plan on the first half of a trace, replay the second half.

For each shipped Philly-derived trace (Gavel's `gavel_philly_0e4a51` and `gavel_philly_2869ce`), split by
arrival, each catalog (the shipped default with all clouds, and AWS + GCP + Azure) and each budget,
`hetplan.evaluation.evaluate` plans on the first half (the planner's objective: average JCT) and replays the
second half on the four setups, LAS, round 300 s, at loads rho = the share of the status quo's GPU time the
arrivals ask for (a Poisson rate per half; the replay's arrivals drawn with another seed than the planner's).

Jobs of models the truth lacks (lm, recommendation, a3c, cyclegan) run as a truth model drawn per job and are
relabelled as that model in both halves (`relabel_unknown`), so the planner knows them by their fitted curves.
Jobs larger than every node (16 and 32 GPUs in 2869ce) are rejected by every setup and counted.

Every figure is a simulation on DERIVED data: the planner sees curves fitted from the derived profiles, jobs
advance at speeds read off the derived profiles. With `--cost` it also plans `--objective cost` with the JCT
target set to the status quo's replayed average JCT at 400 $/h (rho 0.8) and replays the cheaper plan.
Appends a dated section to bench/RESULTS.md unless `--no-record`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import time

import numpy as np
import pandas as pd

from hetplan.catalog import load_default_catalog
from hetplan.codesign import plan_workload
from hetplan.codesign.candidates import STATUS_QUO
from hetplan.codesign.replay import candidate_nodes
from hetplan.evaluation import ProblemInputs, evaluate
from hetplan.contracts import ContractError
from hetplan.hints import HintSet
from hetplan.planning.calibration import COVERAGE, Calibration
from hetplan.sim.engine import SimConfig, simulate
from hetplan.sim.metrics import summarize
from hetplan.sim.truth import TruthCurves
from common import derived_setting, machine, record, sim_fingerprint
from workloads import GAVEL, gavel_halves

TRACES = GAVEL
RHOS = (0.5, 0.8, 1.0, 1.3)


def halves(file: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trace's first half by arrival to plan on, its second to replay."""
    pair = gavel_halves(file)
    return pair.plan, pair.replay


CATALOGS = {"all": "all clouds", "aws-gcp-azure": "AWS + GCP + Azure"}


def catalogs(keys=tuple(CATALOGS)) -> list[tuple[str, pd.DataFrame]]:
    """The default catalog (all clouds) and its AWS + GCP + Azure part, as (label, catalog), those of `keys`."""
    full = load_default_catalog()
    both = {"all": full, "aws-gcp-azure": full[full["cloud"] != "lambda"].reset_index(drop=True)}
    return [(CATALOGS[key], both[key]) for key in keys]


def geomean(values) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def nodes_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} x {shape}" for shape, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def giant_lines(jobs: pd.DataFrame, trace: str, catalog: str, budget: float, largest_node: int) -> list[str]:
    """Per (rho, setup), a table row on the jobs larger than every node of the catalog (they run as gangs): how
    many, how many ran and were rejected, their average JCT and the GPU types they ran on."""
    big = jobs[jobs["num_gpus"] > largest_node]
    lines = []
    for (rho, setup), group in big.groupby(["rho", "setup"], sort=False):
        ran = group[group["status"] == "completed"]
        types = ", ".join(f"{t} {n}" for t, n in ran["gpu_type"].value_counts().items())
        lines.append(f"| {trace} | {catalog} | {budget:g} | {rho:g} | {setup} | {len(group)} | {len(ran)} | "
                     f"{int((group['status'] == 'rejected_too_big').sum())} | "
                     f"{ran['jct_s'].mean() / 3600:.3g} | {types or '-'} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=float, nargs="+", default=[100.0, 400.0])
    parser.add_argument("--traces", nargs="+", default=list(TRACES))
    parser.add_argument("--catalogs", nargs="+", choices=list(CATALOGS), default=list(CATALOGS))
    parser.add_argument("--rhos", type=float, nargs="+", default=list(RHOS), help="loads to run (a subset of rows)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cost", action="store_true", help="also measure the cost objective's saving")
    parser.add_argument("--cost-only", action="store_true", help="only the cost objective's saving")
    parser.add_argument("--rows-out", default=None, help="write hetplan's predicted and replayed speedups here (CSV: "
                        "the calibration rows hetplan ships, hetplan/data/calibration)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    curves, curves_from, truth = derived_setting()
    if args.cost_only:
        lines = cost_objective(curves, truth, args.seed)
        if not args.no_record:
            record(["\n## Cost objective, out of sample (`bench/evaluate.py --cost-only`, issue 13)\n",
                    f"Run on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}; "
                    f"{time.perf_counter() - started:.0f} s; hetplan/sim sha256 `{sim_fingerprint()}`; derived data as "
                    "above.\n", *lines, ""])
        return
    rows, mixes, notes, hetplan_rows, predictions, giants = [], [], set(), [], [], []
    for file in args.traces:
        plan_half, replay_half = halves(file)
        for label, catalog in catalogs(args.catalogs):
            for budget in args.budgets:
                t0 = time.perf_counter()
                result = evaluate(replay_half, ProblemInputs(curves, catalog, budget), truth, plan_trace=plan_half,
                                  rhos=args.rhos, relabel_unknown=True, seed=args.seed)
                notes.update(w for w in result.warnings if "relabelled" not in w)
                short = file.split("_")[-1].split(".")[0]
                for r in result.summary.itertuples():
                    speedup = f"**{r.jct_speedup:.2f}x**" if r.setup == "hetplan" else f"{r.jct_speedup:.2f}x"
                    only = f"{r.extra_jobs} ({r.extra_avg_jct_h:.3g} h)" if r.extra_jobs > 0 else "-"
                    rows.append(f"| {short} | {label} | {budget:g} | {r.rho:g} | {r.setup} | {r.gpus} | "
                                f"{r.cost_per_hour:.1f} | {r.avg_jct_h:.3g} | {r.p95_jct_h:.3g} | {r.gpu_util:.0%} | "
                                f"{speedup} | {r.rejected_too_big} | {only} |")
                    if r.setup == "hetplan":
                        within = bool(r.within_interval) if pd.notna(r.within_interval) else False  # NA: no interval
                        hetplan_rows.append({"trace": file, "catalog": label, "budget": budget, "rho": r.rho,
                                             "speedup": r.jct_speedup, "predicted": r.predicted_jct_speedup,
                                             "low": r.predicted_low, "high": r.predicted_high,
                                             "within": within, "winner": r.winner})
                        predictions.append(f"| {short} | {label} | {budget:g} | {r.rho:g} | "
                                           f"{r.predicted_jct_speedup:.2f}x [{r.predicted_low:.2f}, "
                                           f"{r.predicted_high:.2f}] | {r.jct_speedup:.2f}x | "
                                           f"{r.realised_over_predicted:.2f} | "
                                           f"{'yes' if within else 'no'} |")
                giants.extend(giant_lines(result.jobs, short, label, budget, int(catalog["gpus"].max())))
                for plan_label, plan in result.plans.items():
                    winner = plan.weighing.candidate(plan.winner)
                    counts = {str(plan.weighing.problem.shapes.loc[s, "name"]): n for s, n in winner.counts.items()}
                    decision = (plan.result.plan.planning or {}).get("decision") or {}
                    mixes.append(f"- {file}, {label}, {budget:g} $/h, {plan_label}: **{plan.winner}** "
                                 f"({nodes_text(counts) or 'no node added'}; {winner.policy}): "
                                 f"{decision.get('reason', '')}"
                                 + (f"; {decision['declined']}" if decision.get("declined") else ""))
                print(f"{file} {label} {budget:g}: {time.perf_counter() - t0:.0f} s", flush=True)
                print("\n".join(rows[-4 * len(args.rhos):]), flush=True)
                print("\n".join(predictions[-len(args.rhos):]), flush=True)
                print("\n".join(giants[-4 * len(args.rhos):]), flush=True)
    cost_lines = cost_objective(curves, truth, args.seed) if args.cost else []
    total = time.perf_counter() - started
    frame = pd.DataFrame(hetplan_rows)
    worst = frame.loc[frame["speedup"].idxmin()]
    high = frame[frame["rho"] >= 1.0]
    verdict = [
        f"- hetplan's average-JCT speedup over the status quo, all {len(frame)} rows: geometric mean "
        f"**{geomean(frame['speedup']):.2f}x** (target 1.3x), min **{worst['speedup']:.2f}x** ({worst['trace']}, "
        f"{worst['catalog']}, {worst['budget']:g} $/h, rho {worst['rho']:g}; target >= 0.97x), max "
        f"{frame['speedup'].max():.2f}x; rows below 0.97x: {int((frame['speedup'] < 0.97).sum())}.",
        f"- where rho >= 1.0 ({len(high)} rows): geometric mean {geomean(high['speedup']):.2f}x, min "
        f"{high['speedup'].min():.2f}x (target >= 2x in every such row: {int((high['speedup'] >= 2).sum())} rows "
        "meet it).",
        f"- the planner's prediction (its avg JCT speedup over the status quo, simulated with its curves on the "
        f"first half, nominal 90 % interval from its arrival draws and a held-back 20 %): the replayed speedup lies "
        f"in the interval in **{int(frame['within'].sum())} of {len(frame)} rows ({frame['within'].mean():.0%})**; "
        f"replayed / predicted: geometric mean {geomean(frame['speedup'] / frame['predicted']):.2f}, range "
        f"{(frame['speedup'] / frame['predicted']).min():.2f} to {(frame['speedup'] / frame['predicted']).max():.2f}.",
    ]
    verdict.append(calibrated_coverage(frame))
    print("\n".join(verdict), flush=True)
    if args.rows_out:
        calibration_rows(frame).to_csv(args.rows_out, index=False)
    if args.no_record:
        return
    text = [
        "\n## Out-of-sample evaluation: plan on the first half, replay the second (`bench/evaluate.py`, issue 13)\n",
        f"Run: `.venv/bin/python bench/evaluate.py{''.join(' ' + a for a in sys.argv[1:])}` on "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}; {total:.0f} s in all; hetplan/sim sha256 "
        f"`{sim_fingerprint()}`. Each trace is split by arrival; the planner (objective: average JCT, LAS) sees "
        "the first half at each rho, the four setups replay the second half at the same rho (its own rate; "
        f"arrivals drawn with another seed). rho = the share of the status quo's GPU time the arrivals ask for.\n",
        f"**Every figure is a simulation on derived data**: the planner reads curves {curves_from}; jobs advance "
        "at speeds read off the derived profiles. Jobs of models the truth "
        "lacks run as a truth model drawn per job, relabelled so in both halves. Jobs larger than any node run as "
        "gangs over nodes of one GPU type in every setup; \"too big\" = jobs larger than all of a setup's GPUs of "
        "any one type (rejected). The JCT speedup compares average JCTs over the jobs every setup of the row group "
        "ran (avg JCT is over all a setup completed). **Bold**: hetplan's JCT speedup.\n",
        "| trace | catalog | budget $/h | rho | setup | GPUs | $/h | avg JCT h | p95 JCT h | GPU util | JCT speedup | "
        "too big | only it ran (avg JCT) |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows, "", "Predicted (planner, first half) vs replayed (second half, truth speeds) for hetplan:", "",
        "| trace | catalog | budget $/h | rho | predicted [interval] | replayed | replayed / predicted | inside |",
        "|---|---|---:|---:|---:|---:|---:|---|", *predictions, "",
        "Jobs larger than every node of the catalog (gangs), per setup: how many ran, were rejected, their avg JCT:",
        "", "| trace | catalog | budget $/h | rho | setup | jobs | ran | rejected | giants' avg JCT h | on GPU types |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---|", *giants, "",
        "Against the targets:", *verdict, "", "What hetplan chose (planner's candidates, by its replays of "
        "the first half):", *mixes, "", *(f"- note: {n}" for n in sorted(notes)), "", *cost_lines, "",
    ]
    record(text)


def calibration_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """hetplan's rows as `hetplan.planning.calibration` reads them (evaluate's summary.csv column names)."""
    return pd.DataFrame({"trace": frame["trace"], "catalog": frame["catalog"], "budget": frame["budget"],
                         "rho": frame["rho"], "winner": frame["winner"], "setup": "hetplan",
                         "predicted_jct_speedup": frame["predicted"], "predicted_low": frame["low"],
                         "predicted_high": frame["high"], "jct_speedup": frame["speedup"]})


def calibrated_coverage(frame: pd.DataFrame) -> str:
    """Out-of-sample coverage of the calibrated interval (`hetplan.planning.calibration`): each row calibrated on
    every other row (leave one row out: the rows are the calibration set), and on the other traces' rows only
    (leave one trace out: a trace unlike those calibrated on)."""
    rows = calibration_rows(frame)
    rows = rows[rows["predicted_jct_speedup"].notna()].reset_index(drop=True)
    parts = []
    for name, others in (("every other row", lambda i: rows.index != i),
                         ("the other traces' rows", lambda i: rows["trace"] != rows.loc[i, "trace"])):
        hits, tried = 0, 0
        for i, r in rows.iterrows():
            try:
                calibration = Calibration.fit(rows[others(i)], name)
            except ContractError:  # too few rows to calibrate on
                continue
            _, low, high = calibration.applied(r["predicted_jct_speedup"])
            hits, tried = hits + int(low <= r["jct_speedup"] <= high), tried + 1
        parts.append(f"on {name}: **{hits} of {tried}**" + (f" ({hits / tried:.0%})" if tried else ""))
    return (f"- calibrated interval (split conformal, `hetplan.planning.calibration`, {COVERAGE:.0%}), the replayed "
            f"speedup inside it, each of the {len(rows)} rows with a prediction calibrated " + "; ".join(parts) + ".")


def cost_objective(curves: pd.DataFrame, truth: TruthCurves, seed: int) -> list[str]:
    """`--objective cost --max-avg-jct` = the status quo's average JCT at 400 $/h, rho 0.8, as the planner
    predicts it on the first half: how much cheaper the plan is, and both replayed on the second half."""
    lines = ["**Cost objective** (planner on the first half at rho 0.8, all clouds, budget 400 $/h as the ceiling; "
             "target = the status quo's average JCT as the planner predicts it; both replayed on the second half):",
             "", "| trace | target avg JCT h (predicted) | status quo $/h | cost plan | cost plan $/h | saving | "
             "replayed avg JCT h: status quo / cost plan |", "|---|---:|---:|---|---:|---:|---:|"]
    full = load_default_catalog()
    for file in TRACES:
        plan_half, replay_half = halves(file)
        result = evaluate(replay_half, ProblemInputs(curves, full, 400.0), truth, plan_trace=plan_half, rhos=(0.8,),
                          relabel_unknown=True, seed=seed)
        quo = result.summary[result.summary["setup"] == STATUS_QUO].iloc[0]
        jct_plan = result.plans["rho 0.8"].weighing
        target = float(jct_plan.row(STATUS_QUO)["avg_jct_h"])
        cheap = plan_workload(jct_plan.problem, jct_plan.workload, objective="cost", max_avg_jct=target)
        winner = cheap.candidate(cheap.winner)
        replay = result.jobs[(result.jobs["setup"] == STATUS_QUO)][["job_id", "model", "sim_model", "num_gpus",
                                                                     "arrival_s", "duration_s"]]
        hints = HintSet.from_frame(cheap.result.hints) if len(cheap.result.hints) else HintSet.empty()
        run = simulate(replay.reset_index(drop=True), candidate_nodes(cheap.problem, winner), truth, winner.policy,
                       hints, SimConfig("las"))
        replayed = summarize(run, winner.cost_per_hour)["avg_jct_h"]
        lines.append(f"| {file} | {target:.3g} | {quo['cost_per_hour']:.2f} | {cheap.winner} | "
                     f"{winner.cost_per_hour:.2f} | {1 - winner.cost_per_hour / quo['cost_per_hour']:.0%} | "
                     f"{quo['avg_jct_h']:.3g} / {replayed:.3g} |")
        print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    main()
