"""Trace: the jobs of a workload, with arrival time and duration at the reference allocation.

`job_id,model,num_gpus,arrival_s,duration_s`; importers for public formats live in `hetplan.traces`.
"""

from __future__ import annotations

from hetplan.contracts.table import Column, TableSchema

TRACE = TableSchema(
    name="trace",
    made_by="`hetplan init --workspace DIR` or `hetplan trace import ... --out FILE`",
    columns=(
        Column("job_id", "str"),
        Column("model", "str"),
        Column("num_gpus", "int", min=1),
        Column("arrival_s", "float", min=0),
        Column("duration_s", "float", min=0, min_inclusive=False),
    ),
    key=("job_id",),
)
