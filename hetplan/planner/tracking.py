"""Record a planning run in MLflow (experiment `hetplan-planning`): metrics, the plan, hints and plots."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import mlflow

from hetplan.planner.planner import MilpPlan
from hetplan.tracking import experiment_id, tracking_uri

EXPERIMENT = "hetplan-planning"


def log_planning_run(result: MilpPlan, files: list[Path], baselines: dict[str, float], uri: str | None = None,
                     metrics: dict[str, float] | None = None) -> str:
    """Log one plan with its artifacts (`files`: plan, hints, plots, Kueue YAML) and extra `metrics` (a
    workload plan's predicted JCTs); return the run id."""
    uri = tracking_uri(uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=experiment_id(uri, EXPERIMENT))
    plan = result.plan
    with mlflow.start_run(run_name=plan.plan_id) as run:
        mlflow.set_tags({"plan_id": plan.plan_id, "solver": plan.solver})
        mlflow.log_params({"budget_per_hour": plan.budget_per_hour, "solver": plan.solver,
                           "objective_kind": plan.objective_kind,
                           "workload_objective": (plan.planning or {}).get("objective"),
                           **{f"input.{k}": v for k, v in plan.inputs.items()}})
        mlflow.log_metrics({"objective": plan.objective, "lp_bound": plan.lp_bound, "gap": plan.gap,
                            "cost_per_hour": plan.cost_per_hour, "solve_seconds": plan.solve_seconds,
                            "per_dollar": result.per_dollar,
                            **{"baseline." + re.sub(r"[^A-Za-z0-9_.-]+", "_", k): v for k, v in baselines.items()},
                            **(metrics or {})})
        for path in files:
            mlflow.log_artifact(str(path))
        with tempfile.TemporaryDirectory() as tmp:
            allocation = Path(tmp) / "allocation.csv"
            result.allocation.to_csv(allocation, index=False)
            mlflow.log_artifact(str(allocation))
        return run.info.run_id
