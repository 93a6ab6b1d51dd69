"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

`LeaseElector.lead()` acquires or renews the Lease and says whether this replica leads now. A Lease held by
another replica is taken over only once its record has not changed for `duration` seconds *as this replica
observed it* (its own monotonic clock, as client-go: no trust in other machines' clocks). Every write carries
the resourceVersion read, so two replicas that try at once cannot both succeed (409 Conflict for one of them).
A leader counts as leading until `renew_deadline` after its last successful renewal: it stops acting before
another replica may take over (`duration` > `renew_deadline`).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

log = logging.getLogger(__name__)


def _micro_time() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """One replica's view of the Lease `namespace/name` (`coordination`: a `CoordinationV1Api`)."""

    def __init__(self, coordination: Any, namespace: str, name: str, identity: str, duration: float = 15.0,
                 renew_deadline: float | None = None, request_timeout: float = 10.0) -> None:
        self.api, self.namespace, self.name, self.identity = coordination, namespace, name, identity
        self.duration = duration
        self.renew_deadline = renew_deadline if renew_deadline is not None else duration * 2 / 3
        self.request_timeout = request_timeout
        self._observed: tuple[str, str, str] | None = None  # (holder, renewTime, transitions) last seen
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # monotonic time of our last successful acquire/renew

    def leading(self) -> bool:
        """Whether this replica may act now (without asking the API server)."""
        return self._renewed_at is not None and time.monotonic() - self._renewed_at < self.renew_deadline

    def lead(self) -> bool:
        """Acquire or renew; whether this replica leads. API errors count as not leading (logged)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self._try()
        except ApiException as exc:
            if exc.status != 409:
                log.warning("leader election: HTTP %s %s on lease %s/%s", exc.status, exc.reason, self.namespace,
                            self.name)
        except Exception as exc:  # noqa: BLE001 - an unreachable API server is not leading, and is retried
            log.warning("leader election: %s", " ".join(f"{type(exc).__name__}: {exc}".split())[:300])
        return self.leading()

    def _spec(self, transitions: int, acquired: str | None = None) -> dict[str, Any]:
        now = _micro_time()
        return {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.duration)),
                "acquireTime": acquired or now, "renewTime": now, "leaseTransitions": transitions}

    def _try(self) -> bool:
        import json

        from kubernetes.client.exceptions import ApiException

        started = time.monotonic()
        try:
            answer = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                    _request_timeout=self.request_timeout)
            lease = json.loads(answer.data)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(0)}
            self.api.create_namespaced_lease(self.namespace, body, _preload_content=False,
                                             _request_timeout=self.request_timeout)
            self._won(started, "acquired (new lease)")
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime")), str(spec.get("leaseTransitions")))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        if holder and holder != self.identity and time.monotonic() - self._observed_at < self.duration:
            self._renewed_at = None
            return False  # held by another replica, still fresh
        transitions = int(spec.get("leaseTransitions") or 0)
        mine = holder == self.identity
        lease["spec"] = self._spec(transitions if mine else transitions + 1,
                                   spec.get("acquireTime") if mine else None)
        self.api.replace_namespaced_lease(self.name, self.namespace, lease, _preload_content=False,
                                          _request_timeout=self.request_timeout)
        self._won(started, "renewed" if mine else f"acquired (from {holder or 'nobody'})")
        return True

    def _won(self, started: float, how: str) -> None:
        if self._renewed_at is None:
            log.info("leader election: %s now leads (lease %s/%s %s)", self.identity, self.namespace, self.name, how)
        self._renewed_at = started  # counted from before the request: never longer than the API server's view

    def release(self) -> None:
        """Give the Lease up (a graceful stop): the next replica takes over at once."""
        import json

        if not self.leading():
            return
        try:
            answer = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False,
                                                    _request_timeout=self.request_timeout)
            lease = json.loads(answer.data)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"] = {**lease["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}
                self.api.replace_namespaced_lease(self.name, self.namespace, lease, _preload_content=False,
                                                  _request_timeout=self.request_timeout)
        except Exception as exc:  # noqa: BLE001 - best effort: the lease expires anyway
            log.info("leader election: release failed (%s); the lease expires on its own", type(exc).__name__)
        self._renewed_at = None
