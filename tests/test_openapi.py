"""The service against its own OpenAPI schema (issue 15 item 4): schemathesis sends valid and invalid requests to
every operation of the real ASGI app, in process, and checks every answer: no server error, a documented status
code and content type, a body of the documented schema. Admin operations are called as generated (no or a random
bearer token: 401) and with the token; an app started without a token answers them 403 (401 without credentials).
Every schemathesis check runs."""

from __future__ import annotations

import json

import pytest
import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from allocator_helpers import hints_frame, make_plan
from hetplan.allocator.service import ServiceSettings, create_app
from hetplan.allocator.service.bodies import JOB_ID_FORMAT, NAME_FORMAT
from hetplan.hints import HintStore
from servers import TOKEN

ADMIN = {"Authorization": f"Bearer {TOKEN}"}
WRITES = {"/v1/allocate", "/v1/release", "/v1/adopt"}  # with a write token configured, they need it (401)
NODES = [{"name": "v100-a", "gpu_type": "V100", "gpus": 8, "cpus": 64, "mem_gb": 488},
         {"name": "a100-a", "gpu_type": "A100-80GB", "gpus": 8, "cpus": 96, "mem_gb": 1152},
         {"name": "t4-a", "gpu_type": "T4", "gpus": 4, "cpus": 48, "mem_gb": 192, "labels": {"pool": "small"}}]


class CurrentApp:
    """The schema's ASGI app: forwards to the fixture's app of the moment, so that the requests schemathesis' own
    checks send (ignored_auth's probes without credentials) reach the same service as the case's."""

    app: FastAPI | None = None

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        assert self.app is not None
        await self.app(scope, receive, send)


CURRENT = CurrentApp()


@pytest.fixture(scope="module", params=[TOKEN, None], ids=["token", "no-token"])
def app(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    """The service on a fresh SQLite database, a published hint table and a few nodes, one per token setting. Its
    state carries over from operation to operation (GET /v1/allocations lists what allocate placed); schemathesis
    ends its lifespan after each test and starts it again on the next request (the allocator reopens the database)."""
    root = tmp_path_factory.mktemp("openapi")
    HintStore(root / "store").publish(make_plan("p1"), hints_frame("p1"))
    (root / "nodes.json").write_text(json.dumps(NODES))
    CURRENT.app = create_app(ServiceSettings(db=root / "allocator.db", store=root / "store",
                                             nodes=root / "nodes.json", token=request.param,
                                             write_token=request.param, tick_seconds=0,
                                             synchronous="NORMAL"))
    return CURRENT.app


# The document does not depend on the settings, so it is read from an app that never starts; each call goes to the
# fixture's app. (`schemathesis.pytest.from_fixture` would read it from the fixture, but fails on pytest 9.2.)
SPEC = create_app().openapi()
# names: printable (spec.check_name); the schema's pattern uses \p{C} and \p{Z}, which the generator cannot read
NAMES = st.text(st.characters(categories=("L", "M", "N", "P", "S"), codec="utf-8") | st.just(" "), min_size=1,
                max_size=40).filter(lambda name: name.isprintable() and name.strip(" ") == name)
schemathesis.openapi.format(NAME_FORMAT, NAMES)
schemathesis.openapi.format(JOB_ID_FORMAT, NAMES.filter(lambda name: "#" not in name))  # spec.check_job_id
schema = schemathesis.openapi.from_dict(SPEC)
schema.app = CURRENT
schema.config.seed = 15  # reproducible runs; the examples still differ per operation
schema.config.generation.update(modes=list(schemathesis.GenerationMode))  # positive and negative
# a valid `since` the log has moved past (or never reached) is 410 Gone, like 404/409 an answer about the state
ACCEPTED = schema.config.checks.positive_data_acceptance
ACCEPTED.expected_statuses = [*ACCEPTED.expected_statuses, "410"]


@schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_every_answer_is_documented(app: FastAPI, case: schemathesis.Case) -> None:
    """Every check schemathesis has (no `checks=`: all of them, negative data rejection, positive data acceptance,
    status codes, content types, response schemas and headers, missing auth, ignored auth, Allow headers...).

    The extender's bodies are Kubernetes objects whose quantities the schema cannot bound (a pod asking 0.5 of
    `nvidia.com/gpu`, or 1e30 bytes): there a schema-valid body may get a 400, and only one that names the
    quantity it could not take (`quantity_refused_by_name`)."""
    extender = case.operation.path in ("/filter", "/prioritize")
    options = {"excluded_checks": [positive_data_acceptance], "additional_checks": [quantity_refused_by_name]} \
        if extender else {}
    if case.operation.path == "/v1/allocate":
        options = {"excluded_checks": [positive_data_acceptance], "additional_checks": [bounds_refused_by_name]}
    case.call_and_validate(**options)
    if "admin" in case.operation.tags or case.operation.path in WRITES:
        case.call_and_validate(headers=ADMIN, **options)


def quantity_refused_by_name(ctx, response, case) -> None:
    """The extender's positive-data check: `positive_data_acceptance`, except that a 400 naming the quantity it
    could not take is an accepted answer too."""
    if response.status_code == 400 and case.meta is not None and case.meta.generation.mode.is_positive:
        detail = response.json()["detail"]
        assert any(word in detail for word in ("quantity", "whole number", "negative")), detail
        return None
    return positive_data_acceptance(ctx, response, case)


def bounds_refused_by_name(ctx, response, case) -> None:
    """`POST /v1/allocate`'s positive-data check: `positive_data_acceptance`, except that elastic bounds the schema
    cannot relate (min_gpus above max_gpus, bounds off the parts' size) are a 422 naming the field (issue 31)."""
    if response.status_code == 422 and case.meta is not None and case.meta.generation.mode.is_positive:
        said = [error["msg"] for error in response.json()["detail"]]
        assert said and all(any(f"Value error, {name}:" in msg for name in ("min_gpus", "max_gpus", "restart_s"))
                            for msg in said), said
        return None
    return positive_data_acceptance(ctx, response, case)


def test_every_post_documents_the_body_limit_and_every_admin_route_the_token_check() -> None:
    """What the run does not reach: bodies over the limit (413), and 401/403 documented on every admin route."""
    for path, operations in SPEC["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert method != "post" or {"400", "413"} <= codes, (method, path, codes)
            assert "admin" not in operation["tags"] or {"401", "403"} <= codes, (method, path, codes)
            assert path not in WRITES or "401" in codes, (method, path, codes)
