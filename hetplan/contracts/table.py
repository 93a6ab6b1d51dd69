"""Typed table schemas: load CSV or Parquet, validate every cell, write atomically.

Each file contract of hetplan (catalog, profiles, demand, trace, hints) is one `TableSchema` declared in
its own module; this module is the machinery they share. Validation collects *every* problem as a
`Problem(file, row, column, message)` instead of stopping at the first, so a person can fix a file in one
pass. Rows are counted as a person sees them: in a CSV file the line number (the header is line 1); in a
Parquet file or a DataFrame the 1-based record number.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from hetplan.fsio import atomic_write_bytes
from hetplan.gpus import UnknownGpuError, canonical_gpu

Kind = Literal["str", "int", "float", "gpu", "timestamp"]
TableCheck = Callable[[pd.DataFrame, "RowLabels"], list["Problem"]]

CSV_SUFFIXES = frozenset({".csv"})
PARQUET_SUFFIXES = frozenset({".parquet", ".pq"})


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input, located as precisely as it can be."""

    file: str
    message: str
    row: int | None = None
    column: str | None = None

    def __str__(self) -> str:
        where = self.file
        if self.row is not None:
            where += f":{self.row}"
            if self.column:
                where += f":{self.column}"
        elif self.column:
            where += f":{self.column}"
        return f"{where}: {self.message}"


class ContractError(ValueError):
    """An input broke its contract; `problems` lists every finding, one line each."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass(frozen=True)
class Column:
    """One column of a contract: its type, whether it must exist and be filled, and its valid range."""

    name: str
    kind: Kind
    required: bool = True
    nullable: bool = False
    min: float | None = None
    min_inclusive: bool = True
    max: float | None = None
    choices: tuple[str, ...] | None = None
    pattern: str | None = None
    doc: str = ""
    omit_empty: bool = False  # optional, and left out of written files when no row fills it


class RowLabels:
    """Maps a frame's positional index to the row numbers a person sees in the source file."""

    def __init__(self, file: str, rows: Sequence[int]) -> None:
        self.file = file
        self.rows = list(rows)

    def problem(self, position: int, column: str | None, message: str) -> Problem:
        return Problem(self.file, message, self.rows[position], column)


@dataclass(frozen=True)
class TableSchema:
    """A file contract: its columns, its key (no duplicates) and whole-table checks."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()
    checks: tuple[TableCheck, ...] = field(default=())
    doc: str = ""
    made_by: str = ""  # the command that writes such a file (in backticks), named when one is missing


    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def header(self) -> str:
        """The CSV header of the contract (optional columns in brackets), as DESIGN.md writes it."""
        return ",".join(c.name if c.required else f"[{c.name}]" for c in self.columns)

    def load(self, path: str | os.PathLike[str]) -> pd.DataFrame:
        """Read and validate a CSV or Parquet file; raise `ContractError` listing every problem."""
        raw, labels = read_raw(path, self.made_by)
        return self.validate(raw, labels)

    def validate(self, frame: pd.DataFrame, labels: RowLabels | str = "<frame>") -> pd.DataFrame:
        """Return a typed copy of `frame`; raise `ContractError` listing every problem."""
        if isinstance(labels, str):
            labels = RowLabels(labels, range(1, len(frame) + 1))
        frame = frame.reset_index(drop=True)
        header_row = 1 if labels.rows and labels.rows[0] >= 2 else None
        problems: list[Problem] = []
        missing = [c.name for c in self.columns if c.required and c.name not in frame.columns]
        for name in missing:
            problems.append(Problem(labels.file, "missing required column", header_row, name))
        if problems:
            raise ContractError(problems)
        if frame.empty:
            raise ContractError([Problem(labels.file, f"no data rows (a {self.name} needs at least one)")])

        typed = frame.copy()
        for col in self.columns:
            if col.name not in frame.columns:
                typed[col.name] = _empty_column(col.kind, len(frame))
                continue
            typed[col.name], found = _coerce(col, frame[col.name], labels)
            problems.extend(found)
        if not problems:
            problems.extend(_duplicate_keys(typed, self.key, labels))
            for check in self.checks:
                problems.extend(check(typed, labels))
        if problems:
            raise ContractError(problems)
        ordered = self.column_names + [c for c in typed.columns if c not in self.column_names]
        return typed[ordered]

    def write(self, frame: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
        """Validate `frame`, then write it as CSV or Parquet (by suffix) atomically; return the path.

        Nothing is written when validation fails: a reader never sees a half-written or invalid file.
        Columns marked `omit_empty` are left out when no row fills them.
        """
        target = Path(path)
        suffix = target.suffix.lower()
        if suffix not in CSV_SUFFIXES | PARQUET_SUFFIXES:
            raise ContractError([Problem(str(target), "output must end in .csv or .parquet")])
        typed = self.validate(frame, "<output>")
        empty = [c.name for c in self.columns if c.omit_empty and typed[c.name].isna().all()]
        typed = typed.drop(columns=empty)
        if suffix in CSV_SUFFIXES:
            payload = typed.to_csv(index=False, lineterminator="\n").encode()
            atomic_write_bytes(target, payload)
        else:
            buffer = io.BytesIO()
            typed.to_parquet(buffer, index=False)
            atomic_write_bytes(target, buffer.getvalue())
        return target


def missing_file(name: str, made_by: str = "") -> ContractError:
    """The error for an input that does not exist, naming the command that makes it when there is one."""
    return ContractError([Problem(name, f"no such file (made by {made_by})" if made_by else "no such file")])


def read_input(path: str | os.PathLike[str], made_by: str = "") -> bytes:
    """The bytes of an input file; `ContractError` if it is missing (naming `made_by`, the command that makes such
    a file), a directory or empty."""
    source, name = Path(path), str(path)
    if not source.exists():
        raise missing_file(name, made_by)
    if source.is_dir():
        raise ContractError([Problem(name, "is a directory, not a file")])
    data = source.read_bytes()
    if not data.strip():
        raise ContractError([Problem(name, "file is empty")])
    return data


def decode_text(name: str, data: bytes, kind: str) -> str:
    """Input bytes as text; `ContractError` naming the expected `kind` of file if they are binary or not UTF-8."""
    if b"\x00" in data[:4096]:
        raise ContractError([Problem(name, f"not a {kind} file (binary content)")])
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ContractError([Problem(name, f"not a {kind} file: not UTF-8 text (byte {exc.start})")]) from exc


def read_raw(path: str | os.PathLike[str], made_by: str = "") -> tuple[pd.DataFrame, RowLabels]:
    """Read a CSV (every cell as text) or Parquet file untyped, with the row labels of its source."""
    name = str(path)
    data = read_input(path, made_by)
    suffix = Path(path).suffix.lower()
    if suffix in PARQUET_SUFFIXES or data[:4] == b"PAR1":
        try:
            frame = pd.read_parquet(io.BytesIO(data))
        except Exception as exc:  # pyarrow raises several exception types for corrupt files
            raise ContractError([Problem(name, f"not a readable Parquet file ({exc.__class__.__name__})")]) from exc
        return frame, RowLabels(name, range(1, len(frame) + 1))
    return _read_csv_text(name, data)


def _read_csv_text(name: str, data: bytes) -> tuple[pd.DataFrame, RowLabels]:
    text = decode_text(name, data, "CSV or Parquet")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except (csv.Error, StopIteration) as exc:
        raise ContractError([Problem(name, f"not a CSV file ({exc})")]) from exc
    header = [h.strip() for h in header]
    if len(header) < 2 and "," not in text.splitlines()[0]:
        raise ContractError([Problem(name, "not a CSV file: the first line has no comma-separated header", 1)])
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        raise ContractError([Problem(name, "column appears more than once in the header", 1, d) for d in dupes])
    rows: list[list[str]] = []
    lines: list[int] = []
    problems: list[Problem] = []
    try:
        for record in reader:
            if not record or all(not cell.strip() for cell in record):
                continue
            if len(record) != len(header):
                problems.append(
                    Problem(name, f"has {len(record)} fields, the header has {len(header)}", reader.line_num)
                )
                continue
            rows.append(record)
            lines.append(reader.line_num)
    except csv.Error as exc:
        problems.append(Problem(name, f"malformed CSV ({exc})", reader.line_num))
    if problems:
        raise ContractError(problems)
    return pd.DataFrame(rows, columns=header, dtype=object), RowLabels(name, lines)


def _empty_column(kind: Kind, n: int) -> pd.Series:
    if kind == "int":
        return pd.Series([pd.NA] * n, dtype="Int64")
    if kind == "float":
        return pd.Series([np.nan] * n, dtype="float64")
    if kind == "timestamp":
        return pd.Series([pd.NaT] * n, dtype="datetime64[ns, UTC]")
    return pd.Series([None] * n, dtype=object)


def _blank(raw: pd.Series) -> pd.Series:
    """True where a cell holds no value (None, NaN, or blank text)."""
    text = raw.map(lambda v: v.strip() if isinstance(v, str) else v)
    return text.isna() | (text == "")


def _coerce(col: Column, raw: pd.Series, labels: RowLabels) -> tuple[pd.Series, list[Problem]]:
    problems: list[Problem] = []
    blank = _blank(raw)
    if not col.nullable:
        for pos in np.flatnonzero(blank.to_numpy()):
            problems.append(labels.problem(int(pos), col.name, "missing value"))
    if col.kind in ("int", "float"):
        values, bad = _numeric(col, raw, blank, labels)
        problems.extend(bad)
    elif col.kind == "timestamp":
        values = pd.to_datetime(raw.where(~blank), errors="coerce", utc=True, format="ISO8601")
        for pos in np.flatnonzero((values.isna() & ~blank).to_numpy()):
            problems.append(labels.problem(int(pos), col.name, f"not an ISO 8601 timestamp: {raw.iloc[pos]!r}"))
    else:
        values = pd.Series([None if b else (v.strip() if isinstance(v, str) else str(v))
                            for v, b in zip(raw, blank)], index=raw.index, dtype=object)
        if col.kind == "gpu":
            values, bad = _gpu_names(col, values, labels)
            problems.extend(bad)
        problems.extend(_text_rules(col, values, labels))
    return values, problems


def _numeric(col: Column, raw: pd.Series, blank: pd.Series, labels: RowLabels) -> tuple[pd.Series, list[Problem]]:
    problems: list[Problem] = []
    values = pd.to_numeric(raw.where(~blank), errors="coerce").astype("float64")
    is_nan_text = raw.map(lambda v: isinstance(v, str) and v.strip().lower() in {"nan", "+nan", "-nan"})
    for pos in np.flatnonzero(((values.isna() & ~blank) | is_nan_text).to_numpy()):
        cell = raw.iloc[pos]
        message = "NaN is not a valid value" if is_nan_text.iloc[pos] else f"not a number: {cell!r}"
        problems.append(labels.problem(int(pos), col.name, message))
    finite = values.notna()
    for pos in np.flatnonzero((finite & ~np.isfinite(values.fillna(0))).to_numpy()):
        problems.append(labels.problem(int(pos), col.name, f"not a finite number: {raw.iloc[pos]!r}"))
    ok = finite & np.isfinite(values.fillna(0))
    if col.kind == "int":
        for pos in np.flatnonzero((ok & (values % 1 != 0)).to_numpy()):
            problems.append(labels.problem(int(pos), col.name, f"not a whole number: {raw.iloc[pos]!r}"))
    if col.min is not None:
        low = values < col.min if col.min_inclusive else values <= col.min
        word = "at least" if col.min_inclusive else "greater than"
        for pos in np.flatnonzero((ok & low).to_numpy()):
            problems.append(labels.problem(int(pos), col.name, f"must be {word} {col.min:g}, got {values.iloc[pos]:g}"))
    if col.max is not None:
        for pos in np.flatnonzero((ok & (values > col.max)).to_numpy()):
            problems.append(labels.problem(int(pos), col.name, f"must be at most {col.max:g}, got {values.iloc[pos]:g}"))
    if col.kind == "int":
        return values.round().astype("Int64"), problems
    return values, problems


def _gpu_names(col: Column, values: pd.Series, labels: RowLabels) -> tuple[pd.Series, list[Problem]]:
    problems: list[Problem] = []
    canonical: dict[str, str | None] = {}
    for name in values.dropna().unique():
        try:
            canonical[name] = canonical_gpu(name)
        except UnknownGpuError as exc:
            canonical[name] = None
            message = str(exc)
            for pos in np.flatnonzero((values == name).to_numpy()):
                problems.append(labels.problem(int(pos), col.name, message))
    mapped = [canonical.get(v, v) if v is not None else None for v in values]
    return pd.Series(mapped, index=values.index, dtype=object), problems


def _text_rules(col: Column, values: pd.Series, labels: RowLabels) -> list[Problem]:
    problems: list[Problem] = []
    for pos, value in enumerate(values):
        if value is None:
            continue
        if col.choices is not None and value not in col.choices:
            problems.append(labels.problem(pos, col.name, f"must be one of {', '.join(col.choices)}; got {value!r}"))
        if col.pattern is not None and not re.fullmatch(col.pattern, str(value)):
            problems.append(labels.problem(pos, col.name, f"{value!r} does not match {col.doc or col.pattern}"))
    return problems


def _duplicate_keys(frame: pd.DataFrame, key: Iterable[str], labels: RowLabels) -> list[Problem]:
    key = list(key)
    if not key:
        return []
    dup = frame.duplicated(subset=key, keep="first").to_numpy()
    if not dup.any():
        return []
    first_seen: dict[tuple, int] = {}
    problems: list[Problem] = []
    for pos, values in enumerate(frame[key].itertuples(index=False, name=None)):
        if values not in first_seen:
            first_seen[values] = pos
        elif dup[pos]:
            shown = ", ".join(f"{k}={v}" for k, v in zip(key, values))
            first = labels.rows[first_seen[values]]
            problems.append(labels.problem(pos, key[0], f"duplicate key ({shown}), first on row {first}"))
    return problems


