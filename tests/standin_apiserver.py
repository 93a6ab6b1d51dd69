"""A STAND-IN for kube-apiserver (and, for pods, for kube-scheduler and the kubelet), NOT a real one: no API server,
kind or Docker runs here. It speaks the wire format the real kubernetes client reads and writes, over HTTP on
loopback, so that the node sync and the controller are tested with the real client. What it serves:

- Nodes: `GET /api/v1/nodes` (a NodeList) and its watch, events pushed by the test (`push`, `events`).
- Pods: list and watch (all namespaces or one; `labelSelector` `k`, `k=v`, `!k`; a watch from a resourceVersion
  older than the kept history answers an ERROR event with a 410 Status, as the API server does), get, create
  (`generateName`; a configured mutating admission webhook is called with an AdmissionReview v1 and its JSONPatch
  applied; failurePolicy Ignore), delete, merge PATCH (resources are immutable there: 422, as in Kubernetes),
  and the subresources `binding`, `eviction` (policy/v1; PodDisruptionBudgets with `minAvailable` honoured:
  429) and `resize` (strategic merge of containers' cpu/memory; the stand-in kubelet actuates it, or marks it
  `PodResizePending` Infeasible/Deferred as the 1.33 kubelet does, and actuates a Deferred resize once its node
  has room, as the 1.33 kubelet retries them when resources are freed).
- batch/v1 **Indexed Jobs** (create, get, merge PATCH by `standin_rules.validate_job_update`: `parallelism`, and
  `completions` with it; a patch naming another `metadata.uid` is refused 409, as the API server's precondition) and a
  Job controller for them (`_sync_jobs`, every 20 ms): a pod per index from 0 while fewer than `parallelism` run,
  named `<job>-<index>-<random>`, the template's labels and annotations plus the completion index (label and
  annotation), `job-name`, `controller-uid` and a controlling owner reference; an index whose pod succeeded is done;
  pods of an index at or above `completions` (the Job was scaled down) are deleted gracefully, as the real Job
  controller does. SIMPLIFIED (labelled so): NonIndexed Jobs are refused; a replacement for a failed or terminating
  pod is made once the old one is terminal or removed (as `podReplacementPolicy: Failed`), with no backoff and no
  `backoffLimit`; no Job status, conditions or completion; no Job watch; deleting a Job is not served.
- kubeflow.org/v1 **PyTorchJobs** (create, get, merge PATCH by `standin_rules.validate_pytorchjob`: the training
  operator v1's webhook rules; a strategic merge patch 415 as for any custom resource; the uid precondition 409) and
  an operator for them (`_sync_pytorchjobs`, in the same 20 ms pass): a pod per replica type and index, named
  `<job>-<type>-<index>` (type lower-case), with the template's labels and annotations plus
  `training.kubeflow.org/job-name`, `replica-type` and `replica-index` and a controlling owner reference; workers at
  or above `Worker.replicas` (scaled down) are deleted gracefully, as the operator deletes the pods of out-of-range
  indexes. SIMPLIFIED (labelled so): no torchrun environment (`PET_*`), Services or status; a pod of an index is made
  again once the old one is removed (a terminal pod is kept, as `restartPolicy: OnFailure` leaves restarts to the
  kubelet, which the stand-in does not model); deleting a PyTorchJob is not served.
- ConfigMaps and coordination.k8s.io/v1 Leases: get, create (409 AlreadyExists), replace (409 Conflict on a stale
  resourceVersion: optimistic concurrency, which leader election and the controller's cursor rely on).
- A scheduler: a pod without `spec.nodeName`, without scheduling gates, is bound to the node its required node
  affinity names (`matchFields metadata.name`), else to the first node it fits on, if its requests fit the node's
  allocatable minus the requests of the pods running there; then it is Running.

Every write is recorded in `calls` (method, path, body) so that tests can tell how a change was made; every holder
a Lease is written with in `lease_history` (time, holder); and every pod change is checked against its node: what
the kubelet actuated for the node's pods above the node's allocatable is recorded in `overcommits` (not a Kubernetes
feature: the invariant the tests assert, at every step rather than sampled).
"""

from __future__ import annotations

import copy
import json
import queue
import re
import socket
import threading
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes.utils.quantity import parse_quantity

from standin_rules import (  # noqa: F401 - ApiError and status are imported from here by the tests
    ApiError, disruptions_allowed, parse_version, qos_class, status, validate_binding, validate_create,
    validate_job_update, validate_pytorchjob, validate_resize, validate_update,
)


def k8s_node(name: str, product: str | None = "Tesla-T4", gpus: str | None = "4", cpu: str = "63500m",
             memory: str = "256Gi", unschedulable: bool = False, ready: str | None = "True",
             labels: dict[str, str] | None = None, rv: str = "1") -> dict[str, Any]:
    """A v1.Node as the API server writes it (trimmed: no images, addresses or daemon endpoints)."""
    all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})}
    if product is not None:
        all_labels["nvidia.com/gpu.product"] = product
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "95491281146"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = gpus
    conditions = [{"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready, "reason": "KubeletReady",
                           "lastHeartbeatTime": "2026-12-01T10:00:00Z", "lastTransitionTime": "2026-12-01T09:00:00Z"})
    spec: dict[str, Any] = {"podCIDR": "10.244.1.0/24", "providerID": f"aws:///us-east-1a/i-{name}"}
    if unschedulable:
        spec["unschedulable"] = True
        spec["taints"] = [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]
    return {"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": rv, "labels": all_labels,
                         "creationTimestamp": "2026-11-30T08:00:00Z"},
            "spec": spec,
            "status": {"capacity": {**allocatable, "cpu": "64", "memory": "264000000Ki"}, "allocatable": allocatable,
                       "conditions": conditions,
                       "nodeInfo": {"kubeletVersion": "v1.33.2", "osImage": "Ubuntu 22.04.4 LTS",
                                    "architecture": "amd64", "containerRuntimeVersion": "containerd://1.7.27"}}}


def k8s_pod(name: str, model: str | None = "res50", gpus: int = 1, cpu: str | None = "2", memory: str | None = "8Gi",
            namespace: str = "default", labels: dict[str, str] | None = None, annotations: dict | None = None,
            sidecar: bool = False) -> dict[str, Any]:
    """A v1.Pod as a user (or a Job's template) writes it: one trainer container, optionally a sidecar."""
    requests: dict[str, str] = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
    containers = [{"name": "trainer", "image": "nvcr.io/nvidia/pytorch:24.08-py3",
                   "resources": {"requests": requests, "limits": {"nvidia.com/gpu": str(gpus)} if gpus else {}}}]
    if sidecar:
        containers.append({"name": "logs", "image": "fluent/fluent-bit:3.0",
                           "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}})
    all_labels = {**({"hetplan.io/model": model} if model else {}), **(labels or {})}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": all_labels, "annotations": annotations or {}},
            "spec": {"restartPolicy": "Never", "containers": containers}}


def eventually(what, deadline_s: float = 20.0):
    """Poll `what()` until it is truthy; return it (fail at the deadline)."""
    deadline = time.monotonic() + deadline_s
    while True:
        result = what()
        if result or time.monotonic() > deadline:
            assert result, "not reached before the deadline"
            return result
        time.sleep(0.05)


# ------------------------------------------------------------------ helpers the stand-in computes with


def actuated_requests(pod: dict) -> dict[str, Decimal] | None:
    """What the stand-in kubelet actuated for a pod's containers (`status.containerStatuses[].resources`), summed;
    None before it ran any."""
    statuses = pod.get("status", {}).get("containerStatuses")
    if not statuses:
        return None
    total: dict[str, Decimal] = {}
    for c in statuses:
        res = c.get("resources") or {}
        for k, v in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            total[k] = total.get(k, Decimal(0)) + parse_quantity(v)
    return total


def pod_requests(pod: dict) -> dict[str, Decimal]:
    """A pod's requests as Kubernetes sums them (containers' requests, else limits; the larger of that and any
    init container)."""
    def of(container: dict) -> dict[str, Decimal]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: parse_quantity(v) for k, v in merged.items()}

    total: dict[str, Decimal] = {}
    for c in pod["spec"]["containers"]:
        for k, v in of(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in pod["spec"].get("initContainers") or []:
        for k, v in of(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    return total


def terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def matches(labels: dict[str, str], selector: str | None) -> bool:
    for term in (selector or "").split(","):
        term = term.strip()
        if not term:
            continue
        if term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=!")) != value:
                return False
        elif term not in labels:
            return False
    return True


def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 merge patch; `strategic`: lists of named objects (containers) merge by name, as Kubernetes'
    strategic merge patch does for them."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif strategic and isinstance(value, list) and isinstance(out.get(key), list) \
                and all(isinstance(v, dict) and "name" in v for v in value + out[key]):
            merged = [dict(v) for v in out[key]]
            for item in value:
                for i, old in enumerate(merged):
                    if old["name"] == item["name"]:
                        merged[i] = merge_patch(old, item, strategic)
                        break
                else:
                    merged.append(copy.deepcopy(item))
            out[key] = merged
        else:
            out[key] = merge_patch(out.get(key), value, strategic)
    return out


def json_patch(doc: Any, ops: list[dict]) -> Any:
    """RFC 6902 (add, replace, remove), as an AdmissionReview's JSONPatch is applied."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif isinstance(parent, list):
            if last == "-":
                parent.append(op["value"])
            elif op["op"] == "add":
                parent.insert(int(last), op["value"])
            else:
                parent[int(last)] = op["value"]
        else:
            parent[last] = op["value"]
    return doc


@dataclass
class Fault:
    """An injected API fault (not Kubernetes: the test's): requests whose method is `method` and whose path matches
    `path` (a regex) are answered `code`, with probability `chance` (seeded), at most `times` times (None: no limit),
    until `until` (time.monotonic(); None: no end). `commit`: the write is done first and only its answer lost (an
    ambiguous write: a 500 or a timeout after etcd committed)."""

    method: str
    path: str
    code: int
    commit: bool = False
    times: int | None = 1
    chance: float = 1.0
    until: float | None = None


FAULT_REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
                 410: "Expired"}


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:  # a client that went away: not news
        pass


LAUNCHER = "system:serviceaccount:default:launcher"  # who creates the test's own pods (a Job's controller, say)
CONTROLLER_USER = "system:serviceaccount:hetplan:hetplan-controller"

POD = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?(?:/([a-z]+))?$")
JOB = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?$")
PYTORCHJOB = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/([^/]+)/pytorchjobs(?:/([^/]+))?$")
KUBEFLOW_LABELS = ("training.kubeflow.org/job-name", "training.kubeflow.org/replica-type",
                   "training.kubeflow.org/replica-index")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
OBJECT = re.compile(r"^/(?:api/v1|apis/coordination\.k8s\.io/v1)/namespaces/([^/]+)/(configmaps|leases)(?:/([^/]+))?$")


class FakeApiServer:
    """The stand-in (see the module's docstring). Nodes: set `nodes` (what a list returns) and push events. Pods,
    ConfigMaps, Leases: through the API, or `add_pod`, `finish`, `pdbs` from the test."""

    def __init__(self, history: int = 100_000, version: str = "1.33", termination_seconds: float = 0.1,
                 seed: int = 0) -> None:
        self.version = parse_version(version)  # what `/version` says and which resize rules apply
        self.termination_seconds = termination_seconds  # a deleted running pod's containers stop after this
        # (capped by its grace period), then its terminal phase is reported, then it is removed
        self.nodes: dict[str, dict] = {}
        self.resource_version = "100"
        self.events: queue.Queue[dict] = queue.Queue()
        self.requests: list[str] = []
        self.lists = 0
        self.refuse_lists = 0  # answer that many Node lists 403 Forbidden first (no RBAC yet)
        self._closing = threading.Event()
        # pods and the objects of the controller
        self.lock = threading.Condition(threading.RLock())
        self.rv = 1000
        self.pods: dict[tuple[str, str], dict] = {}
        self.pod_events: list[tuple[int, str, dict]] = []  # (resourceVersion, type, pod), oldest first
        self.history = history  # pod events kept; a watch from before them is answered 410
        self.compacted = 0  # pod events up to this resourceVersion are gone
        self.objects: dict[tuple[str, str, str], dict] = {}  # (configmaps|leases, namespace, name) -> object
        self.jobs: dict[tuple[str, str], dict] = {}  # batch/v1 Indexed Jobs (`_sync_jobs`)
        self.pytorchjobs: dict[tuple[str, str], dict] = {}  # kubeflow.org/v1 PyTorchJobs (`_sync_pytorchjobs`)
        self.pdbs: list[dict] = []  # policy/v1 PodDisruptionBudgets (selector.matchLabels, minAvailable)
        self.webhook_url: str | list[str] | None = None  # mutating webhook(s) called on pod CREATE: the first that
        # answers, as a Service routes to a ready endpoint (failurePolicy Ignore when none does)
        self.webhook_selector = "hetplan.io/model"  # its objectSelector (a label that must exist)
        self.webhook_failures = 0
        self.kubelet_refuses: set[tuple[str, str]] = set()  # pods whose resizes the kubelet finds Infeasible
        self.calls: list[tuple[str, str, Any]] = []  # (method, path, body) of every write
        self.lease_history: list[tuple[float, str]] = []  # (time.time(), holderIdentity) of every Lease write
        self.overcommits: list[str] = []  # "node resource used > allocatable" after a pod change (should stay [])
        self.bind_waits: dict[tuple[str, str], float] = {}  # pods created without gates and not bound at once:
        # seconds from creation to binding (a pod pinned before its peers' shrinks were actuated waits for room)
        self._unbound: dict[tuple[str, str], float] = {}
        self.call_times: list[float] = []  # when each of `calls` arrived (time.time())
        self.static_cpu_nodes: set[str] = set()  # kubelets with the static CPU manager policy
        self.created_at: dict[tuple[str, str], float] = {}  # time.monotonic() each pod was created
        self.running_at: dict[tuple[str, str], float] = {}  # and first bound (Running)
        self.evictions: Counter[tuple[str, str]] = Counter()  # eviction calls per pod (a terminating one included)
        self.refused: list[tuple[str, str, int]] = []  # (method, path, code) of every error answered
        self.users: dict[str, str] = {"not-a-real-token": CONTROLLER_USER}  # bearer token -> the user it authenticates
        # (`kubeconfig`'s token: the controller's service account, whose pods are its moves' replacements)
        self.faults: list[Fault] = []  # injected faults, matched in order
        self.faulted: Counter[int] = Counter()  # injected faults answered, by code
        self._rng = __import__("random").Random(seed)
        self._terminations: dict[tuple[str, str], list[float]] = {}  # pod -> [containers stop at, removed at]
        self.webhook_timeout = 10.0  # the webhook configuration's timeoutSeconds
        self.webhook_failure_policy = "Ignore"  # and its failurePolicy: Fail refuses the pod when no answer
        self.webhook_context: Any = None  # an ssl.SSLContext trusting the webhook's CA (HTTPS webhooks)
        self.extender: dict[str, Any] | None = None  # the scheduler's extender (`configure_extender`)
        self.extender_calls = 0
        self.admission_warnings: list[str] = []  # the webhook's warnings, as kubectl would print them
        self.resize_log: list[tuple[tuple[str, str], str, str]] = []  # (pod, what, "actuated"|"pending") per resize
        # whose memory went down: what is "request" or "limit"
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length)) if length else None

            def _route(self, method: str) -> None:
                url = urlparse(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                outer.requests.append(self.path)
                try:
                    body = self._body() if method in ("POST", "PUT", "PATCH") else None
                    if method != "GET":
                        outer.call_times.append(time.time())
                        outer.calls.append((method, url.path, body))
                    fault = outer.fault(method, url.path)
                    if fault is not None and not fault.commit:
                        raise outer.fault_error(fault)
                    if fault is not None:  # an ambiguous write: done, and its answer lost
                        self._mute = True
                        try:
                            self._dispatch(method, url, query, body)
                        finally:
                            self._mute = False
                        raise outer.fault_error(fault)
                    return self._dispatch(method, url, query, body)
                except ApiError as exc:
                    outer.refused.append((method, url.path, exc.body["code"]))
                    return self._json(exc.body["code"], exc.body)

            def _dispatch(self, method: str, url: Any, query: dict, body: Any) -> None:
                if url.path.rstrip("/") == "/version" and method == "GET":
                    major, minor = outer.version
                    return self._json(200, {"major": str(major), "minor": str(minor),
                                            "gitVersion": f"v{major}.{minor}.2", "gitCommit": "stand-in", "gitTreeState": "clean",
                                            "buildDate": "2026-11-01T00:00:00Z", "goVersion": "go1.24.4",
                                            "compiler": "gc", "platform": "linux/amd64"})
                if url.path == "/api/v1/nodes" and method == "GET":
                    return self._nodes(query)
                if url.path == "/api/v1/pods" and method == "GET":
                    return self._pods(None, query)
                m = POD.match(url.path)
                if m:
                    ns, name, sub = m.groups()
                    if name is None:
                        if method == "GET":
                            return self._pods(ns, query)
                        if method == "POST":
                            token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                            return self._json(201, outer.create_pod(ns, body, outer.users.get(token, LAUNCHER)))
                    else:
                        ctype = self.headers.get("Content-Type", "")
                        return self._json(*outer.pod_call(method, ns, name, sub, body, ctype))
                m = JOB.match(url.path)
                if m:
                    ctype = self.headers.get("Content-Type", "")
                    return self._json(*outer.job_call(method, m.group(1), m.group(2), body, ctype))
                m = PYTORCHJOB.match(url.path)
                if m:
                    ctype = self.headers.get("Content-Type", "")
                    return self._json(*outer.pytorchjob_call(method, m.group(1), m.group(2), body, ctype))
                m = OBJECT.match(url.path)
                if m:
                    return self._json(*outer.object_call(method, m.group(2), m.group(1), m.group(3), body))
                raise ApiError(404, "NotFound", f"the stand-in serves no {method} {url.path}")

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's names
                self._route("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._route("POST")

            def do_PUT(self) -> None:  # noqa: N802
                self._route("PUT")

            def do_PATCH(self) -> None:  # noqa: N802
                self._route("PATCH")

            def do_DELETE(self) -> None:  # noqa: N802
                self._route("DELETE")

            def _nodes(self, query: dict) -> None:
                if query.get("watch", "").lower() == "true":
                    return self._node_watch(float(query.get("timeoutSeconds", "300")))
                if outer.refuse_lists > 0:
                    outer.refuse_lists -= 1
                    raise ApiError(403, "Forbidden", 'nodes is forbidden: User '
                                   '"system:serviceaccount:hetplan:allocator" cannot list resource "nodes"')
                outer.lists += 1
                return self._json(200, {"kind": "NodeList", "apiVersion": "v1",
                                        "metadata": {"resourceVersion": outer.resource_version},
                                        "items": [copy.deepcopy(n) for n in outer.nodes.values()]})

            def _pods(self, ns: str | None, query: dict) -> None:
                selector = query.get("labelSelector")
                if query.get("watch", "").lower() == "true":
                    return self._pod_watch(ns, selector, int(query.get("resourceVersion") or 0),
                                           float(query.get("timeoutSeconds", "300")))
                with outer.lock:
                    items = [copy.deepcopy(p) for (pns, _), p in outer.pods.items()
                             if (ns is None or pns == ns) and matches(p["metadata"].get("labels") or {}, selector)]
                    return self._json(200, {"kind": "PodList", "apiVersion": "v1",
                                            "metadata": {"resourceVersion": str(outer.rv)}, "items": items})

            def _json(self, code: int, body: dict) -> None:
                if getattr(self, "_mute", False):
                    return
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _start_stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

            def _send(self, event: dict) -> None:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()

            def _node_watch(self, timeout: float) -> None:
                self._start_stream()
                deadline = time.monotonic() + timeout
                try:
                    while not outer._closing.is_set() and time.monotonic() < deadline:
                        try:
                            event = outer.events.get(timeout=0.05)
                        except queue.Empty:
                            continue
                        if event["type"] == "DROP":  # not Kubernetes: the test's way to break a connection
                            self.connection.shutdown(socket.SHUT_RDWR)
                            break
                        self._send(event)
                        if event["type"] == "ERROR":
                            break
                    else:
                        self.wfile.write(b"0\r\n\r\n")  # the server's timeout: the stream ends cleanly
                        self.wfile.flush()
                except OSError:
                    pass  # the client went away (NodeSync.stop shuts its socket down)
                self.close_connection = True

            def _pod_watch(self, ns: str | None, selector: str | None, since: int, timeout: float) -> None:
                self._start_stream()
                deadline = time.monotonic() + timeout
                try:
                    with outer.lock:
                        if since < outer.compacted:
                            self._send({"type": "ERROR", "object": status(
                                410, "Expired", f"too old resource version: {since} ({outer.compacted})")})
                            self.close_connection = True
                            return
                    sent = since
                    while not outer._closing.is_set() and time.monotonic() < deadline:
                        with outer.lock:
                            if sent < outer.compacted:  # compacted while watching: the API server ends it
                                self._send({"type": "ERROR", "object": status(
                                    410, "Expired", f"too old resource version: {sent} ({outer.compacted})")})
                                break
                            fresh = [(rv, kind, pod) for rv, kind, pod in outer.pod_events if rv > sent]
                            if not fresh:
                                outer.lock.wait(0.1)
                                continue
                        for rv, kind, pod in fresh:
                            sent = rv
                            if (ns is None or pod["metadata"]["namespace"] == ns) and \
                                    matches(pod["metadata"].get("labels") or {}, selector):
                                self._send({"type": kind, "object": pod})
                    else:
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                except OSError:
                    pass
                self.close_connection = True

        self.httpd = QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> FakeApiServer:
        self._thread.start()
        threading.Thread(target=self._kubelet_loop, name="standin-kubelet", daemon=True).start()
        threading.Thread(target=self._job_loop, name="standin-job-controller", daemon=True).start()
        return self

    def configure_webhook(self, manifest: Path, url: str | list[str], ca_file: Path | None = None) -> dict:
        """Call the webhook as the MutatingWebhookConfiguration in `manifest` says: its failurePolicy, timeoutSeconds
        and objectSelector (a label that must exist); HTTPS trusting `ca_file` when given (the API server calls
        webhooks over TLS only). Returns the webhook's entry."""
        import ssl

        import yaml

        config = next(d for d in yaml.safe_load_all(manifest.read_text()) if d and
                      d.get("kind") == "MutatingWebhookConfiguration")["webhooks"][0]
        self.webhook_url = url
        self.webhook_failure_policy = config.get("failurePolicy", "Fail")
        self.webhook_timeout = float(config.get("timeoutSeconds", 10))
        self.webhook_selector = ",".join(e["key"] for e in config["objectSelector"]["matchExpressions"]
                                         if e["operator"] == "Exists")
        self.webhook_context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
        return config

    def configure_extender(self, config: Path, url: str) -> dict:
        """Let the stand-in scheduler call an extender as the KubeSchedulerConfiguration in `config` says (its first
        extender, at `url` instead of its urlPrefix): for a pod asking one of its managedResources, `filterVerb` with
        the nodes that passed the scheduler's own fit check (`NodeNames` when nodeCacheCapable), keeping those it
        passes; an extender that fails is skipped when `ignorable`, else the pod stays Pending."""
        import yaml

        extender = yaml.safe_load(config.read_text())["extenders"][0]
        timeout = str(extender.get("httpTimeout", "30s"))
        self.extender = {"url": url.rstrip("/"), "filter": extender["filterVerb"],
                         "cache": bool(extender.get("nodeCacheCapable")), "ignorable": bool(extender.get("ignorable")),
                         "managed": {m["name"] for m in extender.get("managedResources") or []},
                         "timeout": float(timeout.rstrip("s")) if timeout.endswith("s") else 30.0}
        return extender

    def _extend(self, pod: dict, nodes: list[str]) -> list[str]:
        """The nodes the extender passes for `pod` (see `configure_extender`)."""
        ext = self.extender
        if ext is None or not nodes or not set(pod_requests(pod)) & ext["managed"]:
            return nodes
        args: dict[str, Any] = {"Pod": pod}
        if ext["cache"]:
            args["NodeNames"] = nodes
        else:
            args["Nodes"] = {"items": [self.nodes[n] for n in nodes]}
        self.extender_calls += 1
        try:
            request = urllib.request.Request(f"{ext['url']}/{ext['filter']}", json.dumps(args).encode(),
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=ext["timeout"]) as answer:
                result = json.loads(answer.read())
        except (OSError, ValueError):
            return nodes if ext["ignorable"] else []
        if result.get("Error"):
            return nodes if ext["ignorable"] else []
        if ext["cache"]:
            return [n for n in nodes if n in set(result.get("NodeNames") or [])]
        return [n for n in nodes if n in {i["metadata"]["name"] for i in (result.get("Nodes") or {}).get("items", [])}]

    # ------------------------------------------------------------------ faults

    def fault(self, method: str, path: str) -> Fault | None:
        """The injected fault this request meets, if any (and counts it)."""
        with self.lock:
            now = time.monotonic()
            for f in self.faults:
                if f.method != method or not re.search(f.path, path) or (f.times is not None and f.times <= 0) \
                        or (f.until is not None and now > f.until) or self._rng.random() >= f.chance:
                    continue
                if f.times is not None:
                    f.times -= 1
                self.faulted[f.code] += 1
                return f
        return None

    @staticmethod
    def fault_error(f: Fault) -> ApiError:
        reason = FAULT_REASONS.get(f.code, "InternalError")
        return ApiError(f.code, reason, f"stand-in fault: {reason}" + (" (the write was committed)" if f.commit
                                                                        else ""))

    def stop(self) -> None:
        self._closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)

    def push(self, kind: str, obj: dict) -> None:
        self.events.put({"type": kind, "object": copy.deepcopy(obj)})

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: stand-in
  cluster: {{server: "{self.url}"}}
users:
- name: hetplan
  user: {{token: not-a-real-token}}
contexts:
- name: stand-in
  context: {{cluster: stand-in, user: hetplan}}
current-context: stand-in
""")
        return path

    # ------------------------------------------------------------------ pods

    def _emit(self, kind: str, pod: dict) -> None:
        """Under the lock: a new resourceVersion for `pod` and its watch event."""
        self.rv += 1
        pod["metadata"]["resourceVersion"] = str(self.rv)
        node = pod["spec"].get("nodeName")
        if node in self.nodes:
            self._check(node)
        self.pod_events.append((self.rv, kind, copy.deepcopy(pod)))
        if len(self.pod_events) > self.history:
            dropped = self.pod_events[: len(self.pod_events) - self.history]
            del self.pod_events[: len(dropped)]
            self.compacted = dropped[-1][0]
        self.lock.notify_all()

    def compact(self) -> None:
        """Forget every pod event so far: watches from before now are answered 410 Gone (etcd compaction)."""
        with self.lock:
            self.compacted = self.rv
            self.pod_events.clear()
            self.lock.notify_all()

    def pod(self, namespace: str, name: str) -> dict | None:
        with self.lock:
            pod = self.pods.get((namespace, name))
            return copy.deepcopy(pod) if pod is not None else None

    def live_pods(self) -> list[dict]:
        with self.lock:
            return [copy.deepcopy(p) for p in self.pods.values() if not terminal(p)]

    def create_pod(self, namespace: str, body: dict, user: str = LAUNCHER) -> dict:
        """Create a pod as `user` (what the webhook reads in `userInfo`): the test's own pods as a launcher, the
        API's callers as `users` says of their token."""
        pod = copy.deepcopy(body)
        meta = pod.setdefault("metadata", {})
        meta["namespace"] = namespace
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", "name or generateName is required")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if self.webhook_url and matches(meta.get("labels") or {}, self.webhook_selector):
            pod = self._admit(pod, user)
        validate_create(pod)
        with self.lock:
            if (namespace, meta["name"]) in self.pods:
                raise ApiError(409, "AlreadyExists", f'pods "{meta["name"]}" already exists')
            pod["metadata"]["uid"] = str(uuid.uuid4())
            self.created_at[(namespace, pod["metadata"]["name"])] = time.monotonic()
            pod["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            pod["spec"].setdefault("schedulerName", "default-scheduler")
            pod["status"] = {"phase": "Pending", "qosClass": qos_class(pod["spec"])}
            self.pods[(namespace, pod["metadata"]["name"])] = pod
            node = pod["spec"].get("nodeName")
            if node:  # bound at creation (a daemon set's pod): the kubelet admits it if it fits, else fails it
                if node in self.nodes and self._fits(node, pod, but=pod):
                    self._bind(pod, node)
                else:
                    pod["status"] = {**pod["status"], "phase": "Failed", "reason": "OutOfcpu",
                                     "message": "Pod was rejected: Node didn't have enough resource"}
            self._emit("ADDED", pod)
            self.schedule()
            if not pod["spec"].get("nodeName") and not pod["spec"].get("schedulingGates"):
                self._unbound[(namespace, pod["metadata"]["name"])] = time.monotonic()
            return copy.deepcopy(pod)

    def _admit(self, pod: dict, user: str = LAUNCHER) -> dict:
        """Call the mutating webhook (AdmissionReview v1) with the configuration's timeout (HTTPS when
        `webhook_context` is set) and apply its JSONPatch; no answer: admitted unchanged (failurePolicy Ignore) or
        refused (Fail)."""
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
            "namespace": pod["metadata"]["namespace"], "name": pod["metadata"]["name"], "object": pod,
            "userInfo": {"username": user}, "dryRun": False}}
        response, failure = None, "no endpoint"
        for url in [self.webhook_url] if isinstance(self.webhook_url, str) else self.webhook_url or []:
            try:
                request = urllib.request.Request(url, json.dumps(review).encode(), {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=self.webhook_timeout,
                                            context=self.webhook_context) as answer:
                    response = json.loads(answer.read())["response"]
                    break
            except (OSError, ValueError, KeyError) as exc:
                failure = f"{type(exc).__name__}: {exc}"
                continue
        if response is None:
            self.webhook_failures += 1
            if self.webhook_failure_policy == "Fail":
                raise ApiError(500, "InternalError", f'Internal error occurred: failed calling webhook '
                               f'"pods.hetplan.io": {failure}')
            return pod  # failurePolicy: Ignore
        if response.get("uid") != review["request"]["uid"]:
            self.webhook_failures += 1
            return pod
        if not response.get("allowed"):
            raise ApiError(400, "BadRequest", f"admission webhook denied the request: {response.get('status')}")
        self.admission_warnings += response.get("warnings") or []
        if response.get("patch"):
            import base64
            assert response.get("patchType") == "JSONPatch"
            pod = json_patch(pod, json.loads(base64.b64decode(response["patch"])))
        return pod

    def _get(self, namespace: str, name: str) -> dict:
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found', details={"name": name, "kind": "pods"})
        return pod

    def pod_call(self, method: str, ns: str, name: str, sub: str | None, body: Any, ctype: str) -> tuple[int, dict]:
        with self.lock:
            pod = self._get(ns, name)
            if sub is None and method == "GET":
                return 200, copy.deepcopy(pod)
            if sub is None and method == "DELETE":
                want = ((body or {}).get("preconditions") or {}).get("uid")
                if want is not None and want != pod["metadata"].get("uid"):  # as the API server: 409, nothing done
                    raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {want}, UID in "
                                                    f"object meta: {pod['metadata'].get('uid')}")
                return 200, self._delete(pod, (body or {}).get("gracePeriodSeconds"))
            if sub is None and method == "PATCH":
                if isinstance(body, list):
                    try:
                        new = json_patch(pod, body)
                    except (KeyError, IndexError, ValueError, TypeError) as exc:
                        raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our "
                                                       f"request: json patch: {exc!r}") from None
                else:
                    new = merge_patch(pod, body, strategic="strategic" in ctype)
                if {k: v for k, v in new.items() if k not in ("spec", "metadata")} != \
                        {k: v for k, v in pod.items() if k not in ("spec", "metadata")}:
                    raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: status: through the status subresource')
                validate_update(pod, new)
                if not new["spec"].get("schedulingGates"):
                    new["spec"].pop("schedulingGates", None)
                self.pods[(ns, name)] = pod = new
                self._emit("MODIFIED", pod)
                self.schedule()
                return 200, copy.deepcopy(pod)
            if sub == "resize" and method == "GET":
                return 200, copy.deepcopy(pod)
            if sub == "resize" and method == "PATCH":
                return 200, self._resize(pod, body)
            if sub == "binding" and method == "POST":
                validate_binding(pod)
                if pod["spec"].get("nodeName"):
                    raise ApiError(409, "Conflict", f"pod {name} is already assigned to node "
                                                    f'"{pod["spec"]["nodeName"]}"')
                self._bind(pod, body["target"]["name"])
                return 201, status(201, "", "")
            if sub == "eviction" and method == "POST":
                self._evict(pod, ((body or {}).get("deleteOptions") or {}).get("gracePeriodSeconds"))
                return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
            raise ApiError(405, "MethodNotAllowed", f"the stand-in serves no {method} on pods/{sub}")

    def _delete(self, pod: dict, grace: int | None = None) -> dict:
        """Graceful deletion: a pod that never ran, or ended, is removed at once; a running one gets its
        `deletionTimestamp` now, its containers stop within its grace period (the stand-in's `termination_seconds`
        at most), the kubelet reports its terminal phase, and only then is it removed (`_kubelet_loop`). Deleting a
        pod that is already terminating changes nothing."""
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            return copy.deepcopy(pod)
        if not pod["spec"].get("nodeName") or terminal(pod) or grace == 0:
            self._remove(pod)
            return copy.deepcopy(pod)
        grace = int(pod["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace)
        meta["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        meta["deletionGracePeriodSeconds"] = grace
        self._terminations[(meta["namespace"], meta["name"])] = [time.monotonic() + min(grace,
                                                                                      self.termination_seconds), 0.0]
        self._emit("MODIFIED", pod)
        return copy.deepcopy(pod)

    def _remove(self, pod: dict) -> None:
        meta = pod["metadata"]
        self.pods.pop((meta["namespace"], meta["name"]), None)
        self._terminations.pop((meta["namespace"], meta["name"]), None)
        self._emit("DELETED", pod)
        self.schedule()

    def _kubelet_loop(self) -> None:
        """The stand-in kubelets' side of graceful deletion: containers stopped when due (the pod's phase becomes
        Succeeded if its trainer exited cleanly after its checkpoint, annotation `hetplan.io/checkpointed`, else
        Failed: killed by SIGTERM), then the pod removed a moment later."""
        while not self._closing.wait(0.02):
            with self.lock:
                now = time.monotonic()
                for key, due in list(self._terminations.items()):
                    pod = self.pods.get(key)
                    if pod is None:
                        self._terminations.pop(key, None)
                    elif not due[1] and now >= due[0]:
                        clean = "hetplan.io/checkpointed" in (pod["metadata"].get("annotations") or {})
                        pod["status"]["phase"] = "Succeeded" if clean else "Failed"
                        pod["status"]["containerStatuses"] = [
                            {**c, "ready": False, "state": {"terminated": {"exitCode": 0 if clean else 143}}}
                            for c in pod["status"].get("containerStatuses") or []]
                        due[1] = now + self.termination_seconds / 2
                        self._emit("MODIFIED", pod)
                        self.schedule()
                    elif due[1] and now >= due[1]:
                        self._remove(pod)

    def _evict(self, pod: dict, grace: int | None) -> None:
        """policy/v1 Eviction: a pod that is pending, ended or already terminating is deleted without asking the
        budgets (Kubernetes' `canIgnorePDB`); else the one PodDisruptionBudget that selects it must allow a
        disruption (429 otherwise; a pod two budgets select is a 500), which is recorded in its `disruptedPods`,
        the pod gets the condition `DisruptionTarget` and is deleted gracefully."""
        meta = pod["metadata"]
        self.evictions[(meta["namespace"], meta["name"])] += 1
        if not pod["spec"].get("nodeName") or terminal(pod) or meta.get("deletionTimestamp"):
            self._delete(pod, grace)
            return
        budgets = self._budgets(pod)
        if len(budgets) > 1:
            raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the eviction "
                                                 "subresource does not support.")
        if budgets:
            pdb = budgets[0]
            allowed, healthy, desired = disruptions_allowed(pdb, self._selected(pdb), time.time())
            if allowed < 1:
                raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption "
                               "budget.", details={"causes": [{"reason": "DisruptionBudget", "message": (
                                   f"The disruption budget {pdb['metadata']['name']} needs {desired} healthy pods "
                                   f"and has {healthy} currently")}]})
            pdb.setdefault("status", {}).setdefault("disruptedPods", {})[meta["name"]] = time.time()
        conditions = [c for c in pod["status"].get("conditions") or [] if c["type"] != "DisruptionTarget"]
        pod["status"]["conditions"] = conditions + [{"type": "DisruptionTarget", "status": "True",
                                                     "reason": "EvictionByEvictionAPI",
                                                     "message": "Eviction API: evicting"}]
        self._delete(pod, grace)

    def _budgets(self, pod: dict) -> list[dict]:
        labels = pod["metadata"].get("labels") or {}
        return [pdb for pdb in self.pdbs if pdb["metadata"]["namespace"] == pod["metadata"]["namespace"]
                and all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())]

    def _selected(self, pdb: dict) -> list[dict]:
        want = pdb["spec"]["selector"]["matchLabels"]
        return [p for p in self.pods.values() if p["metadata"]["namespace"] == pdb["metadata"]["namespace"]
                and not terminal(p) and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())]

    def _resize(self, pod: dict, body: dict) -> dict:
        """The `resize` subresource: validated by the version's rules (`standin_rules.validate_resize`: a 422 when
        refused), then actuated by the stand-in kubelet, or left `PodResizePending` Infeasible (a kubelet that never
        will: `kubelet_refuses`, or a static CPU manager and a Guaranteed pod's cpu) or Deferred (no room now)."""
        new = merge_patch(pod, body, strategic=True)
        if {k: v for k, v in new.items() if k not in ("spec", "metadata")} != \
                {k: v for k, v in pod.items() if k not in ("spec", "metadata")}:
            raise ApiError(422, "Invalid", "the resize subresource changes spec.containers[*].resources only")
        validate_resize(pod, new, self.version)
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        shrunk = [what for what, before, after in (
            ("request", pod_requests(pod).get("memory"), pod_requests(new).get("memory")),
            ("limit", _limit(pod, "memory"), _limit(new, "memory"))) if before and after and after < before]
        cpu_changed = [pod_requests({"spec": {"containers": [c]}}).get("cpu") for c in pod["spec"]["containers"]] != \
            [pod_requests({"spec": {"containers": [c]}}).get("cpu") for c in new["spec"]["containers"]]
        pod["spec"]["containers"] = new["spec"]["containers"]
        conditions = [c for c in pod["status"].get("conditions") or [] if c["type"] != "PodResizePending"]
        node = pod["spec"].get("nodeName")
        static = node in self.static_cpu_nodes and cpu_changed and qos_class(pod["spec"]) == "Guaranteed"
        if node and (key in self.kubelet_refuses or static):
            conditions.append({"type": "PodResizePending", "status": "True", "reason": "Infeasible",
                               "message": "Resize is infeasible for Guaranteed Pods alongside CPU Manager static "
                                          "policy" if static else "Node didn't have enough capacity: memory, "
                                                                  "requested: ..."})
        elif node and not self._room_for(node, pod):
            conditions.append({"type": "PodResizePending", "status": "True", "reason": "Deferred",
                               "message": "Node didn't have enough resource: cpu"})
        elif node:
            pod["status"]["containerStatuses"] = self._actuated(pod)
        pod["status"]["conditions"] = conditions
        state = "pending" if any(c["type"] == "PodResizePending" for c in conditions) or not node else "actuated"
        self.resize_log += [(key, what, state) for what in shrunk]
        self._emit("MODIFIED", pod)
        if state == "actuated":
            self.schedule()  # a bound pod's resize moves the pods it left room for back to the scheduler (1.33)
        return copy.deepcopy(pod)

    # ------------------------------------------------------------------ the scheduler and the kubelet

    def used(self, node: str, but: dict | None = None, actual: bool = False) -> dict[str, Decimal]:
        """What the pods bound to `node` hold. As the 1.33 scheduler counts it (default): per pod the larger of its
        spec's requests and what the kubelet actuated (a resize still pending holds both). `actual`: what the
        kubelet actuated only, the node's real use (a Deferred resize-up is desired, not held)."""
        total: dict[str, Decimal] = {}
        for p in self.pods.values():
            if p is not but and p["spec"].get("nodeName") == node and not terminal(p):
                held = actuated_requests(p)
                wanted = {} if actual and held is not None else pod_requests(p)
                for k in set(wanted) | set(held or {}):
                    total[k] = total.get(k, Decimal(0)) + max(wanted.get(k, Decimal(0)), (held or {}).get(k, Decimal(0)))
        return total

    def _check(self, node: str) -> None:
        """Record `node` in `overcommits` if what its pods' containers actually hold exceeds its allocatable."""
        allocatable = self.nodes[node]["status"]["allocatable"]
        for resource, used in self.used(node, actual=True).items():
            if used > parse_quantity(allocatable.get(resource, "0")):
                self.overcommits.append(f"{node} {resource} {used} > {allocatable.get(resource, '0')}")

    def _room_for(self, node: str, pod: dict) -> bool:
        """The kubelet's admission of a resize: what the node's other pods actually hold plus `pod`'s new requests
        fit the node's allocatable."""
        allocatable = self.nodes[node]["status"]["allocatable"]
        used = self.used(node, but=pod, actual=True)
        for k, v in pod_requests(pod).items():
            used[k] = used.get(k, Decimal(0)) + v
        return all(v <= parse_quantity(allocatable.get(k, "0")) for k, v in used.items() if v > 0)

    def _fits(self, node: str, pod: dict | None, but: dict | None = None) -> bool:
        """`pod` (None: none more) fits `node` with what runs there (but `but`)."""
        allocatable = self.nodes[node]["status"]["allocatable"]
        used = self.used(node, but=but)
        if pod is not None:
            for k, v in pod_requests(pod).items():
                used[k] = used.get(k, Decimal(0)) + v
        return all(v <= parse_quantity(allocatable.get(k, "0")) for k, v in used.items() if v > 0)

    @staticmethod
    def _actuated(pod: dict) -> list[dict]:
        return [{"name": c["name"], "ready": True, "resources": copy.deepcopy(c.get("resources") or {})}
                for c in pod["spec"]["containers"]]

    def _bind(self, pod: dict, node: str) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if key in self._unbound:
            self.bind_waits[key] = time.monotonic() - self._unbound.pop(key)
        self.running_at.setdefault(key, time.monotonic())
        pod["spec"]["nodeName"] = node
        pod["status"] = {**pod["status"], "phase": "Running", "containerStatuses": self._actuated(pod),
                         "conditions": [{"type": "PodScheduled", "status": "True"}]}
        self._emit("MODIFIED", pod)

    def _retry_deferred(self) -> None:
        """The stand-in kubelet: a Deferred resize is actuated once its node has room (the 1.33 kubelet retries
        Deferred resizes when resources are freed)."""
        for pod in list(self.pods.values()):
            pending = [c for c in pod["status"].get("conditions") or [] if c["type"] == "PodResizePending"]
            node = pod["spec"].get("nodeName")
            if pending and pending[0].get("reason") == "Deferred" and not terminal(pod) and self._room_for(node, pod):
                pod["status"]["conditions"] = [c for c in pod["status"]["conditions"] if c["type"] != "PodResizePending"]
                pod["status"]["containerStatuses"] = self._actuated(pod)
                self._emit("MODIFIED", pod)

    def schedule(self) -> None:
        """The stand-in default-scheduler: bind every pending, ungated pod that fits where it must (or anywhere);
        then the stand-in kubelet retries Deferred resizes."""
        with self.lock:
            self._retry_deferred()
            for pod in list(self.pods.values()):
                spec = pod["spec"]
                if spec.get("nodeName") or spec.get("schedulingGates") or terminal(pod) or \
                        pod["metadata"].get("deletionTimestamp") or \
                        spec.get("schedulerName", "default-scheduler") != "default-scheduler":
                    continue
                wanted = pinned(pod)
                fit = [n for n in ([wanted] if wanted else list(self.nodes)) if n in self.nodes and self._fits(n, pod)]
                passed = self._extend(pod, fit)
                if passed:
                    self._bind(pod, passed[0])

    def add_daemons(self, cpu: str = "500m", memory: str = "1Gi") -> list[dict]:
        """A daemon set's pod on every node (kube-system, bound at creation as the DaemonSet controller binds
        them): what the kubelet counts and an allocator that reads only `allocatable` does not."""
        made = []
        for node in list(self.nodes):
            pod = k8s_pod(f"node-agent-{node}", model=None, gpus=0, cpu=cpu, memory=memory, namespace="kube-system",
                          labels={"app": "node-agent"})
            pod["spec"]["nodeName"] = node
            pod["spec"]["restartPolicy"] = "Always"
            made.append(self.create_pod("kube-system", pod))
        return made

    def finish(self, namespace: str, name: str, phase: str = "Succeeded") -> None:
        """The pod's containers exit: its phase becomes `phase` (the kubelet's report)."""
        with self.lock:
            pod = self._get(namespace, name)
            pod["status"]["phase"] = phase
            self._emit("MODIFIED", pod)
            self.schedule()

    # ------------------------------------------------------------------ batch/v1 Indexed Jobs and their controller

    def create_job(self, namespace: str, body: dict) -> dict:
        """Create an Indexed Job (the test's, as `kubectl apply` would); its pods follow from `_sync_jobs`."""
        job = copy.deepcopy(body)
        meta, spec = job.setdefault("metadata", {}), job.setdefault("spec", {})
        meta["namespace"] = namespace
        if spec.get("completionMode") != "Indexed":
            raise ApiError(422, "Invalid", "the stand-in's Job controller runs Indexed Jobs only (a simplification)")
        spec.setdefault("parallelism", 1)
        if not isinstance(spec.get("completions"), int) or spec["completions"] < 1 or not meta.get("name"):
            raise ApiError(422, "Invalid", "spec.completions: Required value: an Indexed Job needs completions")
        with self.lock:
            if (namespace, meta["name"]) in self.jobs:
                raise ApiError(409, "AlreadyExists", f'jobs.batch "{meta["name"]}" already exists')
            meta["uid"] = str(uuid.uuid4())
            self.rv += 1
            meta["resourceVersion"] = str(self.rv)
            self.jobs[(namespace, meta["name"])] = job
            return copy.deepcopy(job)

    def job_call(self, method: str, ns: str, name: str | None, body: Any, ctype: str) -> tuple[int, dict]:
        if method == "POST" and not name:
            return 201, self.create_job(ns, body)
        with self.lock:
            job = self.jobs.get((ns, name or ""))
            if job is None:
                raise ApiError(404, "NotFound", f'jobs.batch "{name}" not found')
            if method == "GET":
                return 200, copy.deepcopy(job)
            if method == "PATCH" and isinstance(body, dict):
                uid_precondition(job, body)
                new = merge_patch(job, body, strategic="strategic" in ctype)
                for field in ("name", "namespace", "uid"):
                    if (new.get("metadata") or {}).get(field) != job["metadata"].get(field):
                        raise ApiError(422, "Invalid", f'Job "{name}" is invalid: metadata.{field}: field is immutable')
                validate_job_update(job, new)
                self.rv += 1
                new["metadata"]["resourceVersion"] = str(self.rv)
                self.jobs[(ns, name or "")] = new
                return 200, copy.deepcopy(new)
            raise ApiError(405, "MethodNotAllowed", f"the stand-in serves no {method} on jobs")

    def job_pods(self, namespace: str, name: str) -> list[dict]:
        """The pods a Job owns (any phase), by completion index."""
        with self.lock:
            uid = self.jobs[(namespace, name)]["metadata"]["uid"]
            owned = [copy.deepcopy(p) for p in self.pods.values() if _owner_uid(p) == uid]
        return sorted(owned, key=lambda p: int(p["metadata"]["annotations"][COMPLETION_INDEX]))

    def _job_loop(self) -> None:
        while not self._closing.wait(0.02):
            for sync in (self._sync_jobs, self._sync_pytorchjobs):
                try:
                    sync()
                except ApiError:  # a pod the webhook refused: tried again at the next sync, as the controllers do
                    pass

    def _sync_jobs(self) -> None:
        """One pass of the stand-in Job controller (the module's docstring): deletions under the lock, creations
        after it (a creation calls the webhook)."""
        wanted: list[tuple[str, dict]] = []
        with self.lock:
            for (ns, name), job in self.jobs.items():
                spec, uid = job["spec"], job["metadata"]["uid"]
                busy: set[int] = set()  # indexes with a pod not ended, or done
                active = 0
                for pod in [p for p in self.pods.values() if _owner_uid(p) == uid]:
                    index = int(pod["metadata"]["annotations"][COMPLETION_INDEX])
                    ended = terminal(pod)
                    if index >= spec["completions"]:
                        if not ended and not pod["metadata"].get("deletionTimestamp"):
                            self._delete(pod)  # scaled down: removed, gracefully
                        continue
                    if not ended or pod["status"].get("phase") == "Succeeded":
                        busy.add(index)
                    active += not ended
                for index in range(spec["completions"]):
                    if active >= spec["parallelism"]:
                        break
                    if index not in busy:
                        wanted.append((ns, self._job_pod(job, index)))
                        active += 1
        for ns, body in wanted:
            self.create_pod(ns, body)

    @staticmethod
    def _job_pod(job: dict, index: int) -> dict:
        template, meta = job["spec"]["template"], job["metadata"]
        labels = {**(template.get("metadata") or {}).get("labels", {}), COMPLETION_INDEX: str(index),
                  "batch.kubernetes.io/job-name": meta["name"], "batch.kubernetes.io/controller-uid": meta["uid"]}
        annotations = {**(template.get("metadata") or {}).get("annotations", {}), COMPLETION_INDEX: str(index)}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{meta['name']}-{index}-{uuid.uuid4().hex[:5]}", "labels": labels,
                             "annotations": annotations,
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                                  "uid": meta["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": copy.deepcopy(template["spec"])}

    # ------------------------------------------------------------------ kubeflow.org/v1 PyTorchJobs and their operator

    def pytorchjob_call(self, method: str, ns: str, name: str | None, body: Any, ctype: str = "") -> tuple[int, dict]:
        """Create, get or merge-PATCH a PyTorchJob (custom resources take no strategic merge patch: 415)."""
        with self.lock:
            if method == "POST" and not name:
                job = copy.deepcopy(body)
                meta = job.setdefault("metadata", {})
                meta["namespace"] = ns
                validate_pytorchjob(job)
                if (ns, meta["name"]) in self.pytorchjobs:
                    raise ApiError(409, "AlreadyExists", f'pytorchjobs.kubeflow.org "{meta["name"]}" already exists')
                meta["uid"] = str(uuid.uuid4())
            else:
                current = self.pytorchjobs.get((ns, name or ""))
                if current is None:
                    raise ApiError(404, "NotFound", f'pytorchjobs.kubeflow.org "{name}" not found')
                if method == "GET":
                    return 200, copy.deepcopy(current)
                if method != "PATCH" or not isinstance(body, dict):
                    raise ApiError(405, "MethodNotAllowed", f"the stand-in serves no {method} on pytorchjobs")
                if "strategic" in ctype:
                    raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                   "accepted media types include: application/json-patch+json, "
                                   "application/merge-patch+json, application/apply-patch+yaml")
                uid_precondition(current, body)
                job = merge_patch(current, body)
                for field in ("name", "namespace", "uid"):
                    if (job.get("metadata") or {}).get(field) != current["metadata"].get(field):
                        raise ApiError(422, "Invalid", f'PyTorchJob "{name}" is invalid: metadata.{field}: field is '
                                       "immutable")
                validate_pytorchjob(job)
            self.rv += 1
            job["metadata"]["resourceVersion"] = str(self.rv)
            self.pytorchjobs[(ns, job["metadata"]["name"])] = job
            return (201 if method == "POST" else 200), copy.deepcopy(job)

    def pytorchjob_pods(self, namespace: str, name: str) -> list[dict]:
        """The pods a PyTorchJob owns (any phase), master first, then workers by index."""
        with self.lock:
            uid = self.pytorchjobs[(namespace, name)]["metadata"]["uid"]
            owned = [copy.deepcopy(p) for p in self.pods.values() if _owner_uid(p) == uid]
        return sorted(owned, key=lambda p: (p["metadata"]["labels"][KUBEFLOW_LABELS[1]] != "master",
                                            int(p["metadata"]["labels"][KUBEFLOW_LABELS[2]])))

    def _sync_pytorchjobs(self) -> None:
        """One pass of the stand-in training operator (the module's docstring): deletions under the lock,
        creations after it (a creation calls the webhook)."""
        wanted: list[tuple[str, dict]] = []
        with self.lock:
            for (ns, name), job in self.pytorchjobs.items():
                uid = job["metadata"]["uid"]
                names = {p["metadata"]["name"] for p in self.pods.values() if p["metadata"]["namespace"] == ns}
                for rtype, rspec in job["spec"]["pytorchReplicaSpecs"].items():
                    count = rspec.get("replicas", 1)
                    for pod in [p for p in self.pods.values() if _owner_uid(p) == uid
                                and p["metadata"]["labels"][KUBEFLOW_LABELS[1]] == rtype.lower()]:
                        if int(pod["metadata"]["labels"][KUBEFLOW_LABELS[2]]) >= count and not terminal(pod) \
                                and not pod["metadata"].get("deletionTimestamp"):
                            self._delete(pod)  # scaled down: removed, gracefully
                    for index in range(count):
                        if f"{name}-{rtype.lower()}-{index}" not in names:
                            wanted.append((ns, self._pytorchjob_pod(job, rtype, index)))
        for ns, body in wanted:
            self.create_pod(ns, body)

    @staticmethod
    def _pytorchjob_pod(job: dict, rtype: str, index: int) -> dict:
        template, meta = job["spec"]["pytorchReplicaSpecs"][rtype]["template"], job["metadata"]
        labels = {**(template.get("metadata") or {}).get("labels", {}),
                  **dict(zip(KUBEFLOW_LABELS, (meta["name"], rtype.lower(), str(index))))}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{meta['name']}-{rtype.lower()}-{index}", "labels": labels,
                             "annotations": dict((template.get("metadata") or {}).get("annotations", {})),
                             "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                                  "name": meta["name"], "uid": meta["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": copy.deepcopy(template["spec"])}

    # ------------------------------------------------------------------ ConfigMaps and Leases

    def object_call(self, method: str, kind: str, ns: str, name: str | None, body: Any) -> tuple[int, dict]:
        with self.lock:
            key = (kind, ns, name or (body or {}).get("metadata", {}).get("name", ""))
            current = self.objects.get(key)
            singular = kind[:-1]
            if method == "GET" and name:
                if current is None:
                    raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
                return 200, copy.deepcopy(current)
            if method == "POST" and not name:
                if current is not None:
                    raise ApiError(409, "AlreadyExists", f'{kind} "{key[2]}" already exists')
                return 201, self._store(key, body)
            if method == "PUT" and name:
                if current is None:
                    raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
                if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                    raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind} "{name}": the object '
                                   "has been modified; please apply your changes to the latest version and try again")
                return 200, self._store(key, body)
            raise ApiError(405, "MethodNotAllowed", f"the stand-in serves no {method} on {singular}")

    def _store(self, key: tuple[str, str, str], body: dict) -> dict:
        obj = copy.deepcopy(body)
        obj["metadata"]["namespace"] = key[1]
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if key[0] == "leases":
            self.lease_history.append((time.time(), str((obj.get("spec") or {}).get("holderIdentity") or "")))
        self.objects[key] = obj
        return copy.deepcopy(obj)


def uid_precondition(current: dict, patch: dict) -> None:
    """A patch that names a uid (`metadata.uid`) applies only to the object with it: else 409, as the API server's
    "Precondition failed" (the object by that name was deleted and created again)."""
    uid = (patch.get("metadata") or {}).get("uid")
    if uid is not None and uid != current["metadata"].get("uid"):
        raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                                        f"{current['metadata'].get('uid')}")


def _owner_uid(pod: dict) -> str | None:
    """The uid of the pod's controlling owner, if it has one."""
    owner = next((o for o in pod["metadata"].get("ownerReferences") or [] if o.get("controller")), None)
    return None if owner is None else owner.get("uid")


def _limit(pod: dict, resource: str) -> Decimal | None:
    """The sum of the containers' limits of `resource` (None when one has none: unlimited)."""
    limits = [((c.get("resources") or {}).get("limits") or {}).get(resource) for c in pod["spec"]["containers"]]
    return None if any(v is None for v in limits) else sum((parse_quantity(v) for v in limits), Decimal(0))


def pinned(pod: dict) -> str | None:
    """The one node a pod's required node affinity names by `metadata.name`, if it does."""
    terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and field.get("values"):
                return field["values"][0]
    return None
