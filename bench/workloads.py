"""Out-of-sample workload pairs for the benches: (plan on this, replay that), grouped by the trace they come from.

- `gavel_halves(file)`: a shipped Philly-derived Gavel trace split by arrival, first half / second half (the
  out-of-sample grid of bench/evaluate.py, which reads it);
- `gavel_window(file)`: the same trace's second quarter / third quarter (another window of it);
- `sia_pair(kind, plan, replay)`: two of Sia's public workloads (bench/data/sia), one planned on, the other
  replayed: the same generator, other jobs. **Derived**: Sia's files carry arrivals, models and GPU counts but no
  durations, so each job gets a duration drawn (seeded) from the Gavel traces' jobs; models map onto the
  project's truth models where one is the same network (bench/data/sia/PROVENANCE.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hetplan.resources import upstream_path
from hetplan.traces import import_trace

GAVEL = ("gavel_philly_0e4a51.trace", "gavel_philly_2869ce.trace")
SIA = Path(__file__).parent / "data" / "sia" / "workloads"
SIA_MODELS = {"bert": "transformer", "cifar10": "res18", "deepspeech2": "deepspeech", "imagenet": "res50"}
"""Sia's models that are a network the project's truth has; the others (yolov3, ncf) keep their names."""


@dataclass(frozen=True)
class Pair:
    """A workload to plan on and one to replay, the trace group they come from, and a short label."""

    group: str
    label: str
    plan: pd.DataFrame
    replay: pd.DataFrame


def gavel(file: str) -> pd.DataFrame:
    return import_trace(upstream_path("traces", file), "gavel").trace.sort_values("arrival_s", kind="stable")


def short(file: str) -> str:
    return file.split("_")[-1].split(".")[0]


def gavel_halves(file: str) -> Pair:
    trace = gavel(file).reset_index(drop=True)
    cut = len(trace) // 2
    return Pair(short(file), f"{short(file)} halves", trace.iloc[:cut].reset_index(drop=True),
                trace.iloc[cut:].reset_index(drop=True))


def gavel_window(file: str) -> Pair:
    """The trace's second quarter to plan on, its third quarter to replay (arrivals from 0 in each)."""
    trace = gavel(file).reset_index(drop=True)
    n = len(trace)
    return Pair(short(file), f"{short(file)} quarters 2/3", _from_zero(trace.iloc[n // 4: n // 2]),
                _from_zero(trace.iloc[n // 2: 3 * n // 4]))


def sia_pair(kind: str, plan: int, replay: int, seed: int = 0) -> Pair:
    """Sia's `kind` (philly, newtrace) workload `plan` to plan on and `replay` to replay, as derived traces."""
    return Pair(f"sia-{kind}", f"sia {kind} {plan}->{replay}", sia_trace(kind, plan, seed),
                sia_trace(kind, replay, seed + 1))


def sia_halves(kind: str, number: int, seed: int = 0) -> Pair:
    """One of Sia's workloads split by arrival: first half to plan on, second to replay."""
    trace = sia_trace(kind, number, seed)
    cut = len(trace) // 2
    return Pair(f"sia-{kind}", f"sia {kind} {number} halves", trace.iloc[:cut].reset_index(drop=True),
                _from_zero(trace.iloc[cut:]))


def sia_trace(kind: str, number: int, seed: int = 0) -> pd.DataFrame:
    """Sia's workload file as a hetplan trace: its names, arrivals, models (mapped) and GPU counts, each job's
    duration drawn with `seed` from the Gavel traces' jobs (derived: the file has no durations)."""
    raw = pd.read_csv(SIA / kind / f"workload-{number}.csv")
    pool = pd.concat([gavel(f) for f in GAVEL], ignore_index=True)["duration_s"].to_numpy(float)
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "job_id": raw["name"].astype(str), "model": raw["application"].map(lambda m: SIA_MODELS.get(m, m)),
        "num_gpus": raw["num_replicas"].astype(int), "arrival_s": raw["time"].astype(float),
        "duration_s": rng.choice(pool, size=len(raw)),
    }).sort_values("arrival_s", kind="stable").reset_index(drop=True)


def _from_zero(jobs: pd.DataFrame) -> pd.DataFrame:
    first = float(jobs["arrival_s"].min())
    return jobs.assign(arrival_s=jobs["arrival_s"] - first).reset_index(drop=True)


def calibration_pairs() -> list[Pair]:
    """The pairs beyond the main grid's halves that calibrate and check the prediction intervals."""
    return [gavel_window(GAVEL[0]), gavel_window(GAVEL[1]), sia_pair("philly", 2, 3), sia_pair("philly", 4, 5),
            sia_halves("newtrace", 2)]
