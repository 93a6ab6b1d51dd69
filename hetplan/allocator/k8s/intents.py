"""Preemptions of bare pods, made durable: the ConfigMap `<name>-preempted`, one entry per pod.

A bare pod (no owner to create it again) is preempted as "checkpoint, evict, create it again gated". Its entry is
written *before* the eviction and dropped once the pod exists again, so a leader that starts after a kill between
the eviction and the creation finishes the preemption (`Controller._restore_preemptions`). An entry's key is
`<namespace>.<name>` (a namespace has no dots); its value the JSON `{job, uid, seq, pod}`: the job, the evicted
pod's uid, the action's number and the pod as it is created again (`pods.recreated`).

Writes read first and carry the resourceVersion read (a 409: read and try again); only the leader writes.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from hetplan.allocator.k8s.cursor import read_config_map

log = logging.getLogger(__name__)

TRIES = 4  # read-modify-write attempts before a conflict is raised (retried in the controller's next pass)


def key_of(pod: tuple[str, str]) -> str:
    """The entry's key for the pod (namespace, name)."""
    return f"{pod[0]}.{pod[1]}"


def pod_of(key: str) -> tuple[str, str]:
    """The pod (namespace, name) an entry's key names."""
    namespace, _, name = key.partition(".")
    return namespace, name


class IntentStore:
    """The ConfigMap `namespace/name` of preemptions in progress (`core`: a kubernetes `CoreV1Api`)."""

    def __init__(self, core: Any, namespace: str, name: str, timeout: float = 10.0) -> None:
        self.core, self.namespace, self.name, self.timeout = core, namespace, name, timeout

    def _read(self) -> tuple[str | None, dict[str, str]]:
        """The resourceVersion (None: no ConfigMap) and the entries as stored."""
        return read_config_map(self.core, self.namespace, self.name, self.timeout)

    def load(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Every entry: pod (namespace, name) -> {job, uid, seq, pod}. An entry that cannot be read is logged and
        left out (dropped by the next write)."""
        out = {}
        for key, text in self._read()[1].items():
            try:
                entry = json.loads(text)
                out[pod_of(key)] = {"job": str(entry["job"]), "uid": str(entry["uid"]), "seq": int(entry["seq"]),
                                    "pod": dict(entry["pod"])}
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("controller: preemption entry %s in %s/%s not read (%s); ignored", key, self.namespace,
                            self.name, exc)
        return out

    def put(self, pod: tuple[str, str], job: str, uid: str, seq: int, body: dict[str, Any]) -> None:
        """Record the preemption of `pod` (idempotent: the same entry written again changes nothing)."""
        text = json.dumps({"job": job, "uid": uid, "seq": seq, "pod": body}, sort_keys=True)
        self._change(lambda data: data.__setitem__(key_of(pod), text))

    def drop(self, pod: tuple[str, str]) -> None:
        """Forget the preemption of `pod` (nothing when it has no entry)."""
        self._change(lambda data: data.pop(key_of(pod), None))

    def _change(self, edit: Any) -> None:
        """Read, `edit` the entries in place, write them with the resourceVersion read; a 409 reads again."""
        from kubernetes.client.exceptions import ApiException

        for attempt in range(TRIES):
            rv, data = self._read()
            before = dict(data)
            edit(data)
            if data == before:
                return
            body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"name": self.name, "namespace": self.namespace,
                                                 "labels": {"app.kubernetes.io/name": "hetplan"}},
                                    "data": data}
            try:
                if rv is None:
                    self.core.create_namespaced_config_map(self.namespace, body, _preload_content=False,
                                                           _request_timeout=self.timeout)
                else:
                    body["metadata"]["resourceVersion"] = rv
                    self.core.replace_namespaced_config_map(self.name, self.namespace, body, _preload_content=False,
                                                            _request_timeout=self.timeout)
                return
            except ApiException as exc:
                if exc.status != 409 or attempt == TRIES - 1:
                    raise


def report_key(seq: int, target: tuple[str, str]) -> str:
    """A report's key: the action's number, then the pod's (or Job's) namespace and name (no `/`: not a key's)."""
    return f"{seq}.{target[0]}.{target[1]}"


class ReportStore(IntentStore):
    """The ConfigMap `namespace/name` of checkpoint timeouts not yet reported to the allocator (`POST /v1/notes`),
    one entry per (action, pod): written *before* the eviction (or the Job's patch) that goes without a checkpoint,
    dropped once the note is logged. A leader that starts after a kill reports the entries whose eviction was done
    and drops the others (`Controller._restore_reports`); the service logs a note once however often it is sent.
    An entry's value: the JSON `{job, seq, what, ns, name, uid, grace, parts}` (`what`: preemption, move or
    rescale; `uid`: the pod's, `parts`: a rescale's new count)."""

    def load_reports(self) -> dict[str, dict[str, Any]]:
        """Every entry: key -> entry; one that cannot be read is logged and left out."""
        out = {}
        for key, text in self._read()[1].items():
            try:
                entry = json.loads(text)
                out[key] = {"job": str(entry["job"]), "seq": int(entry["seq"]), "what": str(entry["what"]),
                            "ns": str(entry["ns"]), "name": str(entry["name"]), "uid": str(entry.get("uid") or ""),
                            "grace": float(entry["grace"]), "parts": int(entry.get("parts") or 0)}
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("controller: report entry %s in %s/%s not read (%s); ignored", key, self.namespace,
                            self.name, exc)
        return out

    def put_report(self, entry: dict[str, Any]) -> str:
        """Record a report owed (idempotent); its key."""
        key = report_key(entry["seq"], (entry["ns"], entry["name"]))
        text = json.dumps(entry, sort_keys=True)
        self._change(lambda data: data.__setitem__(key, text))
        return key

    def drop_report(self, key: str) -> None:
        self._change(lambda data: data.pop(key, None))
