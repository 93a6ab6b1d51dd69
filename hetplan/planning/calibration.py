"""Calibrate a plan's prediction on how earlier predictions fared (split conformal).

The planner's interval (`hetplan.planning.prediction`) holds the errors of its own simulated world: arrival
draws and a held-back part of the workload. It cannot hold what only an evaluation sees: its curves against
the real speeds, the next jobs, the scheduler's horizon. `hetplan evaluate` records every prediction beside
the replayed outcome (`summary.csv`: `predicted_jct_speedup`, `jct_speedup`); those rows calibrate the next
prediction, in logs (e = log(realised / predicted)):

- shift: c = the median of e over the rows (the planner's bias, e.g. over-predicting);
- margin: m = the ceil((n + 1) x coverage)-th smallest |e - c| of the n rows (split conformal with absolute
  residuals): for a new prediction exchangeable with the rows, [predicted x e^(c - m), predicted x e^(c + m)]
  holds the realised value with probability at least `coverage`.

The planner's own interval is not used: on the shipped rows its width did not track the error (too narrow on one
trace, wide enough on the other), and a score built on it covered fewer left-out rows (bench/RESULTS.md).
With fewer rows than the rank needs (n < coverage / (1 - coverage), 9 for 90 %) there is no margin and no
calibration. The rows must come from predictions like the new one (same planner, similar workloads and
budgets); the shipped rows are simulated on derived data (`SHIPPED`, its provenance in hetplan/data).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hetplan.contracts.table import ContractError, Problem
from hetplan.planner.baselines import HETPLAN
from hetplan.resources import data_path

COVERAGE = 0.90
COLUMNS = ("predicted_jct_speedup", "jct_speedup")
SHIPPED = "calibration/prediction_errors.csv"
"""The rows hetplan ships (hetplan/data): bench/evaluate.py's out-of-sample grid, simulated on derived data."""


@dataclass(frozen=True)
class Calibration:
    """A shift and a margin (both in log space) learned from `rows` evaluated predictions, and where from."""

    shift: float
    margin: float
    rows: int
    source: str
    coverage: float = COVERAGE

    @classmethod
    def fit(cls, rows: pd.DataFrame, source: str, coverage: float = COVERAGE) -> Calibration:
        """The calibration of `rows` (`COLUMNS`; rows missing any of them are skipped). ContractError naming
        `source` when too few rows are left for `coverage`."""
        missing = [c for c in COLUMNS if c not in rows.columns]
        if missing:
            raise ContractError([Problem(source, f"no column {', '.join(missing)}: calibration needs "
                                         f"{', '.join(COLUMNS)} (hetplan evaluate's summary.csv has them)")])
        frame = rows[list(COLUMNS)].apply(pd.to_numeric, errors="coerce")
        usable = frame[(frame > 0).all(axis=1) & np.isfinite(frame).all(axis=1)]
        need = rows_needed(coverage)
        if len(usable) < need:
            raise ContractError([Problem(source, f"{len(usable)} usable predictions (positive predicted and "
                                         f"realised speedups); a {coverage:.0%} calibration needs {need}")])
        errors = np.log(usable["jct_speedup"].to_numpy(float) / usable["predicted_jct_speedup"].to_numpy(float))
        shift = float(np.median(errors))
        rank = math.ceil((len(errors) + 1) * coverage)
        return cls(shift, float(np.sort(np.abs(errors - shift))[rank - 1]), len(usable), source, coverage)

    def applied(self, point: float) -> tuple[float, float, float]:
        """The calibrated (point, low, high) of a predicted `point`: shifted by the bias, +- the margin."""
        centre = point * math.exp(self.shift)
        return centre, centre * math.exp(-self.margin), centre * math.exp(self.margin)

    def to_dict(self) -> dict:
        return {"shift_log": round(self.shift, 6), "margin_log": round(self.margin, 6), "rows": self.rows,
                "source": self.source, "coverage": self.coverage,
                "method": "split conformal on e = log(realised / predicted): shift = median e, margin = the "
                          "ceil((n + 1) x coverage)-th smallest |e - shift|"}


def rows_needed(coverage: float = COVERAGE) -> int:
    """The fewest rows whose conformal rank ceil((n + 1) x coverage) is at most n."""
    return math.ceil(coverage / (1 - coverage) - 1e-9)


def load_rows(paths: list[Path]) -> pd.DataFrame:
    """The evaluated predictions of `paths` (evaluate's summary.csv or the shipped file): the rows that carry a
    prediction (hetplan's). ContractError naming a file that cannot be read or lacks the columns."""
    frames = []
    for path in paths:
        try:
            frame = pd.read_csv(path)
        except (OSError, ValueError) as exc:
            raise ContractError([Problem(str(path), f"cannot read it as CSV: {exc}")]) from exc
        missing = [c for c in COLUMNS if c not in frame.columns]
        if missing:
            raise ContractError([Problem(str(path), f"no column {', '.join(missing)}: not an evaluation summary "
                                         "(hetplan evaluate's summary.csv)")])
        if "setup" in frame.columns:  # evaluate's summary: hetplan's rows (the status quo's are 1 by definition)
            frame = frame[frame["setup"] == HETPLAN]
        frames.append(frame[frame["predicted_jct_speedup"].notna()])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLUMNS))


def calibration_from(paths: list[Path] | None) -> Calibration:
    """The calibration of `paths`' rows, or of the shipped rows when `paths` is None."""
    if paths is None:
        return shipped()
    return Calibration.fit(load_rows(paths), ", ".join(str(p) for p in paths))


def shipped() -> Calibration:
    """The shipped calibration (`SHIPPED`)."""
    path = data_path(SHIPPED)
    return Calibration.fit(load_rows([path]), f"hetplan/data/{SHIPPED} (simulated on derived data)")
