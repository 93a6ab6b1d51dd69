"""Reference sensitivity data: Synergy's published V100 table and a derived multi-GPU-type set.

`build_reference()` regenerates the shipped tables under `hetplan/data/profiles/` (a test checks that the
shipped files equal a fresh build, so they cannot drift from the code that documents them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hetplan.contracts import PROFILES
from hetplan.fsio import atomic_write_bytes
from hetplan.reference.derived import derive_profiles
from hetplan.reference.speed import speed_ratios
from hetplan.reference.synergy import published_v100_profiles
from hetplan.resources import data_path

PUBLISHED_PROFILES = data_path("profiles", "synergy_v100_published.csv")
DERIVED_PROFILES = data_path("profiles", "derived_multi_gpu.csv")
SPEED_RATIOS = data_path("profiles", "gpu_speed_ratios.csv")


@dataclass(frozen=True)
class ReferenceSet:
    published: pd.DataFrame
    derived: pd.DataFrame
    ratios: pd.DataFrame


def build_reference() -> ReferenceSet:
    """Compute the published and derived profile sets and the speed ratios behind them."""
    published = published_v100_profiles()
    ratios = speed_ratios(sorted(published["model"].unique()))
    return ReferenceSet(published, derive_profiles(published, ratios), ratios)


def write_reference(reference: ReferenceSet, directory: Path | None = None) -> list[Path]:
    """Write the three tables (CSV) into `directory` (default: the package's shipped data)."""
    paths = [PUBLISHED_PROFILES, DERIVED_PROFILES, SPEED_RATIOS]
    if directory is not None:
        paths = [Path(directory) / p.name for p in paths]
    PROFILES.write(reference.published, paths[0])
    PROFILES.write(reference.derived, paths[1])
    atomic_write_bytes(paths[2], reference.ratios.to_csv(index=False, lineterminator="\n").encode())
    return paths


def default_profiles() -> pd.DataFrame:
    """The embedded default profile set (derived, all GPU types), validated."""
    return PROFILES.load(DERIVED_PROFILES)
