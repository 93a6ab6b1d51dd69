"""No request makes another wait (issue 30): the service's slow steps (a big body's parse and validation, a write
that waits for the allocator's lock, a node listing's formatting) run in worker threads, never on the event loop,
and formatting never holds the allocator's lock.

Each stall test holds one slow step still (a lock held by the test, or a step that waits on an event) and asserts on
order: another request is answered while the step is held, which cannot happen when the step runs on the event loop
(or under the lock). The app runs on a real uvicorn on 127.0.0.1 in this process, on an in-memory allocator
(SQLite synchronous OFF: the mode whose writes ran on the event loop before, as NORMAL's did)."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import httpx
import pydantic_core
import pytest

from allocator_helpers import T4, hint_set, v100
from hetplan.allocator.core import Allocator
from hetplan.allocator.service import ServiceSettings, create_app
from hetplan.allocator.service import middleware, nodes
from servers import TOKEN, on_loopback

POD = {"metadata": {"name": "p", "labels": {"hetplan.io/model": "res50"}},
       "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "4"}}}]}}
HELD_S = 10.0
"""How long a held step waits at most (the test releases it long before, unless the step stalls the loop)."""
ANSWER_S = 5.0
"""How long the other request may take: generous, since the test asserts on order, not on time."""


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Allocator]]:
    alloc = Allocator([v100("v1"), v100("v2"), T4], "hint", hint_set())
    assert alloc.synchronous == "OFF"
    with on_loopback(create_app(ServiceSettings(token=TOKEN, tick_seconds=0), allocator=alloc)) as url:
        yield url, alloc


def in_background(fn: Callable[[], Any]) -> tuple[ThreadPoolExecutor, Future]:
    pool = ThreadPoolExecutor(1)
    return pool, pool.submit(fn)


def answered_meanwhile(url: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """Another request, on a connection of its own, that must be answered while the held step is held."""
    with httpx.Client(base_url=url, timeout=ANSWER_S) as other:
        return other.request(method, path, **kwargs)


def test_a_write_waiting_for_the_lock_does_not_hold_other_requests(served):
    """An allocate blocked on the allocator's lock (held here, as a rebalance or a node sync holds it) waits in a
    worker thread: reads that need no lock (the hints, the OpenAPI document) are answered meanwhile."""
    url, alloc = served
    alloc.lock.acquire()
    pool, pending = in_background(lambda: httpx.post(f"{url}/v1/allocate", timeout=HELD_S + 5,
                                                     json={"job_id": "w1", "model": "res50", "num_gpus": 1}))
    try:
        time.sleep(0.3)  # the allocate reaches the lock
        assert answered_meanwhile(url, "GET", "/v1/hints").status_code == 200
        assert answered_meanwhile(url, "GET", "/openapi.json").status_code == 200
        assert not pending.done()  # still waiting for the lock: the order is the point
    finally:
        alloc.lock.release()
    answer = pending.result(timeout=HELD_S)
    pool.shutdown()
    assert answer.status_code == 200 and answer.json()["status"] == "allocated"
    assert httpx.post(f"{url}/v1/release", json={"job_id": "w1"}).json()["released"] is True


def test_a_node_listing_is_formatted_without_the_lock(served, monkeypatch):
    """While `GET /v1/nodes` formats its answer (held here at its first node), an allocate, which needs the lock,
    is answered: the listing held the lock only to copy the state."""
    url, alloc = served
    entered, go = threading.Event(), threading.Event()
    real = nodes.NodeOut

    def held_node_out(**fields: Any) -> Any:
        if not entered.is_set():
            entered.set()
            go.wait(HELD_S)
        return real(**fields)

    monkeypatch.setattr(nodes, "NodeOut", held_node_out)
    pool, pending = in_background(lambda: httpx.get(f"{url}/v1/nodes", timeout=HELD_S + 5))
    try:
        assert entered.wait(ANSWER_S)
        answer = answered_meanwhile(url, "POST", "/v1/allocate", json={"job_id": "n1", "model": "res50",
                                                                         "num_gpus": 1})
        assert answer.status_code == 200 and answer.json()["status"] == "allocated"
        assert not pending.done()
    finally:
        go.set()
    listed = pending.result(timeout=HELD_S)
    pool.shutdown()
    assert listed.status_code == 200
    body = listed.json()
    assert [n["name"] for n in body["nodes"]] == ["v1", "v2", "t4"] and body["totals"]["nodes"] == 3
    assert httpx.post(f"{url}/v1/release", json={"job_id": "n1"}).json()["released"] is True
    # the listing (taken before or after the allocate: one consistent copy) matches the state now
    after = httpx.get(f"{url}/v1/nodes").json()
    assert after["totals"]["free_gpus"] == 8 + 8 + 4 and all(n["jobs"] == [] for n in after["nodes"])


def big_filter_body(names: int = 1_000) -> bytes:
    """A NodeNames body over `THREADED_BODY_BYTES` within the names limit (1,027 at 3 nodes): long names."""
    body = json.dumps({"Pod": POD, "NodeNames": ["v1", "t4", *(f"n{i:06d}.{'x' * 60}.example" for i in range(names))]})
    assert len(body) > middleware.THREADED_BODY_BYTES
    return body.encode()


def test_a_request_is_answered_while_a_big_filter_body_is_parsed(served, monkeypatch):
    """A `/filter` body over `THREADED_BODY_BYTES` is parsed in a worker thread: held here in the parse, a health
    check and an allocate are answered meanwhile; the filter's answer is the one it gives unheld."""
    url, _ = served
    body = big_filter_body()
    entered, go = threading.Event(), threading.Event()

    def held_from_json(data: bytes, *args: Any, **kwargs: Any) -> Any:
        if len(data) > middleware.THREADED_BODY_BYTES:
            entered.set()
            go.wait(HELD_S)
        return pydantic_core.from_json(data, *args, **kwargs)

    monkeypatch.setattr(middleware, "pydantic_core", SimpleNamespace(from_json=held_from_json))
    pool, pending = in_background(lambda: httpx.post(f"{url}/filter", content=body, timeout=HELD_S + 5,
                                                     headers={"content-type": "application/json"}))
    try:
        assert entered.wait(ANSWER_S)
        assert answered_meanwhile(url, "GET", "/healthz").status_code == 200
        answer = answered_meanwhile(url, "POST", "/v1/allocate", json={"job_id": "f1", "model": "res50",
                                                                         "num_gpus": 1})
        assert answer.status_code == 200
        assert not pending.done()
    finally:
        go.set()
    filtered = pending.result(timeout=HELD_S)
    pool.shutdown()
    assert httpx.post(f"{url}/v1/release", json={"job_id": "f1"}).status_code == 200
    assert filtered.status_code == 200, filtered.text
    result = filtered.json()
    assert result["NodeNames"] == json.loads(body)["NodeNames"]  # v1, t4 fit; names hetplan does not know pass
    assert result["FailedNodes"] == result["FailedAndUnresolvableNodes"] == {}


PADDING = {"padding": "x" * (2 * 64 * 1024)}
"""An ignored key that takes a body over `THREADED_BODY_BYTES` (ExtenderArgs ignores unknown keys)."""

BAD_BODIES = [
    pytest.param('{"Pod": %s, "NodeNames": ["v1"], %s' % (json.dumps(POD), "{pad}"), id="no-json"),
    pytest.param('{"Pod": %s, "NodeNames": [1e309], %s}' % (json.dumps(POD), "{pad}"), id="non-finite-name"),
    pytest.param('{"Pod": %s, "Nodes": {"items": [{"a": [0, {"b": NaN}]}]}, %s}' % (json.dumps(POD), "{pad}"),
                 id="nan-deep-in-a-node"),
    pytest.param('{"Pod": %s, "NodeNames": "v1", %s}' % (json.dumps(POD), "{pad}"), id="names-not-a-list"),
    pytest.param('{"Pod": {"metadata": {}}, "NodeNames": ["v1"], %s}' % "{pad}", id="pod-without-spec"),
    pytest.param('{"Pod": %s, %s}' % (json.dumps(POD), "{pad}"), id="no-candidates"),
    pytest.param('[1, 2, {pad}]', id="not-an-object"),
]


@pytest.mark.parametrize("template", BAD_BODIES)
def test_a_big_bad_body_gets_the_same_4xx_as_a_small_one(served, template):
    """Parsed and validated in a worker thread or on the event loop, a bad body gets the same status and detail."""
    url, _ = served
    small = template.replace("{pad}", '"padding": ""' if template.startswith("{") else '""')
    big = template.replace("{pad}", json.dumps(PADDING)[1:-1] if template.startswith("{") else
                           json.dumps(PADDING["padding"]))
    assert len(small) < middleware.THREADED_BODY_BYTES < len(big)
    answers = [httpx.post(f"{url}/filter", content=body, headers={"content-type": "application/json"})
               for body in (small, big)]
    assert answers[0].status_code == answers[1].status_code == 422, [a.text[:300] for a in answers]
    details = [a.json()["detail"] for a in answers]
    if isinstance(details[0], list):
        for d in details:  # a decode error's offset differs with the padding; its type and message do not
            for error in d:
                if error["type"] == "json_invalid":
                    error["loc"], error["msg"] = error["loc"][:1], error["msg"].split(" at ")[0]
    assert details[0] == details[1]


FINITE_CASES = [
    (1.5, True), (math.inf, False), (-math.inf, False), (math.nan, False), ("NaN", True), (None, True), (10**400, True),
    ([], True), ({}, True), ([1, "a", None, True], True), ([1, 2.5, -0.0], True), ([1, 2.5, math.nan], False),
    ({"a": {"b": [{"c": [1, {"d": math.inf}]}]}}, False), ({"a": {"b": [{"c": [1, {"d": 1e308}]}]}}, True),
    ([[[[[[float("-inf")]]]]]], False), ({"x": list(range(1000)) + [math.nan]}, False),
]


@pytest.mark.parametrize(("value", "finite"), FINITE_CASES)
def test_the_cheap_pass_agrees_with_the_path_walk(value, finite):
    assert middleware.all_finite(value) is finite
    assert (middleware.non_finite(value) is None) is finite


def test_the_old_generation_pause_holds_while_any_body_is_in_flight_across_threads():
    """Several event loops (threads) handle large bodies at once: the oldest generation stays paused while any one
    is in flight, and the thresholds come back exactly once the last is done (a count changed without the lock
    could restore them early, or never)."""
    import gc
    import sys
    import threading

    before, broken = gc.get_threshold(), []
    start = threading.Barrier(8)

    def body() -> None:
        start.wait()
        for _ in range(1000):
            with middleware.old_generation_paused():
                if gc.get_threshold()[2] <= 10**6:
                    broken.append(gc.get_threshold())

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: a race shows
    try:
        threads = [threading.Thread(target=body) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert broken == [] and middleware._paused == 0 and gc.get_threshold() == before


def test_the_old_generation_pause_nests_and_gives_the_thresholds_back():
    import gc
    before = gc.get_threshold()
    with middleware.old_generation_paused():
        with middleware.old_generation_paused():
            assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 10**6
        assert gc.get_threshold()[2] > 10**6  # one large body still in flight
    assert gc.get_threshold() == before


def test_a_liveness_probe_during_a_round_answers_with_the_last_state_unless_it_is_stale(served, monkeypatch):
    """`/healthz` and `/metrics` wait `LOOK_S` for the allocator's lock (held here, as a round holds it), then answer
    with what they read last; once that is older than `STALE_S` they wait for the lock (a stuck lock fails the
    probe, so the kubelet restarts the service)."""
    from hetplan.allocator.service import ops

    url, alloc = served
    fresh = httpx.get(f"{url}/healthz").json()
    assert httpx.get(f"{url}/metrics").status_code == 200
    alloc.lock.acquire()
    try:
        assert answered_meanwhile(url, "GET", "/healthz").json() == fresh
        assert answered_meanwhile(url, "GET", "/metrics").status_code == 200
        monkeypatch.setattr(ops, "STALE_S", 0.0)
        pool, pending = in_background(lambda: httpx.get(f"{url}/healthz", timeout=HELD_S + 5))
        time.sleep(0.3)
        assert not pending.done()  # stale: it waits for the lock
    finally:
        alloc.lock.release()
    assert pending.result(timeout=HELD_S).status_code == 200
    pool.shutdown()
