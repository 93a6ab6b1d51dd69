"""Node-shape catalog: one purchasable or rentable node shape per row.

`name,gpu_type,gpus,vcpus,mem_gb,price_per_hour[,available][,source]` plus optional provenance columns
(`cloud`, `region`, `spot_price_per_hour`). `available` is how many can be had (blank: unlimited).
"""

from __future__ import annotations

from hetplan.contracts.table import Column, TableSchema

CATALOG = TableSchema(
    name="node-shape catalog",
    columns=(
        Column("name", "str", doc="unique shape name, e.g. aws:p4d.24xlarge"),
        Column("gpu_type", "gpu", doc="canonical GPU type"),
        Column("gpus", "int", min=1),
        Column("vcpus", "int", min=1),
        Column("mem_gb", "float", min=0, min_inclusive=False),
        Column("price_per_hour", "float", min=0, doc="on-demand US$ per hour; 0 for owned hardware"),
        Column("available", "int", required=False, nullable=True, min=0),
        Column("source", "str", required=False, nullable=True),
        Column("cloud", "str", required=False, nullable=True),
        Column("region", "str", required=False, nullable=True),
        Column("spot_price_per_hour", "float", required=False, nullable=True, min=0),
    ),
    key=("name",),
)
