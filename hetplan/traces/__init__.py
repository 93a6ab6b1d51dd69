"""Import public job traces into hetplan's TRACE contract (`job_id,model,num_gpus,arrival_s,duration_s`, and
for Sia's workloads the elastic columns `min_gpus,max_gpus,adapt_batch,restart_s`).

`import_trace(path, fmt, **options)` reads one file of a public format and returns a `TraceImport`: the
validated trace, counts per kind of handling (`read`, `imported`, `rejected_*`, `skipped_*`, ...) and one
warning per kind. No job is dropped silently; bad input raises `ContractError` naming file, line and column.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetplan.traces.alibaba import import_alibaba
from hetplan.traces.gavel import import_gavel
from hetplan.traces.philly import import_philly
from hetplan.traces.report import TraceImport
from hetplan.traces.sia import import_sia
from hetplan.traces.synergy import import_synergy

IMPORTERS: dict[str, Callable[..., TraceImport]] = {
    "synergy": import_synergy,
    "gavel": import_gavel,
    "philly": import_philly,
    "alibaba": import_alibaba,
    "sia": import_sia,
}
FORMATS: tuple[str, ...] = tuple(IMPORTERS)
MODEL_OPTION_FORMATS: tuple[str, ...] = ("philly", "alibaba")
"""Formats that carry no model name and take a `model=` option (default "unknown")."""
MAX_GPUS_OPTION_FORMATS: tuple[str, ...] = ("sia",)
"""Formats whose jobs are elastic up to a bound and take a `max_gpus=` option (the cluster's largest GPU type)."""


def import_trace(path: str | Path, fmt: str, **options: Any) -> TraceImport:
    """Import `path` in format `fmt` (one of FORMATS); `options` go to that format's importer (e.g. `model=`)."""
    try:
        importer = IMPORTERS[fmt]
    except KeyError:
        raise ValueError(f"unknown trace format {fmt!r}; one of {', '.join(FORMATS)}") from None
    return importer(path, **options)


__all__ = [
    "FORMATS", "IMPORTERS", "MAX_GPUS_OPTION_FORMATS", "MODEL_OPTION_FORMATS", "TraceImport",
    "import_alibaba", "import_gavel", "import_philly", "import_sia", "import_synergy", "import_trace",
]
