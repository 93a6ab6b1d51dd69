"""Curves for GPU types with too few points: the model's input-pipeline curve capped by this GPU's rate.

The same assumption as the derived reference set (`hetplan.reference.derived`): the input pipeline depends
on cores and RAM, not on the GPU, so the pipeline curve measured on one GPU type (the *anchor*, the model's
best-covered fitted type) carries over; only the GPU's compute rate changes, by the ratio of the two GPU
types' speeds (`hetplan.reference.speed`). Points measured on the target GPU, if any, raise the cap where
they show it higher and give the curve's uncertainty; without any, the uncertainty is the documented band
of the speed ratio's kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from hetplan.reference.derived import capped_pipeline
from hetplan.reference.speed import speed_ratios
from hetplan.sensitivity.estimators import FEATURES, MonotoneGridRegressor
from hetplan.sensitivity.fitting import SkipPair

# Relative error bands assumed for a transferred curve with no point of its own, by kind of speed ratio
# (a judgement, stated here so that it shows wherever the number is used): Gavel's measured ratios are
# per model; datasheet ratios ignore how well a model uses tensor cores.
RATIO_UNCERTAINTY = {"identity": 0.05, "gavel": 0.15, "spec": 0.30}


@dataclass(frozen=True)
class Transfer:
    """A transferred curve on the planning grid and how far to trust it."""

    model: str
    gpu_type: str
    anchor_gpu: str
    surface: pd.DataFrame  # cpus_per_gpu, mem_gb_per_gpu, throughput
    uncertainty: float
    n_points: int
    note: str


@lru_cache(maxsize=64)
def _ratios(model: str) -> dict[str, tuple[float, str]]:
    table = speed_ratios([model])
    return {row.gpu_type: (row.speed_vs_v100, row.ratio_source) for row in table.itertuples(index=False)}


def transfer_curve(model: str, gpu_type: str, anchor_gpu: str, anchor_surface: pd.DataFrame,
                   points: pd.DataFrame | None = None) -> Transfer:
    """Transfer the anchor's pipeline curve to `gpu_type`; raise `SkipPair` if no cap can be set."""
    ratios = _ratios(model)
    observed = points["throughput"].to_numpy(dtype=float) if points is not None and len(points) else np.array([])
    anchor_rate = float(anchor_surface["throughput"].max())
    if gpu_type in ratios and anchor_gpu in ratios:
        speed, kind = ratios[gpu_type][0] / ratios[anchor_gpu][0], ratios[gpu_type][1]
        cap = speed * anchor_rate
        note = f"pipeline of {anchor_gpu} capped at {speed:.2f}x its GPU rate ({kind} speed ratio)"
    elif len(observed):
        cap, kind = float(observed.max()), "observed"
        note = f"pipeline of {anchor_gpu} capped at the best throughput measured on {gpu_type} (no speed ratio)"
    else:
        raise SkipPair(f"no points and no known speed ratio for {gpu_type}: nothing to transfer from {anchor_gpu}")
    if len(observed) and observed.max() > cap:
        cap = float(observed.max())
        note += "; cap raised to the best measured point"
    surface = anchor_surface[list(FEATURES)].copy()
    surface["throughput"] = capped_pipeline(anchor_surface, cap / anchor_rate).to_numpy()
    if len(observed):
        grid = MonotoneGridRegressor().fit(surface[list(FEATURES)], surface["throughput"])
        predicted = grid.predict(points[list(FEATURES)].astype(float))
        uncertainty = float(np.mean(np.abs(predicted - observed) / observed))
        note += f"; uncertainty = MAPE against the {len(observed)} point(s) measured on {gpu_type}"
    else:
        uncertainty = RATIO_UNCERTAINTY.get(kind, RATIO_UNCERTAINTY["spec"])
        note += f"; uncertainty = the assumed band for {kind} ratios"
    return Transfer(model, gpu_type, anchor_gpu, surface, uncertainty, len(observed), note)
