"""What the planning tests share: three models on three GPU types, jobs of them (`jobs`), their curves fitted
from the derived profiles and the AWS + GCP catalog of those types (module-scoped fixtures: import them into a
test module)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hetplan.catalog import load_default_catalog
from hetplan.reference import build_reference
from hetplan.sensitivity import fit_profiles

MODELS = ["res18", "transformer", "alexnet"]
GPU_TYPES = ["V100", "T4", "A100"]


def jobs(n: int = 40, models=MODELS, gap_s=900.0, seed=0) -> pd.DataFrame:
    """`n` jobs of `models` in turn, one every `gap_s` seconds, of 1, 2 or 4 GPUs, log-normal durations around
    an hour (seeded)."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"job_id": [f"j{i}" for i in range(n)], "model": [models[i % len(models)] for i in range(n)],
                         "num_gpus": rng.choice([1, 1, 2, 4], size=n), "arrival_s": np.arange(n) * gap_s,
                         "duration_s": rng.lognormal(np.log(3600), 1.0, size=n)})


@pytest.fixture(scope="module")
def curves():
    derived = build_reference().derived
    return fit_profiles(derived[derived["model"].isin(MODELS) & derived["gpu_type"].isin(GPU_TYPES)]).curves


@pytest.fixture(scope="module")
def catalog():
    shapes = load_default_catalog()
    return shapes[shapes["cloud"].isin(["aws", "gcp"]) & shapes["gpu_type"].isin(GPU_TYPES)].reset_index(drop=True)
