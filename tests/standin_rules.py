"""Kubernetes' own rules, as the STAND-IN API server (`standin_apiserver.py`; not a real kube-apiserver) enforces
them: pure functions of the objects, so that each rule is read (and tested) on its own.

- **QoS class** (`qos_class`): Guaranteed when every container sets cpu and memory limits equal to its requests,
  BestEffort when none sets any, else Burstable.
- **Pod creation** (`validate_create`): a container's `resizePolicy` `RestartContainer` is refused for a pod with
  `restartPolicy: Never` (1.33 validation: such a pod cannot restart a container).
- **Resize** (`validate_resize`, the `pods/resize` subresource): only cpu and memory requests and limits change;
  none is removed; the QoS class stays; on **1.33** a memory *limit* decrease is refused unless the container's
  memory `resizePolicy` is `RestartContainer` ("memory limits cannot be decreased unless resizePolicy is
  RestartContainer"); from **1.34** it is allowed (the kubelet checks usage on a best-effort basis).
- **PodDisruptionBudgets** (`disruptions_allowed`): policy/v1 semantics: `minAvailable` or `maxUnavailable`, each
  an integer or a percentage of the expected pods (the matching pods; rounded up as the disruption controller does);
  healthy pods are Running, not terminating and not in `status.disruptedPods` (an eviction in flight).
"""

from __future__ import annotations

import math
from typing import Any

MEMORY_DECREASE_VERSION = (1, 34)  # from this minor on, a NotRequired memory limit decrease is accepted


def status(code: int, reason: str, message: str, **extra: Any) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code, **extra}


class ApiError(Exception):
    """An API error answered as a `Status` body with its code."""

    def __init__(self, code: int, reason: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.body = status(code, reason, message, **extra)


def invalid(name: str, message: str) -> ApiError:
    return ApiError(422, "Invalid", f'Pod "{name}" is invalid: {message}')


def parse_version(text: str) -> tuple[int, int]:
    major, minor = text.lstrip("v").split(".")[:2]
    return int(major), int(minor.rstrip("+"))


def qos_class(spec: dict) -> str:
    """The pod's QoS class from its containers' resources (init containers count as Kubernetes counts them)."""
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    any_set, guaranteed = False, True
    for c in containers:
        res = c.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        for resource in ("cpu", "memory"):
            request, limit = requests.get(resource, limits.get(resource)), limits.get(resource)
            any_set = any_set or request is not None or limit is not None
            if limit is None or request is None or _quantity(request) != _quantity(limit):
                guaranteed = False
    if guaranteed and any_set:
        return "Guaranteed"
    return "Burstable" if any_set else "BestEffort"


def _quantity(value: Any):
    from kubernetes.utils.quantity import parse_quantity

    return parse_quantity(value)


def _policy(container: dict, resource: str) -> str:
    for p in container.get("resizePolicy") or []:
        if p.get("resourceName") == resource:
            return str(p.get("restartPolicy") or "NotRequired")
    return "NotRequired"


def validate_create(pod: dict) -> None:
    """A pod as the API server validates it at creation (the rules above that concern hetplan)."""
    spec, name = pod.get("spec") or {}, (pod.get("metadata") or {}).get("name", "")
    if spec.get("restartPolicy", "Always") == "Never":
        for i, c in enumerate(spec.get("containers") or []):
            for p in c.get("resizePolicy") or []:
                if p.get("restartPolicy") == "RestartContainer":
                    raise invalid(name, f"spec.containers[{i}].resizePolicy: Invalid value: \"RestartContainer\": "
                                        "must be 'NotRequired' when `restartPolicy` is 'Never'")


def validate_resize(old: dict, new: dict, version: tuple[int, int]) -> None:
    """A `pods/resize` change as the API server of `version` validates it; `ApiError` 422 when refused."""
    name = (old.get("metadata") or {}).get("name", "")
    olds, news = old["spec"]["containers"], new["spec"]["containers"]
    if [c.get("name") for c in olds] != [c.get("name") for c in news]:
        raise invalid(name, "spec: Forbidden: containers may not be added or removed by a resize")
    for i, (before_c, after_c) in enumerate(zip(olds, news)):
        if {k: v for k, v in before_c.items() if k != "resources"} != \
                {k: v for k, v in after_c.items() if k != "resources"}:
            raise invalid(name, f"spec.containers[{i}]: Forbidden: only resources are mutable through resize")
        before, after = before_c.get("resources") or {}, after_c.get("resources") or {}
        for part in ("requests", "limits"):
            was, now = before.get(part) or {}, after.get(part) or {}
            changed = {k for k in set(was) | set(now) if was.get(k) != now.get(k)}
            if changed - {"cpu", "memory"}:
                raise invalid(name, f"spec.containers[{i}].resources.{part}: Forbidden: only cpu and memory "
                                    "resources are mutable")
            removed = sorted(k for k in was if k not in now)
            if removed:
                raise invalid(name, f"spec.containers[{i}].resources.{part}[{removed[0]}]: Forbidden: resource "
                                    f"{part} cannot be removed")
        was_limit, now_limit = (before.get("limits") or {}).get("memory"), (after.get("limits") or {}).get("memory")
        if version < MEMORY_DECREASE_VERSION and was_limit is not None and now_limit is not None and \
                _quantity(now_limit) < _quantity(was_limit) and _policy(after_c, "memory") != "RestartContainer":
            raise invalid(name, f"spec.containers[{i}].resources.limits[memory]: Forbidden: memory limits cannot "
                                "be decreased unless resizePolicy is RestartContainer")
    if qos_class(old["spec"]) != qos_class(new["spec"]):
        raise invalid(name, f"spec: Forbidden: Pod QOS Class may not change as a result of resizing "
                            f"({qos_class(old['spec'])} -> {qos_class(new['spec'])})")


def _amount(value: Any, expected: int, round_up: bool) -> int:
    text = str(value)
    if text.endswith("%"):
        share = expected * int(text[:-1]) / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(text)


def disruptions_allowed(pdb: dict, matching: list[dict], now: float) -> tuple[int, int, int]:
    """(disruptions allowed, healthy pods, desired healthy) of a PodDisruptionBudget over the pods its selector
    matches (`matching`, terminal pods excluded by the caller). Entries of `status.disruptedPods` (pod name ->
    time.time() of the eviction) older than 2 minutes no longer count, as in the disruption controller."""
    spec = pdb["spec"]
    disrupted = {n for n, t in (pdb.get("status") or {}).get("disruptedPods", {}).items() if now - t < 120}
    expected = len(matching)
    healthy = sum(1 for p in matching if (p.get("status") or {}).get("phase") == "Running"
                  and not p["metadata"].get("deletionTimestamp") and p["metadata"]["name"] not in disrupted)
    if spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _amount(spec["maxUnavailable"], expected, round_up=True))
    else:
        desired = _amount(spec.get("minAvailable", 1), expected, round_up=True)
    return max(0, healthy - desired), healthy, desired
