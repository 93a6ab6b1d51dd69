"""A candidate against the status quo, job by job: the figures the choice and the floor are judged on.

Both ran the same draws (the same jobs, the same arrivals), so their runs pair job by job. The **status quo's
jobs** of a draw are those the status quo completed: what a platform team runs today. On them:

- `avg_jct_h` / `p95_jct_h`: the candidate's average and 95th-percentile JCT (mean over draws), beside the status
  quo's average (`quo_avg_jct_h`);
- `speedups`: per draw, the status quo's average JCT over the candidate's (above 1: faster); `worst` the least;
- `lead_se`: the mean paired lead (status quo's JCT minus the candidate's, per job) over its standard error by
  batch means (jobs in arrival order cut into `BATCHES` batches: neighbouring jobs queue together, batches far
  apart nearly do not), combined over draws: how many standard errors the candidate is ahead by;
- `refused`: status quo's jobs the candidate did not complete (it cannot host them): a plan that refuses a job the
  status quo runs never passes the floor.

Jobs only one of them completed are counted apart: `extra_jobs` (the candidate ran them, the status quo could
not) with their average JCT `extra_avg_jct_h`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BATCHES = 10
__all__ = ["BATCHES", "Versus", "batch_se", "versus"]


@dataclass(frozen=True)
class Versus:
    """A candidate's figures on the status quo's jobs, paired with the status quo's (see the module)."""

    avg_jct_h: float
    p95_jct_h: float
    quo_avg_jct_h: float
    speedups: tuple[float, ...]
    lead_se: float
    refused: int
    quo_jobs: int
    extra_jobs: int
    extra_avg_jct_h: float

    @property
    def speedup(self) -> float:
        """The status quo's average JCT over the candidate's, on the status quo's jobs."""
        return self.quo_avg_jct_h / self.avg_jct_h if self.avg_jct_h > 0 else float("nan")

    @property
    def worst(self) -> float:
        """The least per-draw speedup (NaN without draws)."""
        return min(self.speedups) if self.speedups else float("nan")

    def to_dict(self) -> dict[str, float]:
        """Columns of the candidate table (`core_` figures: on the status quo's jobs)."""
        return {"core_avg_jct_h": self.avg_jct_h, "core_p95_jct_h": self.p95_jct_h, "core_speedup": self.speedup,
                "worst_draw_speedup": self.worst, "lead_se": self.lead_se, "refused_quo_jobs": self.refused,
                "quo_jobs": self.quo_jobs, "extra_jobs": self.extra_jobs, "extra_avg_jct_h": self.extra_avg_jct_h}


def versus(candidate: Sequence[np.ndarray], quo: Sequence[np.ndarray], only: np.ndarray | None = None) -> Versus:
    """The candidate's per-draw per-job JCTs (`hetplan.codesign.replay.JCT_BY_JOB`) against the status quo's on the
    same draws; `only` (a mask over the jobs, the same in every draw) keeps a part of them (the held-back jobs)."""
    if len(candidate) != len(quo) or not len(quo):
        raise ValueError(f"pairing needs the same draws on both sides, got {len(candidate)} and {len(quo)}")
    avg, p95, q_avg, speedups, leads, variances = [], [], [], [], [], []
    refused = extra = quo_jobs = 0
    extra_jct: list[np.ndarray] = []
    for mine, theirs in zip(candidate, quo):
        mine, theirs = np.asarray(mine, dtype=float), np.asarray(theirs, dtype=float)
        if mine.shape != theirs.shape:
            raise ValueError(f"a draw's runs have {len(mine)} and {len(theirs)} jobs: not the same draw")
        keep = np.ones(len(mine), dtype=bool) if only is None else np.asarray(only, dtype=bool)
        ran, quo_ran = keep & np.isfinite(mine), keep & np.isfinite(theirs)
        both = ran & quo_ran
        refused = max(refused, int((quo_ran & ~ran).sum()))
        quo_jobs = max(quo_jobs, int(quo_ran.sum()))
        extra = max(extra, int((ran & ~quo_ran).sum()))
        extra_jct.append(mine[ran & ~quo_ran])
        if not both.any():
            continue
        a, b = mine[both], theirs[both]
        avg.append(float(a.mean()))
        q_avg.append(float(b.mean()))
        p95.append(float(np.percentile(a, 95)))
        speedups.append(q_avg[-1] / avg[-1] if avg[-1] > 0 else float("nan"))
        leads.append(float((b - a).mean()))
        variances.append(batch_se(b - a) ** 2)
    if not avg:
        nan = float("nan")
        return Versus(nan, nan, nan, (), nan, refused, quo_jobs, extra, nan)
    se = math.sqrt(sum(variances)) / len(variances)
    lead = float(np.mean(leads))
    lead_se = lead / se if se > 0 else (math.inf if lead > 0 else -math.inf if lead < 0 else 0.0)
    pooled = np.concatenate(extra_jct)
    return Versus(float(np.mean(avg)), float(np.mean(p95)), float(np.mean(q_avg)),
                  tuple(speedups), lead_se, refused, quo_jobs, extra,
                  float(pooled.mean()) if len(pooled) else float("nan"))


def batch_se(values: np.ndarray, batches: int = BATCHES) -> float:
    """The standard error of the mean of `values` (in arrival order) by batch means: cut into `batches` batches,
    the spread of the batches' means over sqrt(batches) (neighbouring jobs queue together, so their JCTs are not
    independent; batches far apart nearly are); with fewer than two values a batch, the plain standard error
    (0 for a single value)."""
    n = len(values)
    if n < 2:
        return 0.0
    if n < 2 * batches:
        return float(np.std(values, ddof=1) / math.sqrt(n))
    means = [float(part.mean()) for part in np.array_split(values, batches)]
    return float(np.std(means, ddof=1) / math.sqrt(batches))
