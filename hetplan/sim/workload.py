"""Turn a trace into the simulator's workload: truth models for every job, and optionally a new load.

Nothing is dropped silently: every job whose model the truth lacks is mapped (to a stated class, or to a
truth model drawn at random with a seed when `unknown_model="mix"`), and the report counts it.
Bad times never get this far: the trace contract rejects negative arrivals and non-positive durations.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from hetplan.contracts import TRACE
from hetplan.contracts.table import ContractError, Problem
from hetplan.contracts.trace import elastic_defaults

MIX = "mix"
"""`unknown_model` value: assign each job of an unknown model a truth model uniformly at random (seeded)."""


@dataclass(frozen=True)
class Workload:
    """Jobs ready to simulate: the trace's columns (the elastic ones filled: rigid jobs get min = max = num_gpus) plus
    `sim_model`, the truth model the job runs as."""

    jobs: pd.DataFrame
    report: dict[str, int]
    warnings: list[str] = field(default_factory=list)


def prepare_workload(trace: pd.DataFrame, truth_models: Collection[str], unknown_model: str = MIX,
                     seed: int = 0, load: float | None = None) -> Workload:
    """Map the trace's models onto truth models and, with `load` (jobs per hour), draw new arrival times."""
    trace = TRACE.validate(trace, "<trace>")
    models = sorted(truth_models)
    if unknown_model != MIX and unknown_model not in truth_models:
        raise ContractError([Problem("--unknown-model", f"{unknown_model!r} is not a truth model; one of "
                                     f"{', '.join(models)} or {MIX!r}")])
    by_fold = {m.casefold(): m for m in models}
    sim_model = trace["model"].map(lambda m: by_fold.get(str(m).strip().casefold()))
    if "application" in trace:  # a Sia import keeps Sia's model name: a truth keyed by Sia's names reads it
        sim_model = sim_model.fillna(trace["application"].map(lambda m: by_fold.get(str(m).strip().casefold())))
    unknown = sim_model.isna()
    report = {"jobs": len(trace), "mapped_unknown_model": int(unknown.sum())}
    warnings = []
    if unknown.any():
        names = ", ".join(sorted(set(trace.loc[unknown, "model"])))
        if unknown_model == MIX:
            rng = np.random.default_rng(seed)
            sim_model[unknown] = rng.choice(models, size=int(unknown.sum()))
            how = f"a truth model drawn at random (seed {seed})"
        else:
            sim_model[unknown] = unknown_model
            how = unknown_model
        warnings.append(f"{int(unknown.sum())} jobs of models without truth curves ({names}) run as {how}")
    trace, elastic_warnings = elastic_defaults(trace)  # carried for elastic scheduling; the simulator reads none yet
    warnings += elastic_warnings
    jobs = trace.assign(sim_model=sim_model.astype(str))
    if load is not None:
        jobs = with_load(jobs, load, seed)
        warnings.append(f"arrivals redrawn as a Poisson process of {load:g} jobs/h (seed {seed}), trace order kept")
    return Workload(jobs.reset_index(drop=True), report, warnings)


def with_load(jobs: pd.DataFrame, jobs_per_hour: float, seed: int = 0) -> pd.DataFrame:
    """The same jobs in their arrival order, arriving as a Poisson process of `jobs_per_hour` from t = 0."""
    if not jobs_per_hour > 0:
        raise ContractError([Problem("--load", f"must be a positive number of jobs per hour, got {jobs_per_hour}")])
    ordered = jobs.sort_values(["arrival_s"], kind="stable").reset_index(drop=True)
    gaps = np.random.default_rng(seed).exponential(3600.0 / jobs_per_hour, size=len(ordered))
    gaps[0] = 0.0
    return ordered.assign(arrival_s=np.cumsum(gaps))

