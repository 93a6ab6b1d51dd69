"""A workspace: the directory of files one planning cycle reads and writes, seeded from embedded defaults.

`init_workspace` writes the shipped default catalog, the derived profile set (labelled derived), the
published V100 table, a reference trace and the demand mix summarised from it; every file is validated
against its contract on the way out. Later stages (fit, plan, publish) read and add to the same directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hetplan.catalog import load_default_catalog
from hetplan.contracts import CATALOG, DEMAND, PROFILES, TRACE, demand_from_trace
from hetplan.reference import build_reference
from hetplan.resources import upstream_path
from hetplan.traces import import_trace

DEFAULT_TRACE = upstream_path("traces", "synergy_static_100job.csv")


@dataclass(frozen=True)
class Workspace:
    """The files of a workspace, by role."""

    root: Path

    @property
    def catalog(self) -> Path:
        return self.root / "catalog.csv"

    @property
    def profiles(self) -> Path:
        return self.root / "profiles.csv"

    @property
    def published_profiles(self) -> Path:
        return self.root / "profiles_published_v100.csv"

    @property
    def trace(self) -> Path:
        return self.root / "trace.csv"

    @property
    def demand(self) -> Path:
        return self.root / "demand.csv"


@dataclass(frozen=True)
class InitSummary:
    workspace: Workspace
    catalog: pd.DataFrame
    profiles: pd.DataFrame
    trace: pd.DataFrame
    demand: pd.DataFrame
    warnings: list[str]


def init_workspace(root: Path) -> InitSummary:
    """Seed `root` with the embedded defaults; every file is validated and written atomically."""
    workspace = Workspace(Path(root))
    catalog = load_default_catalog()
    reference = build_reference()
    imported = import_trace(DEFAULT_TRACE, "synergy")
    demand = demand_from_trace(imported.trace)
    CATALOG.write(catalog, workspace.catalog)
    PROFILES.write(reference.derived, workspace.profiles)
    PROFILES.write(reference.published, workspace.published_profiles)
    TRACE.write(imported.trace, workspace.trace)
    DEMAND.write(demand, workspace.demand)
    return InitSummary(workspace, catalog, reference.derived, imported.trace, demand, list(imported.warnings))
