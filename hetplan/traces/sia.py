"""Sia's job workloads (siasosp23/artifacts `sia-simulator/workloads/`): a CSV `name,time,application,num_replicas,
batch_size` = job name, arrival second, model, the GPUs the job starts with, global batch size.

Every job becomes elastic from 1 up to `max_gpus` (the cluster's largest GPU type; default 24, the largest type of
Sia's paper cluster), starting on `num_gpus` = num_replicas, with a fixed global batch and the model's restart cost
(`hetplan.contracts.trace.RESTART_S`). Sia's files carry no durations; as in Sia's setting a job trains its model a
fixed number of epochs (`EPOCHS`), so its duration is **derived** (column `duration_source`):

    duration_s = epochs x samples per epoch / (num_replicas x V100 samples/s per GPU at the job's per-GPU batch)

The per-GPU rate is a V100's measured 1-GPU rate (Sia's step times, shipped under `hetplan/data/upstream/
reference/`), its step time interpolated linearly at batch_size / num_replicas and clipped to the measured batches
(counted as `per_gpu_batch_clipped`). Scaling is taken as linear (no all-reduce): the duration is one of hetplan's
reference allocation, num_gpus GPUs each worth one V100. Models with hetplan curves are renamed (`MODELS`); yolov3
and ncf keep Sia's names (`kept_opaque_model`); an application without an epoch count is rejected.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from hetplan.contracts.table import ContractError, RowLabels
from hetplan.contracts.trace import RESTART_S
from hetplan.resources import upstream_path
from hetplan.traces._parse import numbers, read_headed, text
from hetplan.traces.report import TraceImport, Tally

REQUIRED = ("name", "time", "application", "num_replicas", "batch_size")
EPOCHS: dict[str, int] = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
"""Epochs each model trains for in Sia's setting (the artifact's code)."""
SAMPLES_PER_EPOCH: dict[str, int] = {
    "bert": 88_644, "cifar10": 50_048, "deepspeech2": 7_140, "imagenet": 1_281_200, "ncf": 4_971_008,
    "yolov3": 16_552,
}
"""Samples per epoch: the artifact's validation tables' progress after one epoch times their initial batch (e.g.
cifar10 391 steps x 128); SQuAD, CIFAR-10, ImageNet-1k and PASCAL VOC sizes up to the last partial batch."""
MODELS: dict[str, str] = {"bert": "transformer", "cifar10": "res18", "deepspeech2": "deepspeech", "imagenet": "res50"}
"""Sia's models that are a network hetplan has curves for (cifar10 = ResNet-18, imagenet = ResNet-50, bert and
deepspeech2 the nearest Transformer and recurrent speech model); the others keep Sia's names."""
SIA_CLUSTER_MAX_GPUS = 24
"""The largest GPU type of Sia's paper cluster (24 T4, 24 RTX 2080 Ti, 16 A100): the default elastic bound."""
STEP_TABLES = ("sia_1gpu_step_times.csv", "sia_v100_1gpu_step_times_ncf_yolov3.csv")
DURATION_SOURCE = "derived:sia-epochs@v100-1gpu"
REASONS = ("rejected_unknown_model", "kept_opaque_model", "per_gpu_batch_clipped")


@lru_cache(maxsize=1)
def v100_step_times() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per Sia model: the V100's measured per-GPU batches (ascending) and 1-GPU step times (s)."""
    table = pd.concat([pd.read_csv(upstream_path("reference", name)) for name in STEP_TABLES], ignore_index=True)
    table = table[table["gpu_type"] == "V100"].sort_values(["model", "local_bsz"])
    return {str(m): (g["local_bsz"].to_numpy(float), g["step_time_s"].to_numpy(float))
            for m, g in table.groupby("model")}


def per_gpu_rate(model: str, local_bsz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """V100 samples/s per GPU of `model` at each per-GPU batch, and where the batch lay outside the measured ones."""
    batches, steps = v100_step_times()[model]
    clipped = np.clip(local_bsz, batches[0], batches[-1])
    return clipped / np.interp(clipped, batches, steps), clipped != local_bsz


def import_sia(path: str | Path, max_gpus: int | None = None) -> TraceImport:
    """Import one of Sia's workload files; every job elastic from 1 to `max_gpus` (see the module docstring)."""
    bound = SIA_CLUSTER_MAX_GPUS if max_gpus is None else max_gpus
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
        raise ValueError(f"max_gpus must be a whole number of GPUs from 1, got {max_gpus!r}")
    raw, labels = read_headed(path, REQUIRED)
    num = numbers(raw, labels, ("time", "num_replicas", "batch_size"), whole=("num_replicas", "batch_size"))
    name, application = text(raw["name"]), text(raw["application"]).str.casefold()
    _check_rows(name, application, num, bound, labels, "the default, Sia's cluster's largest GPU type"
                if max_gpus is None else "the cluster's largest GPU type or --max-gpus")
    tally = Tally(labels.file, len(raw), REASONS)

    known = application.isin(list(EPOCHS)).to_numpy()
    tally.note("rejected_unknown_model", int((~known).sum()), "of an application Sia gives no epoch count for "
               f"({', '.join(sorted(set(application[~known])))}): no duration can be derived")
    opaque = known & ~application.isin(list(MODELS)).to_numpy()
    tally.note("kept_opaque_model", int(opaque.sum()), "of models hetplan has no curves for "
               f"({', '.join(sorted(set(application[opaque])))}): imported under Sia's names")
    gpus, batch = num["num_replicas"].to_numpy(float), num["batch_size"].to_numpy(float)
    rate, clipped = np.full(len(raw), np.nan), np.zeros(len(raw), bool)
    for model in set(application[known]):
        rows = (application == model).to_numpy()
        rate[rows], clipped[rows] = per_gpu_rate(model, batch[rows] / gpus[rows])
    tally.note("per_gpu_batch_clipped", int(clipped.sum()), "with a per-GPU batch outside the V100's measured "
               "ones, timed at the nearest measured batch")
    samples = application.map(lambda m: EPOCHS.get(m, 0) * SAMPLES_PER_EPOCH.get(m, 0)).to_numpy(float)
    trace = pd.DataFrame({
        "job_id": name,
        "model": application.map(lambda m: MODELS.get(m, m)),
        "num_gpus": num["num_replicas"],
        "arrival_s": num["time"],
        "duration_s": samples / (gpus * rate),
        "min_gpus": 1,
        "max_gpus": bound,
        "adapt_batch": 0,
        "restart_s": application.map(RESTART_S),
        "application": application,
        "batch_size": num["batch_size"].astype("Int64"),
        "epochs": application.map(EPOCHS).astype("Int64"),
        "duration_source": DURATION_SOURCE,
    })[known]
    tally.warnings.append(f"{labels.file}: durations are derived ({DURATION_SOURCE}): epochs x samples per epoch / "
                          "(GPUs x a V100's 1-GPU samples/s at the job's per-GPU batch); every job elastic from 1 "
                          f"to {bound} GPUs" + (" (Sia's cluster's largest GPU type: give --max-gpus or --nodes "
                                                "for yours)" if max_gpus is None else ""))
    return tally.finish(trace, [labels.rows[i] for i in np.flatnonzero(known)])


def _check_rows(name: pd.Series, application: pd.Series, num: dict[str, pd.Series], bound: int, labels: RowLabels,
                why: str) -> None:
    """One problem per bad cell, by Sia's field names; nothing is imported if any."""
    checks = [
        ("name", name == "", lambda pos: "missing value"),
        ("name", name.duplicated() & (name != ""), lambda pos: f"duplicate job name {name.iloc[pos]!r}"),
        ("application", application == "", lambda pos: "missing value"),
        ("time", num["time"] < 0, lambda pos: f"must be at least 0, got {num['time'].iloc[pos]:g}"),
        ("num_replicas", num["num_replicas"] < 1,
         lambda pos: f"must be at least 1, got {num['num_replicas'].iloc[pos]:g}"),
        ("num_replicas", num["num_replicas"] > bound,
         lambda pos: f"{num['num_replicas'].iloc[pos]:g} is above max_gpus {bound} ({why})"),
        ("batch_size", num["batch_size"] < 1, lambda pos: f"must be at least 1, got {num['batch_size'].iloc[pos]:g}"),
    ]
    problems = [labels.problem(int(pos), column, message(int(pos)))
                for column, bad, message in checks for pos in np.flatnonzero(bad.to_numpy(dtype=bool))]
    if problems:
        raise ContractError(sorted(problems, key=lambda p: (p.row or 0)))
