"""Hint table: the one contract between the offline planner and the online allocator.

For each job class (model, GPUs per job), its GPU types in order of preference (`rank` 1 = best), each with
the cores and RAM per GPU to give and the throughput to expect. A class missing from the table falls back
to the GPU-proportional share.

Units: `expected_throughput` is the whole job's (per-GPU throughput x `num_gpus`, in the profiles' unit,
usually samples/s); `normalized_throughput` is per GPU, relative to the class's throughput on the reference
allocation (a V100 with 3 cores and 62.5 GB); `throughput_per_dollar` is per-GPU throughput x 3600 over the
per-GPU hourly price of the plan's shape (samples per US$).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hetplan.contracts.table import Column, Problem, RowLabels, TableSchema


def _ranks_unique_per_class(frame: pd.DataFrame, labels: RowLabels) -> list[Problem]:
    dup = frame.duplicated(subset=["model", "num_gpus", "rank"], keep="first")
    return [labels.problem(int(p), "rank", "rank used twice for the same (model, num_gpus)")
            for p in np.flatnonzero(dup.to_numpy())]


def _one_plan(frame: pd.DataFrame, labels: RowLabels) -> list[Problem]:
    ids = frame["plan_id"].unique()
    if len(ids) > 1:
        return [Problem(labels.file, f"rows name {len(ids)} plans ({', '.join(map(str, ids[:3]))}); "
                        "a hint table comes from one plan", column="plan_id")]
    return []


HINTS = TableSchema(
    name="hint table",
    made_by="`hetplan plan ... --out-dir DIR` (DIR/hints.parquet)",
    columns=(
        Column("model", "str"),
        Column("num_gpus", "int", min=1),
        Column("gpu_type", "gpu"),
        Column("rank", "int", min=1),
        Column("cpus_per_gpu", "float", min=0, min_inclusive=False),
        Column("mem_gb_per_gpu", "float", min=0, min_inclusive=False),
        Column("expected_throughput", "float", min=0),
        Column("normalized_throughput", "float", min=0),
        Column("throughput_per_dollar", "float", min=0),
        Column("plan_id", "str"),
    ),
    key=("model", "num_gpus", "gpu_type"),
    checks=(_ranks_unique_per_class, _one_plan),
)
