"""A workload as the planner sees it: recent jobs, their mix, their arrival rate and their arrival draws."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from hetplan.contracts import TRACE, ContractError, Problem, demand_from_trace
from hetplan.sim.workload import with_load

HOUR = 3600.0


@dataclass(frozen=True)
class Workload:
    """Jobs (trace columns plus `sim_model`), their demand mix, and the arrival draws replays use."""

    jobs: pd.DataFrame
    demand: pd.DataFrame
    draws: tuple[pd.DataFrame, ...]
    summary: dict[str, float]
    warnings: list[str] = field(default_factory=list)


def jobs_per_hour(jobs: pd.DataFrame) -> float:
    """The mean arrival rate: arrivals after the first over the time they span (1 job: 1 per hour)."""
    span = float(jobs["arrival_s"].max() - jobs["arrival_s"].min())
    return (len(jobs) - 1) / span * HOUR if len(jobs) > 1 and span > 0 else 1.0


STRESS_DRAWS = 1
"""Stressed bootstrap draws a planner's workload adds (`stressed`): the mix it will meet, not only the window."""
TAIL_QUANTILE = 0.8  # jobs at or above this quantile of GPU-hours are the tail a stressed draw over-weights
TAIL_WEIGHT = 2.0  # ... drawn this many times as often as the rest
BOOTSTRAP_SEP = "~"  # a bootstrapped job's id: its job's id, this, and the copy's number


def workload_from_trace(trace: pd.DataFrame, draws: int = 2, seed: int = 0, source: str = "<workload>",
                        load_spread: float = 1.0, stress: int = STRESS_DRAWS) -> Workload:
    """The planner's workload: draw 0 is the trace's own arrivals, draws 1 .. `draws` - 1 are Poisson arrivals
    (seeded), the jobs in their order, and `stress` more are stressed bootstrap draws (`stressed`): jobs
    resampled with heavier tails and more large jobs, so that a plan that only wins on the exact window loses.
    With `load_spread` s > 1 the Poisson draws' rates spread evenly in log space from r/s to r x s around the
    trace's mean rate r (a plan robust to the load moving by that factor); with 1, all at r.
    Raises `ContractError` for an empty or invalid trace."""
    if trace is None or len(trace) == 0:
        raise ContractError([Problem(source, "the workload has no jobs: nothing to plan for")])
    jobs = TRACE.validate(trace, source).sort_values("arrival_s", kind="stable").reset_index(drop=True)
    jobs = jobs.assign(sim_model=jobs["model"].astype(str))
    rate = jobs_per_hour(jobs)
    poisson = max(1, draws) - 1
    factors = np.exp(np.linspace(-np.log(load_spread), np.log(load_spread), poisson)) if poisson > 1 \
        else np.full(poisson, load_spread)
    arrivals = [jobs] + [with_load(jobs, rate * f, seed + k) for k, f in enumerate(factors, start=1)]
    arrivals += [stressed(jobs, rate, seed + 100 + k) for k in range(stress if len(jobs) > 1 else 0)]
    offered = float((jobs["num_gpus"] * jobs["duration_s"]).sum()) / HOUR
    span_h = float(jobs["arrival_s"].max() - jobs["arrival_s"].min()) / HOUR
    summary = {"jobs": len(jobs), "jobs_per_hour": rate, "span_h": span_h, "reference_gpu_hours": offered,
               "draws": len(arrivals), "load_factors": [1.0, *(round(float(f), 4) for f in factors)],
               "stressed_draws": len(arrivals) - 1 - poisson,
               "stress": f"jobs resampled with replacement, those at or above the {TAIL_QUANTILE:.0%} quantile of "
                         f"GPU-hours {TAIL_WEIGHT:g}x as likely, Poisson arrivals at the window's rate"}
    return Workload(jobs, demand_from_trace(jobs), tuple(arrivals), summary)


def stressed(jobs: pd.DataFrame, rate: float, seed: int) -> pd.DataFrame:
    """A stressed bootstrap of `jobs`: as many jobs drawn with replacement, those in the tail of GPU-hours
    (`TAIL_QUANTILE`) `TAIL_WEIGHT` times as likely as the rest (heavier tails, more large jobs), arriving as a
    Poisson process at `rate` jobs per hour (seeded); each copy's id is its job's id, `BOOTSTRAP_SEP` and a number."""
    rng = np.random.default_rng(seed)
    size = (jobs["num_gpus"] * jobs["duration_s"]).to_numpy(float)
    weight = np.where(size >= np.quantile(size, TAIL_QUANTILE), TAIL_WEIGHT, 1.0)
    picked = jobs.iloc[rng.choice(len(jobs), size=len(jobs), p=weight / weight.sum())].reset_index(drop=True)
    picked = picked.assign(job_id=[f"{j}{BOOTSTRAP_SEP}{k}" for k, j in enumerate(picked["job_id"].astype(str))])
    return with_load(picked, rate, seed)


def without_classes(workload: Workload, classes: pd.DataFrame, why: str) -> Workload:
    """The workload without the jobs of `classes` (model, num_gpus), counted in a warning."""
    if classes is None or classes.empty:
        return workload
    drop = set(zip(classes["model"], classes["num_gpus"]))

    def keep(jobs: pd.DataFrame) -> pd.DataFrame:
        return jobs[[(m, n) not in drop for m, n in zip(jobs["model"], jobs["num_gpus"])]].reset_index(drop=True)

    kept = keep(workload.jobs)
    dropped = len(workload.jobs) - len(kept)
    if kept.empty:
        raise ContractError([Problem("<workload>", f"every job of the workload is {why}: nothing to plan for")])
    summary = {**workload.summary, "jobs": len(kept), "dropped_jobs": dropped,
               "reference_gpu_hours": float((kept["num_gpus"] * kept["duration_s"]).sum()) / HOUR}
    warning = f"{dropped} of {len(workload.jobs)} jobs left out of the plan's replays: {why}"
    return Workload(kept, workload.demand, tuple(keep(d) for d in workload.draws), summary,
                    [*workload.warnings, warning])
