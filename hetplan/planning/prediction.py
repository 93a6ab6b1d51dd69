"""How far to trust a workload plan's prediction: an interval around its predicted gain, and the method behind it.

The planner predicts the winner's average JCT and its speedup over the status quo (status quo avg JCT / the
winner's) by replaying the workload with its own curves. Two errors hide in that number:

- the draws: each candidate runs on several draws (the trace's own arrivals, Poisson ones and a stressed
  bootstrap of the jobs); the spread of the per-draw figures is how much the prediction moves with the order
  jobs happen to arrive in and the mix they happen to have;
- the future: the plan is chosen on past jobs and judged on the next ones. The held-back check plans again
  on the first (1 - holdout) of the jobs by arrival, replays that plan's winner and status quo on the whole
  workload (so the held-back jobs meet a warm cluster), and compares the speedup and avg JCT on the held-back
  jobs with what the smaller plan predicted: the log of realised / predicted is an out-of-sample error, the
  winner's curse of choosing among candidates included.

The interval is `point x exp(+-z sigma)` with sigma = sqrt(sd of the per-draw log figures^2 + held-back log
error^2) and z for a nominal two-sided `NOMINAL` coverage if the log errors were normal with that spread, and
always at least the range of the per-draw figures. With 2 or 3 draws and one held-back part sigma is a rough
estimate, so the nominal coverage is a label, not a guarantee: bench/RESULTS.md has the measured one. Every
figure is simulated with the planner's curves, so the error of the curves themselves (the truth) is not in it;
`calibrate` adds it from earlier evaluated predictions (`hetplan.planning.calibration`), whose coverage is
measured out of sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from hetplan.codesign import Weighing
from hetplan.codesign.candidates import STATUS_QUO, Candidate
from hetplan.codesign.engines import Engine, Serial
from hetplan.codesign.objectives import FLOOR, beats
from hetplan.codesign.replay import JCT_BY_JOB, Runs, jct_by_job
from hetplan.codesign.versus import Versus, versus
from hetplan.codesign.workload import Workload
from hetplan.planning.calibration import Calibration
from hetplan.progress import Progress
from hetplan.sim.engine import SimConfig

NOMINAL = 0.90
Z = 1.6449  # the standard normal's 95th percentile: a two-sided 90 % interval
MIN_JOBS = 50  # fewer jobs: the interval is printed but not to be trusted
MIN_HELD_BACK = 20  # fewer held-back jobs: one held-back error says too little
HOUR = 3600.0
HELD_BACK_Z = 1.0  # the held-back window is small: a plan wins there by at least one standard error
SHIFT_DISTANCE = 0.25  # a held-back mix this far from the first part's (total variation) is said to differ
SHIFT_LOAD = 1.25  # ... or an offered load this many times higher or lower


@dataclass(frozen=True)
class Interval:
    """A predicted figure and its interval."""

    point: float
    low: float
    high: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict[str, float | None]:
        return {k: (round(v, 6) if math.isfinite(v) else None)
                for k, v in (("point", self.point), ("low", self.low), ("high", self.high))}


@dataclass(frozen=True)
class HeldBack:
    """The held-back check: the smaller plan's prediction and what its replays gave on the held-back jobs, and
    every checked candidate against the status quo on those jobs (`checked`, by name)."""

    jobs: int  # held-back jobs
    winner: str  # the winner of the plan on the first part
    predicted_speedup: float
    realised_speedup: float
    predicted_avg_jct_h: float
    realised_avg_jct_h: float
    checked: dict[str, Versus] = field(default_factory=dict)
    shift: MixShift | None = None  # how the held-back jobs differ from the first part's

    @property
    def speedup_error(self) -> float:
        """log(realised / predicted) speedup on the held-back jobs."""
        return _log_ratio(self.realised_speedup, self.predicted_speedup)

    @property
    def jct_error(self) -> float:
        return _log_ratio(self.realised_avg_jct_h, self.predicted_avg_jct_h)

    def verdict(self, name: str) -> str | None:
        """None when candidate `name` wins on the held-back jobs (`beats`), else why not (one line); a
        candidate the check did not replay has no verdict against it."""
        if name == STATUS_QUO or name not in self.checked:
            return None
        v = self.checked[name]
        if beats(v, HELD_BACK_Z):
            return None
        return (f"on the {self.jobs} held-back jobs {name} realised {v.speedup:.2f}x the status quo (at worst "
                f"{v.worst:.2f}x on a draw, lead {v.lead_se:.1f} standard errors"
                + (f", {v.refused} of its jobs refused" if v.refused else "")
                + f"): not more than the margin and the noise ({HELD_BACK_Z:g} standard errors), floor {FLOOR:g}x")


@dataclass(frozen=True)
class MixShift:
    """How the held-back jobs' mix differs from the first part's: the total variation distance between their
    shares of GPU time by (model, GPUs) class, and the ratio of their offered work per hour."""

    distance: float  # 0: the same mix; 1: nothing in common
    load_ratio: float  # held-back offered GPU-hours per hour over the first part's

    @property
    def log_error(self) -> float:
        """What the shift adds to the interval's sigma: how far the distance and the log of the load ratio go past
        what `differs` allows (sampling alone moves a small window's mix that far), in quadrature; 0 within."""
        load = abs(math.log(self.load_ratio)) if self.load_ratio > 0 and math.isfinite(self.load_ratio) else 0.0
        return math.hypot(max(0.0, self.distance - SHIFT_DISTANCE), max(0.0, load - math.log(SHIFT_LOAD)))

    @property
    def differs(self) -> bool:
        return self.distance > SHIFT_DISTANCE or not (1 / SHIFT_LOAD <= self.load_ratio <= SHIFT_LOAD)

    def line(self) -> str:
        return (f"the held-back jobs' mix differs from the first part's (distance {self.distance:.2f} of GPU time by "
                f"model and size, offered load x{self.load_ratio:.2f}): the interval is widened by it")

    def to_dict(self) -> dict:
        return {"distance": round(self.distance, 6), "load_ratio": _finite(self.load_ratio), "differs": self.differs,
                "log_error": round(self.log_error, 6)}


def mix_shift(first: pd.DataFrame, rest: pd.DataFrame) -> MixShift:
    """The `MixShift` of the jobs `rest` against `first` (trace columns)."""
    def shares(jobs: pd.DataFrame) -> pd.Series:
        work = (jobs["num_gpus"] * jobs["duration_s"]).groupby([jobs["model"], jobs["num_gpus"]]).sum()
        return work / work.sum() if work.sum() > 0 else work

    a, b = shares(first), shares(rest)
    distance = 0.5 * float(a.sub(b, fill_value=0.0).abs().sum())

    def offered(jobs: pd.DataFrame) -> float:
        span = float(jobs["arrival_s"].max() - jobs["arrival_s"].min()) / HOUR
        return float((jobs["num_gpus"] * jobs["duration_s"]).sum()) / HOUR / span if span > 0 else float("nan")

    return MixShift(distance, offered(rest) / offered(first))


@dataclass(frozen=True)
class Prediction:
    """The winner's predicted speedup over the status quo and its avg JCT, each with its interval."""

    speedup: Interval
    avg_jct_h: Interval
    speedup_by_draw: tuple[float, ...]
    held_back: HeldBack | None
    jobs: int
    trusted: bool
    warnings: list[str] = field(default_factory=list)
    calibration: Calibration | None = None
    calibrated: Interval | None = None  # the speedup's interval calibrated on evaluated predictions
    kept: bool = False  # the plan is the status quo itself: 1x by definition, nothing to calibrate

    def calibrate(self, calibration: Calibration | None) -> Prediction:
        """This prediction with its speedup's interval calibrated (`hetplan.planning.calibration`)."""
        if calibration is None or not math.isfinite(self.speedup.point):  # no prediction: nothing to calibrate
            return replace(self, calibration=None, calibrated=None)
        if self.kept:
            return replace(self, calibration=calibration, calibrated=Interval(1.0, 1.0, 1.0))
        return replace(self, calibration=calibration,
                       calibrated=Interval(*calibration.applied(self.speedup.point, self.speedup.low,
                                                                  self.speedup.high)))

    @property
    def method(self) -> str:
        held = "alone (no held-back check)"
        if self.held_back:
            held = ("and the held-back check's log error (plan on the first part by arrival, replay its winner and "
                    "status quo, compare on the last part; a workload longer than one replay's sample is checked "
                    "on as many of its most recent jobs)")
        return (f"point x exp(+-{Z:.3g} sigma), sigma from the spread of {len(self.speedup_by_draw)} draws "
                f"{held}; at least the draws' range; simulated with the planner's curves (the first part's plan "
                "keeps the whole workload's demand mix: only its jobs and arrivals are held back)")

    def line(self) -> str:
        """One line for the CLI: the interval to go by first (the calibrated one where there is one), then the
        planner's own and what it is made of."""
        s, j = self.speedup, self.avg_jct_h
        if self.kept:
            return (f"the plan keeps the status quo: 1x its speed by definition; predicted avg JCT {j.point:.3g} h "
                    f"[{j.low:.3g}, {j.high:.3g}] h")
        if not math.isfinite(s.point):
            gain = ("no speedup over the status quo (no status quo among the candidates), predicted avg JCT "
                    f"{j.point:.3g} h [{j.low:.3g}, {j.high:.3g}] h")
            return gain + ("" if self.trusted else "; too little data to trust it")
        text = "predicted speedup over the status quo on its jobs "
        if self.calibrated is not None and self.calibration is not None:
            c, k = self.calibrated, self.calibration
            text += (f"{c.point:.2f}x [{c.low:.2f}x, {c.high:.2f}x] ({k.coverage:.0%} interval calibrated on "
                     f"{k.rows} evaluated predictions, {k.source}); the planner's own: ")
        text += (f"{s.point:.2f}x [{s.low:.2f}x, {s.high:.2f}x], avg JCT {j.point:.3g} h [{j.low:.3g}, {j.high:.3g}] h "
                 f"(nominal {NOMINAL:.0%} interval: {len(self.speedup_by_draw) or 'its'} draws")
        if self.held_back:
            h = self.held_back
            text += (f" + {h.jobs} held-back jobs, where the plan on the rest predicted {h.predicted_speedup:.2f}x "
                     f"and replayed {h.realised_speedup:.2f}x")
        return text + ")" + ("" if self.trusted else "; too little data to trust it")

    def to_dict(self) -> dict:
        """For plan.json's `planning.prediction`."""
        held = None
        if self.held_back:
            h = self.held_back
            held = {"jobs": h.jobs, "winner": h.winner, "predicted_speedup": _finite(h.predicted_speedup),
                    "realised_speedup": _finite(h.realised_speedup), "speedup_log_error": _finite(h.speedup_error),
                    "predicted_avg_jct_h": _finite(h.predicted_avg_jct_h),
                    "realised_avg_jct_h": _finite(h.realised_avg_jct_h), "jct_log_error": _finite(h.jct_error),
                    "mix_shift": h.shift.to_dict() if h.shift is not None else None}
        return {"speedup_over_status_quo": self.speedup.to_dict(), "avg_jct_h": self.avg_jct_h.to_dict(),
                "speedup_by_draw": [_finite(v) for v in self.speedup_by_draw], "held_back": held,
                "nominal_coverage": NOMINAL, "method": self.method, "jobs": self.jobs, "trusted": self.trusted,
                "min_jobs": MIN_JOBS, "min_held_back_jobs": MIN_HELD_BACK, "warnings": list(self.warnings),
                "note": "simulated with the planner's curves; the curves' own error is in the calibrated interval only",
                "calibrated_speedup": self.calibrated.to_dict() if self.calibrated else None,
                "calibration": self.calibration.to_dict() if self.calibration else None}


def predict(planned: Weighing, held_back: HeldBack | None, holdout: float) -> Prediction:
    """The interval of `planned`'s prediction (see the module), widened by `held_back`'s error and by the mix
    shift between the held-back jobs and the rest when given. The speedup is on the status quo's jobs."""
    unpaired = held_back is not None and not math.isfinite(held_back.speedup_error)
    if unpaired:  # no held-back job both sides completed: no error to widen by, and no check to trust
        held_back = None
    winner = _by_draw(planned, planned.winner)
    paired = _paired(planned, planned.winner)
    chosen = planned.row(planned.winner)
    jct = float(chosen["avg_jct_h"])
    speedup = planned.speedup()
    by_draw = paired.speedups if paired is not None else ()
    shift = held_back.shift.log_error if held_back and held_back.shift else 0.0
    e_speedup = math.hypot(held_back.speedup_error, shift) if held_back else 0.0
    if planned.winner == STATUS_QUO:  # the status quo against itself: 1x, whatever the draws and the check
        e_speedup = 0.0
    e_jct = math.hypot(held_back.jct_error, shift) if held_back else 0.0
    jobs = int(planned.workload.summary["jobs"])
    warnings = []
    if holdout <= 0:
        warnings.append("no held-back check (holdout 0): the interval is the draws' spread alone and misses "
                        "the error of planning on past jobs for future ones")
    elif unpaired:
        warnings.append("the held-back check completed no held-back job on both sides: the interval is the "
                        "draws' spread alone")
    elif held_back is None:
        warnings.append(f"the workload ({jobs} jobs) is too small to hold back {holdout:.0%} of it: the interval is "
                        "the draws' spread alone")
    if held_back is not None and held_back.shift is not None and held_back.shift.differs:
        warnings.append(held_back.shift.line())
    small = jobs < MIN_JOBS or held_back is None or held_back.jobs < MIN_HELD_BACK
    if small and holdout > 0:
        held = 0 if held_back is None else held_back.jobs
        warnings.append(f"too few jobs to trust the prediction interval: {jobs} jobs (trusted from {MIN_JOBS}), "
                        f"{held} held back (trusted from {MIN_HELD_BACK})")
    return Prediction(interval(speedup, by_draw, e_speedup), interval(jct, winner, e_jct), by_draw, held_back, jobs,
                      not small and holdout > 0, warnings, kept=planned.winner == STATUS_QUO)


def interval(point: float, by_draw: Sequence[float], error: float) -> Interval:
    """`point` x exp(+-Z sigma), sigma = sqrt(sd(log by_draw)^2 + error^2), widened to the draws' range."""
    logs = np.log([v for v in by_draw if v > 0 and math.isfinite(v)])
    spread = float(np.std(logs, ddof=1)) if len(logs) > 1 else 0.0
    sigma = math.hypot(spread, error) if math.isfinite(error) else float("inf")
    if not (point > 0 and math.isfinite(point)):
        return Interval(point, float("nan"), float("nan"))
    low, high = point * math.exp(-Z * sigma), point * math.exp(Z * sigma)
    if len(logs):
        low, high = min(low, float(np.exp(logs.min()))), max(high, float(np.exp(logs.max())))
    return Interval(point, low, high)


def split(jobs: pd.DataFrame, holdout: float) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """The first (1 - holdout) of `jobs` by arrival and the rest; None when either part would be empty or the
    first part has fewer than 2 jobs."""
    ordered = jobs.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    cut = int(round(len(ordered) * (1 - holdout)))
    if holdout <= 0 or cut < 2 or cut >= len(ordered):
        return None
    return ordered.iloc[:cut].reset_index(drop=True), ordered.iloc[cut:].reset_index(drop=True)


def held_back_check(first: Weighing, workload: Workload, held_back_ids: set[str], config: SimConfig,
                    engine: Engine | None = None, progress: Progress | None = None,
                    also: Sequence[Candidate] = (), shift: MixShift | None = None) -> HeldBack:
    """Replay the winner and the status quo of `first` (planned on the first part), and the candidates `also`
    (the whole workload's plan's winner, say), on every draw of the whole `workload` (on `engine`; default: this
    process); compare their figures on the held-back jobs with `first`'s prediction and with the status quo."""
    names = [n for n in dict.fromkeys((first.winner, STATUS_QUO)) if first.candidate(n) is not None]
    chosen_ones = [first.candidate(n) for n in names]
    chosen_ones += [c for c in also if c.name not in names]
    runs = Runs(first.problem, tuple(chosen_ones), tuple(workload.draws), config)
    out = (engine or Serial()).summaries(_HeldBackRuns(runs), runs.every(), progress)
    draws = range(len(workload.draws))
    masks = [d["job_id"].astype(str).isin(held_back_ids).to_numpy() for d in workload.draws]
    by_job = {c.name: [np.asarray(out[(i, d)][JCT_BY_JOB], dtype=float) for d in draws]
              for i, c in enumerate(chosen_ones)}

    def held_back_jct(name: str) -> float:
        if name not in by_job:
            return float("nan")
        return float(np.mean([np.nanmean(v[m]) if np.isfinite(v[m]).any() else np.nan
                              for v, m in zip(by_job[name], masks)]))

    checked = {}
    if STATUS_QUO in by_job:
        for name, jct in by_job.items():
            checked[name] = _versus_on(jct, by_job[STATUS_QUO], masks)
    chosen, status_quo = first.row(first.winner), first.row(STATUS_QUO)
    realised = held_back_jct(first.winner)
    quo_paired = checked.get(first.winner)
    realised_speedup = quo_paired.speedup if quo_paired is not None else held_back_jct(STATUS_QUO) / realised
    predicted = first.speedup() if status_quo is not None else float("nan")
    return HeldBack(len(held_back_ids), first.winner, predicted, realised_speedup, float(chosen["avg_jct_h"]),
                    realised, checked, shift)


def _versus_on(candidate: list[np.ndarray], quo: list[np.ndarray], masks: list[np.ndarray]) -> Versus:
    """`versus` on the held-back jobs of each draw (the masks differ by draw only in order)."""
    return versus([c[m] for c, m in zip(candidate, masks)], [q[m] for q, m in zip(quo, masks)])


@dataclass(frozen=True)
class _HeldBackRuns:
    """The held-back check's replays as an engine runs them (`hetplan.codesign.engines`): each run's per-job JCTs."""

    runs: Runs

    def every(self) -> list[tuple[int, int]]:
        return self.runs.every()

    def label(self, run: tuple[int, int]) -> str:
        return f"held-back check: {self.runs.label(run)}"

    def summary(self, run: tuple[int, int]) -> dict:
        return {JCT_BY_JOB: jct_by_job(self.runs.simulated(run).jobs)}


def _paired(planned: Weighing, name: str) -> Versus | None:
    """`name`'s replays paired with the status quo's (None: no status quo, or not replayed)."""
    mine = next((r for r in planned.replayed if r.candidate.name == name), None)
    quo = next((r for r in planned.replayed if r.candidate.name == STATUS_QUO), None)
    if mine is None or quo is None or not mine.jct_by_job or not quo.jct_by_job:
        return None
    return versus(mine.jct_by_job, quo.jct_by_job)


def _by_draw(planned: Weighing, name: str) -> tuple[float, ...]:
    return next((r.avg_jct_by_draw for r in planned.replayed if r.candidate.name == name), ())


def _log_ratio(a: float, b: float) -> float:
    return math.log(a / b) if a > 0 and b > 0 and math.isfinite(a / b) else float("nan")


def _finite(value: float) -> float | None:
    return round(float(value), 6) if math.isfinite(value) else None
