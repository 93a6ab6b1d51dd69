"""Prediction intervals across traces (issue 29 item 4): calibrate on some traces' out-of-sample rows, check on
another's.

Runs `hetplan.evaluation.evaluate` on the out-of-sample pairs of `bench/workloads.calibration_pairs` (other
windows of the two shipped Gavel traces, and **derived** workloads made from Sia's public workloads), both
catalogs, `--budgets`, `--rhos`; takes in the main grid's rows (`bench/evaluate.py --rows-out`) with `--rows`;
then measures, **leave one trace out** (each row's interval calibrated only on the rows of the other traces),
how often the replayed speedup lies in the interval, for each way of calibrating:

- `planner`: the planner's own interval (draws, held-back error, mix shift), uncalibrated;
- `absolute`: split conformal on |e - shift|, e = log(replayed / predicted) (`hetplan.planning.calibration`);
- `scaled`: split conformal on |e - shift| / the planner's own log half-width (wide where the planner is unsure);
- `grouped` (what hetplan ships): `absolute`'s margin plus the largest distance of one trace group's median e from
  the shift (a new trace may be as biased as the most biased one calibrated on).

Rows whose plan is the status quo itself are counted apart: their prediction is 1x by definition and holds
exactly. Every figure is a simulation on derived data. Writes the rows (with their trace group) to `--rows-out`
(the shipped calibration rows, hetplan/data/calibration/) and appends a dated section to bench/RESULTS.md
unless `--no-record`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import time

import numpy as np
import pandas as pd

from hetplan.codesign.candidates import STATUS_QUO
from hetplan.evaluation import ProblemInputs, evaluate
from hetplan.planning.calibration import coverage_by_group
from common import derived_setting, machine, record
from evaluate import CATALOGS, catalogs
from workloads import calibration_pairs, short


def rows_of(pair, label: str, budget: float, result) -> list[dict]:
    out = []
    for r in result.summary[result.summary["setup"] == "hetplan"].itertuples():
        out.append({"trace": pair.label, "group": pair.group, "catalog": label, "budget": budget, "rho": r.rho,
                    "winner": r.winner, "setup": "hetplan",
                    "predicted_jct_speedup": r.predicted_jct_speedup, "predicted_low": r.predicted_low,
                    "predicted_high": r.predicted_high, "jct_speedup": r.jct_speedup})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=float, nargs="+", default=[100.0, 400.0])
    parser.add_argument("--rhos", type=float, nargs="+", default=[0.5, 1.0])
    parser.add_argument("--catalogs", nargs="+", choices=list(CATALOGS), default=list(CATALOGS))
    parser.add_argument("--pairs", nargs="*", default=None, help="labels of the pairs to run (default: all)")
    parser.add_argument("--rows", nargs="*", default=[], help="rows already evaluated (bench/evaluate.py --rows-out)")
    parser.add_argument("--rows-out", default=None)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    curves, curves_from, truth = derived_setting()
    rows = [pd.read_csv(path) for path in args.rows]
    for pair in calibration_pairs():
        if args.pairs is not None and pair.label not in args.pairs:
            continue
        for label, catalog in catalogs(args.catalogs):
            for budget in args.budgets:
                t0 = time.perf_counter()
                result = evaluate(pair.replay, ProblemInputs(curves, catalog, budget), truth, plan_trace=pair.plan,
                                  rhos=args.rhos, relabel_unknown=True)
                rows.append(pd.DataFrame(rows_of(pair, label, budget, result)))
                print(f"{pair.label}, {label}, {budget:g} $/h: {time.perf_counter() - t0:.0f} s", flush=True)
                print(rows[-1].to_string(index=False), flush=True)
    frame = pd.concat(rows, ignore_index=True)
    if "group" not in frame:
        frame["group"] = np.nan
    frame["group"] = frame["group"].fillna(frame["trace"].map(short))  # bench/evaluate.py's rows: by their file
    if args.rows_out:
        frame.to_csv(args.rows_out, index=False)
    lines = report(frame)
    print("\n".join(lines), flush=True)
    if not args.no_record:
        record(["\n## Prediction intervals across traces, leave one trace out (`bench/calibration.py`, issue 29)\n",
                f"Run: `bench/calibration.py{''.join(' ' + a for a in sys.argv[1:])}` on "
                f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {machine()}; {time.perf_counter() - started:.0f} s. "
                f"**Every figure is a simulation on derived data** (curves {curves_from}; Sia's workloads with "
                "derived durations, bench/data/sia/PROVENANCE.md).\n", *lines, ""])


def report(frame: pd.DataFrame) -> list[str]:
    """Coverage of each way of calibrating, leave one trace group out, and the rows."""
    planned = frame[(frame["winner"] != STATUS_QUO) & frame["predicted_jct_speedup"].notna()]
    kept = frame[frame["winner"] == STATUS_QUO]
    lines = [f"{len(frame)} rows from {frame['group'].nunique()} trace groups ({', '.join(sorted(frame['group'].unique()))}); "
             f"{len(kept)} chose the status quo (1x predicted and replayed: counted apart), {len(planned)} chose a "
             "plan and are scored here.", "",
             "| calibration | inside, leave one trace out | per trace group | median width (high / low) |",
             "|---|---:|---|---:|"]
    for method in ("planner", "absolute", "scaled", "grouped"):
        hits, widths, per_group = coverage_by_group(planned, method)
        tried = len(hits)
        groups = ", ".join(f"{g} {int(sum(h))}/{len(h)}" for g, h in per_group.items())
        lines.append(f"| {method} | {int(sum(hits))} of {tried} ({sum(hits) / max(1, tried):.0%}) | {groups} | "
                     f"{np.median(widths) if widths else math.nan:.2f} |")
    lines += ["", "| trace | catalog | budget $/h | rho | winner | predicted [planner's interval] | replayed |",
              "|---|---|---:|---:|---|---:|---:|"]
    for r in frame.itertuples():
        lines.append(f"| {r.trace} | {r.catalog} | {r.budget:g} | {r.rho:g} | {r.winner} | "
                     f"{r.predicted_jct_speedup:.2f}x [{r.predicted_low:.2f}, {r.predicted_high:.2f}] | "
                     f"{r.jct_speedup:.2f}x |")
    return lines


if __name__ == "__main__":
    main()
