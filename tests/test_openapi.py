"""The service against its own OpenAPI schema (issue 15 item 4): schemathesis sends valid and invalid requests to
every operation of the real ASGI app, in process, and checks every answer: no server error, a documented status
code and content type, a body of the documented schema. Admin operations are called as generated (no or a random
bearer token: 401) and with the token; an app started without a token answers them 403."""

from __future__ import annotations

import json

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance, response_schema_conformance, status_code_conformance,
)

from allocator_helpers import hints_frame, make_plan
from hetplan.allocator.service import ServiceSettings, create_app
from hetplan.hints import HintStore
from servers import TOKEN

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
NODES = [{"name": "v100-a", "gpu_type": "V100", "gpus": 8, "cpus": 64, "mem_gb": 488},
         {"name": "a100-a", "gpu_type": "A100-80GB", "gpus": 8, "cpus": 96, "mem_gb": 1152},
         {"name": "t4-a", "gpu_type": "T4", "gpus": 4, "cpus": 48, "mem_gb": 192, "labels": {"pool": "small"}}]


@pytest.fixture(scope="module", params=[TOKEN, None], ids=["token", "no-token"])
def app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    """The service on a fresh SQLite database, a published hint table and a few nodes, one per token setting. Its
    state carries over from operation to operation (GET /v1/allocations lists what allocate placed); schemathesis
    ends its lifespan after each test and starts it again on the next request (the allocator reopens the database)."""
    root = tmp_path_factory.mktemp("openapi")
    HintStore(root / "store").publish(make_plan("p1"), hints_frame("p1"))
    (root / "nodes.json").write_text(json.dumps(NODES))
    return create_app(ServiceSettings(db=root / "allocator.db", store=root / "store", nodes=root / "nodes.json",
                                      token=request.param, tick_seconds=0, synchronous="NORMAL"))


# The document does not depend on the settings, so it is read from an app that never starts; each call goes to the
# fixture's app. (`schemathesis.pytest.from_fixture` would read it from the fixture, but fails on pytest 9.2.)
SPEC = create_app().openapi()
schema = schemathesis.openapi.from_dict(SPEC)
schema.config.seed = 15  # reproducible runs; the examples still differ per operation
schema.config.generation.update(modes=list(schemathesis.GenerationMode))  # positive and negative


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_every_answer_is_documented(app: FastAPI, case: schemathesis.Case) -> None:
    case.call_and_validate(app=app, checks=CHECKS)
    if "admin" in case.operation.tags:
        case.call_and_validate(app=app, headers=ADMIN, checks=CHECKS)


def test_every_post_documents_the_body_limit_and_every_admin_route_the_token_check() -> None:
    """What the run does not reach: bodies over the limit (413), and 401/403 documented on every admin route."""
    for path, operations in SPEC["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert method != "post" or {"400", "413"} <= codes, (method, path, codes)
            assert "admin" not in operation["tags"] or {"401", "403"} <= codes, (method, path, codes)
