"""DAG params (with sane defaults), the assets the DAGs exchange, and the run key that makes tasks idempotent."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any, Mapping

from airflow.sdk import Asset, Param

# The embedded defaults: a real measurement of a built-in CPU workload on this host, at 1 and 2 cores, with
# short windows, reported as the GPU types named here (there is no GPU on the development machines). GPU
# types not measured keep the workspace's (derived) profiles.
DEFAULTS: dict[str, Any] = {
    "workspace": os.environ.get("HETPLAN_WORKSPACE", ".hetplan"),  # deployments set HETPLAN_WORKSPACE
    "budget": 200.0,
    "fleet": "",              # your owned fleet (a CSV path) for the workspace; empty: keep its fleet.csv
    # The workload's source, read every run: a trace file, an http(s) URL of one, or the cluster's job history
    # (allocator:http://HOST:PORT, allocator:/path/allocator.db; while it has no done job, the workspace's trace);
    # empty: keep the workspace's trace.csv. Deployments set HETPLAN_TRACE (docker-compose.yaml: the allocator).
    "trace": os.environ.get("HETPLAN_TRACE", ""),
    "catalog": "",            # node shapes to buy or rent (a CSV path); empty: keep the workspace's catalog.csv
    "objective": "jct",       # the workspace's workload plan: jct | p95-jct | makespan; throughput: its demand mix
    "gpu_types": ["T4"],
    "workload": "token-batch",
    "workloads": {},          # per-GPU-type override of `workload`, e.g. {"L4": "image-pipeline"}
    "cpus": "1,2",
    "mem_gb": "",             # empty: the profiler's default RAM point
    "warmup_s": 2.0,
    "measure_s": 2.0,
    "repeats": 2,
    "models": [],             # empty: fit every model of the profiles; else only these (+ measured ones)
    "keep_gpu_types": [],     # empty: every GPU type; else only these (+ profiled ones)
    "clouds": [],             # empty: every cloud of the catalog
    "solver": "auto",
    "time_limit": 60.0,
    "mlflow_tracking_uri": "",  # empty: $MLFLOW_TRACKING_URI, else sqlite:///<workspace>/mlflow.db
    "kubernetes": {},         # empty: profile on the Airflow workers; else one pod per GPU type (hetplan_airflow.pods)
    "allocator_conn_id": "hetplan_allocator",  # export DAG: the allocator to reload (an Airflow Connection), if set
}

QUEUES_ENV = "HETPLAN_PROFILE_QUEUES"
"""Deployment config, read when the DAG is parsed: the GPU types that have Celery workers of their own, e.g.
`T4,A100-80GB`. Each gets a `profile_gpu_<type>` task on the queue `gpu-<type>`, which only a worker on such a
host consumes (`airflow celery worker --queues gpu-t4`); the other GPU types are profiled by the mapped
`profile` task on the default queue."""

ASSETS = {
    "profiles": Asset(name="hetplan_profiles", uri="file:///hetplan/workspace/profiles"),
    "curves": Asset(name="hetplan_curves", uri="file:///hetplan/workspace/curves"),
    "hints": Asset(name="hetplan_hints", uri="file:///hetplan/workspace/hints"),
}


def nightly_params(**overrides: Any) -> dict[str, Param]:
    """The nightly DAG's params: DEFAULTS (updated by `overrides`) with types and descriptions."""
    values = {**DEFAULTS, **overrides}
    return {
        "workspace": Param(values["workspace"], type="string", description="Workspace directory (hetplan init)."),
        "budget": Param(values["budget"], type="number", minimum=0, description="US$ per hour to rent more with."),
        "fleet": Param(values["fleet"], type="string", description="Your owned fleet (CSV path); empty: the "
                       "workspace's."),
        "trace": Param(values["trace"], type="string", description="Workload source, read every run: trace file, "
                       "URL, allocator:http://HOST:PORT or allocator:/path/allocator.db; empty: the workspace's."),
        "catalog": Param(values["catalog"], type="string", description="Node shapes to buy or rent (CSV path); "
                         "empty: the workspace's."),
        "objective": Param(values["objective"], type="string", enum=["jct", "p95-jct", "makespan", "throughput"],
                           description="Plan the workspace's workload for this (throughput: its demand mix)."),
        "gpu_types": Param(values["gpu_types"], type="array", description="GPU types to profile (one mapped task each)."),
        "workload": Param(values["workload"], type="string", description="Workload to profile: built-in or module:fn."),
        "workloads": Param(values["workloads"], type="object", description="Per-GPU-type workload overrides."),
        "cpus": Param(values["cpus"], type="string", description="Cores per GPU to measure, comma-separated."),
        "mem_gb": Param(values["mem_gb"], type="string", description="RAM per GPU (GiB) to measure; empty: default."),
        "warmup_s": Param(values["warmup_s"], type="number", minimum=0),
        "measure_s": Param(values["measure_s"], type="number", exclusiveMinimum=0),
        "repeats": Param(values["repeats"], type="integer", minimum=1),
        "models": Param(values["models"], type="array", description="Models to fit (empty: all)."),
        "keep_gpu_types": Param(values["keep_gpu_types"], type="array", description="GPU types to fit (empty: all)."),
        "clouds": Param(values["clouds"], type="array", description="Clouds to buy from (empty: all)."),
        "solver": Param(values["solver"], type="string", enum=["auto", "gurobi", "highs"]),
        "time_limit": Param(values["time_limit"], type="number", exclusiveMinimum=0),
        "mlflow_tracking_uri": Param(values["mlflow_tracking_uri"], type="string"),
        "kubernetes": Param(values["kubernetes"], type="object",
                            description="Profile in Kubernetes pods ({}: on the workers); docs/airflow-kubernetes.md."),
    }


def export_params(**overrides: Any) -> dict[str, Param]:
    """The export DAG's params."""
    values = {**DEFAULTS, **overrides}
    return {
        "workspace": Param(values["workspace"], type="string", description="Workspace directory."),
        "allocator_conn_id": Param(values["allocator_conn_id"], type="string",
                                   description="Airflow Connection of the running allocator to tell to reload "
                                               "(URL, token as password); no such connection or empty: none."),
    }


def tracking_uri(params: Mapping[str, Any]) -> str:
    """The MLflow URI a run uses: hetplan's one rule (`hetplan.tracking.tracking_uri`) on the run's params."""
    from hetplan.tracking import tracking_uri as resolve

    return resolve(params.get("mlflow_tracking_uri") or None, workspace=params["workspace"])


def profile_kwargs(params: Mapping[str, Any], gpu_type: str) -> dict[str, Any]:
    """The keyword arguments of `hetplan.pipeline.profile_gpu` for one GPU type, from the nightly DAG's params."""
    return {"workload": params["workloads"].get(gpu_type, params["workload"]), "cpus": params["cpus"],
            "mem_gb": params["mem_gb"] or None, "warmup_s": params["warmup_s"], "measure_s": params["measure_s"],
            "repeats": params["repeats"]}


def run_key(context: Mapping[str, Any]) -> str:
    """The run's logical date (or, for runs without one, when it was due) as a path-safe key."""
    when: datetime | None = context.get("logical_date")
    if when is None:
        when = context["dag_run"].run_after
    return when.strftime("%Y%m%dT%H%M%S")


def profile_queues(value: str | None = None) -> dict[str, str]:
    """GPU type -> its Celery queue, from `value` or $HETPLAN_PROFILE_QUEUES (empty: none)."""
    from hetplan.gpus import gpu_label

    raw = os.environ.get(QUEUES_ENV, "") if value is None else value
    types = dict.fromkeys(gpu_label(t.strip()) for t in raw.split(",") if t.strip())
    return {t: "gpu-" + "".join(c if c.isalnum() else "-" for c in t.lower()) for t in types}
