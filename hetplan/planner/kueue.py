"""Export a plan to Kueue (API `kueue.x-k8s.io/v1beta2`): ResourceFlavors, a ClusterQueue and a LocalQueue.

- One `ResourceFlavor` per GPU board the plan's nodes carry, selecting nodes by `nvidia.com/gpu.product` with
  the label of each shape's real board (`hetplan.catalog.products`: an Azure A100 80GB PCIe shape gets
  `NVIDIA-A100-80GB-PCIe`, not the SXM4 label), optional node taints and tolerations.
- One `ClusterQueue` listing the flavors in the plan's order of preference (by the mean rank the hint table
  gives each GPU type, best first), each with `nominalQuota` for GPUs, cores and memory equal to what the
  plan's nodes (added plus owned) leave to pods: **allocatable = capacity minus a system reserve**
  (`SystemReserve`, configurable). Memory is in GiB (the catalog's unit) and written as whole `Gi`
  (rounded down); cores as whole cores or millicores (rounded down).
- One `LocalQueue` (namespaced) pointing at the ClusterQueue, which is what workloads name
  (`kueue.x-k8s.io/queue-name`).

Everything comes from published artifacts: the plan, the catalog it was solved on, and its hint table.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import yaml

from hetplan.catalog.products import Product, gpu_product
from hetplan.contracts import Plan

API_VERSION = "kueue.x-k8s.io/v1beta2"
GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
MAX_TAINTS = 8  # Kueue's limit for nodeTaints and tolerations per ResourceFlavor
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class SystemReserve:
    """What a node keeps for the OS, the kubelet and the eviction threshold, not for pods.

    reserved cores = `cpu_base` + `cpu_fraction` x cores; reserved GiB = `mem_base_gib` + `mem_fraction` x GiB.
    The default is Google Distributed Cloud's documented reservation: 80 millicores + 1 % of the CPU capacity,
    330 MiB + 5 % of the memory capacity, plus its 100 MiB eviction threshold. Set your cluster's own figures
    (`kubectl describe node`: capacity minus allocatable) where they differ.
    """

    cpu_base: float = 0.08
    cpu_fraction: float = 0.01
    mem_base_gib: float = (330 + 100) / 1024
    mem_fraction: float = 0.05

    def __post_init__(self) -> None:
        for name in ("cpu_base", "cpu_fraction", "mem_base_gib", "mem_fraction"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"system reserve {name} must be a finite number >= 0, got {value!r}")
        if self.cpu_fraction >= 1 or self.mem_fraction >= 1:
            raise ValueError("system reserve fractions must be below 1")

    def allocatable(self, cpus: float, mem_gib: float) -> tuple[float, float]:
        """Cores and GiB a node of `cpus` cores and `mem_gib` GiB leaves to pods (never below 0)."""
        return (max(0.0, cpus - self.cpu_base - self.cpu_fraction * cpus),
                max(0.0, mem_gib - self.mem_base_gib - self.mem_fraction * mem_gib))


@dataclass(frozen=True)
class KueueOptions:
    """How the export names and shapes the objects.

    `taints` are the `nodeTaints` the GPU nodes carry (`{"key", "value"?, "effect"}`; Kueue then admits only
    workloads that tolerate them, unless the flavor's `tolerations` add the toleration to admitted pods).
    `products` overrides a shape's `nvidia.com/gpu.product` label by shape name.
    """

    queue: str = "hetplan"
    local_queue: str | None = None  # default: the ClusterQueue's name
    namespace: str = "default"
    reserve: SystemReserve = field(default_factory=SystemReserve)
    taints: Sequence[Mapping[str, str]] = ()
    tolerations: Sequence[Mapping[str, Any]] = ()
    products: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for what, name in (("queue", self.queue), ("local queue", self.local_name), ("namespace", self.namespace)):
            if len(name) > 253 or not _DNS1123.match(name):
                raise ValueError(f"Kueue {what} name {name!r} is not a DNS-1123 subdomain (a-z, 0-9, '-', '.')")
        for what, items in (("taints", self.taints), ("tolerations", self.tolerations)):
            if len(items) > MAX_TAINTS:
                raise ValueError(f"at most {MAX_TAINTS} {what} per ResourceFlavor, got {len(items)}")
        for taint in self.taints:
            if not taint.get("key") or taint.get("effect") not in TAINT_EFFECTS:
                raise ValueError(f"taint {dict(taint)!r} needs a key and an effect in {', '.join(TAINT_EFFECTS)}")
        for tol in self.tolerations:
            if tol.get("effect") not in (None, *TAINT_EFFECTS) or tol.get("operator") not in (None, "Equal", "Exists"):
                raise ValueError(f"toleration {dict(tol)!r}: effect in {', '.join(TAINT_EFFECTS)}, "
                                 "operator Equal or Exists")
            if not tol.get("key") and tol.get("operator") != "Exists":
                raise ValueError(f"toleration {dict(tol)!r}: an empty key needs operator Exists")

    @property
    def local_name(self) -> str:
        return self.local_queue or self.queue


@dataclass(frozen=True)
class Flavor:
    """One ResourceFlavor: the board's label, the GPU type, the plan's shapes on it and their allocatable totals."""

    name: str
    gpu_type: str
    product: Product
    shapes: tuple[str, ...]
    nodes: int
    gpus: int
    cpu_m: int  # allocatable millicores, rounded down
    mem_gib: int  # allocatable GiB, rounded down


def flavor_name(product: str) -> str:
    """A DNS-1123 name for a board's flavor, e.g. `gpu-nvidia-a100-80gb-pcie`."""
    slug = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", product.lower())).strip("-")
    return ("gpu-" + slug)[:63].rstrip("-")


def plan_flavors(plan: Plan, catalog: pd.DataFrame | None, hints: pd.DataFrame,
                 options: KueueOptions | None = None) -> list[Flavor]:
    """The plan's nodes (added plus owned) grouped by board, best-ranked GPU type first; shapes come from the
    plan itself, or for plans written before it carried them, from `catalog`."""
    options = options or KueueOptions()
    counts = pd.Series(plan.node_counts, dtype=float).add(pd.Series(plan.owned_nodes, dtype=float), fill_value=0)
    counts = counts[counts > 0]
    if plan.shapes:
        shapes = {name: (s.gpu_type, s.gpus, s.vcpus, s.mem_gb) for name, s in plan.shapes.items()}
    else:
        rows = catalog.set_index("name") if catalog is not None else pd.DataFrame()
        missing = sorted(set(counts.index) - set(rows.index))
        if missing:
            raise ValueError(f"plan {plan.plan_id}: no shape for {', '.join(missing)} (plan.shapes nor catalog)")
        shapes = {name: (rows.at[name, "gpu_type"], int(rows.at[name, "gpus"]), float(rows.at[name, "vcpus"]),
                         float(rows.at[name, "mem_gb"])) for name in counts.index}
    groups: dict[str, dict[str, Any]] = {}
    for name, count in counts.items():
        gpu_type, gpus, vcpus, mem_gib = shapes[name]
        product = gpu_product(name, gpu_type, options.products)
        cpus, mem = options.reserve.allocatable(vcpus, mem_gib)
        g = groups.setdefault(product.label, {"gpu_type": gpu_type, "product": product, "shapes": [], "nodes": 0,
                                              "gpus": 0, "cpu": 0.0, "mem": 0.0})
        g["shapes"].append(name)
        g["nodes"] += int(count)
        g["gpus"] += int(gpus * count)
        g["cpu"] += cpus * count
        g["mem"] += mem * count
    mean_rank = hints.groupby("gpu_type")["rank"].mean() if len(hints) else pd.Series(dtype=float)
    flavors = [Flavor(flavor_name(label), g["gpu_type"], g["product"], tuple(sorted(g["shapes"])), g["nodes"],
                      g["gpus"], int(math.floor(g["cpu"] * 1000 + 1e-6)), int(math.floor(g["mem"] + 1e-9)))
               for label, g in groups.items()]
    return sorted(flavors, key=lambda f: (float(mean_rank.get(f.gpu_type, math.inf)), f.gpu_type, f.name))


def _cpu_quantity(cpu_m: int) -> int | str:
    return cpu_m // 1000 if cpu_m % 1000 == 0 else f"{cpu_m}m"


def kueue_manifests(plan: Plan, catalog: pd.DataFrame | None, hints: pd.DataFrame, queue: str = "hetplan",
                    options: KueueOptions | None = None) -> list[dict]:
    """ResourceFlavors, the ClusterQueue and the LocalQueue for the cluster a plan provides (`options.queue`
    wins over `queue` when options are given)."""
    options = options or KueueOptions(queue=queue)
    flavors = plan_flavors(plan, catalog, hints, options)
    docs: list[dict] = []
    for f in flavors:
        spec: dict[str, Any] = {"nodeLabels": {PRODUCT_LABEL: f.product.label}}
        if options.taints:
            spec["nodeTaints"] = [dict(t) for t in options.taints]
        if options.tolerations:
            spec["tolerations"] = [dict(t) for t in options.tolerations]
        docs.append({"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": f.name},
                     "spec": spec})
    queue_spec: dict[str, Any] = {"namespaceSelector": {}}
    if flavors:
        queue_spec["resourceGroups"] = [{
            "coveredResources": ["cpu", "memory", GPU_RESOURCE],
            "flavors": [{"name": f.name, "resources": [
                {"name": "cpu", "nominalQuota": _cpu_quantity(f.cpu_m)},
                {"name": "memory", "nominalQuota": f"{f.mem_gib}Gi"},
                {"name": GPU_RESOURCE, "nominalQuota": f.gpus},
            ]} for f in flavors],
        }]
    docs.append({"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": options.queue},
                 "spec": queue_spec})
    docs.append({"apiVersion": API_VERSION, "kind": "LocalQueue",
                 "metadata": {"name": options.local_name, "namespace": options.namespace},
                 "spec": {"clusterQueue": options.queue}})
    return docs


def kueue_yaml(plan: Plan, catalog: pd.DataFrame | None, hints: pd.DataFrame, queue: str = "hetplan",
               options: KueueOptions | None = None) -> str:
    """The manifests as one multi-document YAML file, headed by how each flavor's label and quota were chosen."""
    options = options or KueueOptions(queue=queue)
    r = options.reserve
    lines = [f"# Kueue ({API_VERSION}) objects for hetplan plan {plan.plan_id}",
             f"# Quotas: allocatable = capacity - system reserve per node ({r.cpu_base:g} cores + "
             f"{r.cpu_fraction:.2%} of cores, {r.mem_base_gib:.3f} GiB + {r.mem_fraction:.2%} of GiB); "
             "memory in GiB, rounded down."]
    for f in plan_flavors(plan, catalog, hints, options):
        why = f"{f.product.basis}" + (f": {f.product.note}" if f.product.note else "")
        lines.append(f"# {f.name}: {f.gpu_type}, {PRODUCT_LABEL}={f.product.label} ({why}); {f.nodes} nodes "
                     f"of {', '.join(f.shapes)}")
    docs = kueue_manifests(plan, catalog, hints, queue, options)
    return "\n".join(lines) + "\n" + yaml.safe_dump_all(docs, sort_keys=False)
