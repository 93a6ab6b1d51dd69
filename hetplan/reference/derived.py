"""A *derived* multi-GPU-type sensitivity set, under one stated model, until real profiles exist.

The model (every row it produces says `source=derived:...`):

1. A training step needs its input batch (decoded and augmented on the CPU, staged through host RAM) and
   its GPU compute; throughput is the lesser of the input pipeline's rate P(cores, RAM) and the GPU's
   compute rate G.
2. P depends on the host's cores and RAM, not on the GPU. Where the published V100 table is below its
   plateau, the pipeline is the bottleneck and P equals the measured value. Where the V100 is saturated,
   P is only known to be at least G_V100; hetplan extends it linearly in cores (data loading parallelises
   over workers) from the last pipeline-bound point at the same RAM level, or from the fewest cores when
   no point at that RAM level is pipeline-bound: P(c) = max(G_V100, P(c_a) * c / c_a).
3. G on GPU type g = speed_vs_v100(model, g) x G_V100, with the ratios of `hetplan.reference.speed`.

With speed 1 this reproduces the published V100 table exactly (a test checks it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from hetplan.contracts import PROFILES

SATURATION_TOLERANCE = 1e-9


def pipeline_rate(points: pd.DataFrame) -> pd.Series:
    """Input-pipeline rate P for one model's published grid (`cpus_per_gpu`, `mem_gb_per_gpu`, `throughput`)."""
    gpu_rate = points["throughput"].max()
    rate = points["throughput"].astype(float).copy()
    for _, level in points.groupby("mem_gb_per_gpu"):
        level = level.sort_values("cpus_per_gpu")
        saturated = level["throughput"] >= gpu_rate * (1 - SATURATION_TOLERANCE)
        if not saturated.any():
            continue
        first_saturated = level.loc[saturated, "cpus_per_gpu"].min()
        bound = level[~saturated & (level["cpus_per_gpu"] < first_saturated)]
        anchor = bound.iloc[-1] if len(bound) else level.iloc[0]
        per_core = anchor["throughput"] / anchor["cpus_per_gpu"]
        sat_index = level.index[saturated]
        rate.loc[sat_index] = np.maximum(gpu_rate, per_core * level.loc[sat_index, "cpus_per_gpu"])
    return rate


def derive_profiles(published: pd.DataFrame, ratios: pd.DataFrame) -> pd.DataFrame:
    """Profile records for every (model, GPU type) in `ratios`, derived from the published V100 grid."""
    frames = []
    for model, points in published.groupby("model", sort=True):
        points = points.reset_index(drop=True)
        pipeline = pipeline_rate(points)
        gpu_rate_v100 = points["throughput"].max()
        for ratio in ratios[ratios["model"] == model].itertuples(index=False):
            derived = points[["model", "num_gpus", "cpus_per_gpu", "mem_gb_per_gpu", "throughput_unit",
                              "batch_size"]].copy()
            derived["gpu_type"] = ratio.gpu_type
            derived["throughput"] = np.minimum(pipeline, ratio.speed_vs_v100 * gpu_rate_v100)
            derived["source"] = f"derived:synergy-v100-pipeline+{ratio.ratio_source}-speed"
            derived["speed_vs_v100"] = ratio.speed_vs_v100
            frames.append(derived)
    result = pd.concat(frames, ignore_index=True)
    result = result.sort_values(["model", "gpu_type", "cpus_per_gpu", "mem_gb_per_gpu"], ignore_index=True)
    return PROFILES.validate(result, "<derived profiles>")


def capped_pipeline(surface: pd.DataFrame, speed: float) -> pd.Series:
    """Throughput on a GPU `speed` times as fast as the one `surface` was measured on: the same input
    pipeline (it runs on the host), the compute rate scaled (the derived model above)."""
    surface = surface.reset_index(drop=True)
    return np.minimum(pipeline_rate(surface), speed * float(surface["throughput"].max()))
