"""hetplan's publish follow-up, scheduled on the hints asset: export the Kueue YAML of the published hint
table to `<workspace>/exports/<version>/kueue.yaml` and, when the Airflow Connection `allocator_conn_id`
(default `hetplan_allocator`) exists, tell that running allocator to reload (`POST /v1/hints/reload`).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import dag, task
from airflow.sdk.exceptions import AirflowNotFoundException
from hetplan_airflow import ASSETS, AllocatorHook, export_params


@dag(
    dag_id="hetplan_publish",
    schedule=[ASSETS["hints"]],
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    params=export_params(),
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "execution_timeout": timedelta(minutes=10)},
    dagrun_timeout=timedelta(minutes=30),
    tags=["hetplan"],
    doc_md=__doc__,
)
def hetplan_publish():
    @task(execution_timeout=timedelta(minutes=5))
    def export(params=None, triggering_asset_events=None) -> dict:
        """The version the triggering event names (else the store's LATEST), exported as Kueue YAML."""
        from hetplan.pipeline import export_kueue

        workspace, version = params["workspace"], None
        for events in (triggering_asset_events or {}).values():
            for event in events:
                workspace = event.extra.get("workspace", workspace)
                version = event.extra.get("version", version)
        return export_kueue(workspace, version)

    @task(execution_timeout=timedelta(minutes=2))
    def reload(exported: dict, params=None) -> dict:
        conn_id = params["allocator_conn_id"]
        if not conn_id:
            return {"reloaded": False, "version": exported["version"]}
        hook = AllocatorHook(conn_id)
        try:
            hook.get_connection(conn_id)
        except AirflowNotFoundException:
            return {"reloaded": False, "version": exported["version"], "reason": f"no connection {conn_id!r}"}
        reply = hook.reload_hints()
        return {"reloaded": True, "version": exported["version"], "reply": reply}

    reload(export())


hetplan_publish()
