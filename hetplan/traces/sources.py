"""Where a workload comes from: a trace file, a URL of one, or the cluster's own job history.

A source is one string, as `hetplan init --trace` and the nightly DAG's `trace` param take it:

- `PATH` (or `file://PATH`): a trace file, in the trace contract or, with `fmt`, a public format;
- `http://...` / `https://...`: a trace file (trace contract) downloaded;
- `allocator:http://HOST:PORT`: the running allocator's job history (`GET /v1/jobs`), made a trace
  (`hetplan.traces.history`: durations at the reference allocation derived with `speeds`);
- `allocator:PATH`: the same, read from the allocator's SQLite database (read-only; the allocator may run).

Every source is validated; a bad one raises `ContractError` naming it (file:row:column for a file's rows).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hetplan.contracts import TRACE, ContractError, Problem
from hetplan.traces.history import Speeds, trace_from_history

ALLOCATOR = "allocator:"
TIMEOUT_S = 30.0


class EmptyHistory(ContractError):
    """The allocator's job history has no done job on whole GPUs yet (a new cluster): nothing to plan for."""


@dataclass
class Sourced:
    """A workload read from a source: the trace, the source as given, and what the reading said."""

    trace: pd.DataFrame
    source: str
    warnings: list[str] = field(default_factory=list)


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def read_source(spec: str, *, fmt: str = "trace", speeds: Speeds | None = None) -> Sourced:
    """The trace a source names (see the module); `speeds` give an allocator history's durations at the reference
    allocation."""
    spec = spec.strip()
    if spec.startswith(ALLOCATOR):
        return from_allocator(spec.removeprefix(ALLOCATOR), speeds=speeds)
    if is_url(spec):
        return Sourced(_download(spec), spec)
    path = spec.removeprefix("file://")
    if fmt == "trace":
        return Sourced(TRACE.load(path), spec)
    from hetplan.traces import import_trace

    imported = import_trace(path, fmt)
    return Sourced(imported.trace, spec, list(imported.warnings))


def from_allocator(where: str, *, speeds: Speeds | None = None) -> Sourced:
    """The trace of the allocator's job history, at `where`: its URL (`GET /v1/jobs`, open like every read) or its
    SQLite database."""
    from hetplan.allocator.history import Histories, job_histories

    if is_url(where):
        url = where.rstrip("/") + "/v1/jobs"
        body = _get_json(url)
        try:
            histories = Histories.from_dict(body)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # JSON, but not GET /v1/jobs' answer
            raise ContractError([Problem(url, f"not the allocator's job history ({type(exc).__name__}: "
                                              f"{' '.join(str(exc).split())[:200]}): is this the hetplan "
                                              "allocator's URL?")]) from None
    else:
        from hetplan.allocator.cluster import StateError
        from hetplan.allocator.durable import read_actions

        try:
            histories = job_histories(read_actions(where))
        except StateError as exc:
            raise ContractError([Problem(where, str(exc).removeprefix(f"{where}: "))]) from None
    result = trace_from_history(histories, speeds)
    warnings = list(result.warnings)
    if speeds is None:
        warnings.append("no curves or profiles: every duration at the reference allocation is the job's run time")
    if result.trace.empty:
        raise EmptyHistory([Problem(ALLOCATOR + where, "the allocator's job history has no done job on whole GPUs"
                                     + (f" ({'; '.join(warnings)})" if warnings else ""))])
    return Sourced(result.trace, ALLOCATOR + where, warnings)


def _get(url: str) -> bytes:
    import httpx

    try:
        response = httpx.get(url, timeout=TIMEOUT_S, follow_redirects=True)
    except httpx.HTTPError as exc:
        raise ContractError([Problem(url, f"cannot fetch it: {exc}")]) from None
    if response.status_code != 200:
        raise ContractError([Problem(url, f"HTTP {response.status_code}: {response.text[:200]}")])
    return response.content


def _get_json(url: str) -> dict:
    import json

    try:
        return json.loads(_get(url))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past the parser's depth
        raise ContractError([Problem(url, "not a JSON answer: is this the hetplan allocator's URL?")]) from None


def _download(url: str) -> pd.DataFrame:
    """A trace file at `url`, validated; problems name the URL and its rows."""
    data = _get(url)
    suffix = ".parquet" if url.split("?", 1)[0].endswith(".parquet") else ".csv"
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / f"trace{suffix}"
        local.write_bytes(data)
        try:
            return TRACE.load(local)
        except ContractError as exc:
            raise ContractError([Problem(url, p.message, p.row, p.column) for p in exc.problems]) from None
