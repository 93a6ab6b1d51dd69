"""Measured multi-GPU step times: the shipped table, its builder, and the checks a scaling profile must pass.

The shipped table (`hetplan/data/scaling/sia_step_times.csv`, provenance in `hetplan/data/PROVENANCE.md`) has
one row per (model, GPU type, placement, per-GPU batch): Sia's measured seconds per optimizer step on T4, V100 and
A100 nodes. `load_profile` reads any table of these columns and names a bad row by file and row in one line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hetplan.gpus import normalize_gpu
from hetplan.resources import data_path, upstream_path

logger = logging.getLogger(__name__)

SHIPPED = data_path("scaling", "sia_step_times.csv")
COLUMNS = ("model", "gpu_type", "gpus_per_node", "placement", "num_nodes", "num_gpus", "local_bsz", "step_time_s",
           "sync_time_s")
# Sia's clusters: which GPU each one has and how many GPUs a node holds.
SIA_CLUSTERS: dict[str, tuple[str, int]] = {"aws": ("T4", 4), "azure": ("V100", 8), "dgx-ext": ("A100", 8)}
_PLACEMENTS = re.compile(r"^(?P<model>[a-z0-9]+)_placements-(?P<cluster>[a-z-]+)\.csv$")


class ProfileError(ValueError):
    """A scaling profile that cannot be fitted; its message names the file and row, in one line."""


def build_sia_table(source: Path, clusters: Mapping[str, tuple[str, int]] | None = None) -> pd.DataFrame:
    """The shipped table from a directory of Sia's `<model>_placements-<cluster>.csv` files (columns read by name);
    `clusters` maps a cluster name to its (GPU type, GPUs per node) (default `SIA_CLUSTERS`)."""
    clusters = SIA_CLUSTERS if clusters is None else clusters
    frames = []
    for path in sorted(Path(source).glob("*_placements-*.csv")):
        match = _PLACEMENTS.match(path.name)
        if match is None or match["cluster"] not in clusters:
            continue
        gpu, per_node = clusters[match["cluster"]]
        raw = pd.read_csv(path, dtype={"placement": str})
        digits = raw["placement"].map(lambda p: [int(c) for c in p])
        frames.append(pd.DataFrame({
            "model": match["model"], "gpu_type": gpu, "gpus_per_node": per_node, "placement": raw["placement"],
            "num_nodes": digits.map(len), "num_gpus": digits.map(sum), "local_bsz": raw["local_bsz"].astype(int),
            "step_time_s": raw["step_time"].astype(float).round(7),
            "sync_time_s": raw["sync_time"].astype(float).round(7),
        }))
    if not frames:
        raise ProfileError(f"{source}: no <model>_placements-<cluster>.csv files of clusters {sorted(clusters)}")
    table = pd.concat(frames, ignore_index=True)
    return table.sort_values(["model", "gpu_type", "num_gpus", "placement", "local_bsz"], ignore_index=True)


def load_profile(path: Path | str = SHIPPED) -> pd.DataFrame:
    """Read a scaling profile (the shipped table by default); raise `ProfileError` for missing columns or cells."""
    path = Path(path)
    try:
        table = pd.read_csv(path, dtype={"placement": str})
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ProfileError(f"{path}: cannot read a scaling profile: {exc}".splitlines()[0]) from None
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ProfileError(f"{path}: missing column(s) {', '.join(missing)}")
    table = table[list(COLUMNS)].copy()
    table["gpu_type"] = table["gpu_type"].map(lambda g: normalize_gpu(str(g)))
    table.attrs["source"] = str(path)
    return table


@dataclass(frozen=True)
class BadPoint:
    """One row of a scaling profile that makes its (model, GPU type) unfit to fit."""

    source: str
    row: int  # 1-based data row of the file (the header is row 0)
    model: str
    gpu_type: str
    reason: str

    def __str__(self) -> str:
        return f"{self.source} row {self.row}: {self.model} on {self.gpu_type}: {self.reason}"


def check_pair(rows: pd.DataFrame, source: str = "profile") -> BadPoint | None:
    """The first reason `rows` (one model on one GPU type, indexed by file row) cannot be fitted, or None.

    Missing: an empty or non-positive cell, more nodes than GPUs, no 1-GPU point or no multi-GPU point.
    Non-monotone: a multi-GPU step shorter than `MONOTONE_FLOOR` times the 1-GPU step at the same per-GPU batch
    (data-parallel steps do not get shorter as GPUs are added; Sia's noisy means go down to 0.57, so the floor
    catches broken rows, such as a global batch recorded as a per-GPU one, not noise).
    """
    model, gpu = str(rows["model"].iloc[0]), str(rows["gpu_type"].iloc[0])

    def bad(index: object, reason: str) -> BadPoint:
        return BadPoint(source, int(index) + 1, model, gpu, reason)

    numbers = rows[["num_gpus", "num_nodes", "local_bsz", "step_time_s"]].apply(pd.to_numeric, errors="coerce")
    for column in numbers.columns:
        broken = numbers.index[~(numbers[column] > 0)]
        if len(broken):
            return bad(broken[0], f"missing or non-positive {column}")
    crowded = numbers.index[numbers["num_nodes"] > numbers["num_gpus"]]
    if len(crowded):
        return bad(crowded[0], "more nodes than GPUs")
    single = numbers[numbers["num_gpus"] == 1]
    if single.empty:
        return bad(rows.index[0], "missing the 1-GPU points (none with num_gpus = 1)")
    multi = numbers[numbers["num_gpus"] > 1]
    if multi.empty:
        return bad(rows.index[0], "missing multi-GPU points (only num_gpus = 1)")
    base = multi["local_bsz"].map(single.groupby("local_bsz")["step_time_s"].min())
    fast = multi.index[multi["step_time_s"] < MONOTONE_FLOOR * base]
    if len(fast):
        row = multi.loc[fast[0]]
        return bad(fast[0], f"non-monotone: {int(row['num_gpus'])} GPUs step in {row['step_time_s']:.4g} s, under "
                            f"{MONOTONE_FLOOR:g} x 1 GPU's {base[fast[0]]:.4g} s at batch {int(row['local_bsz'])}")
    return None


MONOTONE_FLOOR = 0.5
"""The shortest a multi-GPU step may be, as a fraction of the 1-GPU step at the same per-GPU batch."""


SINGLE_GPU = upstream_path("reference", "sia_1gpu_step_times.csv")


def load_single_gpu(path: Path | str = SINGLE_GPU) -> pd.DataFrame:
    """1-GPU step times (model, gpu_type, local_bsz, step_time_s): by default Sia's, whose RTX 2080 Ti and Quadro
    RTX 6000 have no multi-GPU measurements and so get a derived scaling model."""
    table = pd.read_csv(path)
    missing = [c for c in ("model", "gpu_type", "local_bsz", "step_time_s") if c not in table.columns]
    if missing:
        raise ProfileError(f"{path}: missing column(s) {', '.join(missing)}")
    table = table[["model", "gpu_type", "local_bsz", "step_time_s"]].copy()
    table["gpu_type"] = table["gpu_type"].map(lambda g: normalize_gpu(str(g)))
    return table[(table["step_time_s"] > 0) & (table["local_bsz"] > 0)].reset_index(drop=True)
