"""Kubernetes scheduler extender: `filter` and `prioritize` from the hint table.

Wire format (kube-scheduler `k8s.io/kube-scheduler/extender/v1`): the scheduler POSTs `ExtenderArgs`
(`{"Pod": v1.Pod, "Nodes": v1.NodeList}`, or `{"Pod": ..., "NodeNames": [...]}` when the extender is
`nodeCacheCapable`); filter answers `ExtenderFilterResult` (`Nodes` or `NodeNames`, `FailedNodes`,
`FailedAndUnresolvableNodes`, `Error`), prioritize a `HostPriorityList` (`[{"Host": ..., "Score": 0..10}]`).
The top-level keys are the Go field names (no JSON tags upstream); the Pod and Node objects inside use the
ordinary Kubernetes JSON.

Conventions (see docs/kubernetes.md):
- job class = (model, GPUs). The model comes from the pod label `hetplan.io/model`, else the pod annotation
  `hetplan.io/model`; GPUs from the containers' `nvidia.com/gpu` requests (limits when no request), summed
  over containers, the larger of that and any single init container.
- GPU type of a node: label `nvidia.com/gpu.product` (set by NVIDIA GPU feature discovery), mapped to
  hetplan's canonical names by `canonical_gpu`, with `nvidia.com/gpu.memory` (MiB) telling the 40/80 GB
  A100 and the 16/32 GB V100 apart; a product hetplan does not know is an opaque GPU type (no hints name it:
  such nodes pass and score 0). GPUs, cores and RAM from the node's `status.allocatable`.
- Neutral where hetplan cannot judge: pods without a model or without hints, nodes of GPU types no hint names,
  nodes with GPUs but no product label all pass the filter and score 0 (the scheduler's own scores decide).
- Quantities are bounded before conversion (length, exponent, magnitude; `parse_quantity`): a pod whose
  request is no bounded quantity is refused (HTTP 400); a node whose allocatable is none is unresolvable.
- With `Nodes` the extender knows capacities only (the scheduler's own fit plugins check what is in use);
  with `NodeNames` it answers from the allocator's node state (`/v1/nodes`, allocations made through
  `/v1/allocate`), so it also checks free GPUs and the free cores/RAM for the class's minimum share.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

from pydantic import (
    AliasChoices, BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError, model_validator,
)

from hetplan.allocator.cluster import Free, floor_need, hinted_need
from hetplan.allocator.policies import want_need
from hetplan.allocator.spec import Job, Shape, mib_to_gib
from hetplan.gpus import UnknownGpuError, canonical_gpu
from hetplan.hints.index import HintEntry, HintSet

GPU_RESOURCE = "nvidia.com/gpu"
BYTES_PER_MIB = 2**20
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
MODEL_KEY = "hetplan.io/model"
MAX_SCORE = 10  # extenderv1.MaxExtenderPriority

# ------------------------------------------------------------------ quantities

# Kubernetes' quantity grammar (resource.Quantity; the pattern Kubernetes' own CRD schemas use, with a whole
# exponent as its parser requires). Checked, with the length and exponent bounds, before any conversion, so that
# "1e200000" costs a regex match, not a 200,000-digit number. ASCII digits only (`[0-9]`, not `\d`, which would
# take "٤" or "４" as Python's int() and Decimal do), no spaces, no underscores.
_QUANTITY = re.compile(r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)"
                       r"(?:(?:[eE]([+-]?[0-9]+))|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?\Z")
MAX_QUANTITY_CHARS = 64
MAX_EXPONENT = 24  # |e| in "1e24"; the largest suffix, E, is 1e18
MAX_QUANTITY = Decimal(2) ** 63  # Kubernetes keeps quantities in int64 (scaled); anything larger is no real node


def parse_quantity(value: str | int | float) -> Decimal:
    """A Kubernetes `resource.Quantity` ("500m", "64", "263843236Ki", "1.5Gi", "1e3") as a Decimal.

    Bounded before conversion: at most 64 characters, a decimal exponent within +-24, a magnitude below 2^63;
    then converted by `kubernetes.utils.parse_quantity`. Raises `ValueError` ("not a quantity" / "out of range").
    """
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"not a quantity: {value!r}")
        if abs(value) >= MAX_QUANTITY:
            raise ValueError(f"quantity out of range (|q| < 2^63): {_short(value)}")
        return Decimal(str(value))
    text = str(value)
    if len(text) > MAX_QUANTITY_CHARS:
        raise ValueError(f"not a quantity: {_short(text)} (longer than {MAX_QUANTITY_CHARS} characters)")
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"not a quantity: {text!r} (Kubernetes' grammar: ASCII digits, an optional point, then "
                         "an exponent or a suffix such as m, k, Ki, Gi)")
    if match.group(1) is not None and abs(int(match.group(1))) > MAX_EXPONENT:
        raise ValueError(f"quantity out of range (exponent beyond +-{MAX_EXPONENT}): {text!r}")
    try:
        amount = _kubernetes_parse_quantity()(text)
    except (ValueError, ArithmeticError) as exc:
        raise ValueError(f"not a quantity: {text!r}") from exc
    if not amount.is_finite() or abs(amount) >= MAX_QUANTITY:
        raise ValueError(f"quantity out of range (|q| < 2^63): {text!r}")
    return amount


@lru_cache(maxsize=1)
def _kubernetes_parse_quantity() -> Callable[[str], Decimal]:
    """`kubernetes.utils.parse_quantity`, imported on first use: importing it loads the whole kubernetes client
    (about 0.3 s), which `hetplan serve` should not pay before it is ready."""
    from kubernetes.utils.quantity import parse_quantity as k8s_parse_quantity

    return k8s_parse_quantity


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _whole(value: str | int | float, what: str) -> int:
    try:
        amount = parse_quantity(value)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    if amount < 0 or amount != amount.to_integral_value():
        raise ValueError(f"{what} must be a whole number >= 0, got {value!r}")
    return int(amount)


# ------------------------------------------------------------------ the Kubernetes objects we read

Quantity = StrictStr | StrictInt | StrictFloat
"""A quantity as received: a string (`parse_quantity` reads it where it is used) or a JSON number; never a bool."""


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = ""
    namespace: str = "default"
    uid: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class ResourceRequirements(BaseModel):
    model_config = ConfigDict(extra="allow")
    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)


class Container(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = ""
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)


class PodSpec(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    containers: list[Container] = Field(min_length=1)
    init_containers: list[Container] = Field(default_factory=list, alias="initContainers")


class Pod(BaseModel):
    model_config = ConfigDict(extra="allow")
    metadata: ObjectMeta
    spec: PodSpec


class NodeStatus(BaseModel):
    model_config = ConfigDict(extra="allow")
    capacity: dict[str, Quantity] = Field(default_factory=dict)
    allocatable: dict[str, Quantity] = Field(default_factory=dict)


class K8sNode(BaseModel):
    model_config = ConfigDict(extra="allow")
    metadata: ObjectMeta
    status: NodeStatus = Field(default_factory=NodeStatus)


class NodeList(BaseModel):
    """A v1.NodeList; items are kept as received so that filter can hand them back unchanged."""

    model_config = ConfigDict(extra="allow")
    items: list[dict[str, Any]] = Field(default_factory=list)


class ExtenderArgs(BaseModel):
    """extenderv1.ExtenderArgs. Go decodes field names case-insensitively; so do we for the usual spellings."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, json_schema_extra={"anyOf": [
        {"properties": {"Nodes": {"type": "object"}}, "required": ["Nodes"]},
        {"properties": {"NodeNames": {"type": "array"}}, "required": ["NodeNames"]}]})
    pod: Pod = Field(validation_alias=AliasChoices("Pod", "pod"))
    nodes: NodeList | None = Field(None, validation_alias=AliasChoices("Nodes", "nodes"))
    node_names: list[str] | None = Field(None, validation_alias=AliasChoices("NodeNames", "nodeNames", "nodenames"))

    @model_validator(mode="after")
    def _has_candidates(self) -> ExtenderArgs:
        if self.nodes is None and self.node_names is None:
            raise ValueError("ExtenderArgs needs Nodes (a v1.NodeList) or NodeNames (nodeCacheCapable)")
        return self


class ExtenderFilterResult(BaseModel):
    """extenderv1.ExtenderFilterResult."""

    model_config = ConfigDict(populate_by_name=True)
    nodes: dict[str, Any] | None = Field(None, alias="Nodes")
    node_names: list[str] | None = Field(None, alias="NodeNames")
    failed_nodes: dict[str, str] = Field(default_factory=dict, alias="FailedNodes")
    failed_and_unresolvable: dict[str, str] = Field(default_factory=dict, alias="FailedAndUnresolvableNodes")
    error: str = Field("", alias="Error")


class HostPriority(BaseModel):
    """extenderv1.HostPriority; a prioritize answer is a list of them (HostPriorityList)."""

    model_config = ConfigDict(populate_by_name=True)
    host: str = Field(alias="Host")
    score: int = Field(ge=0, le=MAX_SCORE, alias="Score")


# ------------------------------------------------------------------ what the decisions need


@dataclass(frozen=True)
class PodClass:
    """The job class of a pod: model (None when the pod names none) and GPUs, and the pod's own request of cores
    (`cpu_m`, millicores) and RAM (`mem_mib`), None where no container states one."""

    name: str
    namespace: str
    model: str | None
    gpus: int
    cpu_m: int | None = None
    mem_mib: int | None = None

    def job(self) -> Job:
        """The pod as the allocator's policies see a request (`Job`): its GPUs and its own request, the floor
        (`cluster.floor_need`). The id and model are placeholders: no floor depends on them."""
        return Job("pod", "pod", self.gpus, 0, self.cpu_m, self.mem_mib)


def pod_class(pod: Pod) -> PodClass:
    """Read a pod's job class and own request; `ValueError` when a GPU quantity is not a whole number or a cpu or
    memory quantity is none (or negative).

    As Kubernetes sums a pod's requests: over its containers, the larger of that and any single init container;
    a container's request, else its limit (the API server defaults a request to the limit)."""
    meta = pod.metadata
    model = meta.labels.get(MODEL_KEY) or meta.annotations.get(MODEL_KEY)
    model = model.strip() if model and model.strip() else None

    def requested(container: Container, key: str) -> Quantity | None:
        res = container.resources
        return res.requests.get(key, res.limits.get(key))

    def gpus(container: Container) -> int:
        value = requested(container, GPU_RESOURCE)
        return 0 if value is None else _whole(value, f"container {container.name!r} {GPU_RESOURCE}")

    def own(key: str, unit: Decimal) -> int | None:
        def amount(container: Container) -> int | None:
            value = requested(container, key)
            if value is None:
                return None
            try:
                q = parse_quantity(value)
            except ValueError as exc:
                raise ValueError(f"container {container.name!r} {key}: {exc}") from None
            if q < 0:
                raise ValueError(f"container {container.name!r} {key} must be >= 0, got {value!r}")
            return math.ceil(q / unit)  # a request rounds up: a job never gets less than it asked for

        main = [x for x in map(amount, pod.spec.containers) if x is not None]
        init = [x for x in map(amount, pod.spec.init_containers) if x is not None]
        return max(sum(main), max(init, default=0)) if main or init else None

    total = sum(gpus(c) for c in pod.spec.containers)
    init = max((gpus(c) for c in pod.spec.init_containers), default=0)
    return PodClass(meta.name, meta.namespace, model, max(total, init), own("cpu", Decimal("0.001")),
                    own("memory", Decimal(BYTES_PER_MIB)))


@dataclass(frozen=True)
class Candidate:
    """A node the scheduler asks about: its shape and, when known, what is free. Without a shape the node is
    either `neutral` (hetplan cannot judge it: it passes and scores 0) or unusable (`problem` says why)."""

    name: str
    shape: Shape | None
    free: Free | None = None
    problem: str | None = None
    neutral: bool = False


def item_name(raw: object) -> str:
    """The `metadata.name` of a NodeList item as received ("" where the item or its metadata is no object)."""
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    return str(meta.get("name", "")) if isinstance(meta, dict) else ""


def node_candidate(raw: dict[str, Any]) -> Candidate:
    """A Candidate from a v1.Node object (capacity only; usage unknown).

    A GPU product hetplan does not know is kept as an opaque GPU type (`canonical_gpu`): the node is judged like
    any node of a type the class has no hint for (passes, scores 0). A node with allocatable GPUs but no product
    label (or one that is no GPU name at all) cannot be judged: it is `neutral`. Memory is converted to the
    allocator's unit (`hetplan.allocator.spec`: whole MiB, 2^20 bytes, rounded down: a node never
    offers more than it has).
    """
    name = item_name(raw)
    try:
        node = K8sNode.model_validate(raw)
    except ValidationError as exc:
        return Candidate(name or "<unnamed>", None, None, f"not a v1.Node: {exc.errors()[0]['msg']}")
    name = node.metadata.name
    labels = node.metadata.labels
    try:
        gpus, cpu_m, mem_mib = node_resources(node)
    except ValueError as exc:
        return Candidate(name, None, None, f"bad allocatable: {exc}")
    product = labels.get(GPU_PRODUCT_LABEL)
    if gpus < 1:
        why = f"no allocatable {GPU_RESOURCE}" if product else f"no {GPU_PRODUCT_LABEL} label (not a GPU node)"
        return Candidate(name, None, None, why)
    try:
        gpu_type = node_gpu_type(labels)
    except UnknownGpuError:
        return Candidate(name, None, None, f"{GPU_PRODUCT_LABEL}={product[:100]!r} is no GPU type name, not judged",
                         neutral=True)
    if gpu_type is None:
        return Candidate(name, None, None, f"no {GPU_PRODUCT_LABEL} label: GPU type unknown, not judged",
                         neutral=True)
    if cpu_m < 1 or mem_mib < 1:
        return Candidate(name, None, None, "no allocatable cpu or memory")
    return Candidate(name, Shape(gpu_type, gpus, cpu_m, mem_mib))


def node_resources(node: K8sNode) -> tuple[int, int, int]:
    """GPUs, millicores and MiB of a node's `status.allocatable` (else `status.capacity`), rounded down (a node
    never offers more than it has); `ValueError` naming the quantity that is no bounded quantity."""
    resources = node.status.allocatable or node.status.capacity
    gpus = _whole(resources.get(GPU_RESOURCE, 0), GPU_RESOURCE)
    amounts = []
    for key in ("cpu", "memory"):
        try:
            amounts.append(parse_quantity(resources.get(key, 0)))
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
    return gpus, int(amounts[0] * 1000), int(amounts[1] / BYTES_PER_MIB)


def node_gpu_type(labels: Mapping[str, str]) -> str | None:
    """The canonical GPU type a node's `nvidia.com/gpu.product` label names (`nvidia.com/gpu.memory`, MiB, tells
    the 40/80 GB A100 and the 16/32 GB V100 apart); a product hetplan does not know is an opaque type. None
    without the label; `UnknownGpuError` for a label that is no GPU type name at all."""
    product = labels.get(GPU_PRODUCT_LABEL)
    if not product:
        return None
    memory = labels.get(GPU_MEMORY_LABEL)
    memory_gb = float(memory) / 1024 if memory and memory.isascii() and memory.isdigit() and len(memory) < 10 \
        else None
    return canonical_gpu(product, memory_gb)


def _entry(entries: Sequence[HintEntry], gpu_type: str) -> HintEntry | None:
    for entry in entries:
        if entry.gpu_type == gpu_type:
            return entry
    return None


@dataclass(frozen=True)
class FilterOutcome:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


def filter_nodes(pod: PodClass, candidates: Iterable[Candidate], hints: HintSet, strict: bool = False) -> FilterOutcome:
    """Keep the nodes that can run the pod: GPU type known (and hinted, when `strict`), enough GPUs and at least the
    pod's own request of cores and RAM, and, when usage is known, the GPUs and the pod's floor free: the policies'
    (`cluster.floor_need`: its own request, else the GPU-proportional share; on a hinted type, as `HintPolicy`
    degrades, the smaller of that and the hinted share raised to the own request).

    Failures that preemption cannot fix (wrong node, too small) go to `unresolvable`; the others to `failed`.
    """
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    entries = hints.lookup(pod.model, pod.gpus) if pod.model and pod.gpus else ()
    g = pod.gpus
    job = pod.job()
    for c in candidates:
        if g == 0:
            passed.append(c.name)  # not a GPU pod: not ours to judge
            continue
        shape = c.shape
        if shape is None:
            if c.neutral:
                passed.append(c.name)  # hetplan cannot judge it: the scheduler's own plugins decide
            else:
                unresolvable[c.name] = c.problem or "not usable"
            continue
        if shape.gpus < g:
            unresolvable[c.name] = f"has {shape.gpus} {shape.gpu_type} GPUs; the pod needs {g} on one node"
            continue
        if (job.cpu_m or 0) > shape.cpu_m or (job.mem_mib or 0) > shape.mem_mib:
            unresolvable[c.name] = (f"has {shape.cpu_m / 1000:g} cores and {mib_to_gib(shape.mem_mib):g} GiB; the pod "
                                    f"asks {(job.cpu_m or 0) / 1000:g} cores and {mib_to_gib(job.mem_mib or 0):g} GiB")
            continue
        entry = _entry(entries, shape.gpu_type)
        if strict and entries and entry is None:
            unresolvable[c.name] = (f"class ({pod.model}, {g}) has no hint for {shape.gpu_type} "
                                    f"(hinted: {', '.join(e.gpu_type for e in entries)})")
            continue
        if c.free is not None:
            free = c.free
            if free.gpus < g:
                failed[c.name] = f"{free.gpus} of {shape.gpus} GPUs free; the pod needs {g}"
                continue
            # the one floor rule: the own request, else min(hinted share on this type, proportional share)
            hinted = hinted_need(entry, job.num_gpus) if entry is not None else None
            floor_cpu, floor_mem = floor_need(job, hinted)(shape)
            if free.cpu_m < floor_cpu or free.mem_mib < floor_mem:
                failed[c.name] = (f"{free.cpu_m / 1000:g} cores and {mib_to_gib(free.mem_mib):g} GiB free; the class "
                                  f"needs at least {floor_cpu / 1000:g} cores and {mib_to_gib(floor_mem):g} GiB")
                continue
        passed.append(c.name)
    return FilterOutcome(passed, failed, unresolvable)


def score_nodes(pod: PodClass, candidates: Iterable[Candidate], hints: HintSet) -> list[tuple[str, int]]:
    """Score 0..10 per node: the class's rank-1 GPU type scores 10, the last hinted type 10/R (R types ranked);
    halved when usage is known and the hinted share (raised to the pod's own request) is not free; 0 for unhinted
    types, unusable nodes, or a class with no hints (then every node is equal to the extender and the scheduler's
    own scores decide)."""
    entries = hints.lookup(pod.model, pod.gpus) if pod.model and pod.gpus else ()
    ranks = sorted({e.rank for e in entries})
    job = pod.job()
    out: list[tuple[str, int]] = []
    for c in candidates:
        score = 0
        entry = _entry(entries, c.shape.gpu_type) if c.shape is not None and entries else None
        if entry is not None and c.shape is not None and c.shape.gpus >= pod.gpus:
            position = ranks.index(entry.rank)  # 0 = best
            score = math.ceil(MAX_SCORE * (len(ranks) - position) / len(ranks))
            if c.free is not None:
                cpu, mem = want_need(entry, job)(c.shape)  # the hinted share, raised to the own request
                if c.free.gpus < pod.gpus or c.free.cpu_m < cpu or c.free.mem_mib < mem:
                    score = max(score // 2, 1) if c.free.gpus >= pod.gpus else 0
        out.append((c.name, max(0, min(MAX_SCORE, score))))
    return out
