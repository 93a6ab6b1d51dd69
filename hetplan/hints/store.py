"""The hint store: versioned, atomically published hint tables that the online allocator pulls.

Layout of a store root::

    <root>/LATEST                    the version readers use (one line of text)
    <root>/<version>/plan.json       the plan the hints were read off
    <root>/<version>/hints.parquet   the validated hint table
    <root>/<version>/published.json  publish sequence number and time (the store's own record)
    <root>/<version>/<artifact>      anything else the publisher attached

A version is the plan id. Publishing writes the version into a staging directory, fsyncs every file and the
directory, renames it into place, and only then switches `LATEST` (temporary file, fsync, `os.replace`,
fsync of the root). A crash at any point leaves `LATEST` naming the previous complete version; readers never
see a half-written one. Publishers serialise on an advisory lock (`<root>/.lock`); readers take no lock.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hetplan.contracts.hints import HINTS
from hetplan.fsio import atomic_write_bytes, fsync_dir, write_synced
from hetplan.contracts.plan import Plan, load_plan
from hetplan.contracts.table import ContractError, Problem, RowLabels

log = logging.getLogger(__name__)

LATEST = "LATEST"
PLAN_FILE = "plan.json"
HINTS_FILE = "hints.parquet"
META_FILE = "published.json"
RESERVED_NAMES = frozenset({PLAN_FILE, HINTS_FILE, META_FILE, LATEST})
STORE_ENV = "HETPLAN_HINT_STORE"
DEFAULT_STORE = Path(".hetplan") / "hints"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")


def default_store_root() -> Path:
    """The store used when none is named: `$HETPLAN_HINT_STORE`, else `.hetplan/hints`."""
    env = os.environ.get(STORE_ENV, "").strip()
    return Path(env) if env else DEFAULT_STORE


class VersionExistsError(ContractError):
    """The plan id is already published in this store; versions are immutable."""


@dataclass(frozen=True, eq=False)
class PublishedHints:
    """One published version: its plan and validated hint table."""

    version: str  # = plan.plan_id
    plan: Plan
    hints: pd.DataFrame
    path: Path  # <root>/<version>


def validate_hints(plan: Plan, hints: pd.DataFrame, labels: RowLabels | str = "<hints>") -> pd.DataFrame:
    """Validate a hint table against `HINTS` and check that every row names `plan.plan_id`.

    Returns the typed frame. Raises `ContractError` listing every problem, both kinds together, located by
    `labels` (a file's row labels as `read_raw` gives them, or a name for a frame).
    """
    if isinstance(labels, str):
        labels = RowLabels(labels, range(1, len(hints) + 1))
    problems: list[Problem] = []
    typed: pd.DataFrame | None = None
    try:
        typed = HINTS.validate(hints, labels)
    except ContractError as exc:
        problems.extend(exc.problems)
    if "plan_id" in hints.columns:
        for pos, value in enumerate(hints["plan_id"].tolist()):
            text = "" if value is None or (isinstance(value, float) and value != value) else str(value).strip()
            if text and text != plan.plan_id:
                problems.append(labels.problem(pos, "plan_id", f"plan_id {text!r} does not match the plan's "
                                                               f"plan_id {plan.plan_id!r}"))
    if problems:
        # HINTS reports a table naming several plans as one file-level problem; keep the per-row ones too.
        raise ContractError(problems)
    assert typed is not None
    return typed


class HintStore:
    """A directory of published hint tables, one immutable version per plan id, `LATEST` naming the current one."""

    def __init__(self, root: str | os.PathLike[str], keep: int = 5) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.root = Path(root)
        self.keep = keep

    def __repr__(self) -> str:
        return f"HintStore({str(self.root)!r}, keep={self.keep})"

    @property
    def latest_path(self) -> Path:
        return self.root / LATEST

    # ---------------------------------------------------------------- publishing

    def publish(self, plan: Plan, hints: pd.DataFrame,
                artifacts: Mapping[str, bytes] | None = None) -> PublishedHints:
        """Publish `hints` (read off `plan`) as version `plan.plan_id` and point `LATEST` at it.

        Everything is checked before the store is touched: the hint table (`HINTS`), that every row names
        the plan, the version and artifact names. Raises `ContractError` for bad input and
        `VersionExistsError` when the version is already in the store.
        """
        typed = validate_hints(plan, hints)
        version = plan.plan_id
        _check_name(version, "plan_id", str(self.root))
        extra = dict(artifacts or {})
        problems = []
        for name, payload in extra.items():
            if not isinstance(name, str) or not _NAME.fullmatch(name) or name in RESERVED_NAMES:
                problems.append(Problem(str(self.root), f"artifact name {name!r} is not allowed (a plain file "
                                                        f"name, not one of {', '.join(sorted(RESERVED_NAMES))})"))
            elif not isinstance(payload, (bytes, bytearray, memoryview)):
                problems.append(Problem(str(self.root), f"artifact {name!r} must be bytes"))
        if problems:
            raise ContractError(problems)

        self.root.mkdir(parents=True, exist_ok=True)
        with self._publish_lock():
            target = self.root / version
            if target.exists():
                raise VersionExistsError([Problem(str(self.root), f"version {version!r} is already published "
                                                                  f"(LATEST is {self.latest_version()!r}); "
                                                                  "a version is immutable, publish a new plan id")])
            self._remove_leftovers()
            sequence = max((meta["sequence"] for _, meta in self._version_meta()), default=0) + 1
            files: dict[str, bytes] = {
                PLAN_FILE: (plan.model_dump_json(indent=2) + "\n").encode(),
                HINTS_FILE: _parquet_bytes(typed),
                **{name: bytes(payload) for name, payload in extra.items()},
                META_FILE: json.dumps({"version": version, "sequence": sequence,
                                       "published_at_ns": time.time_ns()}).encode() + b"\n",
            }
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root))
            try:
                for name, payload in files.items():
                    write_synced(staging / name, payload)
                fsync_dir(staging)
                os.rename(staging, target)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            fsync_dir(self.root)
            self._switch_latest(version)
            log.info("published hints %s (%d rows) to %s", version, len(typed), self.root)
            self._prune()
        return PublishedHints(version, plan, typed, target)

    def _switch_latest(self, version: str) -> None:
        """Point LATEST at `version` atomically (readable like any file the publisher writes)."""
        atomic_write_bytes(self.latest_path, version.encode() + b"\n", sync_dir=True)

    def _prune(self) -> None:
        """Remove all but the newest `keep` versions; never the one LATEST names."""
        latest = self.latest_version()
        ordered = self.versions()
        doomed = [v for v in ordered[: max(len(ordered) - self.keep, 0)] if v != latest]
        for version in doomed:
            # Rename first so that a reader never sees a half-deleted version directory.
            trash = self.root / f".trash-{version}-{os.getpid()}-{time.monotonic_ns()}"
            try:
                os.rename(self.root / version, trash)
            except FileNotFoundError:
                continue
            shutil.rmtree(trash, ignore_errors=True)
            log.info("pruned hint version %s", version)
        if doomed:
            fsync_dir(self.root)

    def _remove_leftovers(self) -> None:
        """Delete staging and trash directories left by a publisher that crashed (we hold the lock)."""
        for entry in self.root.iterdir():
            if entry.name.startswith((".staging-", ".trash-")) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.name.startswith(".LATEST.") and entry.name.endswith(".tmp"):
                entry.unlink(missing_ok=True)

    @contextmanager
    def _publish_lock(self) -> Iterator[None]:
        with open(self.root / ".lock", "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    # ---------------------------------------------------------------- reading

    def latest_version(self) -> str | None:
        """The version LATEST names, or None when nothing was ever published."""
        try:
            raw = self.latest_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ContractError([Problem(str(self.latest_path), f"cannot read ({exc.strerror})")]) from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ContractError([Problem(str(self.latest_path), f"does not name a version: not UTF-8 text "
                                                                f"(byte {exc.start})")]) from None
        version = text.strip()
        if not _NAME.fullmatch(version):
            raise ContractError([Problem(str(self.latest_path), f"does not name a version: {text[:80]!r}")])
        return version

    def versions(self) -> list[str]:
        """Complete versions in the store, oldest first (by the publish sequence the store records)."""
        return [version for version, _ in self._version_meta()]

    def _version_meta(self) -> list[tuple[str, dict]]:
        if not self.root.is_dir():
            return []
        found: list[tuple[str, dict]] = []
        for entry in self.root.iterdir():
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            try:
                meta = json.loads((entry / META_FILE).read_text())
                sequence = int(meta["sequence"])
                stamp = int(meta.get("published_at_ns", 0))
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("ignoring %s: no readable %s", entry, META_FILE)
                continue
            found.append((entry.name, {"sequence": sequence, "published_at_ns": stamp}))
        found.sort(key=lambda item: (item[1]["sequence"], item[1]["published_at_ns"], item[0]))
        return found

    def load(self, version: str | None = None) -> PublishedHints:
        """Load one version (None: the one LATEST names); `ContractError` if it is missing or corrupt."""
        if version is None:
            version = self.latest_version()
            if version is None:
                raise ContractError([Problem(str(self.root), "no published hints (LATEST is missing; made by "
                                                     "`hetplan publish --plan P --hints H --store DIR` or `make main`)")])
        _check_name(version, "version", str(self.root))
        path = self.root / version
        if not (path / META_FILE).is_file():
            known = ", ".join(self.versions()[-5:]) or "none"
            raise ContractError([Problem(str(path), f"no such published version (newest: {known})")])
        plan = load_plan(path / PLAN_FILE)
        hints = HINTS.load(path / HINTS_FILE)
        problems = []
        if plan.plan_id != version:
            problems.append(Problem(str(path / PLAN_FILE), f"plan_id {plan.plan_id!r} does not match the version "
                                                           f"directory {version!r}", column="plan_id"))
        wrong = sorted(set(hints["plan_id"]) - {version})
        if wrong:
            problems.append(Problem(str(path / HINTS_FILE), f"rows name plan {wrong[0]!r}, not {version!r}",
                                    column="plan_id"))
        if problems:
            raise ContractError(problems)
        return PublishedHints(version, plan, hints, path)


def _check_name(name: str, what: str, where: str) -> None:
    if not _NAME.fullmatch(name) or name in RESERVED_NAMES:
        raise ContractError([Problem(where, f"{what} {name!r} cannot name a store version: use letters, digits "
                                            "and . _ + - (not starting with one of those), at most 200 characters")])


def _parquet_bytes(frame: pd.DataFrame) -> bytes:
    import io

    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()
