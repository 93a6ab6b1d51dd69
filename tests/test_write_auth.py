"""Allocator writes authenticated (issue 33 item 6): with a write token configured, `POST /v1/allocate`, `/v1/release`
and `/v1/adopt` need `Authorization: Bearer` with it (or the admin token); reads stay open; admin routes take the
admin token only. The real app in process (FastAPI's TestClient) and the controller's own client."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from hetplan.allocator import Allocator, Node
from hetplan.allocator.k8s.service_client import AllocatorClient
from hetplan.allocator.service import ServiceSettings, create_app

WRITE, ADMIN = "write-3c1e", "admin-77b0"
NODES = [Node("gpu-a", "T4", 4, 32, 128)]
BODIES = {"/v1/allocate": {"job_id": "ml/p1", "model": "res50", "num_gpus": 1},
          "/v1/adopt": {"job_id": "ml/p2", "model": "res50", "num_gpus": 1, "cpus": 2, "node": "gpu-a"},
          "/v1/release": {"job_id": "ml/p1"}}


@pytest.fixture
def client():
    app = create_app(ServiceSettings(token=ADMIN, write_token=WRITE, tick_seconds=0),
                     allocator=Allocator(NODES, "first-fit"))
    with TestClient(app) as c:
        yield c


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("token,status", [(None, 401), ("wrong", 401), (WRITE, 200), (ADMIN, 200)])
def test_every_write_needs_the_write_or_admin_token(client, path, token, status):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = client.post(path, json=BODIES[path], headers=headers)
    assert answer.status_code == status, answer.text
    if status == 401:
        assert answer.headers["www-authenticate"] == "Bearer" and "write token" in answer.json()["detail"]


def test_reads_stay_open_and_admin_routes_take_the_admin_token_only(client):
    assert client.get("/v1/allocations").status_code == 200 and client.get("/v1/actions").status_code == 200
    assert client.post("/v1/actions/tick", headers={"Authorization": f"Bearer {WRITE}"}).status_code == 401
    assert client.post("/v1/actions/tick", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200


def test_without_a_write_token_writes_are_open():
    app = create_app(ServiceSettings(tick_seconds=0), allocator=Allocator(NODES, "first-fit"))
    with TestClient(app) as c:
        assert c.post("/v1/allocate", json=BODIES["/v1/allocate"]).status_code == 200


def test_the_controllers_client_sends_the_token(client):
    assert AllocatorClient(http=client, token=WRITE).allocate(BODIES["/v1/allocate"])["status"] == "allocated"
    assert AllocatorClient(http=client, token=WRITE).adopt(BODIES["/v1/adopt"])["allocation"]["node"] == "gpu-a"
    with pytest.raises(Exception, match="401"):
        AllocatorClient(http=client).release("ml/p1")
