"""Gavel traces (stanford-futuredata/gavel `scheduler/traces`): tab-separated, no header, one job per line.

Two layouts, told apart by the field count (one per file): the older 7-field one and the current 10-field one.
A job's duration is its total steps over the V100 steps/s of its exact job type at its scale factor (GPUs),
from the shipped Gavel isolated-throughput table; a scale factor absent from the table falls back to the
scale-1 rate. The job id is the job's 0-based index among the file's lines.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from hetplan.reference.speed import gavel_table
from hetplan.traces._parse import numbers, read_headerless, text
from hetplan.traces.report import TraceImport, Tally

LAYOUTS: dict[int, tuple[str, ...]] = {
    7: ("job_type", "command", "num_steps_arg", "needs_data_dir", "total_steps", "arrival_time", "scale_factor"),
    10: ("job_type", "command", "working_directory", "num_steps_arg", "needs_data_dir", "total_steps",
         "scale_factor", "priority_weight", "SLO", "arrival_time"),
}

# Gavel job family (the job type without its "(batch size N)" suffix) -> hetplan model name.
FAMILY_MODELS: dict[str, str] = {
    "ResNet-18": "res18",
    "ResNet-50": "res50",
    "Transformer": "transformer",
    "LM": "lm",
    "Recommendation": "recommendation",
    "A3C": "a3c",
    "CycleGAN": "cyclegan",
}
BATCH = re.compile(r"^(?P<family>.*?)\s*\(batch size (?P<batch>\d+)\)$")
REASONS = ("duration_from_scale1", "rejected_unknown_job_type", "rejected_zero_duration", "rejected_no_gpus")


@lru_cache(maxsize=1)
def v100_rates() -> dict[tuple[str, int], float]:
    """V100 training steps/s per (Gavel job type, scale factor); only positive rates are kept."""
    table = gavel_table()
    table = table[table["v100"] > 0]
    return {(str(t), int(s)): float(r) for t, s, r in zip(table["job_type"], table["scale_factor"], table["v100"])}


def split_job_type(job_type: str) -> tuple[str | None, int | None]:
    """`"ResNet-18 (batch size 32)"` -> `("res18", 32)`; the model is None for an unmapped family."""
    match = BATCH.match(job_type)
    family, batch = (match["family"], int(match["batch"])) if match else (job_type, None)
    return FAMILY_MODELS.get(family.strip()), batch


def import_gavel(path: str | Path) -> TraceImport:
    """Import a Gavel trace file (7- or 10-field layout); see the module docstring."""
    raw, labels = read_headerless(path, "\t", LAYOUTS, "Gavel trace")
    num = numbers(raw, labels, ("total_steps", "arrival_time", "scale_factor"), whole=("total_steps", "scale_factor"))
    job_type = text(raw["job_type"])
    tally = Tally(labels.file, len(raw), REASONS)

    rates = v100_rates()
    parts = {t: split_job_type(t) for t in job_type.unique()}  # one regex per distinct job type
    model = job_type.map(lambda t: parts[t][0])
    batch = job_type.map(lambda t: parts[t][1]).astype("Int64")
    scale = num["scale_factor"].fillna(0).astype("int64")
    table = pd.Series(rates, dtype="float64")
    exact = pd.Series(table.reindex(pd.MultiIndex.from_arrays([job_type, scale])).to_numpy())
    scale1 = pd.Series(table.reindex(pd.MultiIndex.from_arrays([job_type, np.ones(len(raw), "int64")])).to_numpy())

    known = model.notna() & scale1.notna()
    unknown_types = sorted(set(job_type[~known]))
    tally.note("rejected_unknown_job_type", int((~known).sum()),
               f"of a job type without a Gavel model mapping or V100 rate ({', '.join(unknown_types)})")
    keep = known.copy()
    zero = keep & (num["total_steps"] <= 0)
    tally.note("rejected_zero_duration", int(zero.sum()), "with no steps to run")
    keep &= ~zero
    no_gpus = keep & (scale <= 0)
    tally.note("rejected_no_gpus", int(no_gpus.sum()), "with a scale factor below 1")
    keep &= ~no_gpus
    fallback = keep & exact.isna()
    tally.note("duration_from_scale1", int(fallback.sum()),
               "at a scale factor the Gavel table lacks, timed at the job type's 1-GPU V100 rate")

    rate = exact.where(exact.notna(), scale1)
    trace = pd.DataFrame({
        "job_id": [str(i) for i in range(len(raw))],
        "model": model,
        "num_gpus": scale,
        "arrival_s": num["arrival_time"],
        "duration_s": num["total_steps"] / rate,
        "job_type": job_type,
        "batch_size": batch,
        "total_steps": num["total_steps"].astype("Int64"),
    })[keep.to_numpy()]
    return tally.finish(trace, [labels.rows[i] for i in np.flatnonzero(keep.to_numpy())])
