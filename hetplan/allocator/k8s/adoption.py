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
    """The allocator request that adopts `pod`: its job id (`pods.adoptable_job`: its owner's, as the webhook
    derives it), model, GPUs, its own cpu/memory request (`pods.own_request`), and its node when bound.
    `ValueError` when the pod cannot be read."""
    model = pods.model(pod)
    if model is None:
        raise ValueError(f"no {pods.OPT_IN} label")
    klass = pod_class(Pod.model_validate(pod))
    _, _, own = pods.own_request(pods.annotations(pod), klass.cpu_m, klass.mem_mib)
    body: dict[str, Any] = {"job_id": pods.adoptable_job(pod), "model": model,
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
    """An opted-in pod the webhook did not serve that Kubernetes runs: one to adopt. It has no job id annotation,
    or one naming a job not its own (`pods.adoptable_job`: a user wrote it; the webhook would have replaced it)."""
    job = pods.job_id(pod)
    return pods.model(pod) is not None and (job is None or job != pods.adoptable_job(pod)) \
        and pods.phase(pod) == "Running" and not pods.terminating(pod) and bool((pod.get("spec") or {}).get("nodeName"))
