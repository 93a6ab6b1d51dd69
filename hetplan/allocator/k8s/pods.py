"""Opted-in pods: how a pod carries its job, and the changes that give it an allocation.

Opt-in: the pod label `hetplan.io/model` (the model, as for the extender). What hetplan writes on such a pod:

| key | kind | meaning |
|---|---|---|
| `hetplan.io/job-id` | annotation, written by the webhook | the allocator's job id (`owner_job`: the pod's owner, never what a user writes here); a replacement keeps it |
| `hetplan.io/job` | label, optional, set by the user | names the job explicitly: job id `<namespace>/label/<value>` (pods of one job re-created under other names keep it) |
| `hetplan.io/queued` | scheduling gate, written by the webhook | the job waits in the allocator's queue; removed by the controller once the allocator admits it (`start`) |
| `hetplan.io/queue-position`, `hetplan.io/queue-why` | annotations, written by the webhook | the job's place in the queue when the pod was created, and why it waits (`no-room`, `lower-priority`, `gang-waiting`) |
| `hetplan.io/preempted` | annotation, written by the controller | on a preempted pod: the `stop` action's number (a checkpoint is asked first, as for a move) |
| `hetplan.io/requested-cpu`, `hetplan.io/requested-memory` | annotations | the pod's own request as written (millicores, MiB): the floor, asked again for a replacement |
| `hetplan.io/checkpoint` | annotation, written by the controller | "checkpoint now": the action's number; the pod answers `hetplan.io/checkpointed` with the same number (or exits) before its grace period ends |
| `hetplan.io/checkpoint-grace-seconds` | annotation, optional, set by the user | how long to wait for that answer (default: the controller's `--checkpoint-grace`) |
| `hetplan.io/migrated-from` | annotation | on a replacement: the pod it replaces |
| `hetplan.io/migration` | scheduling gate | on a replacement until the pod it replaces is gone |
| `hetplan.io/gang-size` | annotation, set by the user on the pod template | the job is a gang of that many pods (2 or more: an Indexed Job's `parallelism` = `completions`, a JobSet's or PyTorchJob's pods in all), admitted together or not at all (`gang`) |
| `hetplan.io/elastic-gpus`, `hetplan.io/restart-seconds` | annotations, optional, set by the user on a gang's pod template | `MIN-MAX`: the gang is elastic, from MIN to MAX GPUs (all its parts; whole parts), and a change of count costs it that many seconds (default: its model's, `contracts.trace.restart_cost`; 30 for a model hetplan does not know): with `hetplan serve --scaling-models` the service's rounds choose its count (`elastic_bounds`; a PyTorchJob's within its `elasticPolicy`, a JobSet's never: `owners`) |
| `hetplan.io/gang-part` | annotation, written by the webhook | a gang pod's part (its index: `_part`); the pods of a gang share the gang's job id |
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
QUEUE_GATE = "hetplan.io/queued"
QUEUE_POSITION_KEY = "hetplan.io/queue-position"
QUEUE_WHY_KEY = "hetplan.io/queue-why"
PREEMPTED_KEY = "hetplan.io/preempted"
JOB_LABEL = "hetplan.io/job"
KUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GATE = "kueue.x-k8s.io/admission"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_INDEX = "jobset.sigs.k8s.io/job-index"
KUBEFLOW_LABEL = "training.kubeflow.org/job-name"
KUBEFLOW_ROLE = "training.kubeflow.org/replica-type"
KUBEFLOW_INDEX = "training.kubeflow.org/replica-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
OWNER_KINDS = frozenset({"Job", "PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "TrainJob"})
"""Owners whose pods are one job: a pod re-created by them (after a preemption, a failure) is the same job. Other
owners (ReplicaSet, StatefulSet, ...) run interchangeable or stably named pods: each pod is its own job."""
GANG_SIZE_KEY = "hetplan.io/gang-size"
ELASTIC_KEY = "hetplan.io/elastic-gpus"
RESTART_KEY = "hetplan.io/restart-seconds"
GANG_PART_KEY = "hetplan.io/gang-part"
MAX_GANG = 1024
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


def _part(labels: Mapping[str, str], notes: Mapping[str, str]) -> str:
    """The pod's part of a multi-pod job (`/<part>`, '' for none): a JobSet's child job index, a Kubeflow replica
    type and index, an Indexed Job's completion index."""
    bits = []
    if labels.get(JOBSET_INDEX):
        bits.append(labels[JOBSET_INDEX])
    if labels.get(KUBEFLOW_ROLE):
        bits.append(f"{labels[KUBEFLOW_ROLE].lower()}-{labels.get(KUBEFLOW_INDEX, '0')}")
    index = notes.get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX)
    if index:
        bits.append(index)
    return "/" + "-".join(bits) if bits else ""


def own_request(notes: Mapping[str, str], cpu_m: int | None, mem_mib: int | None) -> tuple[str, str, dict[str, float]]:
    """The pod's own cpu/memory request: millicores and MiB as text ("" where it asks none), from the annotations
    the webhook wrote (a replacement or a re-created pod carries them), else `cpu_m`/`mem_mib` (its requests as
    written); and the allocator body's `cpus`/`mem_gb` from them. `ValueError` naming the annotation when one is no
    whole number in range. "" is kept as written: a pod created again after a preemption carries its last
    allocation as its requests, and must not be taken to ask for that."""
    own_cpu = notes.get(REQUESTED_CPU_KEY, "" if cpu_m is None else str(cpu_m))
    own_mem = notes.get(REQUESTED_MEMORY_KEY, "" if mem_mib is None else str(mem_mib))
    body: dict[str, float] = {}
    for key, text, field_, unit in ((REQUESTED_CPU_KEY, own_cpu, "cpus", 1000), (REQUESTED_MEMORY_KEY, own_mem,
                                                                                 "mem_gb", 1024)):
        if text == "":
            continue
        if not (text.isascii() and text.isdigit()):  # int() would take "-1", " 1", "1_0"
            raise ValueError(f"annotation {key}={text[:40]!r} is no whole number")
        try:
            body[field_] = int(text) / unit
        except (ValueError, OverflowError):  # more digits than int() reads or a float holds
            raise ValueError(f"annotation {key} ({len(text)} digits) is out of range") from None
    return own_cpu, own_mem, body


def owner_job(pod: Mapping[str, Any], namespace: str | None = None, with_part: bool = True) -> str:
    """The allocator's job id of `pod`, from what owns it, never from an annotation a user could write:

    - the label `hetplan.io/job`: `<namespace>/label/<value>`;
    - a JobSet's pod (label `jobset.sigs.k8s.io/jobset-name`; its owner is a child Job): `<namespace>/JobSet/<name>`;
    - a pod whose controlling owner is a Job or a Kubeflow training job (`OWNER_KINDS`): `<namespace>/<kind>/<uid>`
      (a job created again under the same name is another job);
    - else (a bare pod, or another owner's): `<namespace>/<name>`;

    an owned pod's part (`_part`) is appended (unless `with_part` is False: a gang's id), so that the pods of a
    multi-pod job are distinct and a pod created again for the same part has the same id. A pod name has no `/`, so
    a bare pod never shares an owned pod's id."""
    m = meta(pod)
    ns = namespace or str(m.get("namespace") or "default")
    labels, notes = m.get("labels") or {}, m.get("annotations") or {}
    part = _part(labels, notes) if with_part else ""
    if (labels.get(JOB_LABEL) or "").strip():
        return f"{ns}/label/{labels[JOB_LABEL].strip()}"
    if labels.get(JOBSET_LABEL):
        return f"{ns}/JobSet/{labels[JOBSET_LABEL]}{part}"
    owner = next((o for o in m.get("ownerReferences") or [] if o.get("controller")), None)
    if owner is not None and owner.get("kind") in OWNER_KINDS and owner.get("uid"):
        return f"{ns}/{owner['kind']}/{owner['uid']}{part}"
    return f"{ns}/{m.get('name') or ''}"


def move_base(name: str) -> str:
    """A pod's name without one move's suffix (`-m<seq>`, `replacement`), cut to 240 characters: what a bare
    pod's replacements are named after."""
    if "-m" in name and name.rsplit("-m", 1)[1].isdigit():
        name = name.rsplit("-m", 1)[0]
    return name[:240]


def adoptable_job(pod: Mapping[str, Any]) -> str:
    """The job id the controller acts on for `pod`, by the webhook's rule: its owner's (`owner_job`), never an
    annotation a user could write (the webhook down, or a patch since). The annotation `hetplan.io/job-id` counts
    only where hetplan writes one that differs: a gang's pod (the gang's id), a bare pod's move replacement (`<name>-m<seq>`) carries its
    original's `<namespace>/<name>` (within one namespace such a name can still be chosen by a user)."""
    owner, claimed = owner_job(pod), job_id(pod)
    if claimed is None or claimed == owner:
        return owner
    try:
        if claimed == getattr(gang(pod), "job", None):
            return claimed  # a gang's pod: the gang's id, its owner's without the part (`gang`)
    except ValueError:
        pass
    ns, name = key(pod)
    moved = "-m" in name and name.rsplit("-m", 1)[1].isdigit()  # named as a move's replacement
    if owner == f"{ns}/{name}" and moved and claimed.startswith(f"{ns}/") \
            and move_base(claimed[len(ns) + 1:]) == move_base(name):
        return claimed
    return owner


def has_gate(pod: Mapping[str, Any], name: str) -> bool:
    """The pod is held by the scheduling gate `name`: `QUEUE_GATE` (it waits in the allocator's queue),
    `MIGRATION_GATE` (a move's replacement, until the pod it replaces is gone)."""
    return any(g.get("name") == name for g in (pod.get("spec") or {}).get("schedulingGates") or [])


@dataclass(frozen=True, slots=True)
class Gang:
    """A pod's place in a gang (`gang`): the gang's job id, the pod's part, how many parts the gang has."""

    job: str
    part: str
    size: int


def gang(pod: Mapping[str, Any], namespace: str | None = None) -> Gang | None:
    """The gang a pod belongs to: it declares one (annotation `hetplan.io/gang-size`, 2 or more) and is a part of a
    multi-pod job (an Indexed Job's completion index, a JobSet's or a Kubeflow job's replica index: `_part`). Its
    job id is its owner's without the part (`owner_job`): every pod of the gang has it. None for a pod declaring
    none; `ValueError` naming the annotation for a declaration hetplan cannot serve."""
    m = meta(pod)
    notes, labels = m.get("annotations") or {}, m.get("labels") or {}
    declared = notes.get(GANG_SIZE_KEY)
    if declared is None:
        return None
    if not (declared.isascii() and declared.isdigit() and 2 <= int(declared) <= MAX_GANG):
        raise ValueError(f"annotation {GANG_SIZE_KEY} must be a whole number from 2 to {MAX_GANG}, got {declared!r}")
    part = _part(labels, notes)
    job = owner_job(pod, namespace, with_part=False)
    if not part or (labels.get(JOB_LABEL) or "").strip() or job.count("/") < 2:  # < 2: a bare pod's `<ns>/<name>`
        raise ValueError(f"annotation {GANG_SIZE_KEY}: the pod is no indexed part of a Job, JobSet or Kubeflow job "
                         f"(no {COMPLETION_INDEX}, {JOBSET_INDEX} or {KUBEFLOW_INDEX}, or a {JOB_LABEL} label)")
    return Gang(job, part[1:], int(declared))


def elastic_bounds(pod: Mapping[str, Any]) -> dict[str, int | float]:
    """An elastic gang's bounds as `POST /v1/allocate` takes them (`min_gpus`, `max_gpus`, `restart_s`) from its
    pod's annotations (`ELASTIC_KEY`: `MIN-MAX`; `RESTART_KEY`); nothing for a pod that declares none. `ValueError`
    naming the annotation for one hetplan cannot read; the service checks the bounds against the gang."""
    notes = annotations(pod)
    declared = notes.get(ELASTIC_KEY)
    if declared is None:
        return {}
    low, dash, high = declared.partition("-")
    if not (dash and low.isascii() and low.isdigit() and high.isascii() and high.isdigit()):
        raise ValueError(f"annotation {ELASTIC_KEY} must be MIN-MAX in GPUs (the gang's parts together), got "
                         f"{declared!r}")
    out: dict[str, int | float] = {"min_gpus": int(low), "max_gpus": int(high)}
    restart = notes.get(RESTART_KEY)
    if restart is not None:
        try:
            seconds = float(restart)
        except ValueError:
            seconds = math.nan
        if not (restart.isascii() and math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"annotation {RESTART_KEY} must be a number of seconds, got {restart!r}")
        out["restart_s"] = seconds
    return out


def part_order(parts: Iterable[str]) -> list[str]:
    """Parts in the order the gang's allocation numbers them (`<job>#0`, `#1`, ...): by their numbers, so that
    part `10` comes after part `2` (`worker-0` after `master-0`: by name where names differ)."""
    def key(part: str) -> list[tuple[int, int | str]]:
        return [(0, int(x)) if x.isdigit() else (1, x) for x in part.replace("/", "-").split("-")]

    return sorted(parts, key=key)



def dropped_parts(parts: Iterable[str], count: int) -> set[str]:
    """Of the `parts` present, those a gang shrunk to `count` parts dropped, whichever kept part's pod is missing at
    the moment: an Indexed Job's indexes from `count` on; a Kubeflow job's workers (`worker-<i>`) from `count` less
    its master on (`master-0` is never dropped); other names by their place in `part_order`."""
    parts = list(parts)
    if all(p.isascii() and p.isdigit() for p in parts):
        return {p for p in parts if int(p) >= count}
    split = [p.rpartition("-") for p in parts]
    if all(role in ("master", "worker") and i.isascii() and i.isdigit() for role, _, i in split):
        first = count - any(role == "master" for role, _, _ in split)
        return {p for p, (role, _, i) in zip(parts, split) if role == "worker" and int(i) >= first}
    return set(part_order(parts)[count:])


def kueue(pod: Mapping[str, Any]) -> bool:
    """Kueue admits this pod (label `kueue.x-k8s.io/queue-name`): hetplan sizes and places it, never queues it."""
    return bool((meta(pod).get("labels") or {}).get(KUEUE_LABEL))


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


def narrowed_affinity(spec: Mapping[str, Any], node: str) -> dict[str, Any]:
    """`spec.affinity` narrowed to `node`, as the API server lets a gated pod's affinity change (KEP-3838): each
    required term of the pod's own gets the requirement `metadata.name In [node]` added (terms are ORed: none may be
    added or removed); with no required terms, one term that names `node`. The rest kept."""
    affinity = copy.deepcopy(spec.get("affinity") or {})
    required = (affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return pinned_affinity(spec, node)
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), pin]
    return affinity


def sized(pod: Mapping[str, Any], target: Target) -> dict[str, Any]:
    """A copy of a pod (spec) with `target`'s cores and RAM (`resources`); resize policy: no restart."""
    out = copy.deepcopy(dict(pod))
    index, cpu_m, mem_mib = main_share(out, target)
    container = out["spec"]["containers"][index]
    container["resources"] = resources(container, cpu_m, mem_mib)
    container.setdefault("resizePolicy", [{"resourceName": "cpu", "restartPolicy": "NotRequired"},
                                          {"resourceName": "memory", "restartPolicy": "NotRequired"}])
    return out


def with_target(pod: Mapping[str, Any], target: Target) -> dict[str, Any]:
    """A copy of a pod (spec) pinned to `target.node` with `target`'s cores and RAM; resize policy: no restart."""
    out = sized(pod, target)
    out["spec"]["affinity"] = pinned_affinity(out["spec"], target.node)
    return out


def without_gate(pod: Mapping[str, Any], gate: str) -> list[dict[str, Any]]:
    """The JSONPatch ops that remove the scheduling gate `gate` (and only it) from `pod`."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    rest = [g for g in gates if g.get("name") != gate]
    if not rest:
        return [{"op": "remove", "path": "/spec/schedulingGates"}]
    return [{"op": "replace", "path": "/spec/schedulingGates", "value": rest}]


def recreated(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A preempted bare pod as it is created again, under its name, to wait in the queue: its labels, spec and
    annotations (its job id and own request; what hetplan wrote for its run removed), no node, no gates of a move
    (the webhook gives it the queue's gate, or its allocation if room exists by then)."""
    old = meta(pod)
    drop = {CHECKPOINT_KEY, CHECKPOINTED_KEY, MIGRATED_FROM_KEY, PREEMPTED_KEY, RESIZE_PENDING_KEY,
            QUEUE_POSITION_KEY, QUEUE_WHY_KEY}
    spec = copy.deepcopy(pod.get("spec") or {})
    spec.pop("nodeName", None)
    gates = [g for g in spec.pop("schedulingGates", None) or [] if g.get("name") not in (MIGRATION_GATE, QUEUE_GATE)]
    if gates:
        spec["schedulingGates"] = gates
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    if node_of({"spec": {"affinity": spec.get("affinity")}}) is not None:  # hetplan's pin to the node it ran on
        node_affinity.pop("requiredDuringSchedulingIgnoredDuringExecution", None)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": old.get("name"), "namespace": old.get("namespace"),
                         "labels": dict(old.get("labels") or {}),
                         "annotations": {k: v for k, v in (old.get("annotations") or {}).items() if k not in drop}},
            "spec": spec}


def replacement(pod: Mapping[str, Any], target: Target, seq: int) -> dict[str, Any]:
    """The pod that replaces `pod` on `target.node` (migrate): same labels, annotations (job id, own request),
    spec, with the target's resources, pinned, gated by `hetplan.io/migration` until the old pod is gone."""
    old = meta(pod)
    name = f"{move_base(str(old.get('name')))}-m{seq}"
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
