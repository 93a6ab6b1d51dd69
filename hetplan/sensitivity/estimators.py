"""The monotone estimators (defined in the self-contained top-level module `hetplan_estimators`, which every
logged MLflow model carries so that it loads without hetplan installed)."""

from hetplan_estimators import CANDIDATES, FEATURES, MonotoneGridRegressor, monotone_gbrt

__all__ = ["CANDIDATES", "FEATURES", "MonotoneGridRegressor", "monotone_gbrt"]
