"""In-place resize by the API server's rules: what a `pods/resize` patch may ask of a pod on a given version.

The rules that concern hetplan (Kubernetes 1.33 and 1.34, `InPlacePodVerticalScaling` beta and on by default):

- only containers' cpu and memory change, none is removed, and the pod's QoS class may not change (`plan_resize`
  checks it before sending: a Burstable pod's cpu limit is kept above its request where it has one);
- **1.33**: a memory *limit* may not decrease unless the container's memory `resizePolicy` is `RestartContainer`,
  which a pod with `restartPolicy: Never` may not use (and which would restart the trainer anyway): hetplan never
  asks for it. A memory shrink lowers the request and keeps the limit where the pod is Burstable (the shape the
  webhook gives, `pods.resources`); a Guaranteed pod (requests = limits, written by the user or an older webhook)
  keeps its memory and only its cpu is resized (`ResizePlan.memory_kept`);
- **1.34** on: a memory limit decreases in place (the kubelet checks, best effort, that usage is below it).

What the kubelet then does with a valid resize (actuate it, or report `PodResizePending` Deferred / Infeasible) is
the controller's to follow (`Controller._report_kubelet`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from hetplan.allocator.k8s import pods
from hetplan.allocator.k8s.extender import BYTES_PER_MIB, parse_quantity

MEMORY_DECREASE_FROM = (1, 34)
"""The first version whose API server accepts a NotRequired memory limit decrease."""


@dataclass(frozen=True, slots=True)
class Rules:
    """The resize rules of one API server version (`(major, minor)`)."""

    version: tuple[int, int] = (1, 33)

    @property
    def memory_limit_decrease(self) -> bool:
        return self.version >= MEMORY_DECREASE_FROM

    @classmethod
    def of(cls, git_version: str) -> Rules:
        """From `/version`'s `gitVersion` (`v1.33.2`, `v1.34.0-eks-1`); an unreadable one gets 1.33's (stricter)."""
        try:
            major, minor = git_version.lstrip("v").split(".")[:2]
            return cls((int(major), int("".join(ch for ch in minor if ch.isdigit()))))
        except ValueError:
            return cls()


def read_rules(api: Any, timeout: float = 10.0) -> Rules:
    """The rules of the API server `api` (a kubernetes ApiClient) talks to (`GET /version`)."""
    from kubernetes.client import VersionApi

    return Rules.of(str(VersionApi(api).get_code(_request_timeout=timeout).git_version))


def qos_class(pod: Mapping[str, Any]) -> str:
    """Guaranteed (every container's cpu and memory limits equal its requests), BestEffort (none set), else
    Burstable: as the API server computes `status.qosClass`."""
    spec = pod.get("spec") or {}
    any_set, guaranteed = False, True
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        for resource in ("cpu", "memory"):
            limit = limits.get(resource)
            request = requests.get(resource, limit)
            any_set = any_set or request is not None
            if limit is None or request is None or parse_quantity(request) != parse_quantity(limit):
                guaranteed = False
    if guaranteed and any_set:
        return "Guaranteed"
    return "Burstable" if any_set else "BestEffort"


@dataclass(frozen=True, slots=True)
class ResizePlan:
    """The strategic-merge patch for the `resize` subresource, and whether the memory shrink had to be left out
    (a Guaranteed pod on a version that cannot lower its memory limit: only its cpu changes)."""

    body: dict[str, Any]
    memory_kept: bool


def _mib(value: Any) -> int:
    return math.ceil(parse_quantity(value) / Decimal(BYTES_PER_MIB))


def _milli(value: Any) -> int:
    return math.ceil(parse_quantity(value) * 1000)


def _resized(pod: Mapping[str, Any], index: int, requests: dict[str, Any], limits: dict[str, Any]) -> dict[str, Any]:
    """The pod's spec as the resize leaves it (its main container's requests and limits replaced)."""
    containers = [dict(c) for c in pod["spec"]["containers"]]
    containers[index]["resources"] = {**(containers[index].get("resources") or {}), "requests": requests,
                                      "limits": limits}
    return {**pod, "spec": {**pod["spec"], "containers": containers}}


def plan_resize(pod: Mapping[str, Any], target: pods.Target, rules: Rules) -> ResizePlan:
    """The resize that gives the pod `target`'s cores and RAM as far as `rules` allow (see the module's docstring),
    never changing the pod's QoS class: a Guaranteed pod's limits follow its requests; a Burstable pod's cpu limit
    is never lowered nor left below its request, and is kept 1m above it where requests = limits would otherwise
    make the pod Guaranteed. `ValueError` when the other containers already ask for all of it, or when the pod is
    BestEffort (it asks no cores or RAM: any request would change its QoS class; an adopted pod can be so)."""
    qos = qos_class(pod)
    if qos == "BestEffort":
        raise ValueError("a BestEffort pod (no cpu or memory request) cannot get one in place: its QoS class would "
                         "change")
    index, cpu_m, mem_mib = pods.main_share(pod, target)
    container = pod["spec"]["containers"][index]
    res = container.get("resources") or {}
    requests, limits = dict(res.get("requests") or {}), dict(res.get("limits") or {})
    new_requests = {**requests, "cpu": pods.cpu_text(cpu_m), "memory": pods.mem_text(mem_mib)}
    new_limits = dict(limits)
    if "cpu" in limits:
        cpu_limit = cpu_m if qos == "Guaranteed" else max(_milli(limits["cpu"]), cpu_m)
        new_limits["cpu"] = pods.cpu_text(cpu_limit)
    memory_kept = False
    if "memory" in limits:
        if mem_mib < _mib(limits["memory"]) and not rules.memory_limit_decrease:
            if qos == "Guaranteed":  # request = limit must hold, and the limit cannot go down
                new_requests["memory"] = requests.get("memory", limits["memory"])
                memory_kept = True
            # Burstable: the request goes down, the limit stays
        else:
            new_limits["memory"] = pods.mem_text(mem_mib)
    if qos == "Burstable" and "cpu" in limits and qos_class(_resized(pod, index, new_requests, new_limits)) != qos:
        new_limits["cpu"] = pods.cpu_text(cpu_m + 1)  # every request = its limit: Guaranteed, unless 1m above
    after = qos_class(_resized(pod, index, new_requests, new_limits))
    if after != qos:  # the API server refuses it (422): never sent
        raise ValueError(f"the resize would change the pod's QoS class ({qos} -> {after})")
    body = {"spec": {"containers": [{"name": container["name"],
                                     "resources": {"requests": new_requests, "limits": new_limits}}]}}
    return ResizePlan(body, memory_kept)
