"""Opted-in pods: how a pod carries its job, and the changes that give it an allocation.

Opt-in: the pod label `hetplan.io/model` (the model, as for the extender). What hetplan writes on such a pod:

| key | kind | meaning |
|---|---|---|
| `hetplan.io/job-id` | annotation | the allocator's job id (`<namespace>/<name>`); a replacement keeps it |
| `hetplan.io/requested-cpu`, `hetplan.io/requested-memory` | annotations | the pod's own request as written (millicores, MiB): the floor, asked again for a replacement |
| `hetplan.io/checkpoint` | annotation, written by the controller | "checkpoint now": the action's number; the pod answers `hetplan.io/checkpointed` with the same number (or exits) before its grace period ends |
| `hetplan.io/checkpoint-grace-seconds` | annotation, optional, set by the user | how long to wait for that answer (default: the controller's `--checkpoint-grace`) |
| `hetplan.io/migrated-from` | annotation | on a replacement: the pod it replaces |
| `hetplan.io/migration` | scheduling gate | on a replacement until the pod it replaces is gone |
| `hetplan.io/resize-pending` | annotation, written by the controller | the kubelet has not actuated the last resize: `Deferred: <its message>` (it retries when room frees) or `Infeasible: ...` (it never will); removed once actuated |

The allocation goes to one container, the *main* one: the container named by the annotation `hetplan.io/container`,
else the first that asks for GPUs, else the first. It gets requests = the allocation minus what the other
containers request, so the pod's requests (summed as Kubernetes sums them) equal the allocation exactly; a memory
limit equal to its memory request and no cpu limit. So the pod is Burstable, and stays so through every resize
(the QoS class may not change in place): a memory shrink can then lower the request alone where the API server
forbids lowering a memory limit in place (1.33, `resize.plan_resize`), and the static CPU manager, which cannot
resize a Guaranteed pod's cpu, leaves it alone.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from hetplan.allocator.k8s.extender import BYTES_PER_MIB, GPU_RESOURCE, MODEL_KEY, parse_quantity

JOB_ID_KEY = "hetplan.io/job-id"
REQUESTED_CPU_KEY = "hetplan.io/requested-cpu"
REQUESTED_MEMORY_KEY = "hetplan.io/requested-memory"
CONTAINER_KEY = "hetplan.io/container"
CHECKPOINT_KEY = "hetplan.io/checkpoint"
CHECKPOINTED_KEY = "hetplan.io/checkpointed"
GRACE_KEY = "hetplan.io/checkpoint-grace-seconds"
MIGRATED_FROM_KEY = "hetplan.io/migrated-from"
MIGRATION_GATE = "hetplan.io/migration"
RESIZE_PENDING_KEY = "hetplan.io/resize-pending"
OPT_IN = MODEL_KEY


@dataclass(frozen=True, slots=True)
class Target:
    """Where and with what a job's pod runs: an allocation as `/v1/allocations` and the action log write it."""

    node: str
    cpu_m: int
    mem_mib: int

    @classmethod
    def of(cls, allocation: Mapping[str, Any]) -> Target:
        return cls(str(allocation["node"]), round(float(allocation["cpus"]) * 1000),
                   round(float(allocation["mem_gb"]) * 1024))


def cpu_text(cpu_m: int) -> str:
    return f"{cpu_m // 1000}" if cpu_m % 1000 == 0 else f"{cpu_m}m"


def mem_text(mem_mib: int) -> str:
    return f"{mem_mib // 1024}Gi" if mem_mib % 1024 == 0 else f"{mem_mib}Mi"


def meta(pod: Mapping[str, Any]) -> dict[str, Any]:
    return pod.get("metadata") or {}


def key(pod: Mapping[str, Any]) -> tuple[str, str]:
    m = meta(pod)
    return str(m.get("namespace") or "default"), str(m.get("name") or "")


def uid(pod: Mapping[str, Any]) -> str:
    """The pod's UID: unlike its name, never reused by a pod created again under the same name."""
    return str(meta(pod).get("uid") or "")


def resize_pending(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of the kubelet's `PodResizePending` condition (reason `Deferred` or `Infeasible`, 1.33),
    or None when no resize is pending."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodResizePending" and str(c.get("status", "True")) == "True":
            return str(c.get("reason") or "Deferred"), str(c.get("message") or "")
    return None


def annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    return meta(pod).get("annotations") or {}


def job_id(pod: Mapping[str, Any]) -> str | None:
    return annotations(pod).get(JOB_ID_KEY)


def model(pod: Mapping[str, Any]) -> str | None:
    value = (meta(pod).get("labels") or {}).get(MODEL_KEY)
    return value.strip() if value and value.strip() else None


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def ended(pod: Mapping[str, Any]) -> bool:
    return phase(pod) in ("Succeeded", "Failed")


def terminating(pod: Mapping[str, Any]) -> bool:
    """Deleted (or evicted) and not yet ended: its containers are being stopped within its grace period."""
    return bool(meta(pod).get("deletionTimestamp")) and not ended(pod)


def disrupted(pod: Mapping[str, Any]) -> bool:
    """The pod ends because something stopped it (condition `DisruptionTarget`: an eviction, a preemption, the
    kubelet), not because its job ended."""
    return any(c.get("type") == "DisruptionTarget" and str(c.get("status", "True")) == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == MIGRATION_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def node_of(pod: Mapping[str, Any]) -> str | None:
    """The node a pod runs on, or the one its required node affinity pins it to (None: neither)."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and len(f.get("values") or []) == 1:
                return str(f["values"][0])
    return None


def amount(container: Mapping[str, Any], resource: str) -> Decimal | None:
    """A container's (or a container status's) request of `resource`, else its limit (the API server defaults a
    request to the limit); None when it sets neither."""
    res = container.get("resources") or {}
    value = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource))
    return None if value is None else parse_quantity(value)


def summed(containers: Iterable[Mapping[str, Any]], resource: str, unit: Decimal = Decimal(1)) -> int:
    """What `containers` ask of `resource` together, in `unit`s, rounded up."""
    return math.ceil(sum((amount(c, resource) or Decimal(0) for c in containers), Decimal(0)) / unit)


MILLI, MIB = Decimal("0.001"), Decimal(BYTES_PER_MIB)


def main_container(pod: Mapping[str, Any]) -> int:
    """The index of the container that gets the allocation (see the module's docstring)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    wanted = annotations(pod).get(CONTAINER_KEY)
    for i, c in enumerate(containers):
        if wanted and c.get("name") == wanted:
            return i
    if wanted:
        raise ValueError(f"annotation {CONTAINER_KEY}={wanted!r} names no container")
    for i, c in enumerate(containers):
        if (amount(c, GPU_RESOURCE) or 0) > 0:
            return i
    return 0


def totals(pod: Mapping[str, Any]) -> tuple[int, int, int]:
    """The pod's GPUs, cpu (millicores) and memory (MiB) requests, each rounded up, summed as Kubernetes sums them
    (the containers; an init container asking for more counts instead)."""
    spec = pod.get("spec") or {}
    containers, inits = spec.get("containers") or [], spec.get("initContainers") or []

    def total(resource: str, unit: Decimal) -> int:
        return max([summed(containers, resource, unit)] + [summed([c], resource, unit) for c in inits])

    return total(GPU_RESOURCE, Decimal(1)), total("cpu", MILLI), total("memory", MIB)


def requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """The pod's cpu (millicores) and memory (MiB) requests (`totals`)."""
    return totals(pod)[1:]


def main_share(pod: Mapping[str, Any], target: Target) -> tuple[int, int, int]:
    """(container index, cpu_m, mem_mib) the main container gets so that the pod's requests equal `target`;
    `ValueError` when the other containers already ask for all of it."""
    index = main_container(pod)
    others = [c for i, c in enumerate((pod.get("spec") or {}).get("containers") or []) if i != index]
    cpu_m = target.cpu_m - sum(math.ceil((amount(c, "cpu") or 0) * 1000) for c in others)
    mem_mib = target.mem_mib - sum(math.ceil((amount(c, "memory") or 0) / BYTES_PER_MIB) for c in others)
    if cpu_m <= 0 or mem_mib <= 0:
        raise ValueError(f"the other containers ask for all of the allocation ({cpu_text(target.cpu_m)} cores, "
                         f"{mem_text(target.mem_mib)})")
    return index, cpu_m, mem_mib


def resources(container: Mapping[str, Any], cpu_m: int, mem_mib: int) -> dict[str, Any]:
    """The main container's resources at admission: cpu and memory requests = the share, a memory limit = the
    share, no cpu limit (Burstable; see the module's docstring); its other resources kept."""
    res = copy.deepcopy(container.get("resources") or {})
    res["requests"] = {**(res.get("requests") or {}), "cpu": cpu_text(cpu_m), "memory": mem_text(mem_mib)}
    limits = {k: v for k, v in (res.get("limits") or {}).items() if k != "cpu"}
    res["limits"] = {**limits, "memory": mem_text(mem_mib)}
    return res


def matches(pod: Mapping[str, Any], target: Target) -> bool:
    """The pod runs (or is pinned to run) where `target` says, with exactly its cores and RAM."""
    try:
        return node_of(pod) == target.node and requests(pod) == (target.cpu_m, target.mem_mib)
    except ValueError:
        return False


def pinned_affinity(spec: Mapping[str, Any], node: str) -> dict[str, Any]:
    """`spec.affinity` with a required node affinity to exactly `node` (by `metadata.name`), the rest kept."""
    affinity = copy.deepcopy(spec.get("affinity") or {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    return affinity


def with_target(pod: Mapping[str, Any], target: Target) -> dict[str, Any]:
    """A copy of a pod (spec) pinned to `target.node` with `target`'s cores and RAM; resize policy: no restart."""
    out = copy.deepcopy(dict(pod))
    spec = out["spec"]
    index, cpu_m, mem_mib = main_share(out, target)
    container = spec["containers"][index]
    container["resources"] = resources(container, cpu_m, mem_mib)
    container.setdefault("resizePolicy", [{"resourceName": "cpu", "restartPolicy": "NotRequired"},
                                          {"resourceName": "memory", "restartPolicy": "NotRequired"}])
    spec["affinity"] = pinned_affinity(spec, target.node)
    return out


def replacement(pod: Mapping[str, Any], target: Target, seq: int) -> dict[str, Any]:
    """The pod that replaces `pod` on `target.node` (migrate): same labels, annotations (job id, own request),
    spec, with the target's resources, pinned, gated by `hetplan.io/migration` until the old pod is gone."""
    old = meta(pod)
    base = str(old.get("name"))
    if "-m" in base and base.rsplit("-m", 1)[1].isdigit():
        base = base.rsplit("-m", 1)[0]
    name = f"{base[:240]}-m{seq}"
    notes = {k: v for k, v in (old.get("annotations") or {}).items() if k not in (CHECKPOINT_KEY, CHECKPOINTED_KEY)}
    notes[MIGRATED_FROM_KEY] = str(old.get("name"))
    spec = copy.deepcopy(pod.get("spec") or {})
    for field in ("nodeName", "schedulingGates"):
        spec.pop(field, None)
    spec["schedulingGates"] = [{"name": MIGRATION_GATE}]
    new = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": old.get("namespace"), "labels": dict(old.get("labels") or {}),
                        "annotations": notes,
                        **({"ownerReferences": old["ownerReferences"]} if old.get("ownerReferences") else {})},
           "spec": spec}
    return with_target(new, target)
