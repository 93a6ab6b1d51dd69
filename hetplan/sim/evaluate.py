"""Four-way evaluation: plan the setups once, then simulate each on the same workload per load and scheduler.

The planner sees the fitted curves and the trace's demand mix; the simulator advances jobs by the truth
curves. Ratios are against the status quo of the same load and scheduler: `jct_speedup` = status quo's
average JCT / this setup's (above 1 is better), `work_per_dollar_ratio` = this setup's work per dollar /
status quo's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from hetplan.contracts import demand_from_trace
from hetplan.planner import build_problem
from hetplan.planner.baselines import STATUS_QUO
from hetplan.planner.entry import plan_with_baselines
from hetplan.planner.solvers import SolverName
from hetplan.sim.engine import SimConfig, simulate
from hetplan.sim.metrics import summarize
from hetplan.sim.setups import Setup, build_setups
from hetplan.sim.truth import FITTED_FALLBACK, TruthCurves
from hetplan.sim.workload import MIX, prepare_workload

Progress = Callable[[int, int, str], None]
"""Called before each run with (runs done, runs in all, what runs next)."""


@dataclass
class EvaluationResult:
    summary: pd.DataFrame  # one row per (load, scheduler, setup)
    jobs: pd.DataFrame  # one row per job and run, keyed by load, scheduler, setup
    timelines: pd.DataFrame  # resource use over time per run
    setups: list[Setup]
    report: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def plan_setups(jobs: pd.DataFrame, catalog: pd.DataFrame, curves: pd.DataFrame, budget: float,
                fairness: float = 1.0, solver: SolverName = "auto",
                time_limit: float = 60.0) -> tuple[list[Setup], list[str], pd.DataFrame]:
    """Plan hetplan and its baselines for the workload's demand mix under `budget`; the four setups.

    `fairness` is the planner's floor (each class gets at least this fraction of its share of the normalised
    throughput); the default 1 plans for the trace's own mix, which the replay will ask every setup to serve.
    """
    demand = demand_from_trace(jobs.assign(model=jobs["sim_model"]))
    problem = build_problem(curves, catalog, demand, budget)
    planned = plan_with_baselines(problem, solver=solver, time_limit=time_limit)
    return (build_setups(problem.shapes, problem.defaults.curves, problem.classes, planned.result, planned.baselines),
            list(problem.warnings), problem.defaults.curves)


def evaluate(trace: pd.DataFrame, catalog: pd.DataFrame, curves: pd.DataFrame, truth: TruthCurves, budget: float, *,
             schedulers: Sequence[str] = ("las",), loads: Sequence[float | None] = (None,),
             unknown_model: str = MIX, seed: int = 0, round_s: float = 300.0, fairness: float = 1.0,
             solver: SolverName = "auto", time_limit: float = 60.0,
             progress: Progress | None = None) -> EvaluationResult:
    """Simulate the four setups on `trace` for every (load, scheduler); see the module docstring."""
    base = prepare_workload(trace, truth.models, unknown_model, seed)
    setups, warnings, planned_curves = plan_setups(base.jobs, catalog, curves, budget, fairness, solver, time_limit)
    truth = truth.extended(planned_curves)
    warnings = base.warnings + warnings + truth_warnings(truth, set(base.jobs["sim_model"]), setups)
    if all(s.name != STATUS_QUO for s in setups):
        warnings.append(f"no affordable, available shape can run every job class: no status quo at {budget:g} $/h, "
                        f"so no ratios")
    truth.require(base.jobs["sim_model"], {n.gpu_type for setup in setups for n in setup.nodes})  # before any run
    rows, job_frames, timelines = [], [], []
    total, done = len(loads) * len(schedulers) * len(setups), 0
    for load in loads:
        workload = base if load is None else prepare_workload(trace, truth.models, unknown_model, seed, load)
        if load is not None:
            warnings.append(workload.warnings[-1])
        for scheduler in schedulers:
            config = SimConfig(scheduler, round_s)  # type: ignore[arg-type]
            for setup in setups:
                if progress:
                    progress(done, total, f"{setup.name} | {scheduler} | load {load or 'trace'}")
                done += 1
                result = simulate(workload.jobs, setup.nodes, truth, setup.policy, setup.hints, config)
                key = {"load_jobs_per_h": float("nan") if load is None else float(load), "scheduler": scheduler,
                       "setup": setup.name}
                rows.append({**key, "policy": setup.policy, "gpus": setup.gpus, "cost_per_hour": setup.cost_per_hour,
                             "predicted_throughput": setup.predicted_throughput,
                             **summarize(result, setup.cost_per_hour)})
                job_frames.append(result.jobs.assign(**key))
                timelines.append(result.timeline.assign(**key))
    summary = with_ratios(pd.DataFrame(rows))
    rejected = summary.groupby("setup", sort=False)["rejected_too_big"].max()
    for name, count in rejected[rejected > 0].items():
        warnings.append(f"{name}: {count} jobs need more GPUs than any of its nodes has and are rejected there; "
                        f"its JCT and work ratios cover fewer jobs than the status quo's")
    return EvaluationResult(summary, pd.concat(job_frames, ignore_index=True),
                            pd.concat(timelines, ignore_index=True), setups, dict(base.report), warnings)


def truth_warnings(truth: TruthCurves, models: set[str], setups: list[Setup]) -> list[str]:
    """Where the truth cannot show model error (fitted curves standing in) or has no throughput at all."""
    gpu_types = {n.gpu_type for setup in setups for n in setup.nodes}
    fallback = sorted(f"{m} on {g}" for (m, g), grid in truth.grids.items()
                      if m in models and g in gpu_types and grid.source == FITTED_FALLBACK)
    out = []
    if fallback:
        out.append(f"{len(fallback)} truth curves are the fitted curves (no profiles): model error cannot show "
                   f"there ({', '.join(fallback[:6])}{', ...' if len(fallback) > 6 else ''})")
    if truth.gaps:
        out.append(f"{len(truth.gaps)} truth grid cells have no throughput ({', '.join(truth.gaps[:3])}"
                   f"{', ...' if len(truth.gaps) > 3 else ''}): a job granted such a share stops the simulation")
    return out


def with_ratios(summary: pd.DataFrame) -> pd.DataFrame:
    """Add `jct_speedup` and `work_per_dollar_ratio` against the status quo of the same load and scheduler."""
    keys = list(zip(summary["load_jobs_per_h"].fillna(-1.0), summary["scheduler"]))
    base = {k: (jct, wpd) for k, jct, wpd, name in zip(keys, summary["avg_jct_h"], summary["work_per_dollar"],
                                                         summary["setup"]) if name == STATUS_QUO}
    nan = (float("nan"), float("nan"))
    return summary.assign(
        jct_speedup=[base.get(k, nan)[0] / jct for k, jct in zip(keys, summary["avg_jct_h"])],
        work_per_dollar_ratio=[wpd / base.get(k, nan)[1] if base.get(k, nan)[1] > 0 else float("nan")
                               for k, wpd in zip(keys, summary["work_per_dollar"])])
