"""Calibrate a plan's prediction on how earlier predictions fared (split conformal).

The planner's interval (`hetplan.planning.prediction`) holds the errors of its own simulated world: arrival
draws and a held-back part of the workload. It cannot hold what only an evaluation sees: its curves against
the real speeds, the next jobs, the scheduler's horizon. `hetplan evaluate` records every prediction beside
the replayed outcome (`summary.csv`: `predicted_jct_speedup`, `jct_speedup`); those rows calibrate the next
prediction, in logs (e = log(realised / predicted)):

- shift: c = the median of e over the rows (the planner's bias, e.g. over-predicting);
- margin: m = the ceil((n + 1) x coverage)-th smallest |e - c| of the n rows (split conformal with absolute
  residuals): for a new prediction exchangeable with the rows, [predicted x e^(c - m), predicted x e^(c + m)]
  holds the realised value with probability at least `coverage`; with `GROUPED` (the default where the rows name
  their trace) m grows by the largest distance of one trace group's median e from c, as a new trace may be
  biased as the most biased one seen was.

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
from hetplan.planner.baselines import HETPLAN, STATUS_QUO
from hetplan.resources import data_path

COVERAGE = 0.90
COLUMNS = ("predicted_jct_speedup", "jct_speedup")
SHIPPED = "calibration/prediction_errors.csv"
"""The rows hetplan ships (hetplan/data): bench/calibration.py's out-of-sample rows of 4 trace groups, simulated on
derived data."""


ABSOLUTE, SCALED, GROUPED = "absolute", "scaled", "grouped"
SCALES = (ABSOLUTE, SCALED, GROUPED)
"""How a row's error is scored: `absolute` |e - shift|; `scaled` |e - shift| over the planner's own log half-width
(at least `MIN_HALF_WIDTH`), so the calibrated interval is wide where the planner itself is unsure; `grouped`
(the default where the rows name their trace, `group`) |e - shift| plus, on the margin, the largest distance of
one trace group's median error from the shift: a new trace may be biased as the most biased one seen was."""
MIN_HALF_WIDTH = 0.05


@dataclass(frozen=True)
class Calibration:
    """A shift and a margin (both in log space) learned from `rows` evaluated predictions, and where from; with
    the `scaled` score the margin is in units of the planner's own log half-width."""

    shift: float
    margin: float
    rows: int
    source: str
    coverage: float = COVERAGE
    scale: str = ABSOLUTE

    @classmethod
    def fit(cls, rows: pd.DataFrame, source: str, coverage: float = COVERAGE, scale: str = ABSOLUTE) -> Calibration:
        """The calibration of `rows` (`COLUMNS`, and `predicted_low`/`predicted_high` for the `scaled` score; rows
        missing any of them are skipped). ContractError naming `source` when too few rows are left for
        `coverage`."""
        if scale not in SCALES:
            raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
        needed = list(COLUMNS) + (["predicted_low", "predicted_high"] if scale == SCALED else [])
        if scale == GROUPED and "group" not in rows.columns:
            scale = ABSOLUTE  # rows that do not say their trace: one group
        missing = [c for c in needed if c not in rows.columns]
        if missing:
            raise ContractError([Problem(source, f"no column {', '.join(missing)}: calibration needs "
                                         f"{', '.join(needed)} (hetplan evaluate's summary.csv has them)")])
        frame = rows[needed].apply(pd.to_numeric, errors="coerce")
        usable = frame[(frame > 0).all(axis=1) & np.isfinite(frame).all(axis=1)]
        need = rows_needed(coverage)
        if len(usable) < need:
            raise ContractError([Problem(source, f"{len(usable)} usable predictions (positive predicted and "
                                         f"realised speedups); a {coverage:.0%} calibration needs {need}")])
        errors = np.log(usable["jct_speedup"].to_numpy(float) / usable["predicted_jct_speedup"].to_numpy(float))
        shift = float(np.median(errors))
        scores = np.abs(errors - shift)
        if scale == SCALED:
            scores = scores / half_widths(usable)
        rank = math.ceil((len(errors) + 1) * coverage)
        margin = float(np.sort(scores)[rank - 1])
        if scale == GROUPED:
            groups = rows.loc[usable.index, "group"].astype(str).to_numpy()
            margin += max(abs(float(np.median(errors[groups == g])) - shift) for g in set(groups))
        return cls(shift, margin, len(usable), source, coverage, scale)

    def applied(self, point: float, low: float | None = None, high: float | None = None) -> tuple[float, float, float]:
        """The calibrated (point, low, high) of a predicted `point` (the planner's interval `low`, `high` for the
        `scaled` score): shifted by the bias, +- the margin."""
        margin = self.margin
        if self.scale == SCALED:
            margin *= float(half_widths(pd.DataFrame({"predicted_jct_speedup": [point], "predicted_low": [low],
                                                      "predicted_high": [high]}))[0])
        centre = point * math.exp(self.shift)
        return centre, centre * math.exp(-margin), centre * math.exp(margin)

    def to_dict(self) -> dict:
        how = {ABSOLUTE: "the ceil((n + 1) x coverage)-th smallest |e - shift|",
               SCALED: "the ceil((n + 1) x coverage)-th smallest |e - shift| / the planner's log half-width, times "
                       "the new prediction's",
               GROUPED: "the ceil((n + 1) x coverage)-th smallest |e - shift|, plus the largest distance of a trace "
                        "group's median e from the shift"}[self.scale]
        return {"shift_log": round(self.shift, 6), "margin_log": round(self.margin, 6), "rows": self.rows,
                "source": self.source, "coverage": self.coverage, "scale": self.scale,
                "method": f"split conformal on e = log(realised / predicted): shift = median e, margin = {how}"}


def half_widths(rows: pd.DataFrame) -> np.ndarray:
    """The planner's log half-width of each row's interval (the larger side), at least `MIN_HALF_WIDTH`; where
    the interval is missing, `MIN_HALF_WIDTH`."""
    point = rows["predicted_jct_speedup"].to_numpy(float)
    low, high = rows["predicted_low"].to_numpy(float), rows["predicted_high"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        width = np.fmax(np.log(high / point), np.log(point / low))
    return np.where(np.isfinite(width), np.maximum(width, MIN_HALF_WIDTH), MIN_HALF_WIDTH)


def coverage_by_group(rows: pd.DataFrame, method: str,
                      coverage: float = COVERAGE) -> tuple[list[bool], list[float], dict[str, list[bool]]]:
    """Leave one trace group out (`group` column): each row's interval calibrated on the other groups' rows only
    (`method` an element of `SCALES`, or `planner` for the planner's own interval, uncalibrated); per row whether
    the replayed speedup lies inside, the interval's width (high / low), and the hits per group. A row whose
    other groups hold too few rows to calibrate is skipped."""
    hits: list[bool] = []
    widths: list[float] = []
    per_group: dict[str, list[bool]] = {}
    for i, row in rows.iterrows():
        if method == "planner":
            low, high = float(row["predicted_low"]), float(row["predicted_high"])
        else:
            try:
                fitted = Calibration.fit(rows[rows["group"] != row["group"]], "other groups", coverage, method)
            except ContractError:
                continue
            _, low, high = fitted.applied(float(row["predicted_jct_speedup"]), float(row["predicted_low"]),
                                          float(row["predicted_high"]))
        inside = bool(low <= float(row["jct_speedup"]) <= high)
        hits.append(inside)
        widths.append(high / low if low > 0 else math.inf)
        per_group.setdefault(str(row["group"]), []).append(inside)
    return hits, widths, per_group


def rows_needed(coverage: float = COVERAGE) -> int:
    """The fewest rows whose conformal rank ceil((n + 1) x coverage) is at most n."""
    return math.ceil(coverage / (1 - coverage) - 1e-9)


def load_rows(paths: list[Path]) -> pd.DataFrame:
    """The evaluated predictions of `paths` (evaluate's summary.csv or the shipped file): the rows that carry a
    prediction (hetplan's), each with its trace `group` (a file without that column is one group).
    ContractError naming a file that cannot be read or lacks the columns."""
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
        if "winner" in frame.columns:  # a plan that is the status quo itself predicts 1x exactly: nothing to learn
            frame = frame[frame["winner"] != STATUS_QUO]
        if "group" not in frame.columns:  # an evaluation's rows are one trace group: a file, one workload
            frame = frame.assign(group=str(path))
        frames.append(frame[frame["predicted_jct_speedup"].notna()])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLUMNS))


def calibration_from(paths: list[Path] | None) -> Calibration:
    """The calibration of `paths`' rows, or of the shipped rows when `paths` is None."""
    if paths is None:
        return shipped()
    return Calibration.fit(load_rows(paths), ", ".join(str(p) for p in paths), scale=GROUPED)


def shipped() -> Calibration:
    """The shipped calibration (`SHIPPED`)."""
    path = data_path(SHIPPED)
    return Calibration.fit(load_rows([path]), f"hetplan/data/{SHIPPED} (simulated on derived data)", scale=GROUPED)
