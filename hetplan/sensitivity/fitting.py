"""Fit one monotone throughput model per (model, GPU type), choose the estimator by cross-validation.

The steps for one pair: check the points (enough of them, more than one RAM level, no NaN or zero
throughput, roughly monotone); score every candidate estimator by K-fold cross-validation (MAPE, R²) and
keep the best; refit it on all points, drop gross outliers against that fit and refit once more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from sklearn.base import clone
from sklearn.metrics import mean_absolute_percentage_error, r2_score
from sklearn.model_selection import KFold
from threadpoolctl import threadpool_limits

from hetplan.sensitivity.estimators import CANDIDATES, FEATURES

MIN_POINTS = 6
CV_FOLDS = 5
# A point is an outlier when its out-of-fold prediction misses it by more than OUTLIER_MIN_ERROR and no
# grid neighbour lies within OUTLIER_CONFIRM_TOLERANCE of it.
OUTLIER_MIN_ERROR = 0.25
OUTLIER_CONFIRM_TOLERANCE = 0.3
CONFIRMING_GROUP = 3
# A monotone fit missing the points it was fitted to by more than this (median relative error) means the
# data are not monotone at all: throughput falls as cores or RAM grow, or is noise.
MAX_MONOTONE_ERROR = 0.2


class SkipPair(ValueError):
    """A (model, GPU type) whose points cannot be fitted; the message says why."""


@dataclass
class PairFit:
    """A fitted (model, GPU type): the estimator and how well it generalises."""

    model: str
    gpu_type: str
    estimator: object
    estimator_name: str
    n_points: int
    n_outliers: int
    cv_mape: float
    cv_r2: float
    noise: float  # robust scale of the out-of-fold relative errors: the data's noise as the fit sees it
    candidates: dict[str, CvScore] = field(default_factory=dict)
    source: str = ""
    throughput_unit: str | None = None
    points: pd.DataFrame | None = None  # the points fitted (outliers removed)


def usable_points(points: pd.DataFrame) -> pd.DataFrame:
    """The rows a fit may use: measured successfully (failed points carry no throughput)."""
    if "status" in points.columns:
        points = points[points["status"].fillna("ok") != "failed"]
    return points


def check_points(points: pd.DataFrame) -> None:
    """Raise `SkipPair` when the points of one pair cannot support a fit."""
    throughput = points["throughput"].astype(float)
    bad = throughput.isna() | ~np.isfinite(throughput) | (throughput <= 0)
    if bad.any():
        raise SkipPair(f"{int(bad.sum())} point(s) with NaN, infinite or zero throughput")
    if len(points) < MIN_POINTS:
        raise SkipPair(f"only {len(points)} point(s); a fit needs at least {MIN_POINTS}")
    levels = points["mem_gb_per_gpu"].nunique()
    if levels < 2:
        raise SkipPair(f"only one RAM level ({points['mem_gb_per_gpu'].iloc[0]:g} GB per GPU): "
                       "RAM sensitivity cannot be told; profile at least two RAM levels")
    if points["cpus_per_gpu"].nunique() < 2:
        raise SkipPair("only one core count: CPU sensitivity cannot be told")


@dataclass(frozen=True)
class CvScore:
    """Out-of-fold accuracy of one estimator: MAPE, R² and the robust scale of the relative errors."""

    mape: float
    r2: float
    noise: float
    predicted: np.ndarray = field(repr=False)


def cross_validate(estimator: object, X: np.ndarray, y: np.ndarray, folds: int = CV_FOLDS) -> CvScore:
    """K-fold (shuffled, fixed seed) scores of out-of-fold predictions."""
    predicted = np.empty_like(y)
    for train, test in KFold(n_splits=min(folds, len(y)), shuffle=True, random_state=0).split(X):
        predicted[test] = clone(estimator).fit(X[train], y[train]).predict(X[test])
    relative = np.abs(predicted - y) / y
    return CvScore(float(mean_absolute_percentage_error(y, predicted)), _r2(y, predicted),
                   float(1.4826 * np.median(relative)), predicted)


def leave_one_out_errors(estimator: object, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Relative error of predicting each point from all the others."""
    errors = np.empty(len(y))
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        fitted = clone(estimator).fit(X[keep], y[keep])
        errors[i] = abs(fitted.predict(X[i : i + 1])[0] - y[i]) / y[i]
    return errors


def find_outliers(X: np.ndarray, y: np.ndarray, out_of_fold: np.ndarray) -> np.ndarray:
    """Points that their out-of-fold prediction misses badly and that nothing around them confirms.

    A real feature is confirmed: a plateau reached at 12 cores by the neighbour beyond it at the same
    level; a steep first column by its own consistent column. A measurement gone wrong stands alone (or as
    a pair), even in a corner of the grid where a monotone fit cannot pull it back. So a suspect point is
    kept when an unsuspected grid neighbour lies within OUTLIER_CONFIRM_TOLERANCE of it, or when it belongs
    to a group of at least CONFIRMING_GROUP suspects that agree with each other.
    """
    suspect = np.abs(out_of_fold - y) / y > OUTLIER_MIN_ERROR
    cores = np.searchsorted(np.unique(X[:, 0]), X[:, 0])
    mems = np.searchsorted(np.unique(X[:, 1]), X[:, 1])
    adjacent = np.abs(cores[:, None] - cores[None, :]) + np.abs(mems[:, None] - mems[None, :]) <= 1
    agree = adjacent & (np.abs(np.log(y[:, None] / y[None, :])) <= np.log1p(OUTLIER_CONFIRM_TOLERANCE))
    np.fill_diagonal(agree, False)
    confirmed = (agree & ~suspect[None, :]).any(axis=1)
    group = _component_sizes(agree & suspect[:, None] & suspect[None, :])
    return suspect & ~confirmed & (group < CONFIRMING_GROUP)


def _component_sizes(links: np.ndarray) -> np.ndarray:
    """Size of each node's connected component in an undirected graph given as a boolean matrix."""
    sizes = np.zeros(len(links), dtype=int)
    seen = np.zeros(len(links), dtype=bool)
    for start in range(len(links)):
        if seen[start]:
            continue
        members, frontier = [start], [start]
        seen[start] = True
        while frontier:
            node = frontier.pop()
            for other in np.flatnonzero(links[node] & ~seen):
                seen[other] = True
                members.append(other)
                frontier.append(other)
        sizes[members] = len(members)
    return sizes


def fit_pair(model: str, gpu_type: str, points: pd.DataFrame) -> PairFit:
    """Fit one pair; raise `SkipPair` with a reason when it cannot be fitted."""
    # Tens of points: one thread is faster, and OpenMP spinning on a busy 2-core host is ten times slower.
    with threadpool_limits(limits=1):
        return _fit_pair(model, gpu_type, points)


def _fit_pair(model: str, gpu_type: str, points: pd.DataFrame) -> PairFit:
    points = usable_points(points)
    check_points(points)
    X = points[list(FEATURES)].to_numpy(dtype=float)
    y = points["throughput"].to_numpy(dtype=float)

    scores = {name: cross_validate(make(), X, y) for name, make in CANDIDATES.items()}
    best = _best(scores)
    outliers = find_outliers(X, y, scores[best].predicted)
    if outliers.any() and (~outliers).sum() >= MIN_POINTS:
        X, y = X[~outliers], y[~outliers]
        scores = {name: cross_validate(make(), X, y) for name, make in CANDIDATES.items()}
        best = _best(scores)
    else:
        outliers[:] = False
    frame = pd.DataFrame(X, columns=list(FEATURES))
    estimator = CANDIDATES[best]().fit(frame, y)

    misfit = float(np.median(np.abs(estimator.predict(frame) - y) / y))
    if misfit > MAX_MONOTONE_ERROR:
        raise SkipPair(f"not monotone: throughput does not grow with cores and RAM "
                       f"(the best monotone fit misses the points by {misfit:.0%} at the median)")
    units = points["throughput_unit"].dropna().unique() if "throughput_unit" in points.columns else []
    sources = sorted(points["source"].dropna().unique()) if "source" in points.columns else []
    return PairFit(
        model=model, gpu_type=gpu_type, estimator=estimator, estimator_name=best,
        n_points=len(y), n_outliers=int(outliers.sum()), cv_mape=scores[best].mape, cv_r2=scores[best].r2,
        noise=scores[best].noise, candidates=scores, source="+".join(sources) or "unknown",
        throughput_unit=str(units[0]) if len(units) == 1 else None, points=points.iloc[np.flatnonzero(~outliers)],
    )


def _best(scores: dict[str, CvScore]) -> str:
    """The candidate with the lowest cross-validated MAPE; ties go to the earlier candidate."""
    return min(scores, key=lambda name: (scores[name].mape, list(CANDIDATES).index(name)))


def _r2(y: np.ndarray, predicted: np.ndarray) -> float:
    """R², defined as 1 for a perfect prediction of a constant target (scikit-learn says NaN or 0)."""
    if np.allclose(y, y[0]):
        return 1.0 if np.allclose(predicted, y) else 0.0
    return float(r2_score(y, predicted))
