"""Issue 31, elastic counts on the service: `POST /v1/scale` changes a running gang of fixed parts' number of parts,
all or nothing, journaled (a restart keeps the new count); bad input gets a 4xx naming what is wrong and changes
nothing. The real FastAPI app on a `DurableAllocator` (SQLite) in process."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from hetplan.allocator.durable import DurableAllocator
from hetplan.allocator.service import ServiceSettings, create_app
from hetplan.allocator.spec import GANG_SEP
from allocator_helpers import hint_set, v100

MODEL = "resnet50"


def nodes():
    return [v100("a", gpus=4, cpus=32, mem_gb=244), v100("b", gpus=4, cpus=32, mem_gb=244)]


class Service:
    """The app on a journal at `db`; `restart` closes it and opens a new one on the same journal."""

    def __init__(self, db) -> None:
        self.db = db
        self._open(seed=True)

    def _open(self, seed: bool = False) -> None:
        self.alloc = DurableAllocator(self.db, "hint", hint_set())
        if seed:
            for node in nodes():
                self.alloc.upsert_node(node)
        self.client = TestClient(create_app(ServiceSettings(tick_seconds=0), allocator=self.alloc)).__enter__()

    def restart(self) -> None:
        self.close()
        self._open()

    def close(self) -> None:
        self.client.__exit__(None, None, None)
        self.alloc.close()

    def state(self) -> tuple:
        """Everything a refused change must leave as it was: allocations, the log's end, the queue."""
        c = self.client
        return c.get("/v1/allocations").json(), c.get("/v1/actions").json()["latest"], c.get("/v1/queue").json()


@pytest.fixture
def svc(tmp_path):
    s = Service(tmp_path / "a.db")
    yield s
    s.close()


def gang(svc: Service, job: str = "g", parts: int = 2, gpus: int = 1) -> dict:
    r = svc.client.post("/v1/allocate", json={"job_id": job, "model": MODEL, "num_gpus": gpus, "cpus": 2,
                                               "mem_gb": 8, "parts": parts})
    assert r.json()["status"] == "allocated", r.json()
    return r.json()


def check_parts(parts: list[dict], job: str, count: int) -> None:
    """The invariant: parts `<job>#0..count-1`, each of the gang's GPUs, each part its request at the count's."""
    assert [p["job_id"] for p in parts] == [f"{job}{GANG_SEP}{k}" for k in range(count)], parts
    assert all(p["part_of"] == job and p["requested_cpus"] == 2 * count for p in parts), parts


def test_a_gang_scales_up_and_down_keeping_its_parts_in_place_and_a_restart_keeps_the_count(svc):
    first = gang(svc)["parts"]
    c = svc.client
    r = c.post("/v1/scale", json={"job_id": "g", "parts": 4})
    body = r.json()
    assert (r.status_code, body["status"]) == (200, "scaled"), body
    check_parts(body["parts"], "g", 4)
    assert [(p["node"], p["cpus"], p["mem_gb"]) for p in body["parts"][:2]] == \
        [(p["node"], p["cpus"], p["mem_gb"]) for p in first]  # the running parts stay where and as they are
    resize = body["actions"][0]
    assert (resize["kind"], len(resize["before"]), len(resize["after"])) == ("resize", 2, 4)
    assert c.get("/v1/actions", params={"since": resize["seq"] - 1}).json()["actions"][0] == resize  # in the log
    assert c.post("/v1/scale", json={"job_id": "g", "parts": 4}).json()["status"] == "unchanged"

    svc.restart()  # journaled: the count, the parts and the submission's request survive
    c = svc.client
    check_parts([a for a in c.get("/v1/allocations").json()], "g", 4)
    again = c.post("/v1/allocate", json={"job_id": "g", "model": MODEL, "num_gpus": 1, "cpus": 2, "mem_gb": 8,
                                         "parts": 4}).json()
    assert (again["status"], again["replayed"]) == ("allocated", True), again  # the new count is its request
    r = c.post("/v1/scale", json={"job_id": "g", "parts": 2})
    check_parts(r.json()["parts"], "g", 2)
    assert r.json()["parts"] == first  # back to the two it began with, as they were
    assert sum(n["free_gpus"] for n in c.get("/v1/nodes").json()["nodes"]) == 6


def test_new_parts_that_do_not_fit_change_nothing_and_the_answer_says_why(svc):
    gang(svc)
    c = svc.client
    c.post("/v1/allocate", json={"job_id": "x", "model": MODEL, "num_gpus": 4})  # 2 GPUs free in all now
    before = svc.state()
    r = c.post("/v1/scale", json={"job_id": "g", "parts": 5})
    body = r.json()
    assert (r.status_code, body["status"], body["reason"]) == (200, "rejected", "no-capacity"), body
    assert "3 more parts" in body["message"] and len(body["parts"]) == 2
    assert svc.state() == before
    r = c.post("/v1/scale", json={"job_id": "g", "parts": 4})  # exactly the 2 free GPUs: all or nothing, all
    check_parts(r.json()["parts"], "g", 4)


@pytest.mark.parametrize("body, code, field", [
    ({"job_id": "nobody", "parts": 3}, 404, "nobody"),
    ({"job_id": "x", "parts": 3}, 409, "no gang of fixed parts"),
    ({"job_id": "g", "parts": 1}, 422, "parts"),
    ({"job_id": "g", "parts": 2.5}, 422, "parts"),
    ({"job_id": "g", "parts": "3"}, 422, "parts"),
    ({"job_id": "g", "parts": True}, 422, "parts"),
    ({"job_id": "g"}, 422, "parts"),
    ({"job_id": "g#0", "parts": 3}, 422, "job_id"),
    ({"job_id": "g", "parts": 3, "extra": 1}, 422, "extra"),
    ({"job_id": "big", "parts": 600}, 422, "parts"),  # 600 parts of 2 GPUs: more than 1,024 GPUs in all
])
def test_bad_scales_get_a_4xx_naming_what_is_wrong_and_change_nothing(svc, body, code, field):
    gang(svc)
    gang(svc, "big", gpus=2)
    svc.client.post("/v1/allocate", json={"job_id": "x", "model": MODEL, "num_gpus": 1})
    before = svc.state()
    r = svc.client.post("/v1/scale", json=body)
    assert r.status_code == code and field in r.text, r.text
    assert svc.state() == before


def test_a_gang_waiting_in_the_queue_is_not_scaled(svc):
    svc.client.post("/v1/allocate", json={"job_id": "x", "model": MODEL, "num_gpus": 4})
    svc.client.post("/v1/allocate", json={"job_id": "y", "model": MODEL, "num_gpus": 4})
    r = svc.client.post("/v1/allocate", json={"job_id": "w", "model": MODEL, "num_gpus": 1, "parts": 2})
    assert r.json()["status"] == "queued"
    r = svc.client.post("/v1/scale", json={"job_id": "w", "parts": 3})
    assert r.status_code == 409 and "waits in the queue" in r.text
