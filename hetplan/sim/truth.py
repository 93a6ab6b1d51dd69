"""Truth curves: how fast a job really trains under (GPU type, cores, RAM), kept apart from the fitted curves.

The planner and the hints see *fitted* curves; the simulator advances jobs by *truth* curves, built from
profile records (measured, published or derived), so a fitting error shows up in the results instead of
being assumed away. Per (model, GPU type) the points form a grid over cores and RAM per GPU:

- between grid points, throughput is interpolated bilinearly; above the grid it stays at the grid's edge;
- below the smallest grid value it falls linearly towards zero (stated assumption: a job given half the
  fewest cores ever measured gets half that throughput);
- a grid cell with no measurement takes the best throughput of the measured points it dominates (at most
  its cores and RAM), 0 if there is none (a job given such a share would never finish: `gaps` lists them and
  the simulator stops with an error naming the share if a policy ever grants one);
- where one cell has points from several sources, measured beats published beats derived (`sources()` names
  a grid by its best source and says `+derived` etc. when lesser sources fill some of its cells);
- a multi-GPU job runs at the 1-GPU per-GPU rate times its GPUs (stated assumption: linear scaling), so
  its speed relative to the reference allocation is the per-GPU ratio.

Progress is measured in *reference seconds*: a trace's `duration_s` is the job's run time on the reference
allocation (a V100 with the GPU-proportional share of Synergy's servers, 3 cores and 62.5 GiB per GPU), and a
job running at speed s completes s reference seconds per second.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hetplan.allocator.spec import MIB_PER_GIB
from hetplan.contracts.table import ContractError, Problem
from hetplan.gpus import REFERENCE


@dataclass(frozen=True)
class TruthGrid:
    """Per-GPU throughput of one (model, GPU type) on a full cores x RAM grid."""

    cpus: tuple[float, ...]
    mem_gb: tuple[float, ...]
    values: np.ndarray  # shape (len(cpus), len(mem_gb))
    source: str

    def at(self, cpus: float, mem_gb: float) -> float:
        """Bilinear interpolation inside the grid, clamped above, linear towards zero below."""
        scale = min(1.0, cpus / self.cpus[0]) * min(1.0, mem_gb / self.mem_gb[0])
        i, fi = _locate(self.cpus, cpus)
        j, fj = _locate(self.mem_gb, mem_gb)
        v = self.values
        i1, j1 = min(i + 1, len(self.cpus) - 1), min(j + 1, len(self.mem_gb) - 1)
        value = ((1 - fi) * (1 - fj) * v[i, j] + fi * (1 - fj) * v[i1, j]
                 + (1 - fi) * fj * v[i, j1] + fi * fj * v[i1, j1])
        return float(value) * scale


def _locate(axis: tuple[float, ...], x: float) -> tuple[int, float]:
    """Index of the grid cell holding x and the fraction across it (clamped to the axis)."""
    if x <= axis[0]:
        return 0, 0.0
    if x >= axis[-1]:
        return len(axis) - 1, 0.0
    k = bisect.bisect_right(axis, x) - 1
    return k, (x - axis[k]) / (axis[k + 1] - axis[k])


SOURCE_RANK = ("measured", "published", "derived")
FITTED_FALLBACK = "fitted-fallback"


def _best_source_points(points: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Per cell, only the points of its best source kind; and the grid's label (best source, + lesser kinds)."""
    if "source" not in points or points["source"].isna().all():
        return points, "profiles"
    kind = points["source"].fillna("derived:").str.split(":").str[0]
    rank = kind.map({k: i for i, k in enumerate(SOURCE_RANK)}).fillna(len(SOURCE_RANK))
    best = rank.groupby([points["cpus_per_gpu"], points["mem_gb_per_gpu"]]).transform("min")
    kept = points[rank == best]
    kinds = [k for k in SOURCE_RANK if (kind[rank == best] == k).any()]
    label = str(kept.loc[rank[rank == best].idxmin(), "source"])
    return kept, label + "".join(f"+{k}" for k in kinds[1:])


def _grid(points: pd.DataFrame, source: str) -> TruthGrid:
    cpus = tuple(sorted(points["cpus_per_gpu"].astype(float).unique()))
    mems = tuple(sorted(points["mem_gb_per_gpu"].astype(float).unique()))
    measured = points.groupby(["cpus_per_gpu", "mem_gb_per_gpu"])["throughput"].mean()
    values = np.zeros((len(cpus), len(mems)))
    for (c, m), t in measured.items():
        values[cpus.index(float(c)), mems.index(float(m))] = t
    present = values > 0
    for a in range(len(cpus)):
        for b in range(len(mems)):
            if not present[a, b]:  # best measured point this cell dominates
                below = values[: a + 1, : b + 1][present[: a + 1, : b + 1]]
                values[a, b] = below.max() if below.size else 0.0
    return TruthGrid(cpus, mems, values, source)


class TruthCurves:
    """Truth throughput per (model, GPU type), and each model's throughput on the reference allocation."""

    def __init__(self, grids: dict[tuple[str, str], TruthGrid], references: Mapping[str, float] | None = None) -> None:
        """`references` gives a model's reference throughput where no V100 grid can (the planner's view of a
        model profiled on other GPU types only); profiles-as-truth never need it."""
        self.grids = grids
        self.models = frozenset(m for m, _ in grids)
        self.gaps = [f"{m} on {g} at {grid.cpus[a]:g} cores, {grid.mem_gb[b]:g} GiB"
                     for (m, g), grid in sorted(grids.items()) for a, b in zip(*np.nonzero(grid.values <= 0))]
        """Grid cells with no throughput (nothing measured at or below them)."""
        self._reference: dict[str, float] = {}
        self._cache: dict[tuple[str, str, int, int, int], float] = {}
        missing = []
        for model in sorted(self.models):
            grid = grids.get((model, REFERENCE[0]))
            value = grid.at(REFERENCE[1], REFERENCE[2]) if grid else 0.0
            if value <= 0 and references:
                value = float(references.get(model, 0.0))
            if value <= 0:
                missing.append(model)
            self._reference[model] = value
        if missing:
            raise ContractError([Problem("<truth curves>", f"no {REFERENCE[0]} throughput at the reference "
                                         f"allocation ({REFERENCE[1]:g} cores, {REFERENCE[2]:g} GiB) for "
                                         f"{', '.join(missing)}: trace durations cannot be converted")])

    @classmethod
    def from_profiles(cls, profiles: pd.DataFrame, fallback: pd.DataFrame | None = None) -> TruthCurves:
        """From a validated profile table (1-GPU records, failed points ignored); `fallback` (a curve table)
        fills (model, GPU type) pairs the profiles lack, labelled `fitted-fallback` in `sources()`."""
        ok = profiles[profiles["throughput"].notna() & (profiles["throughput"] > 0)]
        if "status" in ok.columns:
            ok = ok[ok["status"].fillna("ok") != "failed"]
        single = ok[ok["num_gpus"] == 1]
        grids: dict[tuple[str, str], TruthGrid] = {}
        for (model, gpu), points in single.groupby(["model", "gpu_type"]):
            grids[(str(model), str(gpu))] = _grid(*_best_source_points(points))
        if not grids and fallback is None:
            raise ContractError([Problem("<truth curves>", "no 1-GPU profile with a throughput: no truth to simulate")])
        truth = cls(grids) if grids else None
        if fallback is not None:
            truth = truth.extended(fallback) if truth is not None else cls.from_curves(fallback)
        return truth

    @classmethod
    def from_curves(cls, curves: pd.DataFrame, references: Mapping[str, float] | None = None) -> TruthCurves:
        """A curve table taken as the truth (the planner's own view, e.g. to compare plans in simulation)."""
        return cls({(str(m), str(g)): _grid(points, FITTED_FALLBACK) for (m, g), points in
                    curves.groupby(["model", "gpu_type"])}, references)

    def extended(self, curves: pd.DataFrame) -> TruthCurves:
        """These curves plus, for (model, GPU type) pairs they lack, grids from a curve table (labelled
        `fitted-fallback`): e.g. the planner's defaults for unprofiled models and uncurved GPU types."""
        grids = dict(self.grids)
        for (model, gpu), points in curves.groupby(["model", "gpu_type"]):
            grids.setdefault((str(model), str(gpu)), _grid(points, FITTED_FALLBACK))
        return TruthCurves(grids, self._reference) if len(grids) > len(self.grids) else self

    def reference(self, model: str) -> float:
        """Per-GPU throughput of `model` on the reference allocation."""
        return self._reference[model]

    def speed(self, model: str, gpu_type: str, gpus: int, cpu_m: int, mem_mib: int) -> float:
        """Reference seconds per second for a job of `gpus` GPUs given `cpu_m` millicores and `mem_mib` MiB
        (profiles' `mem_gb_per_gpu` are GiB: 1024 MiB each)."""
        key = (model, gpu_type, gpus, cpu_m, mem_mib)
        value = self._cache.get(key)
        if value is None:
            grid = self.grids.get((model, gpu_type))
            if grid is None:
                raise KeyError(f"truth has no curve for {model} on {gpu_type}")
            value = grid.at(cpu_m / 1000 / gpus, mem_mib / MIB_PER_GIB / gpus) / self._reference[model]
            self._cache[key] = value
        return value

    def require(self, models: Iterable[str], gpu_types: Iterable[str]) -> None:
        """Raise `ContractError` naming the (model, GPU type) pairs among these that the truth has no curve for."""
        missing = sorted((m, g) for m in set(models) for g in set(gpu_types) if (m, g) not in self.grids)
        if missing:
            pairs = ", ".join(f"{m} on {g}" for m, g in missing)
            raise ContractError([Problem("<truth curves>", f"no truth curve for {pairs}: add profiles or fallbacks")])

    def sources(self) -> dict[str, int]:
        """How many (model, GPU type) curves come from each source (measured:, derived:, fitted-fallback...)."""
        out: dict[str, int] = {}
        for grid in self.grids.values():
            out[grid.source] = out.get(grid.source, 0) + 1
        return out
