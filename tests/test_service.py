"""The HTTP service on a real uvicorn: the API, malformed bodies, admin auth, the extender over HTTP,
concurrency, hint hot-reload, restarts and the co-adaptive actions."""

import json
import random
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from hetplan.allocator.k8s.extender import (
    node_candidate,
)
from hetplan.hints import HintStore
from servers import TOKEN, Server
from allocator_helpers import T4, fixture, hint_set, hints_frame, make_plan, run_concurrently, v100


# --- the HTTP service on a real uvicorn ------------------------------------------------------------------------

def _fixture_nodes_file(path: Path) -> Path:
    """The GPU nodes of the extender fixtures, as `hetplan serve --nodes` reads them."""
    items = fixture("filter_args_res50_nodes.json")["Nodes"]["items"]
    nodes = []
    for c in map(node_candidate, items):
        if c.shape is not None:
            nodes.append({"name": c.name, "gpu_type": c.shape.gpu_type, "gpus": c.shape.gpus,
                          "cpus": c.shape.cpu_m / 1000, "mem_gb": c.shape.mem_mib / 1024,
                          "labels": {"pool": "fixture"}})
    path.write_text(json.dumps(nodes))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("server")
    store = root / "store"
    HintStore(store).publish(make_plan("p1"), hints_frame("p1"))
    srv = Server(root, store, _fixture_nodes_file(root / "nodes.json")).start()
    yield srv
    srv.stop()


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def state(client: httpx.Client) -> tuple:
    return client.get("/v1/allocations").json(), client.get("/v1/nodes").json()


def test_health_openapi_and_metrics(client):
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["nodes"] == 4 and health["policy"] == "hint"
    spec = client.get("/openapi.json").json()
    assert {"/v1/allocate", "/v1/release", "/v1/nodes", "/v1/hints", "/healthz", "/metrics", "/filter",
            "/prioritize"} <= set(spec["paths"])
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
    client.post("/v1/allocate", json={"job_id": "m1", "model": "res50", "num_gpus": 99})
    text = client.get("/metrics").text
    assert 'hetplan_allocator_rejections_total{reason="too-big"}' in text
    assert "# TYPE hetplan_allocator_decision_seconds histogram" in text
    assert 'hetplan_allocator_http_requests_total{method="POST",route="/v1/allocate",status="200"}' in text
    assert "# TYPE hetplan_allocator_gpus gauge\nhetplan_allocator_gpus 21.0\n" in text  # prometheus-client's floats
    assert f'hetplan_allocator_hints_info{{version="{health["hint_version"]}"}} 1.0' in text


def test_allocate_release_over_http(client):
    body = {"job_id": "h1", "model": "res50", "num_gpus": 2}
    first = client.post("/v1/allocate", json=body).json()
    assert first["status"] == "allocated" and not first["replayed"]
    a = first["allocation"]
    assert (a["gpu_type"], a["cpus"], a["mem_gb"], a["share"], a["rank"]) == ("A100-80GB", 24.0, 200.0, "hinted", 1)
    assert a["hint_version"] == first["hint_version"] is not None
    again = client.post("/v1/allocate", json=body).json()
    assert again["replayed"] and again["allocation"] == a
    too_big = client.post("/v1/allocate", json={"job_id": "h2", "model": "res50", "num_gpus": 16})
    assert too_big.status_code == 200 and too_big.json()["reason"] == "too-big"
    released = client.post("/v1/release", json={"job_id": "h1"}).json()
    assert released["released"] and released["allocation"] == a
    assert client.post("/v1/release", json={"job_id": "h1"}).json() == {"job_id": "h1", "released": False,
                                                                        "dequeued": False, "allocation": None,
                                                                        "actions": []}


def test_pods_as_they_come_shares_cpu_only_and_own_requests_over_http(client):
    asked = [{"job_id": "p-half", "model": "bert", "num_gpus": 0.5, "cpus": 2, "mem_gb": 6},
             {"job_id": "p-quarter", "model": "bert", "num_gpus": 0.25},
             {"job_id": "p-cpu", "model": "etl", "num_gpus": 0, "cpus": 4, "mem_gb": 16},
             {"job_id": "p-own", "model": "res50", "num_gpus": 1, "cpus": 30.5, "mem_gb": 0}]
    got = {}
    for body in asked:
        answer = client.post("/v1/allocate", json=body).json()
        assert answer["status"] == "allocated", answer
        got[body["job_id"]] = answer["allocation"]
        assert client.post("/v1/allocate", json=body).json()["replayed"]
    half, quarter = got["p-half"], got["p-quarter"]
    assert (half["gpus"], half["gpu_share"], half["cpus"], half["mem_gb"]) == (0, 0.5, 2.0, 6.0)
    assert (half["requested_cpus"], half["requested_mem_gb"]) == (2.0, 6.0)
    assert (quarter["node"], quarter["device"]) == (half["node"], half["device"])  # packed onto one device
    assert quarter["requested_cpus"] is None and quarter["cpus"] > 0  # no request: its slice of the share
    assert (got["p-cpu"]["gpus"], got["p-cpu"]["gpu_share"], got["p-cpu"]["cpus"]) == (0, None, 4.0)
    assert got["p-own"]["cpus"] == 30.5  # above its hinted share: the request wins
    for job_id in got:
        assert client.post("/v1/release", json={"job_id": job_id}).json()["released"]


@pytest.mark.parametrize(("path", "payload", "status", "reason"), [
    ("/v1/allocate", {"job_id": "x", "model": "res50", "num_gpus": -1}, 422, "greater than or equal to 0"),
    ("/v1/allocate", {"job_id": "x", "model": "res50", "num_gpus": 1.5}, 422, "must be a whole number"),
    ("/v1/allocate", {"job_id": "x", "model": "res50", "num_gpus": 0.0001}, 422, "from 0.001 to 0.999"),
    ("/v1/allocate", {"job_id": "x", "model": "res50", "num_gpus": 1, "cpus": -2}, 422, "greater than or equal to 0"),
    ("/v1/allocate", {"job_id": "x", "model": "res50"}, 422, "Field required"),
    ("/v1/allocate", {"job_id": "x", "model": "res50", "num_gpus": "1"}, 422, "a JSON number"),
    ("/v1/allocate", {"job_id": "x", "model": "res50", "num_gpus": 1, "gpu_type": "A100"}, 422, "Extra inputs"),
    ("/v1/allocate", {"job_id": " ", "model": "res50", "num_gpus": 1}, 422, "printable characters"),
    ("/v1/allocate", b'{"job_id": "x", ', 422, "JSON decode error"),
    # a lone surrogate escape and a body that is no UTF-8: once a 500 (SQLite; the 422 that echoed the input)
    ("/v1/allocate", b'{"job_id": "x\\ud800", "model": "res50", "num_gpus": 1}', 422, "JSON decode error"),
    ("/v1/allocate", b'{"job_id": "\xff", "model": "res50", "num_gpus": 1}', 422, "JSON decode error"),
    ("/filter", b'{"Pod": {"metadata": {}, "spec": {"containers": [{}]}}, "NodeNames": ["n\\udc00"]}', 422,
     "JSON decode error"),
    ("/v1/allocate", [], 422, "valid dictionary"),
    ("/v1/release", {"job": "x"}, 422, "Field required"),
    ("/v1/allocate", {"job_id": "x" * 70000, "model": "res50", "num_gpus": 1}, 413, "exceeds the limit"),
    ("/filter", {"Pod": {"metadata": {"name": "p"}, "spec": {"containers": [{}]}}}, 422, "needs Nodes"),
    ("/filter", {"Pod": {"metadata": {"name": "p"}, "spec": {"containers": [
        {"resources": {"limits": {"nvidia.com/gpu": "1.5"}}}]}}, "NodeNames": []}, 400, "whole number"),
    ("/prioritize", {"Pod": {"metadata": {}}, "NodeNames": []}, 422, "spec"),
])
def test_malformed_bodies_get_a_4xx_with_a_reason_and_change_nothing(client, path, payload, status, reason):
    before = state(client)
    if isinstance(payload, bytes):
        response = client.post(path, content=payload, headers={"content-type": "application/json"})
    else:
        response = client.post(path, json=payload)
    assert response.status_code == status, response.text
    assert reason in response.text
    assert state(client) == before


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_that_is_not_sent_as_json_gets_a_415_and_changes_nothing(client, content_type):
    """Validated as bytes, such a body got a 422 that echoed it, and a 500 where it was no UTF-8."""
    headers = {"content-type": content_type} if content_type else {}
    before = state(client)
    for payload in (b"\xff\xfe", b'{"job_id": "ct", "model": "res50", "num_gpus": 1}'):
        response = client.post("/v1/allocate", content=payload, headers=headers)
        assert response.status_code == 415 and "application/json" in response.json()["detail"], response.text
    assert state(client) == before


def test_a_chunked_body_over_the_limit_is_refused(client):
    before = state(client)

    def chunks():
        yield b'{"job_id": "'
        for _ in range(80):
            yield b"x" * 1024
        yield b'", "model": "m", "num_gpus": 1}'

    response = client.post("/v1/allocate", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and "exceeds the limit" in response.text
    assert state(client) == before


def test_admin_endpoints_need_the_bearer_token(client):
    change = {"upsert": [{"name": "extra", "gpu_type": "NVIDIA-H100-80GB-HBM3", "gpus": 8, "cpus": 192,
                          "mem_gb": 2048}]}
    before = state(client)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        response = client.post("/v1/nodes", json=change, headers=headers)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert client.post("/v1/hints/reload", headers=headers).status_code == 401
    assert state(client) == before
    assert client.post("/v1/nodes", json={"upsert": [{**change["upsert"][0], "gpu_type": "bad name!"}]},
                       headers=ADMIN).status_code == 422
    response = client.post("/v1/nodes", json=change, headers=ADMIN)
    assert response.status_code == 200 and response.json() == {"upserted": 1, "removed": 0, "evicted": []}
    nodes = {n["name"]: n for n in client.get("/v1/nodes").json()["nodes"]}
    assert nodes["extra"]["gpu_type"] == "H100" and nodes["extra"]["free_gpus"] == 8
    job = client.post("/v1/allocate", json={"job_id": "busy", "model": "vgg", "num_gpus": 8}).json()
    busy_node = job["allocation"]["node"]
    before = state(client)
    refused = client.post("/v1/nodes", json={"remove": [busy_node]}, headers=ADMIN)
    assert refused.status_code == 409 and "runs 1 allocations" in refused.json()["detail"]
    assert state(client) == before
    client.post("/v1/release", json={"job_id": "busy"})
    assert client.post("/v1/nodes", json={"remove": ["extra"]}, headers=ADMIN).json()["removed"] == 1
    assert client.post("/v1/hints/reload", headers=ADMIN).status_code == 200


def test_extender_filter_and_prioritize_speak_the_scheduler_json(client):
    args = fixture("filter_args_res50_nodes.json")
    response = client.post("/filter", json=args)
    assert response.status_code == 200
    result = response.json()
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert result["NodeNames"] is None and result["Error"] == "" and result["FailedNodes"] == {}
    kept = [item["metadata"]["name"] for item in result["Nodes"]["items"]]
    assert kept == [n["metadata"]["name"] for n in args["Nodes"]["items"][:3]]
    assert result["Nodes"]["items"][0] == args["Nodes"]["items"][0]  # handed back unchanged
    assert result["Nodes"]["metadata"] == args["Nodes"]["metadata"]
    assert sorted(result["FailedAndUnresolvableNodes"]) == ["ip-10-0-4-44.ec2.internal", "ip-10-0-5-55.ec2.internal"]

    scores = client.post("/prioritize", json=fixture("prioritize_args_transformer_nodes.json")).json()
    hosts = [f"ip-10-0-{i}-{i}{i}.ec2.internal" for i in range(1, 6)]
    assert scores == [{"Host": host, "Score": score} for host, score in zip(hosts, [10, 5, 0, 0, 0])]


def test_extender_with_node_names_answers_from_the_allocator_state(client):
    args = fixture("filter_args_res50_nodenames.json")
    taken = client.post("/v1/allocate", json={"job_id": "fill", "model": "transformer", "num_gpus": 8}).json()
    assert taken["allocation"]["node"] == "ip-10-0-1-11.ec2.internal"  # rank 1 for (transformer, 8)
    try:
        result = client.post("/filter", json=args).json()
        assert result["Nodes"] is None
        # a node hetplan was never told about is not judged: it passes with a neutral score
        assert result["NodeNames"] == ["ip-10-0-2-22.ec2.internal", "ip-10-0-3-33.ec2.internal",
                                       "ip-10-0-4-44.ec2.internal"]
        assert result["FailedNodes"] == {"ip-10-0-1-11.ec2.internal": "0 of 8 GPUs free; the pod needs 2"}
        assert result["FailedAndUnresolvableNodes"] == {"ip-10-0-5-55.ec2.internal": "has 1 L4 GPUs; the pod needs 2 on one node"}
        scores = {h["Host"]: h["Score"] for h in client.post("/prioritize", json=args).json()}
        assert scores["ip-10-0-1-11.ec2.internal"] == 0 and scores["ip-10-0-2-22.ec2.internal"] == 7
        assert scores["ip-10-0-4-44.ec2.internal"] == 0
    finally:
        client.post("/v1/release", json={"job_id": "fill"})


def test_many_clients_at_once_never_overcommit_and_lose_no_release(server):
    kept: dict[int, set[str]] = {}
    waiting: dict[int, set[str]] = {}
    problems: list[str] = []

    def worker(t: int) -> None:
        rng = random.Random(t)
        mine: set[str] = set()
        queued: set[str] = set()  # they start when others release, without asking again
        with httpx.Client(base_url=server.url, timeout=30) as c:
            for i in range(25):
                body = {"job_id": f"c{t}-{i}", "model": rng.choice(["res50", "transformer", "vgg"]),
                        "num_gpus": rng.choice([1, 1, 2])}
                status = c.post("/v1/allocate", json=body).json()["status"]
                (mine if status == "allocated" else queued).add(body["job_id"])
                if mine and rng.random() < 0.5:
                    victim = rng.choice(sorted(mine))
                    if not c.post("/v1/release", json={"job_id": victim}).json()["released"]:
                        problems.append(f"lost release {victim}")
                    mine.discard(victim)
        kept[t], waiting[t] = mine, queued

    run_concurrently(worker, 12)
    with httpx.Client(base_url=server.url, timeout=10) as c:
        allocations, nodes = state(c)
        assert problems == []
        held = {a["job_id"] for a in allocations if a["job_id"].startswith("c")}
        queued = {j["job_id"] for j in c.get("/v1/queue").json()["jobs"] if j["job_id"].startswith("c")}
        assert set().union(*kept.values()) <= held and not held & queued
        assert held | queued == set().union(*kept.values(), *waiting.values())  # nobody lost, nobody twice
        for node in nodes["nodes"]:
            on = [a for a in allocations if a["node"] == node["name"]]
            assert sum(a["gpus"] for a in on) + node["free_gpus"] == node["gpus"]
            assert sum(a["cpus"] for a in on) + node["free_cpus"] == pytest.approx(node["cpus"])
            assert node["free_gpus"] >= 0 and node["free_cpus"] >= 0 and node["free_mem_gb"] >= 0
        for job in sorted(held | queued):
            answer = c.post("/v1/release", json={"job_id": job}).json()
            assert answer["released"] or answer["dequeued"], answer
        assert c.get("/v1/queue").json()["jobs"] == []


def test_publishing_new_hints_is_picked_up_without_a_restart(server, client):
    store = HintStore(server.store)
    version = f"p{int(time.time() * 1000)}"
    store.publish(make_plan(version), hints_frame(version))
    deadline = time.monotonic() + 10
    while client.get("/v1/hints").json()["version"] != version:
        assert time.monotonic() < deadline, "hints not reloaded"
        time.sleep(0.05)
    hints = client.get("/v1/hints").json()
    assert hints["classes"] == 4 and hints["rows"][0]["model"] == "res50"
    decision = client.post("/v1/allocate", json={"job_id": "after-reload", "model": "res50", "num_gpus": 1}).json()
    assert decision["hint_version"] == version == decision["allocation"]["hint_version"]
    client.post("/v1/release", json={"job_id": "after-reload"})


def test_a_killed_server_restarts_with_the_same_state(tmp_path):
    """SIGKILL, not a shutdown; with synchronous=NORMAL, which survives a process crash (FULL also a power cut)."""
    store = tmp_path / "store"
    HintStore(store).publish(make_plan("k1"), hints_frame("k1"))
    srv = Server(tmp_path, store, _fixture_nodes_file(tmp_path / "nodes.json"), ("--synchronous", "NORMAL")).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            for i, (model, gpus, own) in enumerate([("res50", 2, {}), ("transformer", 1, {}), ("vgg", 4, {}),
                                                    ("res50", 1, {"cpus": 3}), ("bert", 0.5, {"mem_gb": 7.5}),
                                                    ("bert", 0.25, {}), ("etl", 0, {"cpus": 2, "mem_gb": 4})]):
                body = {"job_id": f"k{i}", "model": model, "num_gpus": gpus, **own}
                assert c.post("/v1/allocate", json=body).json()["status"] == "allocated"
            c.post("/v1/release", json={"job_id": "k1"})
            before = state(c)
        srv.stop(signal.SIGKILL)
        srv.start()
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            assert state(c) == before
    finally:
        srv.stop()


def test_shrinks_and_regrowth_come_back_as_actions_over_http(tmp_path):
    """TUNE over HTTP: a job that only fits if its peer shrinks gets the room, the peer's resize comes back with
    the allocation; the release grows the peer again; the log serves both; a tick needs the admin token."""
    store = tmp_path / "store"
    HintStore(store).publish(make_plan("p1"), hints_frame("p1"))
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps([{"name": "v", "gpu_type": "V100", "gpus": 2, "cpus": 12, "mem_gb": 120}]))
    srv = Server(tmp_path, store, nodes, extra=("--tick", "0")).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            first = c.post("/v1/allocate", json={"job_id": "r1", "model": "res50", "num_gpus": 1}).json()
            assert (first["allocation"]["cpus"], first["actions"]) == (9.0, [])  # its hinted 9 cores
            second = c.post("/v1/allocate", json={"job_id": "r2", "model": "res50", "num_gpus": 1}).json()
            assert second["status"] == "allocated" and second["allocation"]["cpus"] == 6.0  # the floor: 12 / 2
            [shrink] = second["actions"]
            assert (shrink["kind"], shrink["job_id"], shrink["before"][0]["cpus"], shrink["after"][0]["cpus"]) == \
                ("resize", "r1", 9.0, 6.0)
            released = c.post("/v1/release", json={"job_id": "r2"}).json()
            assert [(a["kind"], a["job_id"], a["after"][0]["cpus"]) for a in released["actions"]] == \
                [("resize", "r1", 9.0)]
            log = c.get("/v1/actions", params={"since": 0}).json()
            # every change is in the log, the allocations and releases too
            assert [(a["kind"], a["job_id"]) for a in log["actions"]] == \
                [("start", "r1"), ("resize", "r1"), ("start", "r2"), ("stop", "r2"), ("resize", "r1")]
            assert log["latest"] == 5
            assert [a["seq"] for a in c.get("/v1/actions", params={"since": 3}).json()["actions"]] == [4, 5]
            assert c.get("/v1/actions", params={"since": 6}).status_code == 410  # ahead of the log: list again
            assert c.post("/v1/actions/tick").status_code == 401
            assert c.post("/v1/actions/tick", headers=ADMIN).json() == {"latest": 5, "actions": []}
            assert {a["job_id"]: a["cpus"] for a in c.get("/v1/allocations").json()} == {"r1": 9.0}
    finally:
        srv.stop()


# --- one allocator: the service on an in-memory Allocator -------------------------------------------------------


def test_the_durable_allocator_is_the_allocator_with_a_journal(tmp_path):
    from hetplan.allocator import Allocator, DurableAllocator
    from hetplan.allocator.durable import SqliteJournal
    memory = Allocator([v100("v1")], "hint", hint_set())
    with DurableAllocator(tmp_path / "a.db", "proportional") as durable:
        # nothing re-written: every method the service calls is Allocator's own
        assert {name for name in vars(DurableAllocator) if not name.startswith("__")} == set()
        assert isinstance(durable.journal, SqliteJournal)
        for a, synchronous, strict in [(memory, "OFF", False), (durable, "FULL", False)]:
            assert isinstance(a, Allocator)
            assert (a.synchronous, a.policy.strict, a.hint_source.last_error) == (synchronous, strict, None)
            assert a.running_jobs() == []


def test_the_service_serves_an_in_memory_allocator_in_gib_on_a_real_uvicorn():
    import uvicorn

    from hetplan.allocator import Allocator, get_policy
    from hetplan.allocator.service import ServiceSettings, create_app
    from servers import free_port
    alloc = Allocator([v100("v1"), T4], get_policy("hint", strict=True), hint_set())
    app = create_app(ServiceSettings(token=TOKEN, tick_seconds=0), allocator=alloc)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            listed = c.get("/v1/nodes").json()
            assert listed["totals"]["mem_gb"] == 488 + 192 and listed["nodes"][0]["mem_gb"] == 488.0
            a = c.post("/v1/allocate", json={"job_id": "j", "model": "res50", "num_gpus": 1}).json()["allocation"]
            assert (a["node"], a["cpus"], a["mem_gb"]) == ("v1", 9.0, 60.0)  # the hint's 60 GiB, exactly
            assert alloc.cluster.allocation("j").mem_mib == 60 * 1024
            assert c.get("/v1/nodes").json()["totals"]["free_mem_gb"] == 488 + 192 - 60
            assert c.get("/v1/hints").json()["last_error"] is None
            text = c.get("/metrics").text
            assert 'hetplan_allocator_decisions_total{outcome="allocated",policy="hint"} 1.0' in text
            assert "hetplan_allocator_free_mem_gb 620.0\n" in text  # GiB
            spec = c.get("/openapi.json").json()["components"]["schemas"]
            for model, field in [("AllocationOut", "mem_gb"), ("NodeIn", "mem_gb"), ("NodeOut", "free_mem_gb"),
                                 ("HintRow", "mem_gb_per_gpu")]:
                assert "GiB" in spec[model]["properties"][field]["description"], (model, field)
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def test_each_app_counts_in_a_registry_of_its_own():
    from hetplan.allocator.metrics import Metrics
    first, second = Metrics(), Metrics()
    first.observe_release(True)
    first.observe_http("GET", "/healthz", 200, 0.001)
    assert 'hetplan_allocator_releases_total{found="true"} 1.0' in first.render()
    assert 'hetplan_allocator_http_requests_total{method="GET",route="/healthz",status="200"} 1.0' in first.render()
    assert "found=" not in second.render() and "route=" not in second.render()
    assert "hetplan_allocator_http_request_seconds_count 0.0" in second.render()


# --- gangs over HTTP, and a kill -9 in the middle of a burst --------------------------------------------------------


def _v100_nodes(path: Path, count: int, gpus: int = 4) -> Path:
    path.write_text(json.dumps([{"name": f"v{i}", "gpu_type": "V100", "gpus": gpus, "cpus": 12 * gpus,
                                 "mem_gb": 120 * gpus} for i in range(count)]))
    return path


def test_a_job_larger_than_any_node_runs_as_a_gang_over_http_all_or_nothing(tmp_path):
    """8 GPUs on 4-GPU nodes: two parts of one GPU type, each named; a retry replays them; the allocations show
    them whole; a restart keeps them one job; the release frees both; a gang that cannot fit whole takes nothing."""
    store = tmp_path / "store"
    HintStore(store).publish(make_plan("g1"), hints_frame("g1"))
    srv = Server(tmp_path, store, _v100_nodes(tmp_path / "nodes.json", 3), ("--tick", "0")).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            body = {"job_id": "big", "model": "transformer", "num_gpus": 8}
            got = c.post("/v1/allocate", json=body).json()
            assert got["status"] == "allocated" and got["allocation"] == got["parts"][0]
            assert sorted((p["job_id"], p["part_of"], p["gpus"]) for p in got["parts"]) == \
                [("big#0", "big", 4), ("big#1", "big", 4)]
            assert len({p["node"] for p in got["parts"]}) == 2
            again = c.post("/v1/allocate", json=body).json()
            assert again["replayed"] and again["parts"] == got["parts"]
            conflict = c.post("/v1/allocate", json={**body, "num_gpus": 4})
            assert conflict.status_code == 409 and "4 GPUs, allocated for 8" in conflict.json()["detail"]
            too_many = c.post("/v1/allocate", json={"job_id": "huge", "model": "transformer", "num_gpus": 8}).json()
            assert (too_many["status"], too_many["why"]) == ("queued", "gang-waiting")  # 4 GPUs left: it waits
            never = c.post("/v1/allocate", json={"job_id": "never", "model": "transformer", "num_gpus": 16}).json()
            assert (never["status"], never["reason"]) == ("rejected", "too-big")  # more than all 12 V100s
            shown = [(a["job_id"], a["part_of"]) for a in c.get("/v1/allocations").json()]
            assert shown == [("big#0", "big"), ("big#1", "big")]
        srv.stop(signal.SIGKILL)
        srv.start()
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            assert [(a["job_id"], a["part_of"]) for a in c.get("/v1/allocations").json()] == shown
            assert [j["job_id"] for j in c.get("/v1/queue").json()["jobs"]] == ["huge"]  # its place kept
            released = c.post("/v1/release", json={"job_id": "big"}).json()
            assert released["released"] and c.get("/v1/queue").json()["jobs"] == []  # the waiting gang starts
            assert {a["part_of"] for a in c.get("/v1/allocations").json()} == {"huge"}
            stop = c.get("/v1/actions", params={"since": 1}).json()["actions"]
            assert [(a["kind"], a["job_id"], len(a["before"]) + len(a["after"])) for a in stop] == \
                [("stop", "big", 2), ("start", "huge", 2)]
    finally:
        srv.stop()


def test_a_kill_9_mid_burst_loses_nothing_acknowledged_and_renumbers_nothing(tmp_path):
    """Clients allocate (gangs too) and release as fast as they can while a reader follows the action log like a
    controller; the server is SIGKILLed mid-burst and restarted. Every acknowledged change is still there, the log
    goes on from where the reader was (no renumbering, no gap) and no node is overcommitted."""
    store = tmp_path / "store"
    HintStore(store).publish(make_plan("b1"), hints_frame("b1"))
    srv = Server(tmp_path, store, _v100_nodes(tmp_path / "nodes.json", 6), ("--synchronous", "NORMAL",
                                                                          "--tick", "0")).start()
    # job -> True: allocation acknowledged; "queued": its place in the queue acknowledged; False: release acknowledged
    held: dict[str, bool | str | None] = {}
    seen: dict[int, dict] = {}  # the log as the reader saw it
    rng = random.Random(7)
    try:
        def burst(worker: int) -> None:
            with httpx.Client(base_url=srv.url, timeout=5) as c:
                for k in range(100_000):
                    try:
                        mine = [j for j, on in held.items() if on and j.startswith(f"w{worker}-")]
                        if mine and rng.random() < 0.45:
                            job = rng.choice(mine)
                            held[job] = None  # in flight: its outcome is unknown until answered
                            answer = c.post("/v1/release", json={"job_id": job}).json()
                            if answer["released"] or answer["dequeued"]:
                                held[job] = False
                        else:
                            job = f"w{worker}-{k}"
                            body = {"job_id": job, "model": rng.choice(["res50", "transformer", "vgg"]),
                                    "num_gpus": rng.choice([1, 1, 2, 4, 8])}
                            status = c.post("/v1/allocate", json=body).json()["status"]
                            held[job] = True if status == "allocated" else status
                        if worker == 0:  # the reader
                            since = max(seen, default=0)
                            for a in c.get("/v1/actions", params={"since": since}).json()["actions"]:
                                seen[a["seq"]] = a
                    except (httpx.HTTPError, ValueError):
                        return  # the server is gone

        threads = [threading.Thread(target=burst, args=(w,)) for w in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len(seen) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        srv.stop(signal.SIGKILL)
        for t in threads:
            t.join()
        assert len(seen) >= 40
        srv.start()
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            running = {a["part_of"] or a["job_id"] for a in c.get("/v1/allocations").json()}
            queued = {j["job_id"] for j in c.get("/v1/queue").json()["jobs"]}
            assert {j for j, on in held.items() if on is True} <= running  # acknowledged allocations survive
            assert {j for j, on in held.items() if on == "queued"} <= running | queued  # and submissions
            assert not {j for j, on in held.items() if on is False} & (running | queued)  # acknowledged releases too
            last = max(seen)
            log = c.get("/v1/actions", params={"since": 0}).json()
            assert [a["seq"] for a in log["actions"]] == list(range(1, log["latest"] + 1))  # no gap
            assert all(log["actions"][seq - 1] == action for seq, action in seen.items())  # no renumbering
            after = c.get("/v1/actions", params={"since": last}).json()
            assert [a["seq"] for a in after["actions"]] == list(range(last + 1, log["latest"] + 1))
            nodes = c.get("/v1/nodes").json()["nodes"]
            assert all(n["free_gpus"] >= 0 and n["free_cpus"] >= 0 and n["free_mem_gb"] >= 0 for n in nodes)
            new = c.post("/v1/allocate", json={"job_id": "after", "model": "res50", "num_gpus": 1}).json()
            if new["status"] == "allocated":
                assert c.get("/v1/actions", params={"since": log["latest"]}).json()["actions"][0]["seq"] == \
                    log["latest"] + 1
    finally:
        srv.stop()


# --- one process per database (issue 30) ----------------------------------------------------------------------------


def test_a_second_serve_on_the_same_database_refuses_to_start_in_one_line(tmp_path):
    """Issue 30: a second `hetplan serve` on the first one's --db started, answered every write with 500 (a duplicate
    action number) and served stale reads. It now exits non-zero with one line naming the database and the pid that
    holds it; the first serves on, untouched; once it is SIGKILLed (no clean-up), a new one starts on that database."""
    store = tmp_path / "store"
    HintStore(store).publish(make_plan("l1"), hints_frame("l1"))
    first = Server(tmp_path, store, _v100_nodes(tmp_path / "nodes.json", 2), ("--tick", "0")).start()
    second = Server(tmp_path, store, None, ("--tick", "0"))
    try:
        with httpx.Client(base_url=first.url, timeout=10) as c:
            assert c.post("/v1/allocate", json={"job_id": "a", "model": "res50", "num_gpus": 1}).json()["status"] \
                == "allocated"
        with pytest.raises(RuntimeError, match="server exited") as refused:
            second.start()
        lines = str(refused.value).split("server exited: ", 1)[1].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), lines
        assert str(first.db) in lines[0] and f"pid {first.proc.pid}" in lines[0], lines
        assert second.proc.returncode != 0
        with httpx.Client(base_url=first.url, timeout=10) as c:  # the first is untouched: reads and writes
            assert c.post("/v1/allocate", json={"job_id": "b", "model": "res50", "num_gpus": 1}).json()["status"] \
                == "allocated"
            assert [a["job_id"] for a in c.get("/v1/allocations").json()] == ["a", "b"]
        first.stop(signal.SIGKILL)
        first.start()  # the OS released the lock of the killed process
        with httpx.Client(base_url=first.url, timeout=10) as c:
            assert [a["job_id"] for a in c.get("/v1/allocations").json()] == ["a", "b"]
            assert c.post("/v1/release", json={"job_id": "a"}).json()["released"]
    finally:
        first.stop()
        if second.proc is not None:
            second.stop()  # still running only if it was not refused
