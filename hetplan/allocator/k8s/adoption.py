"""Adoption: an allocation for a pod that runs without one, where it runs.

Two kinds of pods run without an allocation: a pod with a job id whose allocation the allocator lost (or released
meanwhile), and an opted-in pod the webhook left to the default path (no room when it was created, the allocator
unreachable, the webhook down) that Kubernetes placed since. The controller adopts both where they run
(`POST /v1/adopt` with the pod's node: its own request there, grown toward its hinted share by the next re-sizing
step), and gives the second kind its job id and own request as annotations, as the webhook would have. A pod not
bound yet is allocated anew (`POST /v1/allocate`) and then moved or re-sized as any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetplan.allocator.k8s import pods
from hetplan.allocator.k8s.extender import Pod, pod_class


def request(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The allocator request that adopts `pod`: its job id (annotation, else its owner's: `pods.owner_job`), model, GPUs, its
    own cpu/memory request (the annotations the webhook wrote, else the pod's requests as written), and its node when
    bound. `ValueError` when the pod cannot be read."""
    model = pods.model(pod)
    if model is None:
        raise ValueError(f"no {pods.OPT_IN} label")
    klass = pod_class(Pod.model_validate(pod))
    _, _, own = pods.own_request(pods.annotations(pod), klass.cpu_m, klass.mem_mib)
    body: dict[str, Any] = {"job_id": pods.job_id(pod) or pods.owner_job(pod), "model": model,
                            "num_gpus": klass.gpus, **own}
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        body["node"] = str(node)
    return body


def annotations(body: Mapping[str, Any]) -> dict[str, str]:
    """What the webhook would have written on an adopted default-path pod: its job id and own request ("" where it
    asks none, as the webhook writes it)."""
    return {pods.JOB_ID_KEY: str(body["job_id"]),
            pods.REQUESTED_CPU_KEY: str(round(body["cpus"] * 1000)) if "cpus" in body else "",
            pods.REQUESTED_MEMORY_KEY: str(round(body["mem_gb"] * 1024)) if "mem_gb" in body else ""}


def default_path(pod: Mapping[str, Any]) -> bool:
    """An opted-in pod the webhook did not serve (no job id) that Kubernetes runs: one to adopt."""
    return pods.model(pod) is not None and pods.job_id(pod) is None and pods.phase(pod) == "Running" \
        and not pods.terminating(pod) and bool((pod.get("spec") or {}).get("nodeName"))
