"""The object whose count an elastic gang's count change patches (`Controller._rescale`), and how:

- an **Indexed Job** (batch/v1): `spec.parallelism` and `spec.completions`, together (elastic Indexed Jobs, GA in
  1.31); its controller creates or deletes the pods of the indexes that change;
- a **PyTorchJob** (kubeflow.org/v1, the training operator) with an `elasticPolicy`: `spec.pytorchReplicaSpecs.Worker
  .replicas`, within the policy's `minReplicas`..`maxReplicas` as the operator reads them (`_pytorch`; a `Master`, if
  any, stays at its one replica and counts as a part); the operator creates or deletes the highest-indexed workers.
  Not one whose policy has `metrics`: the operator's HorizontalPodAutoscaler sets its count.

Nothing else: a JobSet's pods (their owner is a child Job the JobSet re-creates from its own template, so a patch of
the child would not last), pods of several owners, other Kubeflow kinds, a PyTorchJob without an `elasticPolicy`
(its torchrun was started with a fixed `--nnodes`). `Unsupported` and `ValueError` say why, in one line."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hetplan.allocator.k8s import pods

MERGE = "application/merge-patch+json"
PYTORCHJOBS = ("kubeflow.org", "v1", "pytorchjobs")


class Unsupported(ValueError):
    """The gang's pods have no owner whose count hetplan changes."""


@dataclass(frozen=True, slots=True)
class Owner:
    """The object that owns every pod of a gang: its kind (`Job` or `PyTorchJob`), namespace, name and uid (an object
    created again under the name is another owner: `OwnerApi.patch` sends the uid as a precondition)."""

    kind: str
    namespace: str
    name: str
    uid: str = ""


def owner_of(members: Iterable[Mapping[str, Any]]) -> Owner:
    """The one object whose count stands for the gang of `members` (its pods). `Unsupported` where there is none."""
    found: set[Owner] = set()
    for pod in members:
        if (pods.meta(pod).get("labels") or {}).get(pods.JOBSET_LABEL):
            raise Unsupported("its pods are a JobSet's: its count is the JobSet's, which hetplan does not change")
        for ref in pods.meta(pod).get("ownerReferences") or []:
            if ref.get("controller"):
                found.add(Owner(str(ref.get("kind")), pods.key(pod)[0], str(ref.get("name")),
                                str(ref.get("uid") or "")))
    if len(found) != 1:
        raise Unsupported(f"its pods are owned by {len(found)} objects, not one")
    owner = found.pop()
    if owner.kind not in ("Job", "PyTorchJob"):
        raise Unsupported(f"its pods are a {owner.kind}'s: only an Indexed Job's or an elastic PyTorchJob's count "
                          "is changed")
    return owner


def _replicas(spec: Mapping[str, Any], rtype: str) -> int:
    """A PyTorchJob's replicas of `rtype` (0 where it has none, 1 where it does not say); `ValueError` naming the
    field when it is no whole number."""
    replicas = spec.get("pytorchReplicaSpecs") or {}
    if rtype not in replicas:
        return 0
    value = (replicas[rtype] or {}).get("replicas", 1)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"spec.pytorchReplicaSpecs.{rtype}.replicas: {value!r} is no whole number")
    return value


def _pytorch(obj: Mapping[str, Any]) -> tuple[int, int, int]:
    """A PyTorchJob's masters and its workers' bounds, as the training operator reads its `elasticPolicy` (one of
    `minReplicas`/`maxReplicas` alone stands for both; neither: both are `Worker.replicas`, a fixed count);
    `ValueError` naming the field where hetplan may not change its count."""
    spec = obj.get("spec") or {}
    policy = spec.get("elasticPolicy")
    if not isinstance(policy, Mapping):
        raise ValueError("spec.elasticPolicy: none, so its torchrun runs a fixed --nnodes and its count is fixed")
    if "Worker" not in (spec.get("pytorchReplicaSpecs") or {}):
        raise ValueError("spec.pytorchReplicaSpecs.Worker: none to scale")
    if policy.get("metrics"):
        raise ValueError("spec.elasticPolicy.metrics: the operator's HorizontalPodAutoscaler sets Worker.replicas")
    low, high = (v if isinstance(v, int) and not isinstance(v, bool) else None
                 for v in (policy.get("minReplicas"), policy.get("maxReplicas")))
    if low is None and high is None:
        low = high = _replicas(spec, "Worker")
    low = high if low is None else low
    high = low if high is None else high
    return _replicas(spec, "Master"), max(1, low), high


def parts_of(owner: Owner, obj: Mapping[str, Any]) -> int | None:
    """How many pods (gang parts) `obj` runs now, by its spec (None where it says none). `ValueError` naming the
    field of a PyTorchJob's count that is no whole number."""
    spec = obj.get("spec") or {}
    if owner.kind == "Job":
        return spec.get("parallelism")
    return _replicas(spec, "Master") + _replicas(spec, "Worker")


def count_patch(owner: Owner, obj: Mapping[str, Any], parts: int) -> dict[str, Any]:
    """The merge patch that sets `obj` (`owner`'s object as read) to `parts` pods. `ValueError` naming the field
    where the object cannot run that many (a PyTorchJob's workers outside its `elasticPolicy`)."""
    if owner.kind == "Job":
        return {"spec": {"parallelism": parts, "completions": parts}}
    masters, low, high = _pytorch(obj)
    workers = parts - masters
    if not low <= workers <= high:
        raise ValueError(f"spec.pytorchReplicaSpecs.Worker.replicas: {workers} is outside spec.elasticPolicy's "
                         f"minReplicas..maxReplicas ({low}..{high})")
    return {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": workers}}}}


def narrowed(owner: Owner, obj: Mapping[str, Any], bounds: Mapping[str, Any], gpus: int) -> dict[str, Any]:
    """An elastic gang's bounds (`pods.elastic_bounds`: `min_gpus`, `max_gpus` in GPUs, all parts together) within
    what its owner can run, each part `gpus` GPUs: a PyTorchJob's masters plus `minReplicas`..`maxReplicas` workers.
    `ValueError` naming the fields when nothing is left."""
    if owner.kind != "PyTorchJob" or "min_gpus" not in bounds:
        return dict(bounds)
    masters, low, high = _pytorch(obj)
    out = {**bounds, "min_gpus": max(int(bounds["min_gpus"]), (masters + low) * gpus),
           "max_gpus": min(int(bounds["max_gpus"]), (masters + high) * gpus)}
    if out["min_gpus"] > out["max_gpus"]:
        raise ValueError(f"annotation {pods.ELASTIC_KEY} ({bounds['min_gpus']}-{bounds['max_gpus']} GPUs) and "
                         f"spec.elasticPolicy ({masters} master(s) + {low}..{high} workers of {gpus} GPU(s)) leave "
                         "no count")
    return out


class OwnerApi:
    """Reads and patches owners through the API server (`batch`: a kubernetes `BatchV1Api`, `custom`: a
    `CustomObjectsApi`)."""

    def __init__(self, batch: Any, custom: Any, timeout: float) -> None:
        self.batch, self.custom, self.timeout = batch, custom, timeout

    def read(self, owner: Owner) -> dict[str, Any]:
        if owner.kind == "Job":
            answer = self.batch.read_namespaced_job(owner.name, owner.namespace, _preload_content=False,
                                                    _request_timeout=self.timeout)
        else:
            answer = self.custom.get_namespaced_custom_object(*PYTORCHJOBS[:2], owner.namespace, PYTORCHJOBS[2],
                                                              owner.name, _preload_content=False,
                                                              _request_timeout=self.timeout)
        return json.loads(answer.data)

    def patch(self, owner: Owner, body: Mapping[str, Any]) -> None:
        """A merge patch of `owner`, with its uid as a precondition (the API server answers 409 when the object by
        that name is another one)."""
        body = {**body, "metadata": {"uid": owner.uid}} if owner.uid else body
        if owner.kind == "Job":
            self.batch.patch_namespaced_job(owner.name, owner.namespace, dict(body), _content_type=MERGE,
                                            _preload_content=False, _request_timeout=self.timeout)
        else:
            self.custom.patch_namespaced_custom_object(*PYTORCHJOBS[:2], owner.namespace, PYTORCHJOBS[2], owner.name,
                                                       dict(body), _content_type=MERGE, _preload_content=False,
                                                       _request_timeout=self.timeout)
