"""Leave one GPU type out: how well a shape borrowed from the other types predicts a type's multi-GPU throughput.

For each (model, held-out type): fit the other types on their measurements, derive the held-out type from its own
1-GPU steps only (`derive`) in the shape of its nearest donor by network class (`nearest_donors`; or, with
`average_all`, of all the other types averaged, the rule before), and compare predicted
against measured throughput (K * b / step time) on every multi-GPU row of the held-out type. Errors are relative:
|predicted - measured| / measured. The held-out type's multi-GPU rows only score its prediction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hetplan.scaling.fit import derive, fit_measured, nearest_donors
from hetplan.scaling.model import step_time

__all__ = ["leave_one_type_out", "summarise"]


def leave_one_type_out(profile: pd.DataFrame, models: list[str] | None = None,
                       donors: dict[str, tuple[str, ...]] | None = None, average_all: bool = False) -> pd.DataFrame:
    """One row per held-out multi-GPU measurement: model, gpu_type, shape_from, placement, local_bsz, measured,
    predicted, error. `donors`: the nearest-first order per type (default `DEFAULT_DONORS`)."""
    out = []
    for name, rows in profile.groupby("model", sort=True):
        if models is not None and name not in models:
            continue
        types = sorted(rows["gpu_type"].unique())
        fitted = {gpu: fit_measured(part) for gpu, part in rows.groupby("gpu_type")}
        for held in types:
            part = rows[rows["gpu_type"] == held]
            others = [g for g in types if g != held]
            chosen = others if average_all else nearest_donors(held, others, donors)
            derived = derive(part[part["num_gpus"] == 1], [fitted[g] for g in chosen])
            multi = part[part["num_gpus"] > 1]
            gpus, nodes, bsz = (multi[c].to_numpy(dtype=float) for c in ("num_gpus", "num_nodes", "local_bsz"))
            measured = gpus * bsz / multi["step_time_s"].to_numpy(dtype=float)
            predicted = gpus * bsz / step_time(derived.params, gpus, nodes, bsz)
            out.append(pd.DataFrame({
                "model": name, "gpu_type": held, "shape_from": derived.shape_from,
                "placement": multi["placement"].to_numpy(), "num_gpus": gpus.astype(int),
                "num_nodes": nodes.astype(int),
                "local_bsz": bsz.astype(int), "measured": measured, "predicted": predicted,
                "error": np.abs(predicted - measured) / measured,
            }))
    return pd.concat(out, ignore_index=True)


def summarise(errors: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Median and 90th percentile relative error (and row count) per group of `by`, plus an `all` row."""
    stats = errors.groupby(by)["error"].agg(median="median", p90=lambda e: e.quantile(0.9), rows="count")
    overall = pd.DataFrame({"median": [errors["error"].median()], "p90": [errors["error"].quantile(0.9)],
                            "rows": [len(errors)]}, index=pd.Index(["all"], name=by[0]))
    return pd.concat([stats.reset_index(), overall.reset_index()], ignore_index=True)
