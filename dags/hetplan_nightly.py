"""hetplan's nightly pipeline: profile each GPU type (mapped) -> fit (MLflow) -> plan -> publish the hints -> report.

`resolve` seeds the workspace and reads its workload from the `trace` param's source every run: a trace file, a
URL, or the cluster's own job history (`allocator:http://HOST:PORT`), so each night plans what the cluster ran.

Planning for the workspace's workload runs as three tasks: `shortlist` (propose and screen the candidates),
`replay` (mapped: one task instance per replay run, a candidate on an arrival draw) and `choose` (the plan).

Each task calls one function of `hetplan.pipeline` on files under `<workspace>/runs/<logical date>/`, so
retries and re-runs rewrite the same files. A GPU type is profiled by the `profile` task on a worker, or, for
the types the `kubernetes` param sends to pods, by `profile_pod` in a pod on a node of that type (the same
step, `python -m hetplan.cli.nightly profile-gpu`, on the shared workspace; docs/airflow-kubernetes.md); an
empty list skips that task. A GPU type whose profiling fails, or whose pod never finishes, falls back to its
last good profiles and is listed in the plan's `stale_gpu_types`; the hints asset is emitted only when
publishing succeeds, which schedules `hetplan_publish` (Kueue export, allocator reload).

GPU types listed in $HETPLAN_PROFILE_QUEUES when the DAG is parsed get a `profile_gpu_<type>` task each on the
Celery queue `gpu-<type>`, so only a worker on a host with that GPU profiles it (docker-compose.yaml starts
one per queue); a run that does not profile that type skips its task.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow.sdk import dag, task
from airflow.sdk.exceptions import AirflowSkipException
from hetplan_airflow import ASSETS, nightly_params, run_key
from hetplan_airflow.config import profile_kwargs, profile_queues, tracking_uri
from hetplan_airflow.operators import ProfilePodOperator
from hetplan_airflow.pods import POD_MAP_INDEX_TEMPLATE, profiled_gpu_types, profiling_plan


@dag(
    dag_id="hetplan_nightly",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),  # aware: a naive date means the server's zone
    catchup=False,
    max_active_runs=1,
    params=nightly_params(),
    # A hung profiling run or solver must not hold the night: each task has a limit, the run as a whole too.
    default_args={"retries": 2, "retry_delay": timedelta(minutes=2), "execution_timeout": timedelta(hours=1)},
    dagrun_timeout=timedelta(hours=6),
    tags=["hetplan"],
    doc_md=__doc__,
)
def hetplan_nightly():
    queues = profile_queues()

    @task
    def resolve(params=None, **context) -> list[str]:
        """Seed the workspace (your fleet/trace/catalog params, else defaults) and read the workload from its
        source; the GPU types profiled on the default queue, one mapped `profile` each."""
        from hetplan.pipeline import prepare

        prepare(params["workspace"], fleet=params["fleet"], trace=params["trace"], catalog=params["catalog"])
        return profiling_plan(params, run_key(context), queued=queues)["local"]

    @task
    def pod_specs(params=None, **context) -> list[dict]:
        """The kwargs of one mapped `profile_pod` per GPU type profiled in Kubernetes (none without a target)."""
        return profiling_plan(params, run_key(context))["pods"]

    @task(map_index_template="{{ task.op_kwargs['gpu_type'] }}")
    def profile(gpu_type: str, params=None, **context) -> dict:
        from hetplan.pipeline import profile_gpu

        return profile_gpu(params["workspace"], run_key(context), gpu_type, **profile_kwargs(params, gpu_type))

    def on_queue(gpu_type: str, queue: str):
        @task(task_id=f"profile_{queue.replace('-', '_')}", queue=queue)
        def profile_on_queue(params=None, **context) -> dict:
            """Profile one GPU type on the queue only workers with that GPU consume."""
            if gpu_type not in profiling_plan(params, run_key(context), queued=queues)["queued"]:
                raise AirflowSkipException(f"{gpu_type} is not among this run's gpu_types")
            from hetplan.pipeline import profile_gpu

            return profile_gpu(params["workspace"], run_key(context), gpu_type, **profile_kwargs(params, gpu_type))

        return profile_on_queue

    @task(trigger_rule="all_done", outlets=[ASSETS["profiles"], ASSETS["curves"]])
    def fit(local: list[str], pods: list[dict], params=None, **context) -> dict:
        """Runs even when a profiling task or pod failed for good: that type is then stale (last good profiles)."""
        from hetplan.pipeline import fit_step

        queued = profiling_plan(params, run_key(context), queued=queues)["queued"]
        return fit_step(params["workspace"], run_key(context), profiled_gpu_types(local, pods, queued),
                        models=params["models"], keep_gpu_types=params["keep_gpu_types"],
                        tracking_uri=tracking_uri(params))

    @task
    def shortlist(fitted: dict, params=None, **context) -> list[list[int]]:
        """The replay runs ([candidate, draw]) of the shortlisted candidates; none without a workload."""
        from hetplan.pipeline import shortlist_step

        return shortlist_step(params["workspace"], run_key(context), budget=params["budget"],
                              objective=params["objective"], clouds=params["clouds"], solver=params["solver"],
                              time_limit=params["time_limit"])

    @task(map_index_template="{{ task.op_kwargs['run'] }}")
    def replay(run: list[int], params=None, **context) -> str:
        from hetplan.pipeline import replay_step

        return replay_step(params["workspace"], run_key(context), run)

    @task(trigger_rule="none_failed")  # zero replay runs (no workload) skip `replay`, not the plan
    def choose(fitted: dict, params=None, **context) -> dict:
        from hetplan.pipeline import choose_step

        return choose_step(params["workspace"], run_key(context), budget=params["budget"],
                           objective=params["objective"], stale_gpu_types=fitted["stale_gpu_types"],
                           clouds=params["clouds"], solver=params["solver"], time_limit=params["time_limit"],
                           tracking_uri=tracking_uri(params))

    @task(outlets=[ASSETS["hints"]])
    def publish(planned: dict, params=None, outlet_events=None, **context) -> dict:
        from hetplan.pipeline import publish_step

        published = publish_step(params["workspace"], run_key(context))
        outlet_events[ASSETS["hints"]].extra = {"workspace": str(Path(params["workspace"]).resolve()),
                                                "version": published["version"]}
        return published

    @task
    def report(planned: dict, published: dict, params=None, **context) -> dict:
        """The one-page report of the published run (`<workspace>/report/report.html`), also in MLflow."""
        from hetplan.pipeline import report_step

        return report_step(params["workspace"], run_key(context), planned["mlflow_run"],
                           tracking_uri=tracking_uri(params))

    local, pods = resolve(), pod_specs()
    profiled = profile.expand(gpu_type=local)
    profiled_in_pods = ProfilePodOperator.partial(task_id="profile_pod", map_index_template=POD_MAP_INDEX_TEMPLATE
                                                  ).expand_kwargs(pods)
    profiled_on_queues = [on_queue(gpu_type, queue)() for gpu_type, queue in queues.items()]
    fitted = fit(local, pods)
    local >> profiled_on_queues  # after the workspace is seeded
    [profiled, profiled_in_pods, *profiled_on_queues] >> fitted
    replayed = replay.expand(run=shortlist(fitted))
    planned = choose(fitted)
    replayed >> planned
    report(planned, publish(planned))


hetplan_nightly()
