"""Fit every (model, GPU type) of a profile table and assemble the curve table the planner reads."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from hetplan.contracts import CURVES
from hetplan.progress import Progress
from hetplan.sensitivity.estimators import FEATURES
from hetplan.sensitivity.fitting import PairFit, SkipPair, fit_pair, usable_points
from hetplan.sensitivity.knee import DEFAULT_KNEE_FRACTION, Knee, find_knee
from hetplan.sensitivity.transfer import Transfer, transfer_curve

logger = logging.getLogger(__name__)

PARALLEL_MIN_PAIRS = 24  # below this, starting worker processes costs more than it saves


@dataclass(frozen=True)
class Skipped:
    """A (model, GPU type) left without a curve, and why."""

    model: str
    gpu_type: str
    reason: str

    def __str__(self) -> str:
        return f"{self.model} on {self.gpu_type}: {self.reason}"


@dataclass
class FitReport:
    """What one fitting job produced: the curve table, the fits, the transfers and the skipped pairs."""

    curves: pd.DataFrame
    fits: list[PairFit] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    knees: dict[tuple[str, str], Knee] = field(default_factory=dict)


def planning_grid(points: pd.DataFrame) -> pd.DataFrame:
    """Every (cores, RAM) combination measured for a model on any GPU type: where its curves are evaluated."""
    cores = np.unique(points["cpus_per_gpu"].to_numpy(dtype=float))
    mems = np.unique(points["mem_gb_per_gpu"].to_numpy(dtype=float))
    mesh = np.array(np.meshgrid(cores, mems)).reshape(2, -1).T
    return pd.DataFrame(mesh, columns=list(FEATURES))


@dataclass(frozen=True)
class MeasuredRange:
    """The box of cores and RAM per GPU a pair's curve rests on: outside it a fit is extrapolation."""

    cpus_min: float
    cpus_max: float
    mem_gb_min: float
    mem_gb_max: float

    @classmethod
    def of(cls, points: pd.DataFrame) -> MeasuredRange:
        cpus, mem = points["cpus_per_gpu"].astype(float), points["mem_gb_per_gpu"].astype(float)
        return cls(float(cpus.min()), float(cpus.max()), float(mem.min()), float(mem.max()))

    def clip(self, grid: pd.DataFrame) -> pd.DataFrame:
        """The grid rows inside the box (a curve never speaks for an allocation nobody measured)."""
        c, m = grid["cpus_per_gpu"], grid["mem_gb_per_gpu"]
        inside = (c >= self.cpus_min) & (c <= self.cpus_max) & (m >= self.mem_gb_min) & (m <= self.mem_gb_max)
        return grid[inside].reset_index(drop=True)


def per_gpu(profiles: pd.DataFrame) -> pd.DataFrame:
    """Usable points with throughput per GPU (multi-GPU records divided by their GPU count)."""
    points = usable_points(profiles).copy()
    points["throughput"] = points["throughput"].astype(float) / points["num_gpus"].astype(float)
    return points


def fit_profiles(
    profiles: pd.DataFrame,
    gpu_types: Iterable[str] = (),
    knee_fraction: float = DEFAULT_KNEE_FRACTION,
    progress: Progress | None = None,
    workers: int | None = None,
) -> FitReport:
    """Fit each (model, GPU type) of a validated profile table; transfer curves to sparse or extra GPU types.

    `gpu_types` names GPU types that need a curve for every model even without points (e.g. the catalog's).
    Pairs that can neither be fitted nor transferred are reported in `skipped`; the rest are fitted.
    A curve covers only its measured range (a transferred curve, its anchor's): the model's grid points
    outside that box are left out, so neither the planner nor a knee ever rests on an extrapolation.
    Models are fitted in `workers` processes (default: the cores available) when there are enough pairs.
    `progress` hears of each pair with points as it is fitted (in processes: as its model finishes).
    """
    points = per_gpu(profiles)
    report = FitReport(curves=pd.DataFrame())
    rows: list[pd.DataFrame] = []
    groups = [(str(model), pts) for model, pts in points.groupby("model", sort=True)]
    pairs = sum(pts["gpu_type"].nunique() for _, pts in groups)
    jobs = max(1, min(fit_workers() if workers is None else workers, len(groups)))
    done = 0

    def fitted(model: str, gpu: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, pairs, f"{model} on {gpu}")

    if progress:
        progress(0, pairs, f"fitting {pairs} (model, GPU type) pairs")
    if jobs > 1 and pairs >= PARALLEL_MIN_PAIRS:
        from joblib import Parallel, delayed

        # Models are independent (a transfer only uses its own model's fits): one task per model, in processes,
        # taken as they finish (for progress) and put back in model order.
        finished = Parallel(n_jobs=jobs, return_as="generator_unordered")(
            delayed(_fit_model)(model, pts, tuple(gpu_types), knee_fraction) for model, pts in groups)
        by_model: dict[str, _ModelPart] = {}
        for part in finished:
            by_model[part.model] = part
            for gpu in part.gpu_types:
                fitted(part.model, gpu)
        parts: Iterable[_ModelPart] = (by_model[model] for model, _ in groups)
    else:
        parts = (_fit_model(model, pts, tuple(gpu_types), knee_fraction, fitted) for model, pts in groups)
    for part in parts:
        report.fits += part.fits
        report.transfers += part.transfers
        report.skipped += part.skipped
        report.knees.update(part.knees)
        rows += part.rows
    if rows:
        table = pd.concat(rows, ignore_index=True).sort_values(list(CURVES.key), ignore_index=True)
        report.curves = CURVES.validate(table, "<curve table>")
    return report


def fit_workers() -> int:
    """Processes to fit in: the cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass
class _ModelPart:
    model: str
    gpu_types: list[str]  # those with points, in order
    fits: list[PairFit] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    knees: dict[tuple[str, str], Knee] = field(default_factory=dict)
    rows: list[pd.DataFrame] = field(default_factory=list)


def _fit_model(model: str, model_points: pd.DataFrame, gpu_types: tuple[str, ...], knee_fraction: float,
               fitted: Callable[[str, str], None] | None = None) -> _ModelPart:
    """Fit (or transfer) every GPU type of one model; `fitted(model, gpu)` after each GPU type with points."""
    by_gpu = {str(gpu): pts for gpu, pts in model_points.groupby("gpu_type", sort=True)}
    report = _ModelPart(model, list(by_gpu))
    rows = report.rows
    grid = planning_grid(model_points)
    pending: dict[str, str] = {}
    for gpu, pts in by_gpu.items():
        try:
            fit = fit_pair(str(model), str(gpu), pts)
        except SkipPair as exc:
            pending[gpu] = str(exc)
            continue
        finally:
            if fitted:
                fitted(model, gpu)
        box = MeasuredRange.of(pts)
        inside = box.clip(grid)
        surface = inside.assign(throughput=fit.estimator.predict(inside))
        knee = find_knee(surface, knee_fraction, fit.noise)
        report.fits.append(fit)
        report.knees[(str(model), str(gpu))] = knee
        rows.append(_rows(str(model), str(gpu), surface, knee, knee_fraction, method="fit", source=fit.source,
                          estimator=fit.estimator_name, n_points=fit.n_points, cv_mape=fit.cv_mape,
                          cv_r2=fit.cv_r2, unit=fit.throughput_unit, box=box))
    for gpu in sorted(set(gpu_types) - set(by_gpu)):
        pending[gpu] = "no points"
    anchor = _anchor(report.fits, str(model))
    for gpu, reason in sorted(pending.items()):
        if anchor is None:
            report.skipped.append(Skipped(str(model), gpu, f"{reason}; no fitted GPU type to transfer from"))
            continue
        box = MeasuredRange.of(by_gpu[anchor.gpu_type])
        inside = box.clip(grid)
        anchor_surface = inside.assign(throughput=anchor.estimator.predict(inside))
        try:
            transfer = transfer_curve(str(model), gpu, anchor.gpu_type, anchor_surface, by_gpu.get(gpu))
        except SkipPair as exc:
            report.skipped.append(Skipped(str(model), gpu, f"{reason}; {exc}"))
            continue
        knee = find_knee(transfer.surface, knee_fraction)
        report.transfers.append(transfer)
        report.knees[(str(model), gpu)] = knee
        rows.append(_rows(str(model), gpu, transfer.surface, knee, knee_fraction, method="transferred",
                          source=f"transferred:{anchor.gpu_type}", estimator=None, n_points=transfer.n_points,
                          cv_mape=None, cv_r2=None, unit=anchor.throughput_unit, uncertainty=transfer.uncertainty,
                          box=box))
        if reason != "no points":
            logger.info("%s on %s: %s; transferred from %s", model, gpu, reason, anchor.gpu_type)
    return report


def _anchor(fits: list[PairFit], model: str) -> PairFit | None:
    """The model's best-covered fit: most points, then lowest CV error."""
    own = [f for f in fits if f.model == model]
    return min(own, key=lambda f: (-f.n_points, f.cv_mape, f.gpu_type)) if own else None


def _rows(model: str, gpu: str, surface: pd.DataFrame, knee: Knee, fraction: float, *, method: str, source: str,
          estimator: str | None, n_points: int, cv_mape: float | None, cv_r2: float | None, unit: str | None,
          box: MeasuredRange, uncertainty: float | None = None) -> pd.DataFrame:
    rows = surface.copy()
    rows.insert(0, "model", model)
    rows.insert(1, "gpu_type", gpu)
    rows["throughput"] = rows["throughput"].clip(lower=0.0)
    rows["throughput_unit"] = unit
    rows["method"] = method
    rows["source"] = source
    rows["estimator"] = estimator
    rows["n_points"] = n_points
    rows["cv_mape"] = cv_mape
    rows["cv_r2"] = cv_r2
    rows["uncertainty"] = uncertainty
    rows["plateau"] = knee.plateau
    rows["knee_fraction"] = fraction
    rows["knee_cpus_at_mem"] = rows["mem_gb_per_gpu"].map(knee.cpus_at_mem)
    rows["knee_cpus"] = knee.cpus
    rows["knee_mem_gb"] = knee.mem_gb
    rows["collapse_mem_gb"] = knee.collapse_mem_gb
    rows["measured_cpus_min"], rows["measured_cpus_max"] = box.cpus_min, box.cpus_max
    rows["measured_mem_gb_min"], rows["measured_mem_gb_max"] = box.mem_gb_min, box.mem_gb_max
    return rows
