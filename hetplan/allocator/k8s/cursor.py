"""The controller's cursor: the last applied action's number, in the ConfigMap `<name>-cursor` (key `cursor`).

Every write carries the resourceVersion last read or written (optimistic concurrency: a replica that lost the Lease
cannot overwrite a newer leader's cursor; a 409 says so). A write whose outcome is unknown (a 5xx, a 429, a
timeout or a broken connection: it may have been committed) or that conflicts (409) leaves the cursor *in doubt*:
the next write first reads the ConfigMap again, takes its resourceVersion, and only then writes. So one ambiguous
write costs one extra GET, never a wedge of stale-resourceVersion conflicts. A cursor that is in doubt and owned
by another writer is not overwritten: `CursorTaken` says another replica leads, and the store stays in doubt (every
later write reads first, and fails the same way) until `read` is called again by a replica that leads anew.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)


class CursorTaken(Exception):
    """The ConfigMap was written by another replica since this one last wrote it: it no longer leads."""


def read_config_map(core: Any, namespace: str, name: str, timeout: float) -> tuple[str | None, dict[str, str]]:
    """A ConfigMap's resourceVersion and data (None and nothing when it does not exist)."""
    from kubernetes.client.exceptions import ApiException

    try:
        answer = core.read_namespaced_config_map(name, namespace, _preload_content=False, _request_timeout=timeout)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return None, {}
    body = json.loads(answer.data)
    return body["metadata"]["resourceVersion"], dict(body.get("data") or {})


class CursorStore:
    """Read and write the cursor ConfigMap `namespace/name` (`core`: a kubernetes `CoreV1Api`)."""

    def __init__(self, core: Any, namespace: str, name: str, identity: str, timeout: float = 10.0) -> None:
        self.core, self.namespace, self.name, self.identity, self.timeout = core, namespace, name, identity, timeout
        self._rv: str | None = None  # the resourceVersion last read or written; None: no ConfigMap yet
        self._doubt = False  # the last write's outcome is unknown: read before writing again
        self.value: int | None = None  # the cursor as last read or written
        self.writer: str | None = None  # the replica that wrote it last (as last read or written)

    def read(self) -> int | None:
        """The stored cursor (None when there is none); takes its resourceVersion for the next write (the controller
        reads when it starts leading: what it then writes is its own)."""
        self._rv, data = read_config_map(self.core, self.namespace, self.name, self.timeout)
        self._doubt = False
        if self._rv is None:
            self.value, self.writer = None, None
            return None
        text = str(data.get("cursor", ""))
        self.value = int(text) if text.isdigit() else None
        self.writer = data.get("writer")
        return self.value

    def save(self, seq: int) -> None:
        """Write `seq`. In doubt (see the module's docstring) it reads first; an error leaves it in doubt."""
        from kubernetes.client.exceptions import ApiException

        if self._doubt:
            self.read()
            if self.writer not in (None, self.identity):
                self._doubt = True  # not cleared by the read: no later write may overwrite it unread
                raise CursorTaken(f"cursor {self.namespace}/{self.name} was written by {self.writer}")
            if self.value == seq:
                return  # the write in doubt was committed
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": self.name, "namespace": self.namespace,
                                             "labels": {"app.kubernetes.io/name": "hetplan"}},
                                "data": {"cursor": str(seq), "writer": self.identity}}
        try:
            if self._rv is None:
                answer = self.core.create_namespaced_config_map(self.namespace, body, _preload_content=False,
                                                                _request_timeout=self.timeout)
            else:
                body["metadata"]["resourceVersion"] = self._rv
                answer = self.core.replace_namespaced_config_map(self.name, self.namespace, body,
                                                                 _preload_content=False,
                                                                 _request_timeout=self.timeout)
        except ApiException as exc:
            self._doubt = True  # a 409 (someone wrote it), a 5xx or 429 (maybe committed): read before writing
            if exc.status == 409:
                log.info("controller: cursor write conflicted (409); it is read again before the next write")
            raise
        except Exception:
            self._doubt = True  # a timeout or a broken connection: maybe committed
            raise
        self._rv = json.loads(answer.data)["metadata"]["resourceVersion"]
        self.value, self.writer = seq, self.identity
