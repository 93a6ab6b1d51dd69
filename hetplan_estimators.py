"""hetplan's monotone estimators of throughput as a function of (CPU cores per GPU, RAM GB per GPU).

Both candidates are scikit-learn regressors whose predictions never fall when cores or RAM grow, so a
fitted curve can never tell the planner that giving a job more of a resource makes it slower.

- `MonotoneGridRegressor`: the measured grid projected onto the monotone cone in both axes (weighted
  bivariate isotonic regression, Dykstra's alternating projections), interpolated bilinearly between
  grid points and held flat beyond them. Non-parametric, exact on clean grids.
- `monotone_gbrt()`: gradient-boosted trees with `monotonic_cst=[1, 1]`, smoother on scattered points.

A top-level module that imports only NumPy and scikit-learn, so that every model hetplan logs to MLflow
carries it (`code_paths`) and loads in a clean environment without hetplan installed;
`hetplan.sensitivity.estimators` is its name inside hetplan.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.isotonic import isotonic_regression
from sklearn.utils.validation import check_is_fitted, validate_data

FEATURES = ("cpus_per_gpu", "mem_gb_per_gpu")
_MISSING_WEIGHT = 1e-3


class MonotoneGridRegressor(RegressorMixin, BaseEstimator):
    """Bivariate isotonic fit on the measurement grid with bilinear interpolation between knots."""

    def __init__(self, iterations: int = 200, tolerance: float = 1e-10) -> None:
        self.iterations = iterations
        self.tolerance = tolerance

    def fit(self, X, y):  # noqa: N803 (scikit-learn's signature)
        X, y = validate_data(self, X, y, ensure_min_samples=1, y_numeric=True)
        cores, mem = np.unique(X[:, 0]), np.unique(X[:, 1])
        total = np.zeros((len(mem), len(cores)))
        count = np.zeros_like(total)
        np.add.at(total, (np.searchsorted(mem, X[:, 1]), np.searchsorted(cores, X[:, 0])), y)
        np.add.at(count, (np.searchsorted(mem, X[:, 1]), np.searchsorted(cores, X[:, 0])), 1)
        grid = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        grid = _fill_missing(grid)
        weights = np.where(count > 0, count, _MISSING_WEIGHT)
        self.grid_ = _project_monotone(grid, weights, self.iterations, self.tolerance)
        self.cores_, self.mem_ = cores, mem
        return self

    def predict(self, X):  # noqa: N803
        check_is_fitted(self, "grid_")
        X = validate_data(self, X, reset=False)
        # Bilinear: along cores within every RAM row, then along RAM; np.interp holds values flat outside.
        by_row = np.vstack([np.interp(X[:, 0], self.cores_, row) for row in self.grid_])
        upper = np.clip(np.searchsorted(self.mem_, X[:, 1]), 1, max(1, len(self.mem_) - 1))
        lower = upper - 1 if len(self.mem_) > 1 else upper * 0
        upper = np.minimum(upper, len(self.mem_) - 1)
        span = self.mem_[upper] - self.mem_[lower]
        weight = np.where(span > 0, (np.clip(X[:, 1], self.mem_[0], self.mem_[-1]) - self.mem_[lower])
                          / np.where(span > 0, span, 1), 0.0)
        columns = np.arange(len(X))
        return (1 - weight) * by_row[lower, columns] + weight * by_row[upper, columns]


def monotone_gbrt() -> HistGradientBoostingRegressor:
    """Gradient-boosted trees constrained to be non-decreasing in cores and in RAM."""
    return HistGradientBoostingRegressor(
        monotonic_cst=[1, 1], min_samples_leaf=2, max_iter=150, learning_rate=0.1, random_state=0
    )


CANDIDATES = {
    "monotone-grid": MonotoneGridRegressor,
    "monotone-gbrt": monotone_gbrt,
}


def _fill_missing(grid: np.ndarray) -> np.ndarray:
    """Fill unmeasured grid cells by interpolating along cores, then along RAM (flat beyond the ends)."""
    filled = grid.copy()
    for _ in range(2):
        for data in (filled, filled.T):
            for row in data:
                known = ~np.isnan(row)
                if known.any() and not known.all():
                    idx = np.arange(len(row))
                    row[~known] = np.interp(idx[~known], idx[known], row[known])
    return np.nan_to_num(filled, nan=float(np.nanmean(grid)))


def _project_monotone(grid: np.ndarray, weights: np.ndarray, iterations: int, tolerance: float) -> np.ndarray:
    """Weighted L2 projection onto grids non-decreasing along both axes (Dykstra's algorithm)."""
    x = grid.astype(float)
    p = np.zeros_like(x)
    q = np.zeros_like(x)
    for _ in range(iterations):
        y = _rows_isotonic(x + p, weights)
        p = x + p - y
        x_next = _rows_isotonic((y + q).T, weights.T).T
        q = y + q - x_next
        if np.max(np.abs(x_next - x)) <= tolerance * max(1.0, float(np.max(np.abs(x)))):
            return x_next
        x = x_next
    return x


def _rows_isotonic(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return np.vstack([isotonic_regression(row, sample_weight=w) for row, w in zip(values, weights)])
