"""One loop, two drivers: a trace replayed by the simulator and through the HTTP service gives the same decisions.

The simulator drives `hetplan.scheduler.Scheduler` in process; the service drives the same loop behind
`POST /v1/allocate` (submit), `POST /v1/release` (finish) and `POST /v1/actions/tick` (the round), on a real uvicorn
on 127.0.0.1 with a durable SQLite allocator and a virtual clock the test sets to each event's time. The events
(arrivals, completions, rounds) are the simulator's own; the two action logs must be the same, action by action
(kind, job, node, GPUs, cores, RAM, preempted), so every job starts, moves and ends at the same time in both.
"""

from __future__ import annotations

import threading
import time
import zlib

import httpx
import numpy as np
import pandas as pd
import pytest
import uvicorn

from hetplan.allocator import Allocator
from hetplan.allocator.core import NodeChanges
from hetplan.allocator.durable import DurableAllocator
from hetplan.allocator.service import ServiceSettings, create_app
from hetplan.allocator.service.bodies import action_out
from hetplan.allocator.spec import Job, Node
from hetplan.hints import HintSet
from hetplan.hints.index import HintEntry
from hetplan.reference import build_reference
from hetplan.scaling import fit_scaling, load_models, load_profile, load_single_gpu
from hetplan.scheduler.belief import HintedRates
from hetplan.scheduler.elastic import Elastic, ElasticRule
from hetplan.scheduler.loop import Scheduler
from hetplan.scheduler.online import Bounds, OnlineScheduler
from hetplan.scheduler.state import JobState
from hetplan.sim import TruthCurves, prepare_workload
from hetplan.sim.engine import SimConfig, Simulator
from servers import TOKEN, free_port

NODES = [Node(f"v{i}", "V100", 4, 32, 244) for i in range(3)] + [Node(f"t{i}", "T4", 4, 48, 192) for i in range(3)] \
    + [Node("big", "V100", 8, 64, 488)]
ROUND_S = 300.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def trace(n: int, seed: int, models: list[str], sizes: tuple[int, ...] = (1, 1, 2, 4, 8, 16),
          prefix: str = "j") -> pd.DataFrame:
    """A mixed trace with an overloaded stretch: many models, GPUs drawn from `sizes` (16 on these nodes: gangs),
    arrivals that outrun the cluster for an hour, then thin out; job ids `<prefix><k>`."""
    rng = np.random.default_rng(seed)
    dense = np.sort(rng.uniform(0, 3600, n * 2 // 3))
    sparse = np.sort(rng.uniform(3600, 4 * 3600, n - len(dense)))
    return pd.DataFrame({"job_id": [f"{prefix}{i:05d}" for i in range(n)], "model": rng.choice(models, n),
                         "num_gpus": rng.choice(list(sizes), n),
                         "arrival_s": np.concatenate([dense, sparse]), "duration_s": rng.exponential(1800, n)})


def hints(models: list[str], version: str = "h-diff") -> HintSet:
    return HintSet(version, {(m, g): (HintEntry("V100", 1, 9.0, 62.5), HintEntry("T4", 2, 6.0, 40.0))
                             for m in models for g in (1, 2, 4, 8)})


class Recording(Simulator):
    """The simulator, writing down each call it makes of the loop (what the service will be asked, in order)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.events: list[tuple[str, float, str]] = []
        loop = self.scheduler
        submit, finish, round_ = loop.submit, loop.finish, loop.round

        def on_submit(job, now):
            self.events.append(("submit", now, job.job_id))
            return submit(job, now)

        def on_finish(job_id, now):
            self.events.append(("finish", now, job_id))
            return finish(job_id, now)

        def on_round(now):
            self.events.append(("round", now, ""))
            return round_(now)

        loop.submit, loop.finish, loop.round = on_submit, on_finish, on_round


def _decisions(actions: list[dict]) -> list[tuple]:
    return [(x["kind"], x["job_id"], x.get("preempted", False),
             tuple((a["node"], a["gpus"], a["cpus"], a["mem_gb"]) for a in x["after"])) for x in actions]


def _sim_actions(simulator: Simulator) -> list[dict]:
    """The simulator's action log as the service would show it."""
    return [action_out(x).model_dump() for x in simulator.allocator.log.entries()]


@pytest.mark.parametrize("policy,order", [("hint", "las"), ("hint-static", "las"), ("first-fit", "fifo")])
def test_the_service_decides_as_the_simulator_does(tmp_path, policy, order):
    truth = TruthCurves.from_profiles(build_reference().derived)
    models = sorted(truth.models)
    workload = prepare_workload(trace(320, zlib.crc32(f"{policy}/{order}".encode()), models), truth.models)
    hint_set = hints(models)
    config = SimConfig(order, ROUND_S)
    sim_alloc = Allocator(list(NODES), config.policy(policy), hint_set)
    simulator = Recording(workload.jobs, sim_alloc, truth, config)
    result = simulator.run()
    assert result.counts["preemptions"] + result.counts["migrations"] > 0 or policy == "first-fit"
    assert result.timeline["waiting"].max() > 20  # the overloaded stretch: jobs queued, not refused

    clock = Clock()
    allocator = DurableAllocator(tmp_path / "allocator.db", config.policy(policy), hint_set, clock=clock)
    allocator.change_nodes(NodeChanges(upsert=list(NODES)))
    settings = ServiceSettings(db=tmp_path / "allocator.db", policy=policy, token=TOKEN, tick_seconds=0,
                               order=order, regrow=False)
    server = uvicorn.Server(uvicorn.Config(create_app(settings, allocator), host="127.0.0.1", port=free_port(),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        url = f"http://127.0.0.1:{server.config.port}"
        rows = {row.job_id: row for row in workload.jobs.itertuples()}
        admin = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, timeout=30) as client:
            for kind, now, job_id in simulator.events:
                clock.now = now
                if kind == "submit":
                    row = rows[job_id]
                    answer = client.post("/v1/allocate", json={"job_id": job_id, "model": row.model,
                                                               "num_gpus": int(row.num_gpus)})
                    assert answer.status_code == 200 and answer.json()["status"] in ("allocated", "queued"), answer.text
                elif kind == "finish":
                    assert client.post("/v1/release", json={"job_id": job_id}).json()["released"]
                else:
                    assert client.post("/v1/actions/tick", headers=admin).status_code == 200
            served = client.get("/v1/actions", params={"since": 0}).json()["actions"]
            assert client.get("/v1/queue").json()["jobs"] == []
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        allocator.close()
    simulated = _decisions(_sim_actions(simulator))
    assert len(simulated) > 400
    assert _decisions(served) == simulated


def _elastic_trace(seed: int = 31, n: int = 24) -> list[tuple[float, str, Job, Bounds | None]]:
    """A small elastic trace: rigid jobs of 1-8 GPUs and elastic gangs of fixed parts (1- or 2-GPU parts, bounds
    around their request, a change costing 5 s), arriving over 40 minutes; each with a run time (finished that long after its start)."""
    rng = np.random.default_rng(seed)
    models = ["imagenet", "cifar10", "bert", "deepspeech2"]
    out = []
    for k, at in enumerate(np.sort(rng.uniform(0, 2400, n))):
        model = str(rng.choice(models))
        if k % 3 == 0:
            part = int(rng.choice([1, 2]))
            job = Job.request(f"e{k:02d}", model, part, parts=2)
            out.append((float(at), float(rng.uniform(900, 2400)), job, Bounds(2 * part, 8 * part, 5.0)))
        else:
            out.append((float(at), float(rng.uniform(600, 2400)), Job(f"r{k:02d}", model, int(rng.choice([1, 2, 4, 8]))),
                        None))
    return out


def test_elastic_rounds_choose_the_same_in_the_service_as_in_the_simulator(tmp_path):
    """Issue 31: the same elastic trace through `Scheduler` called as the simulator calls it (arrivals, rounds at
    each boundary, ends) and through the service's `OnlineScheduler` (durable, journaled, a virtual clock) gives
    the same actions, one by one; the rounds resize elastic gangs (counts change), and end with nothing waiting."""
    models = ["imagenet", "cifar10", "bert", "deepspeech2"]
    hint_set = hints(models)
    belief = HintedRates(load_models(_scaling_csv(tmp_path)), lambda: hint_set)
    rule = ElasticRule(round_s=ROUND_S)
    sim_alloc = Allocator(list(NODES), "hint", hint_set)
    loop = Scheduler(sim_alloc, "las", ROUND_S, elastic=Elastic(belief, rule))
    trace = _elastic_trace()
    arrivals = [(at, "submit", job.job_id) for at, _, job, _ in trace]
    run_s = {job.job_id: run for _, run, job, _ in trace}
    by_id = {job.job_id: (job, bounds) for _, _, job, bounds in trace}
    events: list[tuple[float, str, str]] = []
    now, k, boundary = 0.0, 0, ROUND_S
    while k < len(arrivals) or loop.running or loop.queue:  # the simulator's order at an instant: ends, arrivals,
        ends = sorted((j.start + run_s[j.job_id], j.job_id) for j in loop.running.values())  # then the round
        upcoming = min([t for t, _ in ends[:1]] + [a for a, _, _ in arrivals[k:k + 1]] + [boundary])
        now = upcoming
        for t, job_id in ends:
            if t <= now:
                events.append((now, "finish", job_id))
                loop.finish(job_id, now)
        while k < len(arrivals) and arrivals[k][0] <= now:
            job, bounds = by_id[arrivals[k][2]]
            state = JobState(k, job, now, bounds=None if bounds is None else (bounds.min_gpus, bounds.max_gpus),
                             restart_s=30.0 if bounds is None else bounds.restart_s)
            events.append((now, "submit", job.job_id))
            loop.submit(state, now)
            k += 1
        if now >= boundary:
            boundary += ROUND_S
            if loop.wants_round():
                events.append((now, "round", ""))
                loop.round(now)
        assert now < 100_000, "the trace never drains"
    simulated = _decisions(_sim_actions_of(sim_alloc))
    parts: dict[str, int] = {}
    rescales = 0
    for kind, job_id, _, after in simulated:
        rescales += kind == "resize" and job_id in parts and len(after) != parts[job_id]
        parts[job_id] = len(after)
    assert rescales >= 2  # elastic gangs changed their number of parts
    assert len(simulated) > 20

    clock = Clock()
    allocator = DurableAllocator(tmp_path / "elastic.db", "hint", hint_set, clock=clock)
    allocator.change_nodes(NodeChanges(upsert=list(NODES)))
    online = OnlineScheduler(allocator, "las", ROUND_S, regrow=False, clock=clock,
                             elastic=Elastic(belief, ElasticRule(round_s=ROUND_S)))
    try:
        for at, kind, job_id in events:
            clock.now = at
            if kind == "submit":
                assert online.submit(*by_id[job_id]).status == "queued"
            elif kind == "finish":
                assert online.release(job_id)[0]
            else:
                online.round()
        served = _decisions(_sim_actions_of(allocator))
        assert online.queue() == []
    finally:
        allocator.close()
    assert served == simulated


def _sim_actions_of(allocator: Allocator) -> list[dict]:
    return [action_out(x).model_dump() for x in allocator.log.entries()]


def _scaling_csv(tmp_path) -> str:
    path = tmp_path / "scaling.csv"
    fit_scaling(load_profile(), load_single_gpu()).table().to_csv(path, index=False)
    return str(path)
