"""hetplan's nightly pipeline: profile each GPU type (mapped) -> fit (MLflow) -> plan -> publish the hints.

Each task calls one function of `hetplan.pipeline` on files under `<workspace>/runs/<logical date>/`, so
retries and re-runs rewrite the same files. A GPU type whose profiling fails falls back to its last good
profiles and is listed in the plan's `stale_gpu_types`; the hints asset is emitted only when publishing
succeeds, which schedules `hetplan_publish` (Kueue export, allocator reload).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import dag, task
from hetplan_airflow import ASSETS, nightly_params, run_key
from hetplan_airflow.config import tracking_uri


@dag(
    dag_id="hetplan_nightly",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params=nightly_params(),
    default_args={"retries": 2, "retry_delay": timedelta(minutes=2)},
    tags=["hetplan"],
    doc_md=__doc__,
)
def hetplan_nightly():
    @task
    def resolve(params=None) -> list[str]:
        """Seed the workspace if empty; the GPU types to profile, one mapped task each."""
        from hetplan.gpus import normalize_gpu
        from hetplan.pipeline import prepare

        prepare(params["workspace"])
        return [normalize_gpu(g) for g in params["gpu_types"]]

    @task(map_index_template="{{ task.op_kwargs['gpu_type'] }}")
    def profile(gpu_type: str, params=None, **context) -> dict:
        from hetplan.pipeline import profile_gpu

        workload = params["workloads"].get(gpu_type, params["workload"])
        return profile_gpu(params["workspace"], run_key(context), gpu_type, workload, cpus=params["cpus"],
                           mem_gb=params["mem_gb"] or None, warmup_s=params["warmup_s"],
                           measure_s=params["measure_s"], repeats=params["repeats"])

    @task(trigger_rule="all_done", outlets=[ASSETS["profiles"], ASSETS["curves"]])
    def fit(gpu_types: list[str], params=None, **context) -> dict:
        """Runs even when a profiling task failed for good: that type is then stale (last good profiles)."""
        from hetplan.pipeline import fit_step

        return fit_step(params["workspace"], run_key(context), gpu_types, models=params["models"],
                        keep_gpu_types=params["keep_gpu_types"], tracking_uri=tracking_uri(params))

    @task
    def plan(fitted: dict, params=None, **context) -> dict:
        from hetplan.pipeline import plan_step

        return plan_step(params["workspace"], run_key(context), budget=params["budget"],
                         stale_gpu_types=fitted["stale_gpu_types"], clouds=params["clouds"],
                         solver=params["solver"], time_limit=params["time_limit"], tracking_uri=tracking_uri(params))

    @task(outlets=[ASSETS["hints"]])
    def publish(planned: dict, params=None, outlet_events=None, **context) -> dict:
        from hetplan.pipeline import publish_step

        published = publish_step(params["workspace"], run_key(context))
        outlet_events[ASSETS["hints"]].extra = {"workspace": str(Path(params["workspace"]).resolve()),
                                                "version": published["version"]}
        return published

    gpu_types = resolve()
    profiled = profile.expand(gpu_type=gpu_types)
    fitted = fit(gpu_types)
    profiled >> fitted
    publish(plan(fitted))


hetplan_nightly()
