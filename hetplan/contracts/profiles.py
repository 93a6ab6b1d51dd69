"""Profile records: training throughput of one model on one GPU type at one CPU/RAM allocation.

`model,gpu_type,num_gpus,cpus_per_gpu,mem_gb_per_gpu,throughput[,throughput_unit][,batch_size][,gpu_util]
[,power_w][,source][,measured_at]` plus the profiler's conditions (`status`, `error`, `repeats`, `spread`).
`source` says where a number comes from: `measured:<host>`, `derived:<assumption>` or
`published:<reference>`. A point the profiler could not measure has `status=failed`, an `error` and no
throughput: never a zero.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hetplan.contracts.table import Column, Problem, RowLabels, TableSchema

SOURCE_PATTERN = r"(measured|derived|published):\S.*"


def _throughput_present_unless_failed(frame: pd.DataFrame, labels: RowLabels) -> list[Problem]:
    failed = frame["status"].fillna("ok").eq("failed")
    missing = frame["throughput"].isna() & ~failed
    return [labels.problem(int(p), "throughput", "missing value (only a failed point may omit it)")
            for p in np.flatnonzero(missing.to_numpy())]


PROFILES = TableSchema(
    name="profile table",
    made_by="`hetplan init --workspace DIR` (derived profiles) or `hetplan profile ... --out FILE`",
    columns=(
        Column("model", "str"),
        Column("gpu_type", "gpu"),
        Column("num_gpus", "int", min=1),
        Column("cpus_per_gpu", "float", min=0, min_inclusive=False),
        Column("mem_gb_per_gpu", "float", min=0, min_inclusive=False),
        Column("throughput", "float", nullable=True, min=0, min_inclusive=False),
        Column("throughput_unit", "str", required=False, nullable=True),
        Column("batch_size", "int", required=False, nullable=True, min=1),
        Column("gpu_util", "float", required=False, nullable=True, min=0, max=100),
        Column("power_w", "float", required=False, nullable=True, min=0),
        Column("source", "str", required=False, nullable=True, pattern=SOURCE_PATTERN,
               doc="measured:<host>, derived:<assumption> or published:<reference>"),
        Column("measured_at", "timestamp", required=False, nullable=True),
        Column("status", "str", required=False, nullable=True, choices=("ok", "failed")),
        Column("error", "str", required=False, nullable=True),
        Column("repeats", "int", required=False, nullable=True, min=1),
        Column("spread", "float", required=False, nullable=True, min=0),
    ),
    key=("model", "gpu_type", "num_gpus", "cpus_per_gpu", "mem_gb_per_gpu", "source"),
    checks=(_throughput_present_unless_failed,),
)
