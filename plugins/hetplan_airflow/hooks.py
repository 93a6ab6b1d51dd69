"""The hook for the running hetplan allocator: ask it to reload the published hint table.

The allocator's URL and admin token live in an Airflow Connection (default id `hetplan_allocator`, type
`http`: host, port, schema; the token as the password), not in DAG params, so the token stays out of run
conf and the UI. Set it like any connection, e.g.
`AIRFLOW_CONN_HETPLAN_ALLOCATOR='{"conn_type": "http", "host": "allocator", "port": 8080, "password": "..."}'`.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.http.hooks.http import HttpHook

ALLOCATOR_CONN_ID = "hetplan_allocator"


class AllocatorHook(HttpHook):
    """`POST /v1/hints/reload` on the allocator the connection names, with its password as bearer token."""

    default_conn_name = ALLOCATOR_CONN_ID
    hook_name = "hetplan allocator"

    def __init__(self, http_conn_id: str = ALLOCATOR_CONN_ID, timeout_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(method="POST", http_conn_id=http_conn_id, **kwargs)
        self.timeout_s = timeout_s

    def reload_hints(self) -> dict:
        token = self.get_connection(self.http_conn_id).password
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        response = self.run("/v1/hints/reload", data="{}", headers=headers, extra_options={"timeout": self.timeout_s})
        return response.json() if response.content else {}
