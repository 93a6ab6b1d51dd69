"""Alibaba GPU pod lists (cluster-trace-gpu-v2023 `openb_pod_list_*.csv`).

Header `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,
scheduled_time` (times in seconds). Only `name`, `num_gpu`, `creation_time` and `deletion_time` are required.
A pod runs from `scheduled_time` (when present and > 0, else `creation_time`) to `deletion_time`; `arrival_s`
counts from the earliest `creation_time` in the file. `gpu_spec`, `cpu_milli`, `memory_mib` and `gpu_milli`
are kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hetplan.contracts.table import ContractError
from hetplan.traces._parse import model_option, numbers, read_headed, text
from hetplan.traces.report import TraceImport, Tally

REQUIRED = ("name", "num_gpu", "creation_time", "deletion_time")
OPTIONAL_NUMBERS = ("cpu_milli", "memory_mib", "gpu_milli", "scheduled_time")
REASONS = ("skipped_cpu_only", "rounded_fractional_gpu", "rejected_still_running", "rejected_zero_duration")


def import_alibaba(path: str | Path, model: str = "unknown") -> TraceImport:
    """Import an Alibaba pod list; GPU pods become jobs named `model`, CPU-only pods are skipped."""
    model = model_option(model)
    raw, labels = read_headed(path, REQUIRED)
    optional = [c for c in OPTIONAL_NUMBERS if c in raw.columns]
    num = numbers(raw, labels, ("num_gpu", "creation_time", "deletion_time", *optional),
                  whole=("num_gpu",), blank_ok=("deletion_time", *optional))
    negative = np.flatnonzero((num["num_gpu"] < 0).to_numpy())
    if len(negative):
        raise ContractError([labels.problem(int(i), "num_gpu", "must be at least 0") for i in negative])
    nan = pd.Series(np.nan, index=raw.index, dtype="float64")
    tally = Tally(labels.file, len(raw), REASONS)

    cpu_only = num["num_gpu"] <= 0
    tally.note("skipped_cpu_only", int(cpu_only.sum()), "without GPUs (CPU-only pods)")
    running = ~cpu_only & num["deletion_time"].isna()
    tally.note("rejected_still_running", int(running.sum()), "without a deletion_time (still running)")
    scheduled = num.get("scheduled_time", nan)
    start = scheduled.where(scheduled > 0, num["creation_time"])
    duration = num["deletion_time"] - start
    zero = ~cpu_only & ~running & (duration <= 0)
    tally.note("rejected_zero_duration", int(zero.sum()), "with deletion_time <= start time")
    keep = ~cpu_only & ~running & ~zero
    gpu_milli = num.get("gpu_milli", nan)
    fractional = keep & (num["num_gpu"] == 1) & (gpu_milli < 1000)
    tally.note("rounded_fractional_gpu", int(fractional.sum()), "sharing a fraction of one GPU, rounded up to 1 GPU")

    trace = pd.DataFrame({
        "job_id": text(raw["name"]),
        "model": model,
        "num_gpus": num["num_gpu"].astype("Int64"),
        "arrival_s": num["creation_time"] - num["creation_time"].min(),
        "duration_s": duration,
        "gpu_spec": text(raw["gpu_spec"]) if "gpu_spec" in raw.columns else "",
        "gpu_milli": gpu_milli,
        "cpu_milli": num.get("cpu_milli", nan),
        "memory_mib": num.get("memory_mib", nan),
    })[keep.to_numpy()]
    return tally.finish(trace, [labels.rows[i] for i in np.flatnonzero(keep.to_numpy())])
