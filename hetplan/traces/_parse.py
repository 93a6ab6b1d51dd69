"""Parsing shared by the trace importers: header-less text files, required columns and numeric cells.

Every finding becomes a `Problem(file, message, row=<line>, column=<source column>)`; all of them are
collected before raising one `ContractError`, and the happy path stays vectorised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from hetplan.contracts.table import ContractError, Problem, RowLabels, decode_text, read_input, read_raw

T = TypeVar("T")


def read_headerless(
    path: str | Path, sep: str, layouts: Mapping[int, Sequence[str]], what: str
) -> tuple[pd.DataFrame, RowLabels]:
    """Read a header-less `sep`-separated text file whose field count selects its column names.

    All lines must share one field count, and it must be a key of `layouts`; blank lines are skipped.
    """
    name = str(path)
    text = decode_text(name, read_input(path), "text")
    rows: list[list[str]] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            rows.append(line.split(sep))
            lines.append(number)
    if not rows:
        raise ContractError([Problem(name, "file is empty")])
    expected = " or ".join(str(n) for n in sorted(layouts))
    width = len(rows[0])
    if width not in layouts:
        raise ContractError([Problem(name, f"has {width} fields; a {what} line has {expected}", lines[0])])
    problems = [
        Problem(name, f"has {len(row)} fields but line {lines[0]} has {width} (one layout per file: {expected})", line)
        for row, line in zip(rows, lines)
        if len(row) != width
    ]
    if problems:
        raise ContractError(problems)
    frame = pd.DataFrame(rows, columns=list(layouts[width]), dtype=object)
    return frame, RowLabels(name, lines)


def read_headed(path: str | Path, required: Iterable[str]) -> tuple[pd.DataFrame, RowLabels]:
    """Read a CSV (or Parquet) file with a header; every column in `required` must be present."""
    frame, labels = read_raw(path)
    frame.columns = [str(c).strip() for c in frame.columns]
    header_row = 1 if labels.rows and labels.rows[0] >= 2 else None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise ContractError([Problem(labels.file, "missing required column", header_row, c) for c in missing])
    if frame.empty:
        raise ContractError([Problem(labels.file, "no data rows")])
    return frame.reset_index(drop=True), labels


def numbers(
    frame: pd.DataFrame,
    labels: RowLabels,
    columns: Iterable[str],
    *,
    whole: Iterable[str] = (),
    blank_ok: Iterable[str] = (),
) -> dict[str, pd.Series]:
    """Parse `columns` as finite floats (NaN where blank and allowed); raise one `ContractError` for all bad cells."""
    whole, blank_ok = set(whole), set(blank_ok)
    parsed: dict[str, pd.Series] = {}
    problems: list[Problem] = []
    for column in columns:
        values, blank = _parse_numbers(frame[column])
        bad = values.isna() & ~blank
        for pos in np.flatnonzero(bad.to_numpy()):
            problems.append(labels.problem(int(pos), column, f"not a number: {frame[column].iloc[pos]!r}"))
        infinite = ~bad & ~blank & ~np.isfinite(values.fillna(0.0))
        for pos in np.flatnonzero(infinite.to_numpy()):
            problems.append(labels.problem(int(pos), column, f"not a finite number: {frame[column].iloc[pos]!r}"))
        if column not in blank_ok:
            for pos in np.flatnonzero(blank.to_numpy()):
                problems.append(labels.problem(int(pos), column, "missing value"))
        if column in whole:
            fractional = ~bad & ~blank & ~infinite & (values % 1 != 0)
            for pos in np.flatnonzero(fractional.to_numpy()):
                problems.append(labels.problem(int(pos), column, f"not a whole number: {frame[column].iloc[pos]!r}"))
        parsed[column] = values
    if problems:
        raise ContractError(sorted(problems, key=lambda p: (p.row or 0)))
    return parsed


def text(series: pd.Series) -> pd.Series:
    """Cells as stripped text (object dtype), blank where missing."""
    return series.astype("string").str.strip().fillna("").astype(object)


def _parse_numbers(raw: pd.Series) -> tuple[pd.Series, pd.Series]:
    if pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw):
        values = raw.astype("float64")
        return values, values.isna()
    stripped = raw.astype("string").str.strip()
    blank = (stripped.isna() | (stripped == "")).astype(bool)
    values = pd.to_numeric(stripped.where(~blank), errors="coerce").astype("float64")
    return values, blank


class _Problems:
    """Runs parsing steps, keeping every step's `ContractError` problems so all are reported together."""

    def __init__(self) -> None:
        self.found: list[Problem] = []

    def run(self, step: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return step(*args, **kwargs)
        except ContractError as exc:
            self.found.extend(exc.problems)
            return None  # type: ignore[return-value]  # never used: the block raises on exit


@contextmanager
def collect_problems() -> Iterator[_Problems]:
    """`with collect_problems() as p: a = p.run(step, ...)`; raises one `ContractError` with all problems."""
    problems = _Problems()
    yield problems
    if problems.found:
        raise ContractError(sorted(problems.found, key=lambda p: (p.row or 0)))


def model_option(model: str) -> str:
    """The `model` option of formats that carry no model name: a non-blank name."""
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"model must be a non-blank name, got {model!r}")
    return model.strip()
