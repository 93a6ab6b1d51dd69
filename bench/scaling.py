"""Multi-GPU scaling models, leave one GPU type out (issue 31 target: median <= 15 %, p90 <= 30 %).

For each of Sia's six models and each of T4, V100, A100: fit Pollux's model on the other two types' measured
steps, derive the held-out type from its own 1-GPU steps only, and compare predicted with measured throughput on
every multi-GPU row. Prints markdown tables for bench/RESULTS.md (per type, per model x type, in-node vs across
nodes) beside the in-sample error of the measured fits.

    PYTHONPATH=$PWD python bench/scaling.py [--out errors.csv]
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings

import numpy as np
import pandas as pd

from hetplan.scaling import fit_measured, leave_one_type_out, load_profile, summarise
from hetplan.scaling.model import step_time

logger = logging.getLogger("bench.scaling")


def in_sample(profile: pd.DataFrame) -> pd.DataFrame:
    """Errors of each type's own measured fit on its multi-GPU rows (the floor a borrowed shape could reach)."""
    out = []
    for (name, gpu), rows in profile.groupby(["model", "gpu_type"]):
        model = fit_measured(rows)
        multi = rows[rows["num_gpus"] > 1]
        gpus, nodes, bsz = (multi[c].to_numpy(dtype=float) for c in ("num_gpus", "num_nodes", "local_bsz"))
        measured = gpus * bsz / multi["step_time_s"].to_numpy(dtype=float)
        predicted = gpus * bsz / step_time(model.params, gpus, nodes, bsz)
        out.append(pd.DataFrame({"model": name, "gpu_type": gpu, "error": np.abs(predicted - measured) / measured}))
    return pd.concat(out, ignore_index=True)


def table(frame: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    for _, row in frame.iterrows():
        cells = [f"{v:.1%}" if isinstance(v, float) and k in ("median", "p90") else str(v) for k, v in row.items()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the per-row errors here (CSV)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    warnings.simplefilter("ignore", RuntimeWarning)
    profile = load_profile()
    start = time.perf_counter()
    errors = leave_one_type_out(profile)
    elapsed = time.perf_counter() - start
    if args.out:
        errors.to_csv(args.out, index=False)
    errors["span"] = np.where(errors["num_nodes"] > 1, "across nodes", "one node")
    print(f"leave one GPU type out: {len(errors)} multi-GPU rows, {elapsed:.1f} s\n")
    print(table(summarise(errors, ["gpu_type"]).fillna("")), "\n")
    print(table(summarise(errors, ["span"]).fillna("")), "\n")
    print(table(summarise(errors, ["model", "gpu_type"]).fillna("")), "\n")
    print("in-sample (each type's own measured fit):\n")
    print(table(summarise(in_sample(profile), ["gpu_type"]).fillna("")))


if __name__ == "__main__":
    main()
