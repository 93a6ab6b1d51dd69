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
from hetplan.contracts import CATALOG, DEMAND, FLEET, PROFILES, TRACE, ContractError, Problem, demand_from_trace
from hetplan.reference import build_reference
from hetplan.resources import upstream_path
from hetplan.traces import import_trace

DEFAULT_TRACE = (upstream_path("traces", "gavel_philly_0e4a51.trace"), "gavel")
DEFAULT_ROOT = Path(".hetplan")


def default_curves(root: Path = DEFAULT_ROOT) -> Path:
    """The curve table commands read when none is named: the newer of `hetplan fit`'s default output and the
    published nightly run's (`<root>/current/curves.parquet`); the former when neither exists."""
    candidates = [p for p in (root / "curves.parquet", root / "current" / "curves.parquet") if p.is_file()]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else root / "curves.parquet"


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

    @property
    def seeded(self) -> tuple[Path, ...]:
        """The files `init_workspace` writes."""
        return (self.catalog, self.fleet, self.profiles, self.published_profiles, self.trace, self.demand)


@dataclass(frozen=True)
class InitSummary:
    workspace: Workspace
    catalog: pd.DataFrame
    profiles: pd.DataFrame
    trace: pd.DataFrame
    demand: pd.DataFrame
    warnings: list[str]



class WorkspaceExistsError(ContractError):
    """`init_workspace` would overwrite files a workspace already has."""


def init_workspace(root: Path, *, force: bool = False) -> InitSummary:
    """Seed `root` with the embedded defaults; every file is validated and written atomically.

    Raises `WorkspaceExistsError` naming the files it would overwrite unless `force`.
    """
    workspace = Workspace(Path(root))
    existing = [p for p in workspace.seeded if p.exists()]
    if existing and not force:
        raise WorkspaceExistsError([Problem(str(workspace.root), f"already a workspace ({', '.join(p.name for p in existing)}"
                                            "): nothing overwritten; use --force to re-seed it from the defaults")])
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
