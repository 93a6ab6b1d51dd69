"""Issue 30's controller target, on the STAND-IN API server (`standin_apiserver.py`; not a real kube-apiserver):
controller kills leave 0 pods ungated that the scheduler did not admit.

`hetplan serve` (FIFO queue, a round every second) and two `hetplan controller` replicas (each serving the webhook)
run as subprocesses (`k8s_rig.Rig`); a burst of opted-in pods asks for about three times the cluster's GPUs, so
most wait behind the scheduling gate `hetplan.io/queued`; running pods end as the burst goes on, so queued jobs are
admitted (`start` actions) while the leading controller is SIGKILLed three times and started again. Every removal
of the queue's gate is checked as it reaches the stand-in, before it is applied: the service must allocate the
job at that moment, on the node the pod is pinned to, with the pod's cores and RAM. At the end, once converged:
every ungated pod's job is allocated where and as the pod runs, every gated pod's job waits in the service's queue,
and no node holds more than its allocatable, and no bare pod whose preemption a kill interrupted (between its
eviction and its creation again) is lost: a new leader creates it again from the controller's ConfigMap of
preemptions (`intents`; before that fix about 1 run in 4 lost one, its job queued without a pod)."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import httpx
import pytest

from allocator_helpers import make_plan
from hetplan.allocator import Job
from hetplan.allocator.actions import Action
from hetplan.allocator.k8s import pods
from hetplan.allocator.k8s.controller import CHANGES
from hetplan.hints import HintStore
from k8s_rig import CONTROLLER, SERVE, Rig, healthy, hints_csv
from standin_apiserver import ApiError, eventually, json_patch, k8s_node, k8s_pod, pod_requests
from test_k8s_controller import allocation, requests_of
from test_k8s_controller import rig as inproc  # noqa: F401 - the fixture: the controller and the service in process
from test_k8s_queue import create_queued
from test_k8s_strict import leading

NAMESPACE = "ml"
KILL_AT = (6, 16, 26)  # the burst's steps at which the leading controller is SIGKILLed (and started again)


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)


def small_cluster() -> dict[str, dict]:
    """Three 4-GPU T4 nodes and two 8-GPU V100 nodes: 28 GPUs."""
    shapes = [(f"t4-{i}", "Tesla-T4", "4", "48", "192Gi") for i in range(3)] + \
        [(f"v100-{i}", "Tesla-V100-SXM2-16GB", "8", "64", "488Gi") for i in range(2)]
    return {name: k8s_node(name, product=product, gpus=gpus, cpu=cpu, memory=mem)
            for name, product, gpus, cpu, mem in shapes}


RACE_S = 0.2  # how old the state a gate's removal acted on may be: the controller's last look at the log, then two
# API calls (resize, remove the gate): measured <= 0.02 s here; a start replayed stale after a kill: 0.1-0.6 s


@dataclass
class Ungating:
    """One removal of the queue's gate as it reached the stand-in: when, the pod's node, cores and RAM then, and
    the job's allocation in the service at that moment (None: none)."""

    at: float
    job: str
    pod: pods.Target
    service: pods.Target | None


class GateWatch:
    """Wraps the stand-in's pod calls: each PATCH that removes the queue's gate is checked against the service's
    allocations as it arrives, before the stand-in applies it (what the service allocates at that moment)."""

    def __init__(self, rig: Rig) -> None:
        self.rig, self.original = rig, rig.api.pod_call
        self.seen: list[Ungating] = []
        self.lock = threading.Lock()
        rig.api.pod_call = self.pod_call

    def pod_call(self, method: str, ns: str, name: str, sub: str | None, body: Any, ctype: str) -> tuple[int, dict]:
        before = self.rig.api.pod(ns, name) if method == "PATCH" and sub is None else None
        if before is not None and pods.has_gate(before, pods.QUEUE_GATE) and isinstance(body, list):
            try:
                after = json_patch(before, body)
            except (KeyError, IndexError, ValueError, TypeError):
                after = before  # refused by the stand-in as it is
            if not pods.has_gate(after, pods.QUEUE_GATE):
                self.check(after)
        return self.original(method, ns, name, sub, body, ctype)

    def check(self, pod: dict) -> None:
        at, job = time.time(), str(pods.job_id(pod))
        with httpx.Client(base_url=self.rig.url, timeout=10) as http:
            a = next((a for a in http.get("/v1/allocations").json() if a["job_id"] == job), None)
        cpu_m, mem_mib = pods.requests(pod)
        with self.lock:
            self.seen.append(Ungating(at, job, pods.Target(str(pods.node_of(pod)), cpu_m, mem_mib),
                                      pods.Target.of(a) if a else None))

    def unadmitted(self, history: list[dict]) -> list[str]:
        """The removals whose pod the service did not hold so at that moment, nor (a race: the service changed it
        while the controller acted) at any moment of the `RACE_S` before it (from the action log)."""
        out = []
        for u in self.seen:
            if u.service == u.pod:
                continue
            mine = [a for a in history if a["job_id"] == u.job and a["kind"] in CHANGES]  # notes change nothing
            held = [None if a["kind"] == "stop" else pods.Target.of(a["after"][0]) for a in mine]
            window = [h for a, h in zip(mine, held) if u.at - RACE_S < a["at"] <= u.at]
            before = [h for a, h in zip(mine, held) if a["at"] <= u.at - RACE_S][-1:]
            if u.pod not in window + before:
                out.append(f"{u.job} ungated at {u.pod}, allocated {u.service}; its actions "
                           f"{[(a['seq'], round(a['at'] - u.at, 2), a['kind'], h) for a, h in zip(mine, held)]}")
        return out


def unsettled(rig: Rig) -> str:
    """'' when the cluster matches the service: every job one live pod; an ungated one Running on its
    allocation's node with its cores and RAM; a gated one's job in the queue and not allocated; every allocation and
    every queued job with a pod. Else what is not."""
    allocations = rig.allocations()
    queued = {j["job_id"] for j in rig.http.get("/v1/queue").json()["jobs"]}
    live: dict[str, list[dict]] = {}
    for pod in rig.managed():
        live.setdefault(str(pods.job_id(pod)), []).append(pod)
    for job, held in live.items():
        if len(held) != 1 or pods.terminating(held[0]) or pods.has_gate(held[0], pods.MIGRATION_GATE):
            return f"{job}: {len(held)} pods, terminating or moving"
        pod = held[0]
        if pods.has_gate(pod, pods.QUEUE_GATE):
            if job not in queued or job in allocations:
                return f"{job}: gated, queued {job in queued}, allocated {job in allocations}"
            continue
        a = allocations.get(job)
        if a is None:
            return f"{job}: ungated without an allocation"
        if not pods.matches(pod, pods.Target.of(a)) or pod["spec"].get("nodeName") != a["node"] \
                or pod["status"].get("phase") != "Running":
            return f"{job}: pod {pods.node_of(pod)} {pods.requests(pod)} {pod['status'].get('phase')} != {a}"
    missing = (set(allocations) | queued) - set(live)  # a preempted bare pod is waited for until created again
    if not missing:
        return ""
    return f"jobs without a pod: {sorted(missing)[:5]} (lost mid-preemption: {sorted(lost_in_preemption(rig, queued))})"


def lost_in_preemption(rig: Rig, queued: set[str]) -> set[str]:
    """Queued jobs without a pod whose bare pod a controller began to preempt (a kill between its eviction and its
    creation again lost the pod, before the preemption was recorded in a ConfigMap first)."""
    rig.log.flush()
    text = (rig.root / "processes.log").read_text(errors="replace")
    return {job for job in queued if f"controller: {job} preempted" in text and not any(
        pods.job_id(p) == job for p in rig.managed())}


def overcommitted(rig: Rig) -> list[str]:
    """Nodes whose bound live pods' requests (cpu, memory, GPUs) exceed their allocatable."""
    used: dict[str, dict[str, Decimal]] = {}
    for pod in rig.api.live_pods():
        node = pod["spec"].get("nodeName")
        if node:
            for resource, value in pod_requests(pod).items():
                used.setdefault(node, {}).setdefault(resource, Decimal(0))
                used[node][resource] += value
    out = []
    from kubernetes.utils.quantity import parse_quantity

    for node, held in used.items():
        allocatable = rig.api.nodes[node]["status"]["allocatable"]
        for resource in ("cpu", "memory", "nvidia.com/gpu"):
            if held.get(resource, Decimal(0)) > parse_quantity(allocatable.get(resource, "0")):
                out.append(f"{node} {resource} {held[resource]} > {allocatable.get(resource)}")
    return out


def burst(rig: Rig, count: int, seed: int, gap: float = 0.1, life: tuple[float, float] = (1.0, 4.0)) -> list[str]:
    """`count` opted-in pods, one every `gap` s; a running pod ends `life` s after it starts running (its job is
    released by the controller, the queue's next admitted); at `KILL_AT` the leader is SIGKILLed and started again.
    Goes on (ends, no arrivals) until a few seconds after the last kill. What happened, for the failure message."""
    rng = random.Random(seed)
    ends: dict[str, float] = {}
    told = []
    step = 0
    last_kill = None
    while step < count or last_kill is None or time.monotonic() < last_kill + 4:
        if step < count:
            name = f"p{step:02d}"
            made = rig.api.create_pod(NAMESPACE, k8s_pod(name, model=f"m{step % 6}", gpus=rng.choice([1, 2, 4, 4]),
                                                         cpu="2", memory="8Gi", namespace=NAMESPACE,
                                                         annotations={pods.GRACE_KEY: "0.3"}))
            if not pods.job_id(made):  # no webhook answered: the default path, taken off at once
                rig.api.finish(NAMESPACE, name, phase="Failed")
                rig.unserved += 1
        if step in KILL_AT:  # the replica started again serves the webhook first: a pod always has one
            eventually(lambda: all(healthy(u.replace("/mutate", "/healthz")) for u in rig.api.webhook_url), 30)
            told.append(f"{rig.kill_leader()} killed at step {step}")
            last_kill = time.monotonic()
        now = time.monotonic()
        for pod in rig.managed():
            if pods.has_gate(pod, pods.QUEUE_GATE) or pods.has_gate(pod, pods.MIGRATION_GATE) \
                    or pod["status"].get("phase") != "Running" or pods.terminating(pod):
                continue
            job = str(pods.job_id(pod))
            due = ends.setdefault(job, now + rng.uniform(*life))
            if due <= now:
                try:
                    rig.api.finish(*pods.key(pod))
                except ApiError:
                    pass  # evicted (moved, preempted) since the snapshot
        step += 1
        time.sleep(gap)
    return told


@pytest.mark.slow
def test_controller_kills_leave_no_pod_ungated_that_the_scheduler_did_not_admit(tmp_path):
    HintStore(tmp_path / "store").publish(make_plan("e2e"), hints_csv())
    rig = Rig(tmp_path, small_cluster(), tmp_path / "store", [*SERVE, "--order", "fifo"], CONTROLLER)
    watch = GateWatch(rig)
    try:
        rig.start()
        told = burst(rig, 48, 30)
        try:
            eventually(lambda: not unsettled(rig), 30)
        except AssertionError:
            raise AssertionError(f"not converged: {unsettled(rig)}; {told}") from None
        allocations, live = rig.allocations(), rig.managed()
        crowded = overcommitted(rig)  # as converged: a round's re-sizes after it may grow one pod before another
        # shrinks (the kubelet defers the growth: `api.overcommits`, what it actuated, stays within allocatable)
        queued = {j["job_id"] for j in rig.http.get("/v1/queue").json()["jobs"]}
        lost = lost_in_preemption(rig, queued)
        history = rig.actions()["actions"]
    finally:
        rig.close()
    races = [u for u in watch.seen if u.service != u.pod]
    lags = [u.at - max((a["at"] for a in history if a["job_id"] == u.job and a["at"] <= u.at), default=u.at)
            for u in races]
    print(f"KILL9: {told}; {len(watch.seen)} pods ungated, {len(races)} raced a change of the service's (its last "
          f"{max(lags, default=0):.3f} s before at most)")
    assert len([k for k in rig.kills if k[1] != "service"]) == 3
    assert rig.api.webhook_failures == 0 and rig.unserved == 0
    # every removal of the queue's gate was a job the service ran at that moment, where and as the pod asked
    assert watch.seen and watch.unadmitted(history) == [], f"{watch.unadmitted(history)[:5]}; {told}"
    gated = [p for p in live if pods.has_gate(p, pods.QUEUE_GATE)]
    running = [p for p in live if not pods.has_gate(p, pods.QUEUE_GATE)]
    assert gated and running, "the burst left no pod waiting, or none running"
    for pod in running:
        a = allocations[pods.job_id(pod)]
        assert pod["spec"]["nodeName"] == a["node"] and pods.matches(pod, pods.Target.of(a))
    assert {pods.job_id(p) for p in gated} <= queued and not {pods.job_id(p) for p in gated} & set(allocations)
    assert crowded == [] and rig.api.overcommits == []
    assert lost == set(), f"bare pods lost to a kill mid-preemption, their jobs queued without a pod: {sorted(lost)}"


# ------------------------------------------------------------------ what the kills found, in process


def read_late(rig, c, monkeypatch) -> int:
    """From now on `c` reads no log (as a new leader whose cursor is behind, or a lagging pass): the actions come
    late, given by the test. The log's latest now."""
    passes: list[int] = []
    monkeypatch.setattr(c, "_follow_log", lambda: passes.append(0))
    eventually(lambda: passes)  # a pass began since: none reads the log any more
    return rig.allocator.log.latest


def test_a_start_read_after_its_job_was_stopped_keeps_the_pod_gated(inproc, monkeypatch):
    """Bug (found by the kills above): a new leader replays the log from its saved cursor; a queued job's `start`
    read after the job was stopped again (preempted back to the queue, released) ungated its pod: it ran without an
    allocation (and a `stop` that followed it evicted a bare pod: its job lost)."""
    c = leading(inproc)
    inproc.api.create_pod("ml", k8s_pod("big", gpus=4))
    create_queued(inproc, "q1", cpu="1", memory="4Gi")
    eventually(lambda: c.live("ml/q1"))  # the watch has brought its pod
    since = read_late(inproc, c, monkeypatch)
    inproc.allocator.allocate(Job.request("ml/q1", "res50", 4, 2, 8))
    inproc.allocator.release("ml/q1")  # stopped before the controller read its start
    started = [a for a in inproc.service.actions(since)["actions"] if a["kind"] == "start"]
    c.apply_batch(started)
    q1 = inproc.api.pod("ml", "q1")
    assert pods.has_gate(q1, pods.QUEUE_GATE) and q1["status"]["phase"] == "Pending"
    assert not [p for m, p, _ in inproc.api.calls if p.endswith("/pods/q1") and m == "PATCH"]
    assert c.stats.counts["admit-stale"] == 1


def test_a_start_read_after_its_job_was_resized_admits_the_pod_as_the_job_is_now(inproc, monkeypatch):
    """The same replay when the job runs but was re-sized since its `start`: the pod is admitted with the job's
    allocation now, never ungated with the start's older cores and RAM."""
    c = leading(inproc)
    inproc.api.create_pod("ml", k8s_pod("big", gpus=4))
    create_queued(inproc, "q1", cpu="1", memory="4Gi")
    eventually(lambda: c.live("ml/q1"))
    since = read_late(inproc, c, monkeypatch)
    inproc.allocator.allocate(Job.request("ml/q1", "res50", 4, 2, 8))
    first = allocation(inproc.allocator, "ml/q1")
    inproc.allocator.apply_actions([Action("resize", "ml/q1", (first,), (replace(first, cpu_m=first.cpu_m + 3000,
                                                                                 mem_mib=first.mem_mib + 4096),))])
    now = allocation(inproc.allocator, "ml/q1")
    started = [a for a in inproc.service.actions(since)["actions"] if a["kind"] == "start"]
    c.apply_batch(started)
    q1 = inproc.api.pod("ml", "q1")
    assert not pods.has_gate(q1, pods.QUEUE_GATE) and q1["spec"].get("nodeName") == now.node
    assert requests_of(q1) == (now.cpu_m, now.mem_mib) != (first.cpu_m, first.mem_mib)
    assert c.stats.counts["admit-stale"] == 1
