"""Kubernetes node sync: keep the allocator's nodes in step with a cluster's Nodes (list, then watch).

`hetplan serve --kubeconfig PATH` starts a `NodeSync`: a thread that lists the cluster's Nodes, watches them from
the list's resourceVersion, and applies each change through the allocator's `change_nodes` (one all-or-nothing
`NodeChanges` batch under the allocator's lock; the durable allocator commits it to SQLite first).

Translation (`to_node`, pure): a v1.Node (its JSON, a dict) becomes a hetplan `Node` or a `Skip` saying why not:
- GPUs from `status.allocatable["nvidia.com/gpu"]`, cores from `cpu`, RAM from `memory` in GiB (whole MiB,
  rounded down), each a bounded quantity (`extender.parse_quantity`); at most 1,024 GPUs, 10^6 cores and
  10^9 GiB, the bounds of `POST /v1/nodes`;
- GPU type from the label `nvidia.com/gpu.product` (`nvidia.com/gpu.memory` tells the 40/80 GB A100 apart),
  canonical where hetplan knows the product, else an opaque type (`canonical_gpu`), never refused;
- labels kept, plus `hetplan.io/source=kubernetes`, the sync's mark of ownership;
- skipped: no GPUs, no product label, bad quantities, `spec.unschedulable` (cordoned), Ready not True.

Ownership: the sync removes and closes only nodes marked `hetplan.io/source=kubernetes`. A Kubernetes Node named
like a node from `--nodes`, `--from-plan` or `POST /v1/nodes` takes that node over (a plan's placeholders become
the real nodes); nodes with no Kubernetes Node of their name are never touched.

Placement: a skipped node the sync owns is removed when idle. When busy it is kept, allocations and all, and
closed to new placement (label `hetplan.io/closed=<reason>`, see `spec.CLOSED_LABEL`): a cordon evicts no pod,
and a NotReady node's pods are evicted by Kubernetes itself (the launcher then releases them), so forgetting
them (forced removal) would let hetplan place new jobs on GPUs still in use when the node comes back. A closed
node is reopened or removed once idle, at the next full reconcile (before every watch, at least every
`watch_seconds`). A change the allocator refuses (a busy node shrunk below what runs on it, a new GPU type under
running jobs) closes the node the same way. DELETED, or gone from a re-list: removed, forced (the machine is
gone; its allocations are released and logged).

Room (`room.py`): a second thread lists and watches every pod (all namespaces) into a `PodLedger`, and a node's
capacity for the allocator is its allocatable minus what bound pods hold beyond hetplan's allocations there (daemon
sets, pods hetplan does not hold, the excess of a resize not yet actuated), never below what hetplan's allocations
there hold; recounted at every pod event on the node and every change of hetplan's allocations on it. `recount`
lets the adoption of a pod already running (`/v1/adopt`) count that pod as hetplan's.

Errors: 410 Gone (the watch's resourceVersion expired) re-lists and reconciles; anything else is logged in one
line, counted, and retried after a backoff (1 s doubling to 60 s) from the last resourceVersion (from a new list
after three errors in a row). The threads never stop the service.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import ValidationError

from hetplan.allocator.cluster import Cluster, StateError
from hetplan.allocator.k8s.errors import one_line
from hetplan.allocator.k8s.extender import GPU_RESOURCE, MODEL_KEY, K8sNode, node_gpu_type, node_resources
from hetplan.allocator.k8s.room import PodLedger, Usage, bound, room
from hetplan.allocator.metrics import Metrics
from hetplan.allocator.core import Allocator, NodeChanges
from hetplan.allocator.spec import CLOSED_LABEL, MIB_PER_GIB, Node
from hetplan.gpus import GPU_PRODUCT_LABEL, UnknownGpuError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

SOURCE_LABEL = "hetplan.io/source"
SOURCE = "kubernetes"
IN_CLUSTER = "in-cluster"
"""`--kubeconfig in-cluster`: the pod's service account (`load_incluster_config`) instead of a file."""
MAX_GPUS, MAX_CORES, MAX_MEM_GIB = 1024, 1e6, 1e9  # as `POST /v1/nodes`

SkipKind = Literal["not-a-node", "bad-quantity", "no-gpus", "no-product", "unschedulable", "not-ready"]


@dataclass(frozen=True, slots=True)
class Skip:
    """A Kubernetes Node that is no placeable hetplan node now: `kind` (one word, a metric label), `reason`
    (one line for the log)."""

    name: str
    kind: SkipKind
    reason: str


def to_node(obj: Mapping[str, Any]) -> Node | Skip:
    """The hetplan `Node` for a v1.Node object (its JSON), or why it is skipped. Pure; never raises."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = str(meta.get("name") or "<unnamed>") if isinstance(meta, Mapping) else "<unnamed>"
    try:
        node = K8sNode.model_validate(obj)
    except ValidationError as exc:
        return Skip(name, "not-a-node", f"not a v1.Node: {exc.errors()[0]['msg']}")
    if not node.metadata.name:
        return Skip(name, "not-a-node", "no metadata.name")
    try:
        gpus, cpu_m, mem_mib = node_resources(node)
    except ValueError as exc:
        return Skip(name, "bad-quantity", f"allocatable {exc}")
    if gpus < 1:
        return Skip(name, "no-gpus", f"no allocatable {GPU_RESOURCE}")
    if gpus > MAX_GPUS or cpu_m > MAX_CORES * 1000 or mem_mib > MAX_MEM_GIB * MIB_PER_GIB:
        return Skip(name, "bad-quantity", f"allocatable out of range ({gpus} GPUs, {cpu_m}m cores, {mem_mib} MiB; "
                                          f"at most {MAX_GPUS}, {MAX_CORES:g} cores, {MAX_MEM_GIB:g} GiB)")
    if cpu_m < 1 or mem_mib < 1:
        return Skip(name, "bad-quantity", "no allocatable cpu or memory")
    labels = node.metadata.labels
    try:
        gpu_type = node_gpu_type(labels)
    except UnknownGpuError:
        return Skip(name, "no-product", f"{GPU_PRODUCT_LABEL}={labels[GPU_PRODUCT_LABEL][:100]!r} is no GPU type name")
    if gpu_type is None:
        return Skip(name, "no-product", f"no {GPU_PRODUCT_LABEL} label")
    spec, status = obj.get("spec"), obj.get("status")
    if isinstance(spec, Mapping) and spec.get("unschedulable") is True:
        return Skip(name, "unschedulable", "spec.unschedulable (cordoned)")
    ready = _ready(status.get("conditions") if isinstance(status, Mapping) else None)
    if ready != "True":
        return Skip(name, "not-ready", f"Ready condition {ready}")
    try:
        return Node(name, gpu_type, gpus, cpu_m / 1000, mem_mib / MIB_PER_GIB, {**labels, SOURCE_LABEL: SOURCE})
    except ValueError as exc:
        return Skip(name, "not-a-node", str(exc))


def _ready(conditions: object) -> str:
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return f"{condition.get('status')}"[:20]
    return "missing"


class KubeConfigError(ValueError):
    """A kubeconfig that cannot be used; the message is one line."""


def load_client(kubeconfig: str | os.PathLike[str]) -> ApiClient:
    """A Kubernetes API client for a kubeconfig file (its current context), or for the pod's service account
    with `in-cluster`. Never writes the file (refreshed tokens stay in memory). `KubeConfigError` otherwise."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if str(kubeconfig) == IN_CLUSTER:
            config.load_incluster_config(client_configuration=configuration)
        else:
            if not Path(kubeconfig).is_file():
                raise KubeConfigError(f"kubeconfig {kubeconfig}: no such file")
            config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration,
                                    persist_config=False)
    except (ConfigException, OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        if isinstance(exc, KubeConfigError):
            raise
        raise KubeConfigError(f"kubeconfig {kubeconfig}: {one_line(exc)}") from None
    configuration.retries = False  # the sync's own backoff retries, once, with one log line
    return client.ApiClient(configuration)


class NodeSync:
    """Keeps an allocator's nodes in step with a cluster's Nodes, from a daemon thread (`start`, `stop`).

    `watch_seconds`: how long one watch request lasts (the server ends it; then the sync reconciles from memory
    and watches again). `backoff`: first and longest wait after an error. `ready` is set after the first list.
    """

    def __init__(self, allocator: Allocator, api: ApiClient, metrics: Metrics | None = None,
                 watch_seconds: int = 300, backoff: tuple[float, float] = (1.0, 60.0), page_size: int = 500,
                 request_timeout: float = 60.0, watch_pods: bool = True, recount_seconds: float = 0.2) -> None:
        self.allocator, self.api, self.metrics = allocator, api, metrics
        self.watch_seconds, self.backoff, self.page_size = watch_seconds, backoff, page_size
        self.request_timeout = request_timeout
        self.ready = threading.Event()
        self._seen: dict[str, Node | Skip] = {}  # the latest translation of every Node the cluster has
        self._resource_version: str | None = None  # None: list before watching
        self._stopping = threading.Event()
        self._watch: Any = None
        self._thread: threading.Thread | None = None
        self._failures = 0  # errors in a row; from the third on, the next attempt lists again
        self.watch_pods, self.recount_seconds = watch_pods, recount_seconds
        self.ledger = PodLedger()  # every pod bound to a node (room.py)
        self.pods_ready = threading.Event()  # set after the first pod list
        self._pod_watch: Any = None
        self._threads: list[threading.Thread] = []
        if metrics is not None:
            self._watch_gauges(metrics)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("NodeSync already started")
        self._thread = threading.Thread(target=self._run, name="hetplan-kube-node-sync", daemon=True)
        self._thread.start()
        if self.watch_pods:
            for target, name in ((self._run_pods, "pods"), (self._follow_allocations, "room")):
                thread = threading.Thread(target=target, name=f"hetplan-kube-{name}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (interrupting a watch) and wait up to `timeout` s; once stopped it changes nothing."""
        self._stopping.set()
        thread = self._thread
        deadline = time.monotonic() + timeout
        for other in self._threads:
            while other.is_alive() and time.monotonic() < deadline:
                if self._pod_watch is not None:
                    self._pod_watch.stop()
                other.join(0.1)
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            watch = self._watch
            if watch is not None:
                watch.stop()  # shuts the stream's socket down (again, should the stream have begun meanwhile)
            thread.join(0.1)
        if thread is not None and thread.is_alive():
            log.warning("kubernetes node sync: still in a request after %.0f s; left to end on its own", timeout)

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException

        core = CoreV1Api(self.api)
        self._watch = watch.Watch(return_type="object")  # events' objects stay JSON dicts, as `to_node` reads them
        while not self._stopping.is_set():
            try:
                if self._resource_version is None:
                    self._list(core)
                    self.ready.set()
                else:
                    self.reconcile()  # from memory: closed nodes gone idle, changes an earlier error left out
                self._watch_once(core)
            except ApiException as exc:
                if exc.status == 410 and self._resource_version is not None:
                    log.info("kubernetes node sync: watch expired (410 Gone); listing the Nodes again")
                    self._resource_version = None
                    continue
                self._failed(exc)
            except Exception as exc:  # noqa: BLE001 - the sync must outlive any error; it is logged and retried
                self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        """Count and log an error, wait (doubling with each error in a row); from the third in a row, list again."""
        if self._stopping.is_set():
            return
        if self.metrics is not None:
            self.metrics.kube_errors.inc()
        self._failures += 1
        if self._failures >= 3:
            self._resource_version = None
        delay = min(self.backoff[0] * 2 ** (self._failures - 1), self.backoff[1])
        hint = " (the service account needs get, list and watch on nodes)" if getattr(exc, "status", None) == 403 \
            else ""
        then = "list the Nodes" if self._resource_version is None \
            else f"watch from resourceVersion {self._resource_version}"
        log.warning("kubernetes node sync: %s%s; retrying in %g s (%s)", one_line(exc), hint, delay, then)
        self._stopping.wait(delay)

    def _list_all(self, list_fn: Any) -> tuple[list[Any], str | None]:
        """Every item of a list call (`core.list_node`, `core.list_pod_for_all_namespaces`), in pages, and the
        list's resourceVersion."""
        items: list[Any] = []
        token: str | None = None
        while True:
            response = list_fn(limit=self.page_size, _continue=token, _preload_content=False,
                               _request_timeout=self.request_timeout)
            try:
                body = json.loads(response.data)
            finally:
                response.release_conn()
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                return items, str(meta.get("resourceVersion") or "") or None

    def _list(self, core: Any) -> None:
        """List every Node (in pages), replace what the sync knows, reconcile; watch from the list's version."""
        items, rv = self._list_all(core.list_node)
        self.apply_list(items)
        self._resource_version = rv
        if self._resource_version is None:
            raise ValueError("the Node list has no metadata.resourceVersion")
        self._failures = 0

    def _watch_once(self, core: Any) -> None:
        """One watch request, from the last resourceVersion until the server ends it (or `stop`)."""
        if self._stopping.is_set():
            return
        for event in self._watch.stream(core.list_node, resource_version=self._resource_version,
                                        timeout_seconds=int(self.watch_seconds), allow_watch_bookmarks=True,
                                        _request_timeout=(self.request_timeout, self.watch_seconds + 30)):
            if self._stopping.is_set():
                return
            obj = event.get("raw_object")
            self.apply_event(str(event.get("type")), obj)
            meta = obj.get("metadata") if isinstance(obj, Mapping) else None
            if isinstance(meta, Mapping) and meta.get("resourceVersion"):  # a BOOKMARK event carries only this
                self._resource_version = str(meta["resourceVersion"])
                self._failures = 0

    def apply_list(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Take a full list of Nodes as the truth: Nodes not in it are gone; reconcile every node."""
        seen = {t.name: t for t in map(to_node, items)}
        self._seen = seen
        kinds = Counter(t.kind for t in seen.values() if isinstance(t, Skip))
        log.info("kubernetes node sync: listed %d Nodes, %d placeable, %d skipped%s", len(seen),
                 len(seen) - sum(kinds.values()), sum(kinds.values()),
                 f" ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})" if kinds else "")
        for skip in (t for t in seen.values() if isinstance(t, Skip)):
            log.debug("kubernetes node sync: skipped %s: %s", skip.name, skip.reason)
        self.reconcile()

    def apply_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        """Take one watch event: ADDED or MODIFIED (the Node as it is now) or DELETED; other kinds change nothing."""
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping) or not meta.get("name") or kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        name = str(meta.get("name"))
        if kind == "DELETED":
            if self._seen.pop(name, None) is not None:
                log.info("kubernetes node sync: Node %s deleted", name)
        else:
            seen = to_node(obj)
            before = self._seen.get(seen.name)
            self._seen[seen.name] = seen
            if isinstance(seen, Skip) and (not isinstance(before, Skip) or before.kind != seen.kind):
                log.info("kubernetes node sync: Node %s skipped: %s", seen.name, seen.reason)
        self.reconcile([name])

    # ------------------------------------------------------------------ applying

    def reconcile(self, names: Iterable[str] | None = None, owned: Iterable[str] = ()) -> None:
        """Bring the allocator's nodes named `names` (default: every Node seen and every node the sync owns) in
        step with the latest translations and their room, as one batch; if the allocator refuses the batch, node by
        node. `owned`: jobs whose pods count as hetplan's though it holds no allocation for them yet (`recount`)."""
        a = self.allocator
        with a.lock:
            if self._stopping.is_set():
                return  # stopped: the allocator may be closed
            cluster = a.cluster
            if names is None:
                names = set(self._seen) | {n.name for n in cluster.nodes() if _owned(n)}
            owned = set(owned)
            changes = [c for c in (self._change(cluster, name, owned) for name in sorted(set(names)))
                       if c is not None]
            if changes:
                self._apply(a, changes)

    def recount(self, names: Iterable[str], owned: Iterable[str] = ()) -> None:
        """Recount the room of `names` now (the caller holds the allocator's lock, or need not): with `owned`,
        the pods of those jobs count as hetplan's (a pod being adopted: its room is its own)."""
        self._recount([n for n in names if n in self._seen], owned)

    def _recount(self, names: Iterable[str] | None, owned: Iterable[str] = ()) -> None:
        """A reconcile for the room's sake (a pod event, an allocation change, an adoption): only once the Nodes
        were listed. Before that the sync knows no Node, and a full reconcile would read every node it owns (all of
        them, after a restart) as deleted, and remove them with their allocations."""
        if self.watch_pods and self.ready.is_set():
            self.reconcile(names, owned)

    def _change(self, cluster: Cluster, name: str, owned: set[str] | None = None) -> tuple[str, Node | str] | None:
        """("upsert", node), ("close", node) or ("remove", name) for one node, or None when it is in step."""
        current = cluster.node(name) if name in cluster else None
        want = self._seen.get(name)
        if isinstance(want, Node):
            want = self._with_room(cluster, want, owned or set())
            return None if current == want else ("upsert", want)
        if current is None or not _owned(current):
            return None  # never touch what the sync does not own
        if want is None or not cluster.jobs_on(name):
            return ("remove", name)
        return None if current.labels.get(CLOSED_LABEL) == want.kind else ("close", _closed(current, want.kind))

    def _with_room(self, cluster: Cluster, node: Node, owned: set[str]) -> Node:
        """The Node's allocatable less what other pods hold there (`room.room`)."""
        if not self.watch_pods or not self.pods_ready.is_set():
            return node
        used = Usage()
        if node.name in cluster:
            shape, free = cluster.node(node.name).shape, cluster.free(node.name)
            used = Usage(shape.gpus - free.gpus, shape.cpu_m - free.cpu_m, shape.mem_mib - free.mem_mib)

        def held(job: str) -> list[Any]:
            return [p for p in self.allocator.running([job]).get(job, ()) if p.node == node.name]

        return room(node, self.ledger.foreign(node.name, held, owned), used)

    def _apply(self, a: Allocator, changes: list[tuple[str, Node | str]]) -> None:
        if len(changes) > 1:
            batch = NodeChanges(upsert=[c for _, c in changes if isinstance(c, Node)],
                                remove=[c for _, c in changes if isinstance(c, str)], force=True)
            try:
                self._done(changes, a.change_nodes(batch))
                return
            except StateError as exc:
                log.info("kubernetes node sync: a batch of %d changes was refused (%s); applying them one by one",
                         len(changes), exc)
        for what, item in changes:
            single = NodeChanges(upsert=[item]) if isinstance(item, Node) else NodeChanges(remove=[item], force=True)
            try:
                self._done([(what, item)], a.change_nodes(single))
            except StateError as exc:  # only an upsert can be refused: a busy node shrunk, or a new GPU type
                current = a.cluster.node(_name(item)) if _name(item) in a.cluster else None
                if current is None or not _owned(current):
                    log.warning("kubernetes node sync: %s %s refused: %s", what, _name(item), exc)
                elif current.labels.get(CLOSED_LABEL) == "update-refused":
                    log.debug("kubernetes node sync: update of %s refused again: %s", _name(item), exc)
                else:
                    log.warning("kubernetes node sync: update of %s refused (%s); closed to new placement until "
                                "idle", _name(item), exc)
                    closed = _closed(current, "update-refused")
                    self._done([("close", closed)], a.change_nodes(NodeChanges(upsert=[closed])))

    def _done(self, changes: list[tuple[str, Node | str]], evicted: list[Any]) -> None:
        for what, item in changes:
            if self.metrics is not None:
                self.metrics.kube_changes.labels(what).inc()
            detail = f" ({item.labels[CLOSED_LABEL]})" if what == "close" and isinstance(item, Node) else ""
            log.info("kubernetes node sync: %s %s%s", what, _name(item), detail)
        if evicted:
            log.warning("kubernetes node sync: %d allocation(s) evicted from removed nodes: %s", len(evicted),
                        ", ".join(f"{e.job_id}@{e.node}" for e in evicted[:50]) + (" ..." if len(evicted) > 50 else ""))

    # ------------------------------------------------------------------ room: every pod bound to a node

    def _run_pods(self) -> None:
        """List, then watch, every pod into the ledger; recount the nodes whose pods changed (410: list again)."""
        from kubernetes import watch
        from kubernetes.client import CoreV1Api
        from kubernetes.client.exceptions import ApiException

        core = CoreV1Api(self.api)
        self._pod_watch = watch.Watch(return_type="object")
        rv: str | None = None
        failures = 0
        while not self._stopping.is_set():
            try:
                if rv is None:
                    rv = self._list_pods(core)
                for event in self._pod_watch.stream(core.list_pod_for_all_namespaces, resource_version=rv,
                                                    timeout_seconds=int(self.watch_seconds),
                                                    allow_watch_bookmarks=True,
                                                    _request_timeout=(self.request_timeout, self.watch_seconds + 30)):
                    if self._stopping.is_set():
                        return
                    obj = event.get("raw_object") or {}
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        changed = self.ledger.update(str(event["type"]), obj)
                        if changed:
                            self._recount(changed)
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                failures = 0
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
                    continue
                failures = self._pods_failed(exc, failures)
                rv = None if failures >= 3 else rv
            except Exception as exc:  # noqa: BLE001 - the room outlives any error: logged, retried
                failures = self._pods_failed(exc, failures)
                rv = None if failures >= 3 else rv

    def _pods_failed(self, exc: Exception, failures: int) -> int:
        if not self._stopping.is_set():
            hint = " (the service account needs list and watch on pods)" if getattr(exc, "status", 0) == 403 else ""
            log.warning("kubernetes node sync: pod watch: %s%s; retrying", one_line(exc), hint)
            self._stopping.wait(min(self.backoff[0] * 2 ** failures, self.backoff[1]))
        return failures + 1

    def _list_pods(self, core: Any) -> str:
        """List every pod into the ledger and recount (every node at the first list); the list's version."""
        items, rv = self._list_all(core.list_pod_for_all_namespaces)
        changed = self.ledger.replace(items)
        first = not self.pods_ready.is_set()
        self.pods_ready.set()
        self._recount(None if first else changed)
        return rv or "0"

    def bound_jobs(self) -> set[str] | None:
        """The jobs with an opted-in pod bound to a node as the API server says now (a list, not the watch, which
        may lag a binding); None when it cannot be read (logged)."""
        from kubernetes.client import CoreV1Api

        core = CoreV1Api(self.api)

        def opted_in(**kw: Any) -> Any:
            return core.list_pod_for_all_namespaces(label_selector=MODEL_KEY, **kw)

        try:
            items, _ = self._list_all(opted_in)
        except Exception as exc:  # noqa: BLE001 - unknown: the caller takes no room back
            log.warning("kubernetes node sync: reading the bound pods: %s", one_line(exc))
            return None
        return {b.job for p in items if (b := bound(p)) is not None and b.job is not None}

    def _follow_allocations(self) -> None:
        """Recount the nodes whose allocations changed (a job released, moved or re-sized changes what its pods hold
        beyond it), every `recount_seconds`."""
        from hetplan.allocator.journal import TooOld

        seen = self.allocator.log.latest
        while not self._stopping.wait(self.recount_seconds):
            if not self.pods_ready.is_set():
                continue
            a = self.allocator
            with a.lock:
                latest = a.log.latest
                if latest == seen:
                    continue
                try:
                    names = {p.node for x in a.log.since(seen) for p in x.action.before + x.action.after}
                except TooOld:
                    names = None
                seen = latest
            try:
                self._recount(names)
            except Exception as exc:  # noqa: BLE001 - logged; the next change or pod event recounts again
                log.warning("kubernetes node sync: recount: %s", one_line(exc))

    def _watch_gauges(self, metrics: Metrics) -> None:
        """Read the gauges at scrape time (never on the sync's own path)."""

        def owned() -> int:
            with self.allocator.lock:
                return sum(1 for n in self.allocator.cluster.nodes() if _owned(n))

        def skipped(kind: str) -> int:
            return sum(1 for t in list(self._seen.values()) if isinstance(t, Skip) and t.kind == kind)

        metrics.kube_synced.set_function(owned)
        for kind in get_args(SkipKind):
            metrics.kube_skipped.labels(kind).set_function(lambda kind=kind: skipped(kind))


def _owned(node: Node) -> bool:
    return node.labels.get(SOURCE_LABEL) == SOURCE


def _closed(node: Node, why: str) -> Node:
    return Node(node.name, node.gpu_type, node.gpus, node.cpus, node.mem_gb, {**node.labels, CLOSED_LABEL: why})


def _name(item: Node | str) -> str:
    return item.name if isinstance(item, Node) else item
