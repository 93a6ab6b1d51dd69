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
- **Pod update** (`validate_update`, PATCH/PUT of the pod itself): the spec is immutable but for container images,
  `activeDeadlineSeconds`, added tolerations and `terminationGracePeriodSeconds`; resources change through `resize`
  only. **Scheduling gates** (KEP-3521, GA 1.30): set at creation only; afterwards gates may only be removed
  ("only deletion is allowed"). While a pod is gated (KEP-3838, GA 1.30) `nodeSelector` may get new keys (none
  changed or removed) and the required node affinity may be set when there is none, or narrowed: the same terms,
  each keeping its requirements first and adding some; the preferred affinity is free. Never `nodeName`.
- **Creation with gates** (`validate_create`): a pod may not name its node (`spec.nodeName`) and have gates.
- **Binding** (`validate_binding`): a gated pod cannot be bound (the scheduler never sees it either).
- **Resize of a pod not yet scheduled**: allowed from 1.33 (the API server refuses a resize only for a pod whose
  running containers report no resources: a node without resize support; a Pending pod has none running), the
  scheduler then places it with the new requests. The stand-in's `_resize` follows: nothing for a kubelet to actuate.
- **PodDisruptionBudgets** (`disruptions_allowed`): policy/v1 semantics: `minAvailable` or `maxUnavailable`, each
  an integer or a percentage of the expected pods (the matching pods; rounded up as the disruption controller does);
  healthy pods are Running, not terminating and not in `status.disruptedPods` (an eviction in flight).
- **Job update** (`validate_job_update`, batch/v1): `spec.template`, `completionMode` and `selector` are immutable;
  `parallelism` is a whole number >= 0; `completions` changes only for an Indexed Job and only together with
  `parallelism`, to the same value (elastic Indexed Jobs, KEP-3715, GA 1.31: "can only be modified in tandem with
  .spec.parallelism").
- **PyTorchJob** (`validate_pytorchjob`, kubeflow.org/v1, on create and update): what the training operator v1's
  validating webhook (`pytorchjob_webhook.go`) and its CRD schema refuse: a name that is no DNS-1035 label; replica
  types other than `Master` and `Worker`; a `Master` whose `replicas` is not 1; `Worker.replicas` below 1 or no
  integer (the schema's int32); an `elasticPolicy` without a `Worker`; a replica template without a container named
  `pytorch`. Not checked, as the operator does not check it: `Worker.replicas` within the policy's min..max (its
  autoscaler keeps to them; a client that patches must).
"""

from __future__ import annotations

import math
import re
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
    if spec.get("nodeName") and spec.get("schedulingGates"):
        raise invalid(name, "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared")
    if spec.get("restartPolicy", "Always") == "Never":
        for i, c in enumerate(spec.get("containers") or []):
            for p in c.get("resizePolicy") or []:
                if p.get("restartPolicy") == "RestartContainer":
                    raise invalid(name, f"spec.containers[{i}].resizePolicy: Invalid value: \"RestartContainer\": "
                                        "must be 'NotRequired' when `restartPolicy` is 'Never'")


MUTABLE_SPEC = ("activeDeadlineSeconds", "terminationGracePeriodSeconds", "tolerations")


def _required_terms(spec: dict) -> list[dict] | None:
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    return None if required is None else list(required.get("nodeSelectorTerms") or [])


def _narrowed(old: list[dict] | None, new: list[dict] | None) -> bool:
    """KEP-3838: a gated pod's required node affinity may be set when it had none, else only narrowed (the same
    number of terms, each keeping its old requirements first)."""
    if old is None:
        return True
    if new is None or len(new) != len(old):
        return False
    for before, after in zip(old, new):
        for part in ("matchExpressions", "matchFields"):
            was, now = before.get(part) or [], after.get(part) or []
            if now[:len(was)] != was:
                return False
    return True


def validate_update(old: dict, new: dict) -> None:
    """An update of the pod itself (not a subresource) as the API server validates it; `ApiError` 422 when refused."""
    name = (old.get("metadata") or {}).get("name", "")
    before, after = old.get("spec") or {}, new.get("spec") or {}
    was_gates = [g.get("name") for g in before.get("schedulingGates") or []]
    now_gates = [g.get("name") for g in after.get("schedulingGates") or []]
    added = [g for g in now_gates if g not in was_gates]
    if added:
        raise invalid(name, f"spec.schedulingGates: Forbidden: only deletion is allowed, but found new scheduling "
                            f"gate '{added[0]}'")
    if [c.get("resources") for c in before.get("containers") or []] != \
            [c.get("resources") for c in after.get("containers") or []]:
        raise invalid(name, "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`"
                            ", ... (resources: through the resize subresource)")
    if before.get("nodeName") != after.get("nodeName"):
        raise invalid(name, "spec.nodeName: Forbidden: pod updates may not change the node (bind through binding)")
    if was_gates:
        for key, value in (before.get("nodeSelector") or {}).items():
            if (after.get("nodeSelector") or {}).get(key) != value:
                raise invalid(name, f"spec.nodeSelector: Invalid value: only additions are allowed (key {key})")
        if not _narrowed(_required_terms(before), _required_terms(after)):
            raise invalid(name, "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: Invalid "
                                "value: only additions to the existing terms' requirements are allowed")
    loose = set(MUTABLE_SPEC) | {"schedulingGates"} | ({"nodeSelector", "affinity"} if was_gates else set())
    frozen = {k for k in set(before) | set(after) if k not in loose and k != "containers" and
              before.get(k) != after.get(k)}
    strip = [{k: v for k, v in c.items() if k not in ("image", "resources")} for c in before.get("containers") or []]
    if frozen or strip != [{k: v for k, v in c.items() if k not in ("image", "resources")}
                           for c in after.get("containers") or []]:
        raise invalid(name, f"spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`"
                            f", ... ({', '.join(sorted(frozen)) or 'containers'})")
    was_tol, now_tol = before.get("tolerations") or [], after.get("tolerations") or []
    if now_tol[:len(was_tol)] != was_tol:
        raise invalid(name, "spec.tolerations: Forbidden: existing toleration can not be modified except its "
                            "tolerationSeconds")


def validate_binding(pod: dict) -> None:
    """The `binding` subresource: a gated pod is not bound (the API server refuses it)."""
    if (pod.get("spec") or {}).get("schedulingGates"):
        name = (pod.get("metadata") or {}).get("name", "")
        raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} has "
                                        "non-empty .spec.schedulingGates")


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


def validate_job_update(old: dict, new: dict) -> None:
    """A PATCH of a batch/v1 Job (the module's docstring); `ApiError` 422 naming the field."""
    name = (old.get("metadata") or {}).get("name", "")
    before, after = old.get("spec") or {}, new.get("spec") or {}
    for field in ("template", "completionMode", "selector"):
        if before.get(field) != after.get(field):
            raise invalid(name, f"spec.{field}: Invalid value: field is immutable")
    parallelism = after.get("parallelism")
    if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 0:
        raise invalid(name, f"spec.parallelism: Invalid value: {parallelism!r}: must be greater than or equal to 0")
    if before.get("completions") != after.get("completions"):
        if before.get("completionMode") != "Indexed":
            raise invalid(name, "spec.completions: Invalid value: field is immutable")
        if after.get("completions") != parallelism:
            raise invalid(name, f"spec.completions: Invalid value: {after.get('completions')!r}: can only be modified "
                                "in tandem with spec.parallelism")


DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def validate_pytorchjob(new: dict) -> None:
    """A PyTorchJob as created or updated (the module's docstring); `ApiError` 422 naming the field."""
    name = (new.get("metadata") or {}).get("name", "")

    def refused(message: str) -> ApiError:
        return ApiError(422, "Invalid", f'PyTorchJob.kubeflow.org "{name}" is invalid: {message}')

    if not isinstance(name, str) or not DNS_1035.match(name):
        raise refused(f"metadata.name: Invalid value: {name!r}: should match a DNS-1035 label")
    spec = new.get("spec") or {}
    replicas = spec.get("pytorchReplicaSpecs")
    if not isinstance(replicas, dict) or not replicas:
        raise refused("spec.pytorchReplicaSpecs: Required value")
    for rtype, rspec in replicas.items():
        path = f"spec.pytorchReplicaSpecs[{rtype}]"
        if rtype not in ("Master", "Worker"):
            raise refused(f"{path}: Unsupported value: {rtype!r}: supported values: \"Master\", \"Worker\"")
        count = (rspec or {}).get("replicas")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)):
            raise refused(f"{path}.replicas: Invalid value: {count!r}: must be an integer")
        if rtype == "Master" and count != 1:
            raise refused(f"{path}.replicas: Forbidden: must be 1")
        if rtype == "Worker" and count is not None and count < 1:
            raise refused(f"{path}.replicas: Forbidden: must be at least 1")
        containers = (((rspec or {}).get("template") or {}).get("spec") or {}).get("containers") or []
        if not any(c.get("name") == "pytorch" for c in containers):
            raise refused(f"{path}.template.spec.containers: Required value: a container named \"pytorch\"")
    if spec.get("elasticPolicy") is not None and "Worker" not in replicas:
        raise refused("spec.pytorchReplicaSpecs[Worker]: Required value: must be configured if elastic policy is used")
