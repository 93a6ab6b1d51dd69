"""Export a plan to Kueue: a `ResourceFlavor` per GPU type and a `ClusterQueue` with the plan's quotas.

Flavors select nodes by the label `nvidia.com/gpu.product`; the ClusterQueue lists them in the plan's order
of preference (by the mean rank the hint table gives each GPU type, best first), each with `nominalQuota`
for GPUs, cores and memory equal to what the plan provides (added plus owned nodes). Everything comes from
published artifacts: the plan, the catalog it was solved on, and its hint table.
"""

from __future__ import annotations

import re

import pandas as pd
import yaml

from hetplan.contracts import Plan
from hetplan.gpus import K8S_PRODUCT

API_VERSION = "kueue.x-k8s.io/v1beta1"
GPU_RESOURCE = "nvidia.com/gpu"


def flavor_name(gpu_type: str) -> str:
    """A DNS-1123 name for a GPU type's flavor, e.g. `gpu-a100-80gb`."""
    return "gpu-" + re.sub(r"[^a-z0-9-]", "-", gpu_type.lower())


def kueue_manifests(plan: Plan, catalog: pd.DataFrame | None, hints: pd.DataFrame,
                    queue: str = "hetplan") -> list[dict]:
    """Kueue objects for the cluster a plan provides (added plus owned nodes); shapes come from the plan
    itself, or for plans written before it carried them, from `catalog`."""
    counts = pd.Series(plan.node_counts, dtype=float).add(pd.Series(plan.owned_nodes, dtype=float), fill_value=0)
    if plan.shapes:
        shapes = pd.DataFrame({name: s.model_dump() for name, s in plan.shapes.items()}).T.loc[counts.index]
    else:
        shapes = catalog.set_index("name").loc[counts.index]
    totals = pd.DataFrame({"gpu_type": shapes["gpu_type"], "gpus": shapes["gpus"] * counts,
                           "cpus": shapes["vcpus"] * counts, "mem_gb": shapes["mem_gb"] * counts})
    totals = totals.groupby("gpu_type").sum()
    mean_rank = hints.groupby("gpu_type")["rank"].mean()
    order = sorted(totals.index, key=lambda g: (float(mean_rank.get(g, float("inf"))), g))
    flavors = [{"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": flavor_name(g)},
                "spec": {"nodeLabels": {"nvidia.com/gpu.product": K8S_PRODUCT.get(g, g)}}} for g in order]
    queue_spec = {
        "namespaceSelector": {},
        "resourceGroups": [{
            "coveredResources": ["cpu", "memory", GPU_RESOURCE],
            "flavors": [{"name": flavor_name(g), "resources": [
                {"name": "cpu", "nominalQuota": int(totals.loc[g, "cpus"])},
                {"name": "memory", "nominalQuota": f"{int(totals.loc[g, 'mem_gb'])}Gi"},
                {"name": GPU_RESOURCE, "nominalQuota": int(totals.loc[g, "gpus"])},
            ]} for g in order],
        }],
    }
    cluster_queue = {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": queue}, "spec": queue_spec}
    return [*flavors, cluster_queue]


def kueue_yaml(plan: Plan, catalog: pd.DataFrame | None, hints: pd.DataFrame, queue: str = "hetplan") -> str:
    """The manifests as one multi-document YAML file."""
    header = f"# Kueue objects for hetplan plan {plan.plan_id}\n"
    return header + yaml.safe_dump_all(kueue_manifests(plan, catalog, hints, queue), sort_keys=False)

