"""A workspace: the directory of files one planning cycle reads and writes, seeded from your files or defaults.

`init_workspace` writes what the workspace lacks: the node-shape catalog, the owned fleet and the workload (a
trace) from your own files when given (`Seed`), else from the embedded defaults (the shipped catalog of real
cloud prices, a derived sample of Alibaba PAI's heterogeneous GPU fleet, Gavel's Philly-derived trace of 1,181
jobs), the derived profile set (labelled derived), the published V100 table and the demand mix of the trace.
Every file is validated against its contract before anything is written.

A file hetplan did not write (you copied it in, or edited it since) is never overwritten: it is validated and
kept, and a different file given for its place is refused (`--force` overwrites); a `demand.csv` of yours is
kept when the trace changes, with a warning. `workspace.json` records what hetplan wrote, with each file's checksum and
source, so that a nightly run may refresh a trace it wrote from a source (`hetplan.traces.sources`) and never
touches one you placed. A workspace made before `workspace.json` existed gets one at its next init: a file that
holds its embedded default (`demand.csv`: the mix of the workspace's trace) is hetplan's, the others are yours
and kept, a different source for them a warning, never an error. Later stages (fit, plan, publish) read and add
to the same directory: the plan is for the workload, on the owned fleet plus what the budget rents.
"""

from __future__ import annotations

import functools
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from hetplan.catalog import DEFAULT_CATALOG, load_default_catalog, load_default_fleet
from hetplan.contracts import (
    CATALOG, DEMAND, FLEET, PROFILES, TRACE, ContractError, Problem, TableSchema, demand_from_trace, fingerprint,
)
from hetplan.fsio import atomic_write_bytes
from hetplan.resources import upstream_path

DEFAULT_TRACE = (upstream_path("traces", "gavel_philly_0e4a51.trace"), "gavel")
DEFAULT_ROOT = Path(".hetplan")
MANIFEST = "workspace.json"


def default_curves(root: Path = DEFAULT_ROOT) -> Path:
    """The curve table commands read when none is named (`plan`, `evaluate`, `report`, `curves show`): the newer of
    `hetplan fit`'s default output and the published nightly run's (`<root>/current/curves.parquet`); the former
    when neither exists."""
    return _newest(root / "curves.parquet", root / "current" / "curves.parquet")


def default_plan_dir(root: Path = DEFAULT_ROOT) -> Path:
    """The plan directory `hetplan report` reads when none is named, by the same rule: the newer of `hetplan
    plan`'s default output (`<root>/plan`) and the published nightly run's (`<root>/current/plan`)."""
    return _newest(root / "plan" / "plan.json", root / "current" / "plan" / "plan.json").parent


def _newest(default: Path, published: Path) -> Path:
    candidates = [p for p in (default, published) if p.is_file()]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else default


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
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def seeded(self) -> tuple[Path, ...]:
        """The files `init_workspace` writes."""
        return (self.catalog, self.fleet, self.profiles, self.published_profiles, self.trace, self.demand)

    def written(self) -> dict[str, dict]:
        """`workspace.json`: file name -> {"source", "sha256", "at"} of each file hetplan wrote, or {"source",
        "at", "yours": true} for a file of yours found when it was first written ({} if none)."""
        try:
            return json.loads(self.manifest.read_text())
        except (OSError, ValueError):
            return {}

    def is_ours(self, path: Path) -> bool:
        """True when hetplan wrote `path` and nobody changed it since (its checksum is the recorded one)."""
        entry = self.written().get(path.name)
        return entry is not None and path.is_file() and entry.get("sha256") == fingerprint(path)

    def predates(self, path: Path) -> bool:
        """True for a file of yours the workspace held before `workspace.json` existed (see the module)."""
        return bool(self.written().get(path.name, {}).get("yours"))


@dataclass(frozen=True)
class Seed:
    """Your own files to seed a workspace with; None: keep the workspace's file, else the embedded default."""

    fleet: str | None = None     # owned fleet (name,gpu_type,gpus,vcpus,mem_gb,count, or name,count of catalog shapes)
    trace: str | None = None     # a workload source (`hetplan.traces.sources`): file, URL, allocator
    catalog: str | None = None   # node shapes to buy or rent
    trace_format: str = "trace"  # a public trace format for a trace file (`hetplan trace import`'s)
    curves: Path | None = None   # the curves an allocator's job history is converted with (else the profiles)


@dataclass(frozen=True)
class InitSummary:
    workspace: Workspace
    catalog: pd.DataFrame
    profiles: pd.DataFrame
    trace: pd.DataFrame
    demand: pd.DataFrame
    warnings: list[str]
    origins: dict[str, str] = field(default_factory=dict)  # file name -> where its content comes from
    written: list[Path] = field(default_factory=list)


class WorkspaceExistsError(ContractError):
    """`init_workspace` would overwrite files a workspace already has."""


@dataclass
class _File:
    """One file of the workspace: its frame and where it comes from; `fresh` when it is to be (re)written."""

    path: Path
    schema: TableSchema
    frame: pd.DataFrame
    origin: str
    fresh: bool


def init_workspace(root: Path, *, force: bool = False, seed: Seed = Seed()) -> InitSummary:
    """Seed `root` (see the module): every input is read and validated first, then the files it lacks or that
    `seed` replaces are written atomically; your own files are kept.

    Raises `WorkspaceExistsError` when the workspace has every file and `seed` names none (nothing to do) unless
    `force`, and `ContractError` naming the file for a bad input or a file of yours that `seed` would replace.
    """
    ws = Workspace(Path(root))
    if not force and not (seed.fleet or seed.trace or seed.catalog) and all(p.exists() for p in ws.seeded):
        raise WorkspaceExistsError([Problem(str(ws.root), f"already a workspace ({', '.join(p.name for p in ws.seeded)}"
                                            "): nothing overwritten; use --force to re-seed it from the defaults")])
    warnings: list[str] = []
    if not force:
        _adopt(ws)
    catalog = _file(ws, ws.catalog, CATALOG, seed.catalog, force, warnings,
                    lambda: (load_default_catalog(), "default catalog"), CATALOG.load)
    catalog_path = seed.catalog or (ws.catalog if ws.catalog.is_file() and not catalog.fresh else DEFAULT_CATALOG)
    fleet = _file(ws, ws.fleet, FLEET, seed.fleet, force, warnings, lambda: (load_default_fleet(), "default fleet"),
                  lambda src: _read_fleet(src, catalog_path))
    profiles = _file(ws, ws.profiles, PROFILES, None, force, warnings,
                     lambda: (_reference().derived, "derived profiles"))
    published = _file(ws, ws.published_profiles, PROFILES, None, force, warnings,
                      lambda: (_reference().published, "published V100 table"))
    trace = _file(ws, ws.trace, TRACE, seed.trace, force, warnings, lambda: _default_trace(warnings),
                  lambda src: _read_trace(src, seed, profiles.frame, warnings))
    demand = _demand(ws, trace, force, warnings)
    files = [catalog, fleet, profiles, published, trace, demand]
    written = [f.schema.write(f.frame, f.path) for f in files if f.fresh]
    _record(ws, {f.path.name: f.origin for f in files if f.fresh})
    return InitSummary(ws, catalog.frame, profiles.frame, trace.frame, demand.frame, warnings,
                       {f.path.name: f.origin for f in files}, written)


def _file(ws: Workspace, path: Path, schema: TableSchema, source: str | None, force: bool, warnings: list[str],
          default: Callable[[], tuple[pd.DataFrame, str]],
          read: Callable[[str], pd.DataFrame] | None = None) -> _File:
    """What `path` will hold: `source` read (if given), else the workspace's own file kept, else the default."""
    exists = path.is_file()
    if source is not None and read is not None:
        frame = read(source)
        if exists and not force:
            if _same(schema, path, frame):
                return _File(path, schema, frame, "kept (the same as " + source + ")", False)
            if ws.predates(path):
                warnings.append(f"{path}: your own file (older than {MANIFEST}) is kept and {source} is not used; "
                                "move it aside to take the source")
                return _File(path, schema, schema.load(path), "kept (yours)", False)
            if not ws.is_ours(path):
                raise ContractError([Problem(str(path), f"your own file (hetplan did not write it, or it changed "
                                             f"since) differs from {source}: nothing overwritten; move it aside, or "
                                             "use --force to replace it")])
        return _File(path, schema, frame, f"yours: {source}", True)
    if exists and not force:
        return _File(path, schema, schema.load(path), "kept", False)
    frame, what = default()
    return _File(path, schema, frame, f"embedded default: {what}", True)


def _demand(ws: Workspace, trace: _File, force: bool, warnings: list[str]) -> _File:
    """`demand.csv`: the trace's mix when the file is missing or the trace changed, but never over a file of yours
    (kept, with a warning when it no longer matches the trace)."""
    path = ws.demand
    if path.is_file() and not force and not (trace.fresh and ws.is_ours(path)):
        kept = DEMAND.load(path)
        if trace.fresh and not _same(DEMAND, path, demand_from_trace(trace.frame)):
            warnings.append(f"{path}: your own file is kept but no longer matches {ws.trace.name}'s demand mix; "
                            "move it aside (or use --force) to have it rewritten")
        return _File(path, DEMAND, kept, "kept", False)
    return _File(path, DEMAND, demand_from_trace(trace.frame), f"demand mix of {ws.trace.name}", True)


def _adopt(ws: Workspace) -> None:
    """Write `workspace.json` for a workspace made before it existed (all its files, no manifest): a file that
    holds its embedded default (`demand.csv`: the mix of the workspace's trace) is recorded as hetplan's, the
    others as yours."""
    if ws.manifest.exists() or not all(p.is_file() for p in ws.seeded):
        return
    defaults: dict[Path, tuple[TableSchema, Callable[[], pd.DataFrame]]] = {
        ws.catalog: (CATALOG, load_default_catalog), ws.fleet: (FLEET, load_default_fleet),
        ws.profiles: (PROFILES, lambda: _reference().derived),
        ws.published_profiles: (PROFILES, lambda: _reference().published),
        ws.trace: (TRACE, lambda: _default_trace([])[0]),
        ws.demand: (DEMAND, lambda: demand_from_trace(TRACE.load(ws.trace))),
    }
    at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    entries: dict[str, dict] = {}
    for path, (schema, default) in defaults.items():
        try:
            ours = _holds(schema, path, default())
        except ContractError:
            ours = False
        entries[path.name] = ({"source": f"embedded default (found before {MANIFEST})", "sha256": fingerprint(path),
                               "at": at} if ours else {"source": f"yours (found before {MANIFEST})", "at": at,
                                                       "yours": True})
    atomic_write_bytes(ws.manifest, (json.dumps(entries, indent=2, sort_keys=True) + "\n").encode())


def _holds(schema: TableSchema, path: Path, frame: pd.DataFrame) -> bool:
    """True when `path` is `frame` as hetplan writes it (the same checksum), or holds the same rows."""
    with tempfile.TemporaryDirectory() as tmp:
        written = schema.write(frame, Path(tmp) / path.name)
        return fingerprint(written) == fingerprint(path) or _same(schema, path, frame)


def _same(schema: TableSchema, path: Path, frame: pd.DataFrame) -> bool:
    """True when `path` holds the rows of `frame` (validated both), whatever the file's formatting."""
    try:
        ours = schema.validate(frame, "<new>").reset_index(drop=True)
        theirs = schema.load(path).reset_index(drop=True)
        pd.testing.assert_frame_equal(ours[theirs.columns.intersection(ours.columns)],
                                      theirs[theirs.columns.intersection(ours.columns)], check_dtype=False)
        return list(ours.columns) == list(theirs.columns)
    except (ContractError, AssertionError):
        return False


def _read_fleet(source: str, catalog_path: str | Path) -> pd.DataFrame:
    from hetplan.planner.entry import read_fleet

    return read_fleet(source, catalog_path)


def _read_trace(source: str, seed: Seed, profiles: pd.DataFrame, warnings: list[str]) -> pd.DataFrame:
    from hetplan.traces.history import workspace_speeds
    from hetplan.traces.sources import ALLOCATOR, read_source

    speeds, how = workspace_speeds(seed.curves, profiles) if source.startswith(ALLOCATOR) else (None, "")
    sourced = read_source(source, fmt=seed.trace_format, speeds=speeds)
    warnings.extend(sourced.warnings + ([how] if how else []))
    return sourced.trace


def _default_trace(warnings: list[str]) -> tuple[pd.DataFrame, str]:
    from hetplan.traces import import_trace

    imported = import_trace(*DEFAULT_TRACE)
    warnings.extend(imported.warnings)
    return imported.trace, "Gavel's Philly-derived trace (0e4a51)"


@functools.cache
def _reference():
    from hetplan.reference import build_reference

    return build_reference()


def _record(ws: Workspace, origins: dict[str, str]) -> None:
    """Add the files just written, with their checksums and sources, to `workspace.json`."""
    if not origins:
        return
    entries = ws.written()
    at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for name, origin in origins.items():
        entries[name] = {"source": origin, "sha256": fingerprint(ws.root / name), "at": at}
    atomic_write_bytes(ws.manifest, (json.dumps(entries, indent=2, sort_keys=True) + "\n").encode())
