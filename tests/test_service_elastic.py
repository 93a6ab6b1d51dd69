"""Issue 31 in the service: elastic submissions (`min_gpus`/`max_gpus`) and the elastic rounds `hetplan serve
--scaling-models` runs on its ticks (real service, real HiGHS, the shipped scaling fit).

Cluster: 4 V100 nodes of 4 GPUs. Three rigid 4-GPU jobs and an elastic gang of 1-GPU parts (2-16 GPUs, restart
cost 1 s) arrive; rounds 60 s apart (a virtual clock). The elastic job starts on the 4 GPUs left; two rigid jobs
end and it grows 4 -> 8 (never more than 2x a round though 12 are free) -> 12; an 8-GPU job arrives and it shrinks
to 4 (the rigid job left is held: it has not run 20 x its 30 s restart cost). A kill -9 of a served process keeps
the counts and the queue.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from hetplan.allocator.core import NodeChanges
from hetplan.allocator.durable import DurableAllocator
from hetplan.allocator.service import ServiceSettings, create_app
from hetplan.allocator.spec import Node
from hetplan.scaling import fit_scaling, load_models, load_profile, load_single_gpu
from servers import TOKEN, Server, free_port

NODES = [Node(f"v{i}", "V100", 4, 32, 244) for i in range(4)]
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
ELASTIC = {"job_id": "e", "model": "imagenet", "num_gpus": 1, "parts": 2, "min_gpus": 2, "max_gpus": 16,
           "restart_s": 1}


@pytest.fixture(scope="module")
def scaling_csv(tmp_path_factory) -> Path:
    """The table `hetplan fit --scaling` writes, from the shipped profile."""
    path = tmp_path_factory.mktemp("scaling") / "scaling.csv"
    fit_scaling(load_profile(), load_single_gpu()).table().to_csv(path, index=False)
    return path


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Served:
    """The real app on a uvicorn thread on 127.0.0.1 over a durable allocator with a virtual clock."""

    def __init__(self, db: Path, scaling: Path | None) -> None:
        self.clock = Clock()
        self.allocator = DurableAllocator(db, "hint", None, clock=self.clock)
        self.allocator.change_nodes(NodeChanges(upsert=list(NODES)))
        settings = ServiceSettings(db=db, token=TOKEN, tick_seconds=0, scaling_models=scaling)
        self.server = uvicorn.Server(uvicorn.Config(create_app(settings, self.allocator), host="127.0.0.1",
                                                    port=free_port(), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> httpx.Client:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.server.config.port}", timeout=30)
        return self.client

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.allocator.close()


def counts(client: httpx.Client) -> dict[str, int]:
    """GPUs per job as `GET /v1/allocations` shows them (a gang's parts summed)."""
    out: dict[str, int] = {}
    for a in client.get("/v1/allocations").json():
        job = a["part_of"] or a["job_id"]
        out[job] = out.get(job, 0) + a["gpus"]
    return out


def submit(client: httpx.Client, body: dict) -> dict:
    answer = client.post("/v1/allocate", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_an_elastic_job_grows_at_most_2x_a_round_and_shrinks_for_an_arrival(tmp_path, scaling_csv):
    served = Served(tmp_path / "a.db", scaling_csv)
    with served as client:
        for k in range(3):
            assert submit(client, {"job_id": f"f{k}", "model": "imagenet", "num_gpus": 4})["status"] == "queued"
        assert submit(client, ELASTIC)["status"] == "queued"  # elastic rounds: every job starts at a round
        seen = []
        for now, event in [(60, "tick"), (100, "release"), (120, "tick"), (180, "tick"), (200, "arrive"),
                           (240, "tick"), (300, "tick")]:
            served.clock.now = now
            if event == "tick":
                actions = client.post("/v1/actions/tick", headers=ADMIN).json()["actions"]
                for x in actions:
                    if x["job_id"] == "e" and x["kind"] == "resize":  # a count change: parts differ in number
                        assert len(x["before"]) != len(x["after"])
                        assert all(a["gpus"] == 1 and a["part_of"] == "e" for a in x["after"])
            elif event == "release":
                for job in ("f0", "f1"):
                    assert client.post("/v1/release", json={"job_id": job}).json()["released"]
            else:
                assert submit(client, {"job_id": "g", "model": "imagenet", "num_gpus": 8})["status"] == "queued"
            seen.append(counts(client).get("e", 0))
            assert sum(counts(client).values()) <= 16
        assert seen == [4, 4, 8, 12, 12, 4, 4]
        assert counts(client) == {"f2": 4, "e": 4, "g": 8}
        assert client.get("/v1/queue").json()["jobs"] == []


@pytest.mark.parametrize("change,field", [
    ({"min_gpus": 8, "max_gpus": 4}, "max_gpus"),  # inverted
    ({"max_gpus": 32}, "max_gpus"),  # above every type's GPUs (16 V100s)
    ({"num_gpus": 2, "min_gpus": 3}, "min_gpus"),  # no whole number of 2-GPU parts
    ({"max_gpus": None}, "max_gpus"),  # one bound only
    ({"parts": None}, "min_gpus"),  # a single pod cannot change its GPU count
    ({"min_gpus": 4, "max_gpus": 8}, "min_gpus"),  # the request (2 GPUs) is outside its bounds
    ({"min_gpus": None, "max_gpus": None}, "restart_s"),  # a restart cost without bounds
])
def test_bad_bounds_are_a_422_naming_the_field_and_change_nothing(tmp_path, scaling_csv, change, field):
    body = {**ELASTIC, **change}
    body = {k: v for k, v in body.items() if v is not None}
    with Served(tmp_path / "b.db", scaling_csv) as client:
        before = client.get("/v1/actions", params={"since": 0}).json()["latest"]
        answer = client.post("/v1/allocate", json=body)
        assert answer.status_code == 422, answer.text
        assert field in answer.text
        assert client.get("/v1/queue").json()["jobs"] == [] and counts(client) == {}
        assert client.get("/v1/actions", params={"since": 0}).json()["latest"] == before


def test_without_scaling_models_bounds_are_ignored_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="hetplan.scheduler.online"), Served(tmp_path / "c.db", None) as client:
        answer = submit(client, ELASTIC)
        assert answer["status"] == "allocated" and len(answer["parts"]) == 2  # at once, at its requested count
        for now in (60, 120, 180):
            client.post("/v1/actions/tick", headers=ADMIN)
        assert counts(client) == {"e": 2}
    said = [r for r in caplog.records if "no scaling models" in r.getMessage()]
    assert len(said) == 1 and "e asks for 2-16 GPUs" in said[0].getMessage()


def test_a_kill_9_keeps_the_counts_and_the_queue(tmp_path, scaling_csv):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("name,gpu_type,gpus,vcpus,mem_gb\n" + "".join(f"{n.name},V100,4,32,244\n" for n in NODES))
    store = tmp_path / "store"
    store.mkdir()
    extra = ("--tick", "0", "--scaling-models", str(scaling_csv))
    server = Server(tmp_path, store, nodes, extra).start()
    fast = {**ELASTIC, "restart_s": 0.01}  # held 20 x 0.01 s after each change: the real clock moves past it
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for k in range(3):
                submit(client, {"job_id": f"f{k}", "model": "imagenet", "num_gpus": 4})
            submit(client, fast)
            client.post("/v1/actions/tick", headers=ADMIN)
            for job in ("f0", "f1"):
                client.post("/v1/release", json={"job_id": job})
            time.sleep(0.3)
            client.post("/v1/actions/tick", headers=ADMIN)
            submit(client, {"job_id": "w", "model": "imagenet", "num_gpus": 16})  # waits: f2 is held
            before = counts(client)
            assert before == {"f2": 4, "e": 8}
            queue = client.get("/v1/queue").json()["jobs"]
            latest = client.get("/v1/actions", params={"since": 0}).json()["latest"]
        server.stop(signal.SIGKILL)
        server.start()
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert counts(client) == before
            assert client.get("/v1/queue").json()["jobs"] == queue and [j["job_id"] for j in queue] == ["w"]
            assert client.get("/v1/actions", params={"since": 0}).json()["latest"] == latest
            time.sleep(0.3)
            client.post("/v1/actions/tick", headers=ADMIN)  # the elastic job goes on growing from its count
            assert counts(client)["e"] == 12
    finally:
        server.stop()


def test_load_models_names_the_bad_line(tmp_path, scaling_csv):
    models = load_models(scaling_csv)
    assert ("imagenet", "V100") in models
    lines = scaling_csv.read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([lines[0], lines[1].replace(lines[1].split(",")[2], "nan", 1), *lines[2:]]) + "\n")
    with pytest.raises(ValueError, match="line 2"):
        load_models(bad)
    with pytest.raises(ValueError, match="no column"):
        load_models(_write(tmp_path / "cols.csv", "model,gpu_type\nx,V100\n"))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_restart_of_the_service_keeps_each_jobs_restarts_and_attained_service(tmp_path, scaling_csv):
    """The change budget (`ElasticRule.change_budget`) and LAS's attained GPU-seconds are the journal's, not the
    process's: the elastic job grows 4 -> 8 -> 12 (two restarts, GPU-seconds at each count), then the service
    restarts and its scheduler knows both."""
    from hetplan.allocator.spec import Job
    from hetplan.scheduler.belief import HintedRates
    from hetplan.scheduler.elastic import Elastic, ElasticRule
    from hetplan.scheduler.online import Bounds, OnlineScheduler

    clock, db = Clock(), tmp_path / "r.db"

    def opened() -> tuple[DurableAllocator, OnlineScheduler]:
        alloc = DurableAllocator(db, "hint", None, clock=clock)
        if not alloc.cluster.nodes():
            alloc.change_nodes(NodeChanges(upsert=list(NODES)))
        rates = HintedRates(load_models(scaling_csv), lambda: alloc.hints)
        return alloc, OnlineScheduler(alloc, round_s=60, clock=clock, elastic=Elastic(rates, ElasticRule(round_s=60)))

    alloc, sched = opened()
    for k in range(3):
        sched.submit(Job(f"f{k}", "imagenet", 4))
    sched.submit(Job("e", "imagenet", 2, part_gpus=1), Bounds(2, 16, 1.0))
    for now, release in [(60, False), (100, True), (120, False), (180, False)]:
        clock.now = now
        if release:
            for job in ("f0", "f1"):
                sched.release(job)
        else:
            sched.round()
    state = sched.state("e")
    assert state.gpus == 12 and state.restarts == 2
    state.advance(clock.now)
    attained = state.attained  # 4 GPUs 60 s, 8 GPUs 60 s: 720 GPU-s
    assert attained == pytest.approx(4 * 60 + 8 * 60)
    alloc.close()

    alloc, sched = opened()
    try:
        again = sched.state("e")
        assert again.gpus == 12 and again.restarts == 2
        again.advance(clock.now)
        assert again.attained == pytest.approx(attained)
    finally:
        alloc.close()


@pytest.mark.parametrize("model,restart_s,expected", [
    ("res50", None, 250.0),      # Sia's imagenet cost, under hetplan's name
    ("imagenet", None, 250.0),   # ... and under Sia's
    ("unknown-net", None, 30.0),  # no known cost: the flat 30 s
    ("res50", 7, 7.0),           # stated: as stated
])
def test_an_elastic_jobs_restart_cost_is_its_models_unless_stated(model, restart_s, expected):
    from hetplan.allocator.service.bodies import AllocateRequest

    body = {**ELASTIC, "model": model, "restart_s": restart_s}
    assert AllocateRequest(**{k: v for k, v in body.items() if v is not None}).bounds().restart_s == expected
