"""The nightly DAG's Kubernetes path: which GPU types are profiled in pods, and each pod's operator kwargs.

With the `kubernetes` param set, a GPU type is profiled in its own pod, pinned to a node of that type by the
label NVIDIA GPU feature discovery sets (`nvidia.com/gpu.product`), with the grid's largest point as its
resources and the shared workspace (a PVC) mounted at the workspace's path, so the status record the pod
writes means the same to the `fit` task. Everything returned here is plain JSON, as mapped kwargs travel
through XCom; `hetplan_airflow.operators.ProfilePodOperator` turns the Kubernetes parts into models.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

from hetplan.gpus import GPU_PRODUCT_LABEL, K8S_PRODUCT, gpu_label, normalize_gpu
from hetplan.profiling.grid import parse_list
from hetplan_airflow.config import profile_kwargs

log = logging.getLogger(__name__)

GPU_TYPE_LABEL = "hetplan.io/gpu-type"
POD_MAP_INDEX_TEMPLATE = f"{{{{ task.labels['{GPU_TYPE_LABEL}'] }}}}"  # a pod task's name in the UI: its GPU type
HARNESS_GIB = 1  # RAM a pod gets above the grid's largest RAM point, for the profiling harness itself
POD_CMDS = ["python", "-m", "hetplan.cli.nightly"]
WORKSPACE_VOLUME = "workspace"
# GPU nodes are commonly tainted `nvidia.com/gpu:NoSchedule` (GKE, EKS's and the GPU operator's defaults). The
# ExtendedResourceToleration admission plugin would add this toleration, but it is off outside GKE, so the pods
# carry it themselves; `Exists` matches the taint whatever its value.
GPU_TOLERATIONS = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)


@dataclass(frozen=True)
class PodTarget:
    """The `kubernetes` DAG param: where profiling pods run. `{}` (no target): every GPU type is profiled locally."""

    image: str                                   # an image with hetplan installed (`python -m hetplan.cli.nightly`)
    workspace_claim: str                         # PVC holding the workspace, the one the workers mount
    namespace: str = "default"
    service_account: str = ""                    # empty: the namespace's default
    kubernetes_conn_id: str = "kubernetes_default"
    in_cluster: bool | None = None               # None: as the connection says
    gpu_types: tuple[str, ...] = ()              # GPU types profiled in pods; empty: all of the run's
    products: Mapping[str, str] = field(default_factory=dict)  # GPU type -> node label value, over K8S_PRODUCT
    memory_gb: float = 16.0                      # the RAM point measured in pods when the `mem_gb` param is empty
    startup_timeout_s: int = 600                 # how long a pod may wait for a GPU node (autoscaling included)

    @classmethod
    def from_param(cls, value: Mapping[str, Any] | None) -> PodTarget | None:
        """Parse the param; raise `ValueError` naming unknown or missing fields (None for `{}`)."""
        if not value:
            return None
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"kubernetes param: unknown field(s) {', '.join(unknown)} (known: {', '.join(known)})")
        missing = [name for name in ("image", "workspace_claim") if not value.get(name)]
        if missing:
            raise ValueError(f"kubernetes param: {' and '.join(missing)} required (or {{}} to profile on the workers)")
        target = cls(**{**value, "gpu_types": tuple(normalize_gpu(g) for g in value.get("gpu_types") or ()),
                        "products": {normalize_gpu(g): p for g, p in (value.get("products") or {}).items()}})
        memory = target.memory_gb
        if isinstance(memory, bool) or not isinstance(memory, (int, float)) or not memory > 0:
            raise ValueError(f"kubernetes param: memory_gb must be a number > 0, not {memory!r}")
        return target


def split_gpu_types(gpu_types: Sequence[str], target: PodTarget | None) -> tuple[list[str], list[str]]:
    """The run's GPU types (canonical, de-duplicated, in order) split into (profiled locally, profiled in pods)."""
    gpus = list(dict.fromkeys(gpu_label(g) for g in gpu_types))
    if target is None:
        return gpus, []
    in_pods = set(target.gpu_types or gpus)
    if ignored := sorted(in_pods - set(gpus)):
        log.warning("kubernetes.gpu_types %s are not among the run's gpu_types: not profiled", ignored)
    return [g for g in gpus if g not in in_pods], [g for g in gpus if g in in_pods]


def node_product(gpu_type: str, products: Mapping[str, str]) -> str:
    """The `nvidia.com/gpu.product` value of `gpu_type`'s nodes; `ValueError` naming the type when none is known."""
    product = products.get(gpu_type)
    if not product:
        raise ValueError(f"no {GPU_PRODUCT_LABEL} node label value known for GPU type {gpu_type!r}: add it to the "
                         f"kubernetes param's products, e.g. {{\"{gpu_type}\": \"<value on your nodes>\"}}")
    return product


def pod_resources(cpus: str, mem_gb: str) -> dict[str, dict[str, str]]:
    """Requests = limits (Guaranteed QoS): the grid's largest core count and RAM point (+ harness), one GPU."""
    cores = math.ceil(max(parse_list(cpus, "cpus")))
    memory = math.ceil(max(parse_list(mem_gb, "mem-gb")) + HARNESS_GIB)
    amounts = {"cpu": str(cores), "memory": f"{memory}Gi", "nvidia.com/gpu": "1"}
    return {"requests": amounts, "limits": dict(amounts)}


def cli_flags(kwargs: Mapping[str, Any]) -> list[str]:
    """`profile_gpu` keyword arguments as `python -m hetplan.cli.nightly profile-gpu` flags (None: left out)."""
    return [arg for key, value in kwargs.items() if value is not None
            for arg in (f"--{key.replace('_', '-')}", str(value))]


def pod_kwargs(gpu_type: str, target: PodTarget, workspace: str, run_key: str,
               profile: Mapping[str, Any]) -> dict[str, Any]:
    """The operator kwargs (JSON) of the pod that runs `profile_gpu(workspace, run_key, gpu_type, **profile)`."""
    args = {**profile, "mem_gb": profile["mem_gb"] or f"{target.memory_gb:g}"}  # in a pod, "all the RAM" is the pod's
    kwargs: dict[str, Any] = {
        "name": f"hetplan-profile-{gpu_type.lower()}",
        "namespace": target.namespace,
        "labels": {"app.kubernetes.io/name": "hetplan", GPU_TYPE_LABEL: gpu_type},
        "image": target.image,
        "cmds": POD_CMDS,
        "arguments": ["profile-gpu", "--workspace", workspace, "--run-key", run_key, "--gpu-type", gpu_type,
                      *cli_flags(args)],
        "node_selector": {GPU_PRODUCT_LABEL: node_product(gpu_type, {**K8S_PRODUCT, **target.products})},
        "container_resources": pod_resources(args["cpus"], args["mem_gb"]),
        "tolerations": [dict(t) for t in GPU_TOLERATIONS],
        "volumes": [{"name": WORKSPACE_VOLUME, "persistentVolumeClaim": {"claimName": target.workspace_claim}}],
        "volume_mounts": [{"name": WORKSPACE_VOLUME, "mountPath": workspace}],
        "kubernetes_conn_id": target.kubernetes_conn_id,
        "startup_timeout_seconds": target.startup_timeout_s,
    }
    if target.service_account:
        kwargs["service_account_name"] = target.service_account
    if target.in_cluster is not None:
        kwargs["in_cluster"] = target.in_cluster
    return kwargs


def profiling_plan(params: Mapping[str, Any], run_key: str, queued: Collection[str] = ()) -> dict[str, list]:
    """Where one nightly run profiles each GPU type: `{"local": [GPU type, ...], "queued": [GPU type, ...],
    "pods": [pod kwargs, ...]}`: pods as the `kubernetes` param says; of the rest, the types in `queued` (those
    with Celery workers of their own, `profile_queues()`) on their queues, the others on the default queue."""
    target = PodTarget.from_param(params.get("kubernetes"))
    workers, in_pods = split_gpu_types(params["gpu_types"], target)
    pods = []
    if target is not None:
        workspace = str(Path(params["workspace"]).resolve())  # the workers' path, where the pods mount the PVC too
        pods = [pod_kwargs(g, target, workspace, run_key, profile_kwargs(params, g)) for g in in_pods]
    return {"local": [g for g in workers if g not in queued], "queued": [g for g in workers if g in queued],
            "pods": pods}


def profiled_gpu_types(local: Sequence[str], pods: Sequence[Mapping[str, Any]], queued: Sequence[str] = ()) -> list[str]:
    """All the GPU types a run profiles, from the lists `profiling_plan` returns."""
    return [*local, *queued, *(pod["labels"][GPU_TYPE_LABEL] for pod in pods)]
