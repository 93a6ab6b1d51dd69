"""Curve table: predicted throughput of every (model, GPU type) on the planning grid, the planner's input.

One row per (model, gpu_type, cpus_per_gpu, mem_gb_per_gpu). `method` says how the curve was made (`fit`
from that pair's own profiles, or `transferred` from another GPU type's input-pipeline curve capped by this
GPU's compute rate); `source` names the data behind it. Knee columns: `knee_cpus_at_mem` is the fewest
cores reaching `knee_fraction` of the best throughput at that RAM level; `knee_cpus`/`knee_mem_gb` the
smallest allocation reaching it of the pair's plateau; below `collapse_mem_gb` throughput collapses.
`measured_*` give the box of cores and RAM per GPU the curve rests on (a transferred curve: its anchor's);
a curve has rows only inside it. Tables written before these columns existed load without them.
"""

from __future__ import annotations

from hetplan.contracts.table import Column, TableSchema

CURVES = TableSchema(
    name="curve table",
    made_by="`hetplan fit --profiles PROFILES --out FILE`",
    columns=(
        Column("model", "str"),
        Column("gpu_type", "gpu"),
        Column("cpus_per_gpu", "float", min=0, min_inclusive=False),
        Column("mem_gb_per_gpu", "float", min=0, min_inclusive=False),
        Column("throughput", "float", min=0),
        Column("throughput_unit", "str", nullable=True),
        Column("method", "str", choices=("fit", "transferred")),
        Column("source", "str"),
        Column("estimator", "str", nullable=True),
        Column("n_points", "int", min=0),
        Column("cv_mape", "float", nullable=True, min=0),
        Column("cv_r2", "float", nullable=True),
        Column("uncertainty", "float", nullable=True, min=0, doc="relative error band of a transferred curve"),
        Column("plateau", "float", min=0),
        Column("knee_fraction", "float", min=0, min_inclusive=False, max=1),
        Column("knee_cpus_at_mem", "float", min=0),
        Column("knee_cpus", "float", min=0),
        Column("knee_mem_gb", "float", min=0),
        Column("collapse_mem_gb", "float", min=0),
        Column("measured_cpus_min", "float", required=False, nullable=True, min=0, omit_empty=True),
        Column("measured_cpus_max", "float", required=False, nullable=True, min=0, omit_empty=True),
        Column("measured_mem_gb_min", "float", required=False, nullable=True, min=0, omit_empty=True),
        Column("measured_mem_gb_max", "float", required=False, nullable=True, min=0, omit_empty=True),
    ),
    key=("model", "gpu_type", "cpus_per_gpu", "mem_gb_per_gpu"),
)
