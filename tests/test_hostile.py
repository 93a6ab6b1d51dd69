"""Hostile input gets a clean 4xx (issue 21): every number field of every body, quantities, ids, query parameters
and malformed bodies, sent as raw JSON text to the real app (an in-memory allocator with a few nodes and hints).
Each case: the expected 4xx (never a 5xx), a JSON body with a `detail`, no non-finite number in it (nor the raw
literal sent), and the allocator's state unchanged."""

from __future__ import annotations

import gzip
import json
import warnings

import pytest

from allocator_helpers import T4, hint_set, v100
from hetplan.allocator.core import Allocator
from hetplan.allocator.spec import Job
from servers import TOKEN

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note on httpx
    from fastapi.testclient import TestClient

from hetplan.allocator.service import ServiceSettings, create_app  # noqa: E402

ADMIN = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"content-type": "application/json"}
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e309", "1E400"]
NUMBERS = [*NON_FINITE, "-1", "1e30", str(10**40), '"1"', "true", "null", "[]"]
"""Raw JSON literals for a number field (json.dumps writes none of the first five)."""

POD = ('{"metadata": {"name": "p", "labels": {"hetplan.io/model": "res50"}}, "spec": {"containers": [{"name": "c", '
       '"resources": {"requests": {"nvidia.com/gpu": %s, "cpu": %s, "memory": %s}}}]}}')
QUANTITY_DEFAULTS = {"nvidia.com/gpu": '"1"', "cpu": '"4"', "memory": '"16Gi"'}


def pod(**raw: str) -> str:
    values = {**QUANTITY_DEFAULTS, **{k.replace("_", "."): v for k, v in raw.items()}}
    return POD % (values["nvidia.com/gpu"], values["cpu"], values["memory"])


def allocate(job_id: str = '"h"', model: str = '"res50"', num_gpus: str = "1", cpus: str = "4",
             mem_gb: str = "16") -> bytes:
    return (f'{{"job_id": {job_id}, "model": {model}, "num_gpus": {num_gpus}, "cpus": {cpus}, '
            f'"mem_gb": {mem_gb}}}').encode()


def upsert(name: str = '"n9"', gpus: str = "8", cpus: str = "64", mem_gb: str = "488") -> bytes:
    return (f'{{"upsert": [{{"name": {name}, "gpu_type": "V100", "gpus": {gpus}, "cpus": {cpus}, '
            f'"mem_gb": {mem_gb}}}]}}').encode()


def node_item(**raw: str) -> str:
    alloc = {"nvidia.com/gpu": '"8"', "cpu": '"64"', "memory": '"488Gi"',
             **{k.replace("_", "."): v for k, v in raw.items()}}
    return ('{"metadata": {"name": "v1", "labels": {"nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB"}}, "status": '
            f'{{"allocatable": {{"nvidia.com/gpu": {alloc["nvidia.com/gpu"]}, "cpu": {alloc["cpu"]}, '
            f'"memory": {alloc["memory"]}}}}}}}')


def names_body(pod_json: str, names: str = '["v1", "v2"]') -> bytes:
    return f'{{"Pod": {pod_json}, "NodeNames": {names}}}'.encode()


CASES: list = []


def case(id_: str, path: str, body: bytes | None, status: int, *, method: str = "POST", headers: dict | None = None,
         params: dict | None = None, literal: str | None = None) -> None:
    CASES.append(pytest.param(method, path, body, status, headers if headers is not None else JSON, params, literal,
                              id=id_))


# --- every number field x every hostile literal -----------------------------------------------------------------
for field in ("num_gpus", "cpus", "mem_gb"):
    for value in NUMBERS:
        if value == "null" and field != "num_gpus":
            continue  # an absent own request: valid
        case(f"allocate-{field}={value}", "/v1/allocate", allocate(**{field: value}), 422, literal=value)
for field in ("gpus", "cpus", "mem_gb"):
    for value in [*NUMBERS, "-0", "0"]:
        case(f"nodes-{field}={value}", "/v1/nodes", upsert(**{field: value}), 422, headers={**JSON, **ADMIN},
             literal=value)
for route in ("/filter", "/prioritize"):
    for key in ("nvidia_com/gpu", "cpu", "memory"):
        for value in NUMBERS:
            if value == '"1"':
                continue  # a quantity string: valid
            expected = 422 if value in NON_FINITE or value in ("true", "null", "[]") else 400
            case(f"{route[1:]}-pod-{key}={value}", route, names_body(pod(**{key: value})), expected, literal=value)
    for key in ("nvidia_com/gpu", "cpu", "memory"):
        for value in NON_FINITE:  # Nodes items are free-form objects: refused anywhere in the body
            body = f'{{"Pod": {pod()}, "Nodes": {{"items": [{node_item(**{key: value})}]}}}}'.encode()
            case(f"{route[1:]}-node-{key}={value}", route, body, 422, literal=value)

# --- quantities that Python's int()/float()/Decimal() would take but Kubernetes' grammar does not --------------
QUANTITIES = ["\u0664", "\uff14", "\u09ea", "1_000", "1e3Gi", " 4", "4 ", "0x10", "4\\n", "", "1e99", "Infinity",
              "NaN", "+-1", "1.2.3", "4Gb", "\u0664Gi", "\u00b2", "1\u00a0Gi", "\u2163"]
for route in ("/filter", "/prioritize"):
    for key in ("nvidia_com/gpu", "cpu", "memory"):
        for value in QUANTITIES:
            case(f"{route[1:]}-quantity-{key}={value!r}", route, names_body(pod(**{key: f'"{value}"'})), 400)

# --- ids: printable, no space at either end, at most 253 characters ---------------------------------------------
IDS = ["\\u200b", "\\ufeff", "\\u0000", "\\n", "\\ud800", "\\udc00x", "x" * 254, "\\u202e", "a\\tb", " a", "a ", "",
       "\\u2028", "\\u00a0x", "x\\u3000", "\\udb40\\udc01", "\\ue000", "\\u0378", "a\\u200db", "\\u0085", "\\u061c"]
for value in IDS:
    raw = f'"{value}"'
    case(f"allocate-job_id={value[:12]!r}", "/v1/allocate", allocate(job_id=raw), 422)
    case(f"allocate-model={value[:12]!r}", "/v1/allocate", allocate(model=raw), 422)
    case(f"release-job_id={value[:12]!r}", "/v1/release", f'{{"job_id": {raw}}}'.encode(), 422)
    case(f"nodes-name={value[:12]!r}", "/v1/nodes", upsert(name=raw), 422, headers={**JSON, **ADMIN})

# --- query parameters ---------------------------------------------------------------------------------------------
for value in [*NON_FINITE, "1.5", "true", "[]", "", "\u0664", "\uff14", "1_0", " 1", "0x10", "1e3"]:
    case(f"actions-since={value!r}", "/v1/actions", None, 422, method="GET", params={"since": value})

# --- bodies -------------------------------------------------------------------------------------------------------
NESTED = b"[" * 10_000 + b"]" * 10_000
MANY_KEYS = ("{" + ", ".join(f'"k{i}": {i}' for i in range(4000)) + "}").encode()
DUPLICATE = b'{"job_id": "ok", "job_id": "\\u200b", "model": "res50", "num_gpus": 1}'  # the last wins, as in Go
BODIES = {"not-json": (b"job_id=h&model=res50", 422), "truncated": (b'{"job_id": "h", "model": ', 422),
          "empty": (b"", 422), "nested-10k": (NESTED, 422),
          "nested-object": (b'{"a":' * 5000 + b"1" + b"}" * 5000, 422),
          "many-keys": (MANY_KEYS, 422), "duplicate-keys": (DUPLICATE, 422), "not-utf8": (b'{"job_id": "\xff"}', 422),
          "array": (b"[]", 422), "scalar": (b"1e309", 422), "string": (b'"NaN"', 422), "nan": (b"NaN", 422),
          "bom": (b'\xef\xbb\xbf{"job_id": "h"}', 422), "gzip": (gzip.compress(allocate()), 422),
          "gzip-bomb": (gzip.compress(b"[" * 1_000_000), 422)}
for route, admin in [("/v1/allocate", False), ("/v1/release", False), ("/v1/nodes", True), ("/filter", False),
                     ("/prioritize", False)]:
    auth = ADMIN if admin else {}
    for name, (body, status) in BODIES.items():
        if name == "duplicate-keys" and route != "/v1/allocate":
            continue
        headers = {**JSON, **auth, **({"content-encoding": "gzip"} if name.startswith("gzip") else {})}
        case(f"{route[1:]}-body-{name}", route, body, status, headers=headers)
    case(f"{route[1:]}-text-plain", route, allocate(), 415, headers={"content-type": "text/plain", **auth})
    case(f"{route[1:]}-form", route, b"job_id=h", 415,
         headers={"content-type": "application/x-www-form-urlencoded", **auth})
    case(f"{route[1:]}-over-limit", route, b'{"a": "' + b"x" * (64 * 1024 if route[1] == "v" else 33 * 2**20) + b'"}',
         413, headers={**JSON, **auth})
case("filter-too-many-names", "/filter", names_body(pod(), json.dumps([f"n{i}" for i in range(2000)])), 413)
case("prioritize-too-many-names", "/prioritize", names_body(pod(), json.dumps([f"n{i}" for i in range(2000)])), 413)


@pytest.fixture(scope="module")
def service():
    allocator = Allocator([v100("v1"), v100("v2"), T4], "hint", hint_set())
    app = create_app(ServiceSettings(token=TOKEN, tick_seconds=0), allocator=allocator)
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.post("/v1/allocate", json={"job_id": "held", "model": "res50", "num_gpus": 2, "cpus": 4}
                           ).json()["status"] == "allocated"
        yield client, allocator


def _no_constants(name: str) -> None:
    raise AssertionError(f"the answer holds a non-finite number: {name}")


def test_there_are_enough_cases():
    assert len(CASES) >= 250


@pytest.mark.parametrize(("method", "path", "body", "status", "headers", "params", "literal"), CASES)
def test_hostile_input_gets_a_clean_4xx_and_changes_nothing(service, method, path, body, status, headers, params,
                                                           literal):
    client, allocator = service
    before = allocator.cluster.snapshot()
    response = client.request(method, path, content=body, headers=headers, params=params)
    assert response.status_code == status, response.text[:500]
    answer = json.loads(response.text, parse_constant=_no_constants)  # valid JSON, no NaN/Infinity in it
    assert isinstance(answer, dict) and answer["detail"], answer
    if literal in NON_FINITE:
        assert literal not in response.text
    if status == 422 and isinstance(answer["detail"], list):
        assert all(set(e) == {"loc", "msg", "type"} for e in answer["detail"])  # FastAPI's shape, no input echoed
    assert allocator.cluster.snapshot() == before
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(("field", "value"), [("num_gpus", "-0"), ("cpus", "-0"), ("mem_gb", "-0.0"),
                                              ("cpus", "null")])
def test_negative_zero_and_an_absent_request_are_valid(service, field, value):
    client, _ = service
    answer = client.post("/v1/allocate", content=allocate(job_id='"zero"', **{field: value}), headers=JSON).json()
    assert answer["status"] == "allocated", answer
    assert client.post("/v1/release", json={"job_id": "zero"}).json()["released"]


def test_a_retry_with_a_larger_own_request_is_a_conflict_not_the_old_allocation(service):
    """Issue 21: a repeated allocate with a larger own cpus was answered with the earlier, smaller allocation."""
    client, allocator = service
    first = client.post("/v1/allocate", json={"job_id": "r", "model": "res50", "num_gpus": 1, "cpus": 2}).json()
    assert first["status"] == "allocated" and not first["replayed"]
    again = client.post("/v1/allocate", json={"job_id": "r", "model": "res50", "num_gpus": 1, "cpus": 2}).json()
    assert again["replayed"] and again["allocation"] == first["allocation"]
    before = allocator.cluster.snapshot()
    bigger = client.post("/v1/allocate", json={"job_id": "r", "model": "res50", "num_gpus": 1, "cpus": 12})
    assert bigger.status_code == 409 and "own cpus 12 cores, allocated for 2" in bigger.json()["detail"]
    assert allocator.cluster.snapshot() == before
    client.post("/v1/release", json={"job_id": "r"})


# --- gang part ids are no job ids (issue 30) ------------------------------------------------------------------------

PART_IDS = ["hg#0", "hg#1", "hx#0", "#", "a#b", "x#"]


@pytest.fixture()
def gang_service():
    """Four 4-GPU V100 nodes; job `hg` (8 GPUs) runs as a gang over two of them (parts `hg#0`, `hg#1`)."""
    allocator = Allocator([v100(f"n{i}", gpus=4, cpus=32, mem_gb=244) for i in range(4)], "hint", hint_set())
    app = create_app(ServiceSettings(token=TOKEN, tick_seconds=0), allocator=allocator)
    with TestClient(app, raise_server_exceptions=False) as client:
        answer = client.post("/v1/allocate", json={"job_id": "hg", "model": "transformer", "num_gpus": 8}).json()
        assert [p["job_id"] for p in answer["parts"]] == ["hg#0", "hg#1"], answer
        yield client, allocator


@pytest.mark.parametrize("job_id", PART_IDS)
@pytest.mark.parametrize(("path", "extra"), [("/v1/allocate", {"model": "transformer", "num_gpus": 4}),
                                             ("/v1/release", {}),
                                             ("/v1/adopt", {"model": "transformer", "num_gpus": 4, "node": "n0"})])
def test_a_job_id_with_the_gang_separator_is_refused_by_every_route(gang_service, path, extra, job_id):
    """Issue 30: `hg#0` was allocated and released as a job: releasing it split an 8-GPU gang to 4."""
    client, allocator = gang_service
    before = allocator.cluster.snapshot()
    response = client.post(path, json={"job_id": job_id, **extra})
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "job_id"] and "'#'" in error["msg"], error
    assert allocator.cluster.snapshot() == before
    assert [a.gpus for a in allocator.running()["hg"]] == [4, 4]


@pytest.mark.parametrize("job_id", PART_IDS)
def test_the_library_refuses_a_job_id_with_the_gang_separator_and_never_answers_a_part_as_a_job(gang_service,
                                                                                                job_id):
    _, allocator = gang_service
    before = allocator.cluster.snapshot()
    with pytest.raises(ValueError, match="job_id may not contain '#'"):
        Job(job_id, "res50", 1)
    with pytest.raises(ValueError, match="job_id may not contain '#'"):
        allocator.release(job_id)
    assert allocator.running([job_id]) == {}
    assert allocator.cluster.snapshot() == before


def test_an_extender_pod_annotated_with_a_part_id_is_not_pinned_to_the_parts_node(gang_service):
    """A pod whose `hetplan.io/job-id` names a gang's part is judged by free capacity like any other pod; its own
    job's pod would pass only its allocation's node."""
    client, allocator = gang_service
    part = allocator.running()["hg"][0]
    body = json.loads(names_body(pod(nvidia_com_gpu='"1"'), json.dumps([f"n{i}" for i in range(4)])))
    body["Pod"]["metadata"]["annotations"] = {"hetplan.io/job-id": part.job_id}
    passed = client.post("/filter", json=body).json()["NodeNames"]
    assert passed != [part.node] and set(passed) == {f"n{i}" for i in range(4)} - {a.node for a in
                                                                                     allocator.running()["hg"]}


def test_a_released_gang_frees_all_its_parts_and_a_larger_gang_then_fits(gang_service):
    client, allocator = gang_service
    assert client.post("/v1/release", json={"job_id": "hg"}).json()["released"]
    assert allocator.cluster.free_gpus_total() == 16
    answer = client.post("/v1/allocate", json={"job_id": "hx", "model": "transformer", "num_gpus": 16}).json()
    assert answer["status"] == "allocated" and len(answer["parts"]) == 4, answer


# --- a hint store that cannot be read (issue 30) --------------------------------------------------------------------

STORE_FAULTS = {  # what breaks -> (the file the answer names, how it is broken)
    "latest-not-utf8": ("LATEST", lambda root: (root / "LATEST").write_bytes(b"p\xff2\n")),
    "latest-nul": ("LATEST", lambda root: (root / "LATEST").write_bytes(b"p2\x00\n")),
    "latest-names-nothing": ("gone", lambda root: (root / "LATEST").write_text("gone\n")),
    "plan-not-utf8": ("p2/plan.json", lambda root: (root / "p2" / "plan.json").write_bytes(b'{"plan_id": "\xff"}')),
    "plan-nested-deep": ("p2/plan.json", lambda root: (root / "p2" / "plan.json").write_bytes(b"[" * 100_000)),
    "hints-not-parquet": ("p2/hints.parquet",
                          lambda root: (root / "p2" / "hints.parquet").write_bytes(b"PAR1\xff\xfe" * 100)),
}


@pytest.mark.parametrize("fault", STORE_FAULTS)
def test_a_store_that_cannot_be_read_keeps_the_last_good_hints_and_reload_names_the_file(tmp_path, caplog, fault):
    """Issue 30: a LATEST that is no UTF-8 text gave 500s on reload and on every allocate that polled the store. Any
    version that cannot be loaded: the last good hints stay in force, one log line says why, reload answers 409
    naming the file, allocate goes on deciding with the last good hints; a good LATEST is loaded again."""
    from hetplan.allocator.sources import StoreHints
    from hetplan.hints import HintStore
    from allocator_helpers import hints_frame, make_plan

    store = HintStore(tmp_path)
    store.publish(make_plan("p1"), hints_frame("p1"))
    store.publish(make_plan("p2"), hints_frame("p2"))
    (tmp_path / "LATEST").write_text("p1\n")
    allocator = Allocator([v100("v1")], "hint", StoreHints(store, poll_seconds=0))
    app = create_app(ServiceSettings(token=TOKEN, tick_seconds=0), allocator=allocator)
    named, corrupt = STORE_FAULTS[fault]
    with TestClient(app, raise_server_exceptions=False) as client:
        (tmp_path / "LATEST").write_text("p2\n")
        corrupt(tmp_path)
        with caplog.at_level("WARNING", logger="hetplan.allocator.sources"):
            caplog.clear()
            for k in range(3):  # each polls the store
                answer = client.post("/v1/allocate", json={"job_id": f"a{k}", "model": "res50", "num_gpus": 1})
                assert answer.status_code == 200 and answer.json()["allocation"]["hint_version"] == "p1", answer.text
            reload = client.post("/v1/hints/reload", headers=ADMIN)
        assert reload.status_code == 409, reload.text
        detail = reload.json()["detail"]
        assert "\n" not in detail and str(tmp_path / named) in detail and "p1 stays in force" in detail, detail
        [logged] = [r.getMessage() for r in caplog.records if r.name == "hetplan.allocator.sources"
                    and r.levelname == "WARNING"]  # once, not once per poll
        assert "\n" not in logged and str(tmp_path / named) in logged and "keeping hints p1" in logged
        hints = client.get("/v1/hints").json()
        assert hints["version"] == "p1" and str(tmp_path / named) in hints["last_error"]
        store.publish(make_plan("p3"), hints_frame("p3"))  # a good LATEST again
        reload = client.post("/v1/hints/reload", headers=ADMIN)
        assert reload.status_code == 200 and reload.json()["version"] == "p3" and reload.json()["last_error"] is None


# --- the admission webhook's bodies (issue 30) ----------------------------------------------------------------------

WEBHOOK_BODIES = {  # name -> (Content-Length as sent, body, status)
    "not-utf8": (None, b'{"request": "\xff"}', 400), "deep": (None, b"[" * 100_000, 400),
    "not-json": (None, b"review", 400), "negative-length": ("-1", b"{}", 400), "spaced-length": (" 2", b"{}", 400),
    "underscored-length": ("1_0", b"{}", 400), "huge-length": ("9" * 40, b"{}", 413),
}


@pytest.mark.parametrize("case", WEBHOOK_BODIES)
def test_the_webhook_answers_a_hostile_body_with_a_clean_4xx(service, case):
    """Issue 30: a deep JSON body dropped the connection without an answer (RecursionError), and a Content-Length of
    -1 made the webhook read until the client gave up."""
    import http.client

    from hetplan.allocator.k8s.service_client import AllocatorClient
    from hetplan.allocator.k8s.webhook import WebhookServer

    client, allocator = service
    before = allocator.cluster.snapshot()
    length, body, status = WEBHOOK_BODIES[case]
    webhook = WebhookServer(AllocatorClient(http=client), host="127.0.0.1", port=0).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", webhook.port, timeout=10)
        conn.putrequest("POST", "/mutate")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", length if length is not None else str(len(body)))
        conn.endheaders(body)
        answer = conn.getresponse()
        assert answer.status == status
        assert json.loads(answer.read())["detail"]
        conn.close()
    finally:
        webhook.stop()
    assert allocator.cluster.snapshot() == before
