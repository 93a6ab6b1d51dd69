"""Multi-GPU scaling models, leave one GPU type out (issue 31 target: median <= 15 %, p90 <= 30 %).

For each of Sia's six models and each of T4, V100, A100: fit Pollux's model on the other two types' measured
steps, derive the held-out type from its own 1-GPU steps only, and compare predicted with measured throughput on
every multi-GPU row. Two rules side by side: `before` (the other two types' all-reduce terms averaged) and `after`
(the nearest type by network class only, `hetplan.scaling.fit.DEFAULT_DONORS` or `--donors`). Prints markdown
tables for bench/RESULTS.md (per type, in-node vs across nodes, per model x type, and the median over the 18
(model, type) pairs of each pair's median) beside the in-sample error of the measured fits.

    PYTHONPATH=$PWD:bench python bench/scaling.py [--out errors.csv] [--donors T4=V100,V100=T4,A100=V100]
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
        cells = [f"{v:.1%}" if isinstance(v, float) and ("median" in k or "p90" in k) else str(v)
                 for k, v in row.items()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def side_by_side(before: pd.DataFrame, after: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """`summarise` of both rules on the same rows, one row per group: median and p90 before and after."""
    left, right = summarise(before, by), summarise(after, by)
    keys = [c for c in by if c in left.columns]
    merged = left.merge(right, on=keys, suffixes=(" before", " after"))
    return merged[[*keys, "median before", "median after", "p90 before", "p90 after", "rows before"]].rename(
        columns={"rows before": "rows"}).fillna("")


def pair_medians(errors: pd.DataFrame) -> float:
    """Median over (model, held-out type) pairs of each pair's median error (each pair weighs alike)."""
    return float(errors.groupby(["model", "gpu_type"])["error"].median().median())


def parse_donors(text: str) -> dict[str, tuple[str, ...]]:
    """`T4=V100,V100=T4` -> {"T4": ("V100",), "V100": ("T4",)} (a nearest-first order per held-out type)."""
    out: dict[str, tuple[str, ...]] = {}
    for item in filter(None, text.split(",")):
        gpu, _, donor = item.partition("=")
        if not gpu or not donor:
            raise argparse.ArgumentTypeError(f"--donors: {item!r} is not TYPE=DONOR")
        out[gpu.strip()] = (*out.get(gpu.strip(), ()), donor.strip())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the per-row errors of the after rule here (CSV)")
    parser.add_argument("--donors", type=parse_donors, default=None,
                        help="nearest-first donors per type for the after rule, e.g. T4=V100,V100=T4,A100=V100")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    warnings.simplefilter("ignore", RuntimeWarning)
    profile = load_profile()
    start = time.perf_counter()
    before = leave_one_type_out(profile, average_all=True)
    after = leave_one_type_out(profile, donors=args.donors)
    elapsed = time.perf_counter() - start
    if args.out:
        after.to_csv(args.out, index=False)
    for errors in (before, after):
        errors["span"] = np.where(errors["num_nodes"] > 1, "across nodes", "one node")
    donors = after.groupby("gpu_type")["shape_from"].first()
    print(f"leave one GPU type out: {len(after)} multi-GPU rows, both rules in {elapsed:.1f} s; after = donor "
          + ", ".join(f"{gpu} <- {d}" for gpu, d in donors.items()) + "\n")
    print(table(side_by_side(before, after, ["gpu_type"])), "\n")
    print(table(side_by_side(before, after, ["span"])), "\n")
    print(table(side_by_side(before, after, ["model", "gpu_type"])), "\n")
    print(f"median over the 18 (model, type) pairs of each pair's median: before {pair_medians(before):.1%}, "
          f"after {pair_medians(after):.1%}\n")
    print("in-sample (each type's own measured fit):\n")
    print(table(summarise(in_sample(profile), ["gpu_type"]).fillna("")))


if __name__ == "__main__":
    main()
