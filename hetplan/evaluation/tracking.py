"""Record an evaluation in MLflow (experiment `hetplan-evaluation`): settings, per-run metrics, tables and plots."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import mlflow

from hetplan.evaluation.evaluate import EvaluationResult
from hetplan.tracking import experiment_id, tracking_uri

EXPERIMENT = "hetplan-evaluation"
METRICS = ("avg_jct_h", "p95_jct_h", "p99_jct_h", "makespan_h", "gpu_util", "cpu_util", "work_per_dollar",
           "jct_speedup", "predicted_jct_speedup", "predicted_low", "predicted_high", "realised_over_predicted",
           "work_per_dollar_ratio")
ELASTIC_METRICS = ("restarts_per_job", "restart_waste_share", "elastic_avg_jct_h", "elastic_p95_jct_h",
                   "elastic_restarts_per_job", "elastic_restart_waste_share", "elastic_jct_ratio")
"""Logged where the evaluation was elastic (`hetplan.evaluation.evaluate.ELASTIC_COLUMNS`)."""


def metric_prefix(rho: float, load: float, scheduler: str, setup: str) -> str:
    """`<setup>.<scheduler>.<load>` with MLflow-safe characters, e.g. `status_quo.las.trace`, `hetplan.fifo.8jph`,
    `hetplan.las.rho1.3`."""
    where = f"rho{rho:g}" if not math.isnan(rho) else ("trace" if math.isnan(load) else f"{load:g}jph")
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{setup}.{scheduler}.{where}")


def log_evaluation_run(result: EvaluationResult, params: dict[str, Any], files: list[Path],
                       uri: str | None = None) -> str:
    """Log one evaluation with its files (summary, per-job table, report, plots); return the run id."""
    uri = tracking_uri(uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=experiment_id(uri, EXPERIMENT))
    metrics = {}
    names = METRICS + tuple(m for m in ELASTIC_METRICS if m in result.summary)
    for row in result.summary.itertuples():
        prefix = metric_prefix(row.rho, row.load_jobs_per_h, row.scheduler, row.setup)
        metrics.update({f"{prefix}.{name}": float(getattr(row, name)) for name in names
                        if math.isfinite(float(getattr(row, name)))})
    with mlflow.start_run(run_name=f"evaluate-{params.get('budget')}") as run:
        mlflow.log_params(params)
        mlflow.log_metrics(metrics)
        for path in files:
            mlflow.log_artifact(str(path))
        return run.info.run_id
