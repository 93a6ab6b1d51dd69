"""Node-shape catalog and owned fleet: the node shapes a plan can buy, and the nodes it already has.

Catalog: `name,gpu_type,gpus,vcpus,mem_gb,price_per_hour[,available][,source]` plus optional provenance
columns (`cloud`, `region`, `spot_price_per_hour`). `available` is how many can be had (blank: unlimited);
a price-0 shape needs one, else a plan could add free nodes without end (owned hardware belongs in a fleet).

Owned fleet: `name,gpu_type,gpus,vcpus,mem_gb,count`, no price: nodes the plan always includes and never
buys more of. Both may name GPU types hetplan does not know and declare how they run in the optional
columns `gpu_like` (a known GPU type), `gpu_speed` (its speed relative to that type, default 1) and
`gpu_memory_gb` (`gpu_declarations`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hetplan.contracts.table import Column, ContractError, Problem, RowLabels, TableSchema
from hetplan.gpus import GpuDeclaration, is_known_gpu

DECLARATION_COLUMNS = (
    Column("gpu_like", "gpu", required=False, nullable=True, doc="a known GPU type this one runs like",
           omit_empty=True),
    Column("gpu_speed", "float", required=False, nullable=True, min=0, min_inclusive=False,
           doc="speed relative to gpu_like (default 1)", omit_empty=True),
    Column("gpu_memory_gb", "float", required=False, nullable=True, min=0, min_inclusive=False, omit_empty=True),
)


def _free_shapes_are_capped(frame: pd.DataFrame, labels: RowLabels) -> list[Problem]:
    free = (frame["price_per_hour"] == 0) & frame.get("available", pd.Series(np.nan, index=frame.index)).isna()
    return [labels.problem(int(p), "available", "a price-0 shape needs `available` (how many can be had), "
                           "else a plan could add free nodes without end; list owned nodes in an owned fleet "
                           "file instead") for p in np.flatnonzero(free.to_numpy())]


def _declarations_name_known_types(frame: pd.DataFrame, labels: RowLabels) -> list[Problem]:
    if "gpu_like" not in frame:
        return []
    bad = frame["gpu_like"].notna() & ~frame["gpu_like"].map(lambda g: is_known_gpu(str(g)) if pd.notna(g) else True)
    return [labels.problem(int(p), "gpu_like", f"{frame['gpu_like'].iloc[p]!r} is not a GPU type hetplan knows")
            for p in np.flatnonzero(bad.to_numpy())]


CATALOG = TableSchema(
    name="node-shape catalog",
    made_by="`hetplan init --workspace DIR` (the default catalog) or `hetplan catalog import ... --out FILE`",
    columns=(
        Column("name", "str", doc="unique shape name, e.g. aws:p4d.24xlarge"),
        Column("gpu_type", "gpu", doc="canonical GPU type (or an unknown type's own name)"),
        Column("gpus", "int", min=1),
        Column("vcpus", "int", min=1),
        Column("mem_gb", "float", min=0, min_inclusive=False),
        Column("price_per_hour", "float", min=0, doc="on-demand US$ per hour"),
        Column("available", "int", required=False, nullable=True, min=0),
        Column("source", "str", required=False, nullable=True),
        Column("cloud", "str", required=False, nullable=True),
        Column("region", "str", required=False, nullable=True),
        Column("spot_price_per_hour", "float", required=False, nullable=True, min=0),
        *DECLARATION_COLUMNS,
    ),
    key=("name",),
    checks=(_free_shapes_are_capped, _declarations_name_known_types),
)

FLEET = TableSchema(
    name="owned fleet",
    made_by="`hetplan init --workspace DIR --fleet YOURS.csv` (or without --fleet: the embedded owned fleet)",
    columns=(
        Column("name", "str", doc="unique shape name of these owned nodes"),
        Column("gpu_type", "gpu"),
        Column("gpus", "int", min=1),
        Column("vcpus", "int", min=1),
        Column("mem_gb", "float", min=0, min_inclusive=False),
        Column("count", "int", min=0, doc="how many such nodes are owned"),
        *DECLARATION_COLUMNS,
    ),
    key=("name",),
    checks=(_declarations_name_known_types,),
)


def gpu_declarations(*frames: pd.DataFrame, source: str = "<catalog>") -> dict[str, GpuDeclaration]:
    """The GPU types declared in validated catalog or fleet frames (rows with `gpu_like`); raise
    `ContractError` when two rows declare one type differently."""
    out: dict[str, GpuDeclaration] = {}
    problems = []
    for frame in frames:
        if frame is None or "gpu_like" not in frame:
            continue
        for row in frame[frame["gpu_like"].notna()].itertuples():
            speed = getattr(row, "gpu_speed", np.nan)
            memory = getattr(row, "gpu_memory_gb", np.nan)
            declared = GpuDeclaration(str(row.gpu_type), str(row.gpu_like), 1.0 if pd.isna(speed) else float(speed),
                                      None if pd.isna(memory) else float(memory))
            if out.setdefault(declared.name, declared) != declared:
                problems.append(Problem(source, f"GPU type {declared.name} is declared twice, differently: "
                                        f"{out[declared.name]} and {declared}", column="gpu_like"))
    if problems:
        raise ContractError(problems)
    return out
