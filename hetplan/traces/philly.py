"""Philly-derived job summaries: a CSV with header `timestamp,duration,num_gpus[,...]` (extra columns ignored).

`timestamp` is either seconds (numbers) or date-times (ISO 8601 or `YYYY-MM-DD HH:MM:SS`, read as UTC);
`arrival_s` counts from the earliest timestamp in the file, `duration` is in seconds. The job id comes from a
`job_id` (or `jobid`) column if there is one, else the row's 0-based index among the data rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hetplan.contracts.table import ContractError, RowLabels
from hetplan.traces._parse import collect_problems, model_option, numbers, read_headed, text
from hetplan.traces.report import TraceImport, Tally

REQUIRED = ("timestamp", "duration", "num_gpus")
ID_COLUMNS = ("job_id", "jobid")
REASONS = ("rejected_zero_duration", "rejected_no_gpus")


def import_philly(path: str | Path, model: str = "unknown") -> TraceImport:
    """Import a Philly summary CSV; every job gets the model name `model`."""
    model = model_option(model)
    raw, labels = read_headed(path, REQUIRED)
    with collect_problems() as problems:
        num = problems.run(numbers, raw, labels, ("duration", "num_gpus"), whole=("num_gpus",))
        seconds = problems.run(timestamps_as_seconds, raw["timestamp"], labels)
    tally = Tally(labels.file, len(raw), REASONS)

    zero = num["duration"] <= 0
    tally.note("rejected_zero_duration", int(zero.sum()), "with a duration of zero or less")
    no_gpus = ~zero & (num["num_gpus"] <= 0)
    tally.note("rejected_no_gpus", int(no_gpus.sum()), "asking for no GPU")
    keep = (~zero & ~no_gpus).to_numpy()

    id_column = next((c for c in ID_COLUMNS if c in raw.columns), None)
    job_id = text(raw[id_column]) if id_column else pd.Series(np.arange(len(raw)).astype(str), dtype=object)
    trace = pd.DataFrame({
        "job_id": job_id,
        "model": model,
        "num_gpus": num["num_gpus"],
        "arrival_s": seconds - seconds.min(),
        "duration_s": num["duration"],
    })[keep]
    return tally.finish(trace, [labels.rows[i] for i in np.flatnonzero(keep)])


def timestamps_as_seconds(column: pd.Series, labels: RowLabels) -> pd.Series:
    """Seconds from numbers, or from date-times (UTC) if any cell is not a number; bad cells raise."""
    try:
        return numbers(pd.DataFrame({"timestamp": column}), labels, ("timestamp",))["timestamp"]
    except ContractError as numeric_error:
        cells = text(column)
        moments = pd.to_datetime(cells.where(cells != ""), format="ISO8601", utc=True, errors="coerce")
        if moments.isna().all():
            raise numeric_error from None
        bad = np.flatnonzero(moments.isna().to_numpy())
        if len(bad):
            raise ContractError([
                labels.problem(int(pos), "timestamp", "missing value" if cells.iloc[pos] == "" else
                               f"neither seconds nor a date-time like the other rows: {column.iloc[pos]!r}")
                for pos in bad
            ]) from None
        epoch = pd.Timestamp("1970-01-01", tz="UTC")
        return (moments - epoch).dt.total_seconds()
