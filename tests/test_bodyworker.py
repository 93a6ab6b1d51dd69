"""Large extender bodies are read in a worker process (issue 30: parsing holds the GIL, so a thread still stalled
every other request): the same bytes answer every body on every path, a worker killed under a request is replaced
(the request answered or refused with a clean 4xx, the next one answered), and no worker outlives `hetplan serve`.

The app runs on a real uvicorn on 127.0.0.1 in this process (so the tests can move the thresholds) on an in-memory
allocator; `hetplan serve` itself in the orphan tests. The worker is a real spawned process."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import uvicorn

import worker_calls
from allocator_helpers import T4, hint_set, v100
from hetplan.allocator.core import Allocator
from hetplan.allocator.service import ServiceSettings, create_app
from hetplan.allocator.service import extender as service_extender
from hetplan.allocator.service import middleware
from hetplan.allocator.service.bodyworker import BodyWorker, WorkerDied
from hetplan.allocator.service.extender_body import PROCESS_BODY_BYTES
from servers import TOKEN, Server, free_port

POD = {"metadata": {"name": "p", "labels": {"hetplan.io/model": "res50"}},
       "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "4"}}}]}}
HELD = {**POD, "metadata": {**POD["metadata"], "annotations": {"hetplan.io/job-id": "held"}}}
BAD_POD = {**POD, "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1e999"}}}]}}
JSON = {"content-type": "application/json"}


def node(name: Any, product: str | None = "Tesla-V100-SXM2-16GB", gpus: Any = "8", **extra: Any) -> dict:
    """A v1.Node item (`extra`: more keys, kept as sent in /filter's answer)."""
    labels = {"nvidia.com/gpu.product": product, "zone": "eu-1 \u00e9\u2603"} if product else {"zone": "z"}
    return {"metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"nvidia.com/gpu": gpus, "cpu": "64", "memory": "488Gi"}}, **extra}


ITEMS = [node("n-a"), node("n-small", gpus="0"), node("n-b", big=10**30, ratio=0.1, deep=[{"x": [1.5e300, None]}]),
         node("n-c", product=None), node("n-bad", gpus="1e999"), {"metadata": "no object"}, node("n-d"),
         node("n-e", product="Tesla-T4"), node("n-a")]
"""Nodes that pass, fail and are unresolvable, interleaved (the answer splices runs of kept items), a repeated
name, numbers of every kind, and an item that is no v1.Node."""

CASES: list[tuple[str, Any, int]] = [
    ("names", {"Pod": POD, "NodeNames": ["v1", "t4", "gone", "v2"]}, 200),
    ("names-empty", {"Pod": POD, "NodeNames": []}, 200),
    ("nodes", {"Pod": POD, "Nodes": {"apiVersion": "v1", "kind": "NodeList", "metadata": {"rv": "7"},
                                     "items": ITEMS}}, 200),
    ("nodes-items-only", {"Pod": POD, "Nodes": {"items": ITEMS[::-1]}}, 200),
    ("nodes-none-kept", {"Pod": POD, "Nodes": {"items": [node("x", gpus="0"), node("y", product=None, gpus="0")]}},
     200),
    ("nodes-and-names", {"Pod": POD, "Nodes": {"items": ITEMS[:3]}, "NodeNames": ["v1"]}, 200),
    ("allocated-names", {"Pod": HELD, "NodeNames": ["v1", "v2", "t4"]}, 200),
    ("allocated-nodes", {"Pod": HELD, "Nodes": {"items": [node("v1"), node("v2")]}}, 200),
    ("no-gpu-pod", {"Pod": {**POD, "spec": {"containers": [{"name": "c"}]}}, "NodeNames": ["t4"]}, 200),
    ("bad-pod-quantity", {"Pod": BAD_POD, "NodeNames": ["v1"]}, 400),
    ("too-many-names", {"Pod": POD, "NodeNames": [f"n{i}" for i in range(1028)]}, 413),
    ("too-many-names-allocated", {"Pod": HELD, "NodeNames": [f"n{i}" for i in range(1028)]}, 413),
    ("bad-pod-and-too-many-names", {"Pod": BAD_POD, "NodeNames": [f"n{i}" for i in range(1028)]}, 400),
    ("names-not-strings", {"Pod": POD, "NodeNames": list(range(120))}, 422),
    ("names-not-a-list", {"Pod": POD, "NodeNames": "v1"}, 422),
    ("pod-without-spec", {"Pod": {"metadata": {}}, "NodeNames": ["v1"]}, 422),
    ("no-candidates", {"Pod": POD}, 422),
    ("not-an-object", [1, 2, 3], 422),
    ("no-json", '{"Pod": {}, "NodeNames": ["v1"]', 422),
    ("nan-deep-in-a-node", '{"Pod": %s, "Nodes": {"items": [{"a": [0, {"b": NaN}]}]}}' % json.dumps(POD), 422),
    ("non-finite-name", '{"Pod": %s, "NodeNames": [1e309]}' % json.dumps(POD), 422),
    ("lone-surrogate", '{"Pod": %s, "NodeNames": ["\\ud800"]}' % json.dumps(POD), 422),
]

PATHS = {"event loop": (1 << 40, 1 << 40), "thread": (0, 1 << 40), "process": (0, 0)}
"""Where a body is read: (`THREADED_BODY_BYTES`, `PROCESS_BODY_BYTES`) that send every body there."""


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, Any]]:
    alloc = Allocator([v100("v1"), v100("v2"), T4], "hint", hint_set())
    app = create_app(ServiceSettings(token=TOKEN, tick_seconds=0), allocator=alloc)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    held = httpx.post(f"{url}/v1/allocate", json={"job_id": "held", "model": "res50", "num_gpus": 1})
    assert held.json()["status"] == "allocated"
    try:
        yield url, app.state.context
    finally:
        server.should_exit = True
        thread.join(timeout=15)
    assert app.state.context.body_worker.pids() == []  # stopped with the app
    assert not list(Path(tempfile.gettempdir()).glob("hetplan-body-*"))  # every body's file deleted, errors included


def encoded(body: Any) -> bytes:
    return (body if isinstance(body, str) else json.dumps(body)).encode()


def post_on(url: str, monkeypatch: pytest.MonkeyPatch, path: str, route: str, body: bytes) -> tuple[int, bytes]:
    threaded, process = PATHS[path]
    monkeypatch.setattr(middleware, "THREADED_BODY_BYTES", threaded)
    monkeypatch.setattr(service_extender, "PROCESS_BODY_BYTES", process)
    answer = httpx.post(f"{url}{route}", content=body, headers=JSON, timeout=60)
    return answer.status_code, answer.content


@pytest.mark.parametrize("route", ["/filter", "/prioritize"])
@pytest.mark.parametrize(("name", "body", "status"), CASES, ids=[c[0] for c in CASES])
def test_every_path_gives_the_same_bytes(served, monkeypatch, route, name, body, status):
    """On the event loop, in a thread or in the worker process, a body gets the same status and the same bytes."""
    url, ctx = served
    answers = {path: post_on(url, monkeypatch, path, route, encoded(body)) for path in PATHS}
    assert answers["process"][0] == status, answers["process"][1][:300]
    assert answers["event loop"] == answers["thread"] == answers["process"], name
    assert ctx.body_worker.pids(), "the process path ran in the worker"


def test_the_filter_answer_keeps_exactly_the_passing_items_as_sent(served, monkeypatch):
    """The spliced Nodes answer: the NodeList's own keys, then the passing items (a repeated name twice), each as
    sent; the others failed or unresolvable."""
    url, _ = served
    status, content = post_on(url, monkeypatch, "process", "/filter", encoded(CASES[2][1]))
    answer = json.loads(content)
    assert status == 200 and list(answer["Nodes"]) == ["apiVersion", "kind", "metadata", "items"]
    kept = [0, 2, 3, 6, 7, 8]  # three runs; n-c (no product label) passes as neutral
    assert answer["Nodes"]["items"] == [ITEMS[i] for i in kept]
    assert set(answer["FailedAndUnresolvableNodes"]) == {"n-small", "n-bad", "<unnamed>"}


def test_a_body_over_the_threshold_goes_to_the_worker_with_the_same_answer(served, monkeypatch):
    """Unpatched thresholds: a 1.5 MiB Nodes body is read in the worker process (a fresh worker's pid appears),
    and its answer is byte for byte the one read on the event loop."""
    url, ctx = served
    ctx.body_worker.close()
    body = encoded({"Pod": POD, "Nodes": {"kind": "NodeList", "items": ITEMS * 1500}})
    assert len(body) > PROCESS_BODY_BYTES
    answer = httpx.post(f"{url}/filter", content=body, headers=JSON, timeout=60)
    assert answer.status_code == 200 and ctx.body_worker.pids()
    assert (answer.status_code, answer.content) == post_on(url, monkeypatch, "event loop", "/filter", body)


@pytest.mark.parametrize("slice_bytes", [1, 5, 333, 1 << 20])
def test_the_spliced_answer_is_the_same_in_slices_of_any_size(served, monkeypatch, slice_bytes):
    """The kept runs are copied in slices of at most `SLICE_BYTES`: any size gives the same bytes."""
    url, _ = served
    body = encoded(CASES[2][1])
    expected = post_on(url, monkeypatch, "event loop", "/filter", body)
    monkeypatch.setattr(service_extender, "SLICE_BYTES", slice_bytes)
    assert post_on(url, monkeypatch, "process", "/filter", body) == expected


def test_more_than_the_listed_errors_are_counted(served, monkeypatch):
    """A body with 1,000 errors: 50 listed and "and 950 more errors" on every path (the worker sends 50 and a count)."""
    url, _ = served
    body = encoded({"Pod": POD, "NodeNames": list(range(1000))})
    answers = {path: post_on(url, monkeypatch, path, "/filter", body) for path in PATHS}
    assert len(set(answers.values())) == 1
    detail = json.loads(answers["process"][1])["detail"]
    assert len(detail) == 51 and detail[-1]["msg"] == "and 950 more errors"


def kill_when_running(worker: BodyWorker, not_these: set[int], ready: Path | None = None, timeout: float = 30) -> int:
    """Wait for a worker process other than `not_these` (and for the file `ready`, which the call under it
    writes), SIGKILL it, return its pid. Killed while still starting, it is a death all the same."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = set(worker.pids()) - not_these
        if pids and (ready is None or ready.exists()):
            pid = pids.pop()
            os.kill(pid, signal.SIGKILL)
            return pid
        time.sleep(0.01)
    raise AssertionError("no worker process started")


def test_a_worker_killed_under_a_call_is_replaced_and_the_call_answered():
    worker = BodyWorker()
    try:
        pending = threading.Thread(target=lambda: results.append(asyncio.run(worker.run(worker_calls.pid))))
        results: list[int] = []
        first = asyncio.run(worker.run(worker_calls.pid))
        assert first != os.getpid() and worker.pids() == [first]
        os.kill(first, signal.SIGKILL)  # killed while idle: the next call finds a fresh one
        pending.start()
        pending.join(60)
        assert results and results[0] not in (first, os.getpid()) and worker.pids() == results
    finally:
        worker.close()
    assert worker.pids() == [] and not psutil.pid_exists(results[0])


def test_a_call_whose_worker_dies_every_time_is_worker_died_and_the_next_call_works():
    worker = BodyWorker()
    try:
        errors: list[BaseException] = []

        def call() -> None:
            try:
                asyncio.run(worker.run(worker_calls.hang))
            except WorkerDied as exc:
                errors.append(exc)

        pending = threading.Thread(target=call)
        pending.start()
        first = kill_when_running(worker, set())
        kill_when_running(worker, {first})
        pending.join(60)
        assert len(errors) == 1 and "died 2 times" in str(errors[0])
        assert asyncio.run(worker.run(worker_calls.pid)) in worker.pids()
    finally:
        worker.close()


def test_a_request_whose_worker_is_killed_is_answered_or_refused_cleanly_and_the_next_is_answered(
        served, monkeypatch, tmp_path):
    """Killed once under a /filter: the request is read again by a fresh worker and answered as if nothing
    happened. Killed on every try: a clean 413 naming why. Either way the next request is answered."""
    url, ctx = served
    body = encoded(CASES[2][1])
    expected = post_on(url, monkeypatch, "event loop", "/filter", body)
    monkeypatch.setattr(middleware, "THREADED_BODY_BYTES", 0)
    monkeypatch.setattr(service_extender, "PROCESS_BODY_BYTES", 0)
    monkeypatch.setattr(service_extender, "read_large_file", functools.partial(worker_calls.hang_first,
                                                                          str(tmp_path / "hung")))
    answers: list[httpx.Response] = []
    for kills in (1, 2):
        (tmp_path / "hung").unlink(missing_ok=True)
        if kills == 2:
            monkeypatch.setattr(service_extender, "read_large_file", worker_calls.hang)
        pending = threading.Thread(target=lambda: answers.append(httpx.post(f"{url}/filter", content=body,
                                                                             headers=JSON, timeout=120)))
        pending.start()
        seen: set[int] = set()
        for _ in range(kills):
            seen.add(kill_when_running(ctx.body_worker, seen, tmp_path / "hung" if kills == 1 else None))
        pending.join(120)
    assert (answers[0].status_code, answers[0].content) == expected
    assert answers[1].status_code == 413 and answers[1].json()["detail"] == service_extender.WORKER_DIED
    monkeypatch.setattr(service_extender, "read_large_file", worker_calls.read_large_file)
    assert post_on(url, monkeypatch, "process", "/filter", body) == expected


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def gone(procs: list[psutil.Process], timeout: float) -> bool:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return all(p.status() == psutil.STATUS_ZOMBIE for p in alive)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_no_worker_process_outlives_hetplan_serve(tmp_path, sig):
    """`hetplan serve` stopped (SIGTERM, Ctrl-C) stops its worker; killed (-9), the worker sees its parent gone and
    exits by itself. Checked by the pids of every process the service started."""
    server = Server(tmp_path, tmp_path / "store").start()
    try:
        body = encoded({"Pod": POD, "NodeNames": ["v1"], "padding": "x" * (PROCESS_BODY_BYTES + 1)})
        answer = httpx.post(f"{server.url}/filter", content=body, headers=JSON, timeout=60)
        assert answer.status_code == 200, answer.text
        started = descendants(server.proc.pid)
        workers = [p for p in started if "spawn_main" in " ".join(p.cmdline())]
        assert len(workers) == 1, [p.cmdline() for p in started]
    finally:
        server.stop(sig)
    if sig != signal.SIGKILL:  # stopped by the service itself before it exited, not by its own watch afterwards
        assert gone(workers, timeout=0)
    assert gone(started, timeout=10), [(p.pid, p.cmdline()) for p in started if p.is_running()]

