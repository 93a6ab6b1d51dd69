"""The controller end to end on the STAND-IN API server (`standin_apiserver.py`; not a real kube-apiserver): `hetplan
serve` (node sync from the stand-in) and `hetplan controller` replicas as subprocesses, started and SIGKILLed by
PID. Shared by `tests/test_k8s_e2e.py`, `tests/test_k8s_replay.py`, `bench/k8s_latency.py` and
`bench/k8s_replay.py`; what they measure is computed here once (`resize_delays`, `without_leader`)."""

from __future__ import annotations

import copy
import csv
import io
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pandas as pd

from hetplan.allocator.k8s import pods
from hetplan.hints import HintStore
from allocator_helpers import make_plan
from servers import free_port
from standin_apiserver import ApiError, FakeApiServer, actuated_requests, eventually, k8s_node, k8s_pod

TYPES = [("NVIDIA-A100-SXM4-80GB", "A100-80GB", 8, "96", "1000Gi", 12), ("Tesla-V100-SXM2-16GB", "V100", 8, "64",
         "488Gi", 14), ("Tesla-T4", "T4", 4, "48", "192Gi", 14)]
MODELS = [f"m{i}" for i in range(6)]


def hints_csv() -> pd.DataFrame:
    rows = ["model,num_gpus,gpu_type,rank,cpus_per_gpu,mem_gb_per_gpu,expected_throughput,normalized_throughput,"
            "throughput_per_dollar,plan_id"]
    for i, model in enumerate(MODELS):
        for gpus in (1, 2, 4):
            for rank, (_, gpu, *_rest) in enumerate(TYPES, 1):
                speed = 100 * gpus / rank
                rows.append(f"{model},{gpus},{gpu},{rank},{10 + 3 * (i % 3) + 2 * (rank == 3)},{40 + 20 * (i % 2)},{speed},"
                            f"{1 / rank:.3f},{speed / 3:.1f},e2e")
    return pd.read_csv(io.StringIO("\n".join(rows)), dtype=str)

# the e2e's settings: a short lease (2 s) and poll so that kills are survived quickly
CONTROLLER = ["--poll", "0.05", "--reconcile", "3", "--orphan-grace", "3", "--checkpoint-grace", "0.3",
              "--lease-seconds", "2", "--allocate-wait", "15"]
SERVE = ["--tick", "1", "--hint-poll", "0.5"]


class Proc:
    """A hetplan subprocess, started and SIGKILLed by PID."""

    def __init__(self, args: list[str], log: Any) -> None:
        self.args, self.log, self.proc = args, log, None

    def start(self) -> Proc:
        self.proc = subprocess.Popen([sys.executable, "-c", "from hetplan.cli import main; main()", *self.args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "NO_PROXY": "*"})
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def healthy(url: str) -> bool:
    try:
        return httpx.get(url if "healthz" in url else f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Rig:
    """The stand-in with `nodes`, one service, `replicas` controllers (each serving the webhook)."""

    root: Path
    nodes: dict[str, dict]
    store: Path
    serve_args: list[str] = field(default_factory=list)
    controller_args: list[str] = field(default_factory=list)
    replicas: int = 2
    kills: list[tuple[float, str]] = field(default_factory=list)  # (time.time(), what) of every SIGKILL
    unserved: int = 0  # pods the webhook left to the default path (`run_pods` takes them off at once)
    standin: dict[str, Any] = field(default_factory=dict)  # the stand-in's options (version, termination_seconds)
    token: str | None = None  # the allocator's write token, given to the service and the controllers

    def __post_init__(self) -> None:
        self.api = FakeApiServer(**self.standin).start()
        if self.token:
            self.serve_args = [*self.serve_args, "--write-token", self.token]
            self.controller_args = [*self.controller_args, "--write-token", self.token]
        self.api.nodes = self.nodes
        self.config = self.api.kubeconfig(self.root / "kubeconfig.yaml")
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(self.root / "processes.log", "wb")
        self.service = Proc(["serve", "--host", "127.0.0.1", "--port", self.url.rsplit(":", 1)[1], "--db",
                             str(self.root / "a.db"), "--store", str(self.store), "--kubeconfig", str(self.config),
                             "--synchronous", "NORMAL", *self.serve_args], self.log)
        self.hooks = [free_port() for _ in range(self.replicas)]
        self.api.webhook_url = [f"http://127.0.0.1:{p}/mutate" for p in self.hooks]
        self.controllers = [self._controller(i) for i in range(self.replicas)]
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def _controller(self, i: int) -> Proc:
        return Proc(["controller", "--service", self.url, "--kubeconfig", str(self.config), "--identity", f"c{i}",
                     "--webhook-host", "127.0.0.1", "--webhook-port", str(self.hooks[i]), "--log-level", "info",
                     *self.controller_args], self.log)

    def start(self, timeout: float = 120) -> Rig:
        self.service.start()
        eventually(lambda: healthy(self.url) and len(self.http.get("/v1/nodes").json()["nodes"]) == len(self.nodes),
                   timeout)
        for c in self.controllers:
            c.start()
        eventually(lambda: all(healthy(u.replace("/mutate", "/healthz")) for u in self.api.webhook_url), timeout)
        eventually(lambda: ("leases", "hetplan", "hetplan-controller") in self.api.objects, timeout)
        return self

    def close(self) -> None:
        for c in self.controllers:
            c.kill()
        self.service.kill()
        self.api.stop()
        self.http.close()
        self.log.close()

    def leader(self) -> int:
        return int(self.api.objects[("leases", "hetplan", "hetplan-controller")]["spec"]["holderIdentity"][1:])

    def kill_leader(self) -> str:
        victim = self.leader()
        self.controllers[victim].kill()
        self.kills.append((time.time(), f"c{victim}"))
        self.controllers[victim] = self._controller(victim).start()
        return f"controller c{victim}"

    def kill_service(self) -> str:
        self.service.kill()
        self.kills.append((time.time(), "service"))
        self.service.start()
        return "service"

    def managed(self) -> list[dict]:
        """The stand-in's pods that run or wait with a hetplan job id."""
        return [p for p in self.api.live_pods() if pods.job_id(p)]

    def allocations(self) -> dict[str, dict]:
        return {a["job_id"]: a for a in self.http.get("/v1/allocations").json()}

    def actions(self) -> dict[str, Any]:
        return self.http.get("/v1/actions", params={"since": 0}).json()

    def drift(self) -> str:
        """'' when every allocation has exactly one ungated pod, on its node, with its cores and RAM; else what
        differs (a few)."""
        allocations = self.allocations()
        live = {pods.job_id(p): p for p in self.managed()}
        if set(allocations) != set(live) or any(pods.has_gate(p, pods.MIGRATION_GATE) for p in live.values()):
            return (f"allocations without pods {sorted(set(allocations) - set(live))[:5]}, pods without allocations "
                    f"{sorted(set(live) - set(allocations))[:5]}, "
                    f"gated {[j for j, p in live.items() if pods.has_gate(p, pods.MIGRATION_GATE)]}")
        differ = [(j, pods.node_of(live[j]), pods.requests(live[j]), live[j]["status"]["phase"], a["node"], a["cpus"],
                   a["mem_gb"]) for j, a in allocations.items()
                  if not (pods.matches(live[j], pods.Target.of(a)) and live[j]["spec"].get("nodeName") == a["node"])]
        if not differ:
            return ""
        node = differ[0][4]  # what holds the first one's node (spec requests, actuated, a pending resize)
        with self.api.lock:
            held = [(p["metadata"]["name"], p["status"].get("phase"), pods.requests(p),
                     [(c.get("resources") or {}).get("requests") for c in p["status"].get("containerStatuses") or []],
                     pods.resize_pending(p)) for p in self.api.pods.values() if p["spec"].get("nodeName") == node
                    and p["status"].get("phase") not in ("Succeeded", "Failed")]
        return f"differing {differ[:5]}; on {node}: {held}"

    def leaderless(self) -> list[tuple[float, float]]:
        """The windows without a leader: from each controller kill to the next Lease write (by another replica, or
        by the killed one started again: same identity, so it renews the Lease as its own at once)."""
        windows = []
        for at, who in self.kills:
            if who == "service":
                continue
            taken = next((t for t, holder in self.api.lease_history if t > at and holder), None)
            windows.append((at, taken if taken is not None else float("inf")))
        return windows

    def resize_delays(self, actions: list[dict]) -> list[tuple[float, dict]]:
        """(seconds, action) from each `resize` action's number (its `at`) to the first PATCH of the pod's resize
        subresource with its cores and RAM; actions whose pod never got one (it ended or moved first) are left out."""
        patches: dict[str, list[tuple[float, Any]]] = defaultdict(list)
        for t, (_, path, body) in zip(self.api.call_times, self.api.calls):
            if path.endswith("/resize"):
                ns, name = path.split("/")[4], path.split("/")[-2]
                patches[f"{ns}/{re.sub(r'-m[0-9]+$', '', name)}"].append((t, body))
        out = []
        for a in actions:
            if a["kind"] != "resize" or len(a["after"]) != 1:
                continue
            want = pods.Target.of(a["after"][0])
            for t, body in patches.get(a["job_id"], []):
                res = body["spec"]["containers"][0]["resources"]["requests"]
                if t >= a["at"] - 0.01 and (res["cpu"], res["memory"]) == (pods.cpu_text(want.cpu_m),
                                                                             pods.mem_text(want.mem_mib)):
                    out.append((t - a["at"], a))
                    break
        return out


def without_leader(action: dict, windows: list[tuple[float, float]]) -> bool:
    return any(start <= action["at"] <= end for start, end in windows)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))] if ordered else float("nan")


def cluster(root) -> dict[str, dict]:
    """40 nodes of 3 GPU types, as GPU feature discovery labels them."""
    nodes = {}
    for product, _, gpus, cpu, mem, count in TYPES:
        for k in range(count):
            name = f"{product.split('-')[1].lower()}-{k}"
            nodes[name] = k8s_node(name, product=product, gpus=str(gpus), cpu=cpu, memory=mem)
    HintStore(root / "store").publish(make_plan("e2e"), hints_csv())
    return nodes


def run_pods(rig: Rig, count: int, seed: int, kill_at: dict[int, str], gap: float = 0.04,
             life: tuple[float, float] = (1.0, 6.0)) -> list[str]:
    """`count` pods of the 6 models arrive every `gap` s and run `life` s; at the pod numbers in `kill_at` the
    leading controller ("controller") or the service ("service") is SIGKILLed and started again."""
    rng = random.Random(seed)
    ends: dict[str, float] = {}
    kills = []

    def finish_due() -> None:  # a job whose time is up ends, running or still waiting (not a gated replacement)
        now = time.monotonic()
        for pod in rig.managed():
            job = pods.job_id(pod)
            if job in ends and ends[job] <= now and not pods.has_gate(pod, pods.MIGRATION_GATE):
                try:
                    rig.api.finish(*pods.key(pod))
                except ApiError:
                    pass  # evicted (moved) since the snapshot: its replacement ends at the next call

    for i in range(count):
        pod = rig.api.create_pod("ml", k8s_pod(f"p{i:03d}", model=MODELS[i % 6], gpus=rng.choice([1, 1, 2, 4]),
                                               cpu="2", memory="8Gi", annotations={pods.GRACE_KEY: "0.3"}))
        if not pods.job_id(pod):  # the allocator had no room (fail-open): a rejection, taken off at once
            rig.api.finish(*pods.key(pod), phase="Failed")
            rig.unserved += 1
        ends[f"ml/p{i:03d}"] = time.monotonic() + rng.uniform(*life)
        if i in kill_at:
            kills.append(f"{rig.kill_leader() if kill_at[i] == 'controller' else rig.kill_service()} at pod {i}")
        finish_due()
        time.sleep(gap)
    arrived = time.monotonic()
    try:
        eventually(lambda: not rig.drift(), 40)  # quiet: the controller converges on the allocator's state
    except AssertionError:
        raise AssertionError(f"not converged: {rig.drift()}") from None
    kills.append(f"converged {time.monotonic() - arrived:.1f} s after the last arrival")
    deadline = time.monotonic() + 40
    while rig.managed() and time.monotonic() < deadline:  # everything ends
        for job in ends:
            ends[job] = 0.0
        finish_due()
        time.sleep(0.1)
    return kills


# ------------------------------------------------------------------ Alibaba's pod list through the controller

OPENB = Path(__file__).resolve().parents[1] / "bench" / "data" / "openb"


def openb_nodes(path: Path = OPENB / "openb_node_list_gpu_node.csv", limit: int | None = None) -> dict[str, dict]:
    """Alibaba's cluster-trace-gpu-v2023 GPU nodes as v1.Nodes (its `model` as `nvidia.com/gpu.product`)."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))[:limit]
    return {r["sn"]: k8s_node(r["sn"], product=r["model"], gpus=r["gpu"], cpu=f"{r['cpu_milli']}m",
                              memory=f"{r['memory_mib']}Mi") for r in rows}


def openb_pod(body: dict) -> dict:
    """A pod of the trace as a user writes it: its own cpu/memory request; a GPU-sharing pod (`gpu_milli` < 1000)
    asks one whole GPU (`nvidia.com/gpu` is whole in Kubernetes); model `pod` (no hint applies)."""
    share = float(body["num_gpus"])
    gpus = 1 if 0 < share < 1 else int(share)
    return k8s_pod(body["job_id"], model=body["model"], gpus=gpus, cpu=f"{round(body['cpus'] * 1000)}m",
                   memory=f"{round(body['mem_gb'] * 1024)}Mi", annotations={pods.GRACE_KEY: "0.2"})


def below_own_request(pod: dict) -> str:
    """'' when the kubelet actuated at least the pod's own request (its annotations) for the pod; else why not."""
    notes = pods.annotations(pod)
    held = actuated_requests(pod)
    if held is None:
        return f"{pods.key(pod)[1]}: never ran ({pod['status'].get('phase')})"
    cpu_m, mem_mib = int(held.get("cpu", 0) * 1000), int(held.get("memory", 0) / 2**20)
    if cpu_m < int(notes.get(pods.REQUESTED_CPU_KEY) or 0) or mem_mib < int(notes.get(pods.REQUESTED_MEMORY_KEY) or 0):
        return f"{pods.key(pod)[1]}: {cpu_m}m, {mem_mib} MiB < its own request"
    return ""


def replay_events(rig: Rig, events: list, seconds: float, namespace: str = "default") -> dict:
    """The pod list's events in order, the trace's time compressed so that they take `seconds` (or as long as
    admission takes): a creation is a pod created (the webhook asks the allocator); a deletion ends the job's pods
    (Succeeded; its gated replacement, if moving, is the controller's to delete). A pod the webhook left to the
    default path is ended at once and counted (`default-path`), as a rejection. At each end: did the pod run with
    at least its own request (`below`)?"""
    counts: Counter[str] = Counter()
    below: list[str] = []
    first, last = events[0].at, events[-1].at
    start = time.monotonic()
    for event in events:
        due = start + (event.at - first) / max(last - first, 1e-9) * seconds
        if due > time.monotonic():
            time.sleep(due - time.monotonic())
        job = f"{namespace}/{event.body['job_id']}"
        if event.release:
            with rig.api.lock:
                mine = [copy.deepcopy(p) for p in rig.api.pods.values()
                        if pods.job_id(p) == job and not pods.ended(p) and not pods.has_gate(p, pods.MIGRATION_GATE)]
            for pod in mine:
                why = below_own_request(pod)
                if why:
                    below.append(why)
                rig.api.finish(*pods.key(pod))
            counts["ended"] += bool(mine)
            continue
        created = rig.api.create_pod(namespace, openb_pod(event.body))
        counts["asked"] += 1
        if pods.job_id(created):
            counts["served"] += 1
        else:
            counts["default-path"] += 1
            rig.api.finish(*pods.key(created), phase="Failed")
    counts["wall_s"] = round(time.monotonic() - start)
    return {"counts": counts, "below": below}


# ------------------------------------------------------------------ one trace through the whole cluster path


class VirtualClock:
    """The allocator's clock, set by the replay to each event's time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ClusterPath:
    """`hetplan serve` (create_app on a real uvicorn, node sync and room from the stand-in, a durable allocator on a
    `VirtualClock`), the admission webhook and one `hetplan controller`, all in process on the STAND-IN API server
    (`standin_apiserver.py`; not a real kube-apiserver). `nodes`: v1.Nodes (`k8s_node`); the allocator's nodes come
    from them through the service's node sync, as in a cluster."""

    def __init__(self, root: Path, nodes: dict[str, dict], policy: str, hints: Any, order: str,
                 namespace: str = "ml") -> None:
        import threading

        import uvicorn

        from hetplan.allocator.durable import DurableAllocator
        from hetplan.allocator.k8s.controller import Controller
        from hetplan.allocator.k8s.nodes import load_client
        from hetplan.allocator.k8s.service_client import AllocatorClient
        from hetplan.allocator.k8s.webhook import WebhookServer
        from hetplan.allocator.service import ServiceSettings, create_app
        from servers import TOKEN

        self.namespace, self.token = namespace, TOKEN
        self.api = FakeApiServer(termination_seconds=0.02).start()
        self.api.nodes = nodes
        self.config = self.api.kubeconfig(root / "kubeconfig.yaml")
        self.clock = VirtualClock()
        self.allocator = DurableAllocator(root / "allocator.db", policy, hints, synchronous="NORMAL",
                                          clock=self.clock, retain=10**7)
        settings = ServiceSettings(db=root / "allocator.db", store=root / "hints", policy=policy, token=TOKEN,
                                   kubeconfig=self.config, tick_seconds=0, order=order, regrow=False,
                                   action_log=10**6)
        self.server = uvicorn.Server(uvicorn.Config(create_app(settings, self.allocator), host="127.0.0.1",
                                                    port=free_port(), log_level="warning"))
        self._thread = threading.Thread(target=self.server.run, daemon=True)
        self._thread.start()
        eventually(lambda: self.server.started, 60)
        self.url = f"http://127.0.0.1:{self.server.config.port}"
        self.http = httpx.Client(base_url=self.url, timeout=30)
        eventually(lambda: len(self.http.get("/v1/nodes").json()["nodes"]) == len(nodes), 60)
        self.webhook = WebhookServer(AllocatorClient(self.url), host="127.0.0.1", port=0).start()
        self.api.webhook_url = f"http://127.0.0.1:{self.webhook.port}/mutate"
        self.controller = Controller(load_client(self.config), AllocatorClient(self.url), identity="c0", poll=0.02,
                                     reconcile_seconds=30, orphan_grace=3600, checkpoint_grace=0,
                                     lease_seconds=5).start()
        eventually(lambda: self.controller.elector.leading() and self.controller.stats.counts["reconciles"], 60)
        self.finished: dict[str, str] = {}  # job -> the pod that ran it to its end

    def close(self) -> None:
        self.controller.stop()
        self.webhook.stop()
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self.http.close()
        self.api.stop()
        self.allocator.close()

    # ------------------------------------------------------------------ the events

    def submit(self, job_id: str, model: str, gpus: int) -> str:
        """A pod of `job_id` (`<namespace>/<name>`) created: the webhook asks the allocator; 'allocated' or
        'queued' (gated)."""
        name = job_id.split("/", 1)[1]
        pod = self.api.create_pod(self.namespace, k8s_pod(name, model=model, gpus=gpus, cpu=None, memory=None,
                                                          annotations={pods.GRACE_KEY: "0"}))
        assert pods.job_id(pod) == job_id, f"{job_id}: the webhook left it to the default path"
        return "queued" if pods.has_gate(pod, pods.QUEUE_GATE) else "allocated"

    def finish(self, job_id: str) -> None:
        """The job's running pod ends (Succeeded); the controller releases it."""
        running = [p for p in self.api.live_pods() if pods.job_id(p) == job_id and not pods.has_gate(p, pods.QUEUE_GATE)
                   and not pods.has_gate(p, pods.MIGRATION_GATE) and p["spec"].get("nodeName")]
        mine = [(pods.key(p), p["status"].get("phase"), p["spec"].get("schedulingGates"))
                for p in self.api.live_pods() if pods.job_id(p) == job_id]
        assert len(running) == 1, (f"{job_id} finishes but runs in {len(running)} pods: {mine}, allocation "
                                   f"{self.allocator.running([job_id])}")
        self.api.finish(*pods.key(running[0]))
        self.finished[job_id] = pods.key(running[0])[1]

    def tick(self) -> None:
        answer = self.http.post("/v1/actions/tick", headers={"Authorization": f"Bearer {self.token}"})
        assert answer.status_code == 200, answer.text

    # ------------------------------------------------------------------ quiet

    def unsettled(self) -> str:
        """'' when the cluster has caught up with the allocator: the controller's cursor at the log's latest; every
        running job in exactly one ungated pod, bound to its node, with its cores and RAM actuated by the kubelet, no
        resize pending; every waiting job in exactly one pod behind the queue's gate; no other pod alive; every
        node's room for the allocator its whole allocatable (no pod holds room beyond hetplan's). Else what is not."""
        latest, c = self.allocator.log.latest, self.controller
        if c.cursor != latest:
            return f"cursor {c.cursor} < {latest}"
        # the cursor moves on once a batch is begun; a preemption or a move goes on over later passes (private
        # books: the controller offers no public view of its work in progress)
        busy = {"preemptions": c._preemptions, "moves": c._migrations, "after-moves": c._after_move,
                "retries": c._retries, "requeued": c._waiting}
        if any(busy.values()):
            return f"controller busy: {({k: sorted(v)[:3] for k, v in busy.items() if v})}"
        running = {j: parts for j, parts in self.allocator.running().items()}
        waiting = {w["job_id"] for w in self.http.get("/v1/queue").json()["jobs"]}
        live: dict[str, list[dict]] = defaultdict(list)
        for p in self.api.live_pods():
            if pods.job_id(p):
                live[pods.job_id(p)].append(p)
            elif pods.model(p):
                return f"{pods.key(p)}: left to the default path"
        for job, held in live.items():
            if len(held) != 1 or pods.terminating(held[0]) or pods.has_gate(held[0], pods.MIGRATION_GATE):
                return f"{job}: {len(held)} pods, terminating or moving"
            pod = held[0]
            if job in waiting:
                if not pods.has_gate(pod, pods.QUEUE_GATE):
                    return f"{job} waits but its pod is not gated"
                continue
            if job not in running:
                return f"{job}: a pod without an allocation"
            if pods.has_gate(pod, pods.QUEUE_GATE) or pods.resize_pending(pod) is not None:
                return f"{job}: still gated, or a resize pending"
            a = running[job][0]
            target = pods.Target(a.node, a.cpu_m, a.mem_mib)
            if pod["spec"].get("nodeName") != a.node or not pods.matches(pod, target) or pod["status"].get(
                    "phase") != "Running":
                return f"{job}: pod {pods.node_of(pod)} {pods.requests(pod)} != {target}"
            held_now = actuated_requests(pod) or {}
            if (int(held_now.get("cpu", 0) * 1000), int(held_now.get("memory", 0) / 2**20)) != (a.cpu_m, a.mem_mib):
                return f"{job}: actuated {held_now} != {target}"
        missing = (set(running) | waiting) - set(live)
        if missing:
            return f"jobs without a pod: {sorted(missing)[:5]}"
        return self._room_differs()

    def _room_differs(self) -> str:
        from hetplan.allocator.k8s.nodes import to_node

        for node in self.allocator.cluster.nodes():
            whole = to_node(self.api.nodes[node.name])
            if (node.gpus, node.cpus, node.mem_gb) != (whole.gpus, whole.cpus, whole.mem_gb):
                return f"room of {node.name} {(node.gpus, node.cpus, node.mem_gb)} != its allocatable"
        return ""

    def settle(self, deadline_s: float = 30.0) -> None:
        try:
            eventually(lambda: not self.unsettled(), deadline_s)
        except AssertionError:
            raise AssertionError(f"the cluster did not settle: {self.unsettled()}") from None
