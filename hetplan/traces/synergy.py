"""Synergy traces (msr-fiddle/synergy `deploy_trace` files).

No header; comma-separated `job_id, model, arrival_time (hours), num_iters, gpu_demand`. A job's duration is
its iteration count times the model's seconds per iteration at the GPU-proportional CPU/memory share, from
the shipped Synergy V100 table (see `hetplan/data/upstream/PROVENANCE.md`).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hetplan.reference.synergy import iteration_seconds_at_fair_share
from hetplan.traces._parse import numbers, read_headerless, text
from hetplan.traces.report import TraceImport, Tally

COLUMNS = ("job_id", "model", "arrival_h", "num_iters", "gpu_demand")

# Models that Synergy traces use but its throughput table never profiled. The job keeps its own model name;
# only its iteration time is borrowed from a similar profiled model: small image CNNs from ResNet-18, the LSTM
# language model from GNMT (the profiled recurrent model).
PROXY_MODELS: dict[str, str] = {
    "mobilenet": "res18",
    "shufflenet": "res18",
    "lstm": "gnmt",
}

REASONS = ("mapped_model_proxy", "rejected_unknown_model", "rejected_zero_duration", "rejected_no_gpus")


def import_synergy(path: str | Path) -> TraceImport:
    """Import a Synergy trace file; see the module docstring for the format."""
    raw, labels = read_headerless(path, ",", {len(COLUMNS): COLUMNS}, "Synergy trace")
    num = numbers(raw, labels, ("arrival_h", "num_iters", "gpu_demand"), whole=("num_iters", "gpu_demand"))
    model = text(raw["model"])
    tally = Tally(labels.file, len(raw), REASONS)

    times = iteration_seconds_at_fair_share()
    basis = model.where(model.isin(list(times)), model.map(PROXY_MODELS))
    known = basis.notna()
    proxied = known & (basis != model)
    keep = known.copy()
    tally.note("rejected_unknown_model", int((~known).sum()),
               f"with a model absent from the Synergy table and from PROXY_MODELS "
               f"({', '.join(sorted(set(model[~known])))})")
    zero = keep & (num["num_iters"] <= 0)
    tally.note("rejected_zero_duration", int(zero.sum()), "with no iterations to run")
    keep &= ~zero
    no_gpus = keep & (num["gpu_demand"] <= 0)
    tally.note("rejected_no_gpus", int(no_gpus.sum()), "asking for no GPU")
    keep &= ~no_gpus
    used = proxied & keep
    pairs = ", ".join(f"{m}->{PROXY_MODELS[m]}" for m in sorted(set(model[used])))
    tally.note("mapped_model_proxy", int(used.sum()), f"timed with a proxy model's iteration time ({pairs})")

    trace = pd.DataFrame({
        "job_id": text(raw["job_id"]),
        "model": model,
        "num_gpus": num["gpu_demand"].astype("Int64"),
        "arrival_s": num["arrival_h"] * 3600.0,
        "duration_s": num["num_iters"] * basis.map(times).astype("float64"),
        "num_iters": num["num_iters"].astype("Int64"),
    })[keep.to_numpy()]
    return tally.finish(trace, [labels.rows[i] for i in keep.to_numpy().nonzero()[0]])
