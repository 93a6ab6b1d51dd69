"""Demand mix: which job classes (model, GPUs per job) make up the GPU demand, as fractions that sum to 1."""

from __future__ import annotations

import pandas as pd

from hetplan.contracts.table import Column, Problem, RowLabels, TableSchema

SHARE_TOLERANCE = 1e-3


def _shares_sum_to_one(frame: pd.DataFrame, labels: RowLabels) -> list[Problem]:
    total = float(frame["share"].sum())
    if abs(total - 1.0) > SHARE_TOLERANCE:
        return [Problem(labels.file, f"shares sum to {total:.4f}, expected 1", column="share")]
    return []


DEMAND = TableSchema(
    name="demand mix",
    made_by="`hetplan init --workspace DIR` or `hetplan trace import ... --demand-out FILE`",
    columns=(
        Column("model", "str"),
        Column("num_gpus", "int", min=1),
        Column("share", "float", min=0, min_inclusive=False, max=1),
    ),
    key=("model", "num_gpus"),
    checks=(_shares_sum_to_one,),
)


def demand_from_trace(trace: pd.DataFrame) -> pd.DataFrame:
    """Summarise a validated trace into a demand mix: each class's share of GPU-seconds."""
    gpu_seconds = trace["num_gpus"].astype(float) * trace["duration_s"].astype(float)
    grouped = gpu_seconds.groupby([trace["model"], trace["num_gpus"]]).sum()
    mix = (grouped / grouped.sum()).rename("share").reset_index()
    return DEMAND.validate(mix.sort_values(["model", "num_gpus"], ignore_index=True), "<demand from trace>")
