"""Sensitivity models: throughput vs CPU cores and RAM per GPU, per model and GPU type.

`fit_profiles` fits a monotone scikit-learn estimator per (model, GPU type), picked by cross-validation,
finds knees, transfers curves to GPU types with too few points, and returns the curve table the planner
reads. `log_fit_job` (in `hetplan.sensitivity.tracking`) records it all in MLflow.
"""

from __future__ import annotations

from hetplan.sensitivity.curves import FitReport, Skipped, fit_profiles, planning_grid
from hetplan.sensitivity.fitting import MIN_POINTS, PairFit, SkipPair, fit_pair, leave_one_out_errors
from hetplan.sensitivity.knee import DEFAULT_KNEE_FRACTION, Knee, find_knee
from hetplan.sensitivity.transfer import Transfer, transfer_curve

__all__ = [
    "DEFAULT_KNEE_FRACTION", "MIN_POINTS", "FitReport", "Knee", "PairFit", "SkipPair", "Skipped", "Transfer",
    "find_knee", "fit_pair", "fit_profiles", "leave_one_out_errors", "planning_grid", "transfer_curve",
]
