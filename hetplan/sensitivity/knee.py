"""Knees of a throughput surface on a (cores, RAM) grid: where more of a resource stops paying."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

DEFAULT_KNEE_FRACTION = 0.95
COLLAPSE_FRACTION = 0.5
# Measurement noise widens the band under the plateau that counts as reached: by NOISE_BANDS times the
# fit's relative noise, but never to below MIN_EFFECTIVE_FRACTION of the plateau. Clean data: no band.
NOISE_BANDS = 2.0
MIN_EFFECTIVE_FRACTION = 0.85


@dataclass(frozen=True)
class Knee:
    """The knee of one (model, GPU type) surface."""

    plateau: float
    cpus: float  # smallest allocation reaching `fraction` of the plateau: fewest cores, then least RAM
    mem_gb: float
    collapse_mem_gb: float  # the least RAM whose best throughput is at least half the plateau
    cpus_at_mem: dict[float, float]  # per RAM level: fewest cores reaching `fraction` of that level's best


def find_knee(surface: pd.DataFrame, fraction: float = DEFAULT_KNEE_FRACTION, noise: float = 0.0) -> Knee:
    """Knee of a surface given as rows of `cpus_per_gpu`, `mem_gb_per_gpu`, `throughput`.

    `noise` is the relative scale of the measurement noise behind the surface (0 for exact data): a point
    within that noise of `fraction` of the plateau counts as reaching it, so noise cannot push the knee
    to the far end of a flat curve.
    """
    fraction = max(min(fraction, fraction - NOISE_BANDS * noise), min(fraction, MIN_EFFECTIVE_FRACTION))
    grid = surface.pivot_table(index="mem_gb_per_gpu", columns="cpus_per_gpu", values="throughput", aggfunc="max")
    grid = grid.sort_index().sort_index(axis=1)
    values = grid.to_numpy()
    plateau = float(np.nanmax(values))
    cores = grid.columns.to_numpy(dtype=float)
    mems = grid.index.to_numpy(dtype=float)

    reach = values >= fraction * plateau
    best_cpus, best_mem = np.inf, np.inf
    for i, mem in enumerate(mems):
        hits = np.flatnonzero(reach[i])
        if len(hits) and (cores[hits[0]], mem) < (best_cpus, best_mem):
            best_cpus, best_mem = cores[hits[0]], mem

    cpus_at_mem = {}
    for i, mem in enumerate(mems):
        level_best = np.nanmax(values[i])
        cpus_at_mem[float(mem)] = float(cores[np.flatnonzero(values[i] >= fraction * level_best)[0]])

    healthy = np.flatnonzero(np.nanmax(values, axis=1) >= COLLAPSE_FRACTION * plateau)
    collapse = float(mems[healthy[0]]) if len(healthy) else float(mems[-1])
    return Knee(plateau, float(best_cpus), float(best_mem), collapse, cpus_at_mem)
