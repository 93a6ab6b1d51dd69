"""A workspace: the directory of files one planning cycle reads and writes, seeded from embedded defaults.

`init_workspace` writes the shipped default catalog, the default owned fleet (a derived sample of Alibaba
PAI's heterogeneous GPU fleet), the derived profile set (labelled derived), the published V100 table, a
reference workload (Gavel's Philly-derived trace, 1,181 jobs) and the demand mix summarised from it; every
file is validated against its contract on the way out. Later stages (fit, plan, publish) read and add to
the same directory: the plan is for the workload, on the owned fleet plus what the budget rents.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hetplan.catalog import load_default_catalog, load_default_fleet
from hetplan.contracts import CATALOG, DEMAND, FLEET, PROFILES, TRACE, demand_from_trace
from hetplan.reference import build_reference
from hetplan.resources import upstream_path
from hetplan.traces import import_trace

DEFAULT_TRACE = (upstream_path("traces", "gavel_philly_0e4a51.trace"), "gavel")


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
    def fleet(self) -> Path:
        return self.root / "fleet.csv"

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
    imported = import_trace(*DEFAULT_TRACE)
    demand = demand_from_trace(imported.trace)
    CATALOG.write(catalog, workspace.catalog)
    FLEET.write(load_default_fleet(), workspace.fleet)
    PROFILES.write(reference.derived, workspace.profiles)
    PROFILES.write(reference.published, workspace.published_profiles)
    TRACE.write(imported.trace, workspace.trace)
    DEMAND.write(demand, workspace.demand)
    return InitSummary(workspace, catalog, reference.derived, imported.trace, demand, list(imported.warnings))
