"""`ProfilePodOperator`: the `KubernetesPodOperator` of the nightly DAG's pod path, fed by JSON mapped kwargs.

Mapped kwargs come from XCom, which carries JSON, not Kubernetes models; this subclass only turns the
`container_resources`, `volumes` and `volume_mounts` it receives as API dicts (`hetplan_airflow.pods`) into
models. Kept out of the package's `__init__` so that only the DAG using it imports the provider.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from kubernetes.client import ApiClient


def k8s_model(value: Any, kind: str) -> Any:
    """The Kubernetes model `kind` (e.g. "V1Volume") of an API dict; anything else passes through unchanged."""
    if not isinstance(value, dict):
        return value
    return ApiClient().deserialize(SimpleNamespace(data=json.dumps(value)), kind)


class ProfilePodOperator(KubernetesPodOperator):
    """A `KubernetesPodOperator` that also takes `container_resources`, `volumes`, `volume_mounts` as API dicts."""

    def __init__(self, *, container_resources: Any = None, volumes: list | None = None,
                 volume_mounts: list | None = None, **kwargs: Any) -> None:
        super().__init__(container_resources=k8s_model(container_resources, "V1ResourceRequirements"),
                         volumes=[k8s_model(v, "V1Volume") for v in volumes or ()],
                         volume_mounts=[k8s_model(m, "V1VolumeMount") for m in volume_mounts or ()], **kwargs)
