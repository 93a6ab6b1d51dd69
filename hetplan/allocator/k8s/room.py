"""Room as the kubelet counts it: a node's allocatable minus every pod bound to it, not only hetplan's allocations.

The allocator hands out a node's room; Kubernetes admits a pod only where the requests of *every* pod bound there
fit `allocatable` (the scheduler counts, per pod, the larger of its spec's requests and what the kubelet actuated:
a resize not yet actuated holds both). So the node sync (`nodes.NodeSync`) watches all pods (`PodLedger`) and gives
the allocator, per node, `allocatable - foreign`, where **foreign** is what bound pods hold beyond hetplan's own
allocations there:

- a pod hetplan does not hold on that node (a daemon set's pod, any pod without a job id, an opted-in pod that fell
  to the default scheduler, the old pod of a move while its containers stop, a pod whose job was released): all of
  its usage;
- a pod of a job hetplan holds on that node: what it uses *above* the allocation (a shrink the kubelet has not
  actuated yet, a memory shrink a Guaranteed pod could not make on 1.33): the excess, per resource.

The node's capacity is never set below what hetplan's allocations already hold there (a node over-booked for a while
has no room, and is not refused or closed): `room`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetplan.allocator.k8s import pods
from hetplan.allocator.spec import CLOSED_LABEL, MIB_PER_GIB, Allocation, Node


@dataclass(frozen=True, slots=True)
class Usage:
    """GPUs, millicores and MiB a pod holds (or a node has to give)."""

    gpus: int = 0
    cpu_m: int = 0
    mem_mib: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.gpus + other.gpus, self.cpu_m + other.cpu_m, self.mem_mib + other.mem_mib)

    def beyond(self, held: Usage) -> Usage:
        """What this usage holds above `held`, per resource (never below 0)."""
        return Usage(max(0, self.gpus - held.gpus), max(0, self.cpu_m - held.cpu_m),
                     max(0, self.mem_mib - held.mem_mib))


def usage(pod: Mapping[str, Any]) -> Usage:
    """What a bound pod holds as the scheduler counts it: per resource, the larger of its spec's requests (an init
    container asking for more counts instead: `pods.totals`) and what the kubelet actuated
    (`status.containerStatuses`)."""
    gpus, cpu_m, mem_mib = pods.totals(pod)
    actuated = (pod.get("status") or {}).get("containerStatuses") or []
    return Usage(gpus, max(cpu_m, pods.summed(actuated, "cpu", pods.MILLI)),
                 max(mem_mib, pods.summed(actuated, "memory", pods.MIB)))


def held_by(allocation: Allocation) -> Usage:
    return Usage(allocation.gpus, allocation.cpu_m, allocation.mem_mib)


@dataclass(frozen=True, slots=True)
class Bound:
    """A pod bound to a node: its node, the job it serves (the annotation `hetplan.io/job-id`, or, for an opted-in
    pod the webhook left to the default path, the id it would have had: `<namespace>/<name>`), its usage."""

    node: str
    job: str | None
    usage: Usage


def bound(pod: Mapping[str, Any]) -> Bound | None:
    """The pod as the ledger keeps it; None when it holds nothing on a node (not bound, or ended)."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or pods.ended(pod):
        return None
    job = pods.job_id(pod)
    if job is None and pods.model(pod) is not None:
        job = pods.owner_job(pod)
    try:
        return Bound(str(node), job, usage(pod))
    except ValueError:
        return Bound(str(node), job, Usage())  # quantities the API server accepted but hetplan cannot read


class PodLedger:
    """Every pod bound to a node, from a list and its watch (thread-safe); what each node's pods hold."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], Bound] = {}
        self._by_node: dict[str, set[tuple[str, str]]] = {}

    def replace(self, items: Iterable[Mapping[str, Any]]) -> set[str]:
        """A full list: the pods now; the nodes whose pods changed."""
        fresh = {pods.key(p): b for p in items if (b := bound(p)) is not None}
        with self._lock:
            changed = {b.node for k, b in self._pods.items() if fresh.get(k) != b}
            changed |= {b.node for k, b in fresh.items() if self._pods.get(k) != b}
            self._pods = fresh
            self._by_node = {}
            for k, b in fresh.items():
                self._by_node.setdefault(b.node, set()).add(k)
        return changed

    def update(self, kind: str, pod: Mapping[str, Any]) -> set[str]:
        """One watch event (ADDED, MODIFIED, DELETED); the nodes whose pods changed."""
        k = pods.key(pod)
        now = None if kind == "DELETED" else bound(pod)
        with self._lock:
            before = self._pods.get(k)
            if before == now:
                return set()
            if before is not None:
                self._by_node.get(before.node, set()).discard(k)
                del self._pods[k]
            if now is not None:
                self._pods[k] = now
                self._by_node.setdefault(now.node, set()).add(k)
        return {b.node for b in (before, now) if b is not None}

    def jobs(self) -> set[str]:
        """The jobs with a pod bound to some node."""
        with self._lock:
            return {b.job for b in self._pods.values() if b.job is not None}

    def on(self, node: str) -> list[Bound]:
        with self._lock:
            return [self._pods[k] for k in self._by_node.get(node, ())]

    def foreign(self, node: str, held: Callable[[str], Sequence[Allocation]], owned: Iterable[str] = ()) -> Usage:
        """What `node`'s pods hold beyond hetplan's allocations there (see the module's docstring). `held(job)`: the
        job's allocations on this node (one; several for a gang's parts there; none); `owned`: jobs to count as
        held whole (a pod being adopted)."""
        total, left, owned = Usage(), {}, set(owned)
        for b in self.on(node):
            if b.job in owned:
                continue
            if b.job is not None and b.job not in left:
                left[b.job] = list(held(b.job))
            mine = left.get(b.job) if b.job is not None else None
            a = mine.pop(0) if mine else None  # one pod per allocation: a pod more of the job on the node is foreign
            total = total + (b.usage.beyond(held_by(a)) if a is not None else b.usage)
        return total


FULL = "full"
"""The `hetplan.io/closed` reason of a node whose every GPU, core or MiB other pods hold (a node has at least one
of each in hetplan): closed to placement until room frees."""


def room(node: Node, foreign: Usage, used: Usage) -> Node:
    """`node` (its allocatable) less `foreign`, never below what hetplan's allocations there use (`used`)."""
    gpus = max(node.gpus - foreign.gpus, used.gpus)
    cpu_m = max(round(node.cpus * 1000) - foreign.cpu_m, used.cpu_m)
    mem_mib = max(round(node.mem_gb * MIB_PER_GIB) - foreign.mem_mib, used.mem_mib)
    if (gpus, cpu_m, mem_mib) == (node.gpus, round(node.cpus * 1000), round(node.mem_gb * MIB_PER_GIB)):
        return node
    labels = dict(node.labels)
    if min(gpus, cpu_m, mem_mib) < 1:
        labels.setdefault(CLOSED_LABEL, FULL)
    return Node(node.name, node.gpu_type, max(gpus, 1), max(cpu_m, 1) / 1000, max(mem_mib, 1) / MIB_PER_GIB, labels)
