"""The allocator service as the controller and the webhook call it (`hetplan serve`'s HTTP API), over httpx."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import httpx


class Gone(Exception):
    """`GET /v1/actions` answered 410: the cursor is older than the log or ahead of it; `latest` is the log's."""

    def __init__(self, latest: int | None, message: str) -> None:
        super().__init__(message)
        self.latest = latest


NOT_THE_REQUEST = {401, 403, 408, 429}
"""4xx that say nothing about the request itself (credentials, load): errors like any other, not a refusal."""


def refusal(exc: BaseException) -> str | None:
    """One line when `exc` is the service refusing the request itself (a 4xx but `NOT_THE_REQUEST`: a job id too
    long, a request out of range): its status and what it said; None for anything else."""
    if isinstance(exc, httpx.HTTPStatusError):
        code = exc.response.status_code
        if 400 <= code < 500 and code not in NOT_THE_REQUEST:
            return f"HTTP {code}: {' '.join(exc.response.text.split())[:200]}"
    return None


class AllocatorClient:
    """`allocate`, `adopt`, `release`, `actions`, `allocations` of one allocator service. `http`: an httpx.Client
    (the tests pass FastAPI's TestClient); `wait`: how long a call retries while the service cannot be reached (a
    restart), before the error is raised; `token`: the service's write token (`HETPLAN_WRITE_TOKEN`), sent as
    `Authorization: Bearer` with every call."""

    def __init__(self, url: str = "", http: httpx.Client | None = None, timeout: float = 10.0,
                 wait: float = 0.0, token: str | None = None) -> None:
        self.http = http if http is not None else httpx.Client(base_url=url, timeout=timeout)
        self.wait = wait
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        deadline = time.monotonic() + self.wait
        while True:
            try:
                return self.http.request(method, path, headers=self.headers, **kw)
            except httpx.TransportError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def allocate(self, body: Mapping[str, Any]) -> dict[str, Any]:
        answer = self._call("POST", "/v1/allocate", json=dict(body))
        answer.raise_for_status()
        return answer.json()

    def adopt(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """`POST /v1/adopt`: an allocation on `body["node"]` for a pod that already runs there."""
        answer = self._call("POST", "/v1/adopt", json=dict(body))
        answer.raise_for_status()
        return answer.json()

    def release(self, job_id: str) -> dict[str, Any]:
        answer = self._call("POST", "/v1/release", json={"job_id": job_id})
        answer.raise_for_status()
        return answer.json()

    def scale(self, job_id: str, parts: int) -> dict[str, Any]:
        """`POST /v1/scale`: gang `job_id` to `parts` parts (`status` `scaled` or `rejected`)."""
        answer = self._call("POST", "/v1/scale", json={"job_id": job_id, "parts": parts})
        answer.raise_for_status()
        return answer.json()

    def note(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """`POST /v1/notes`: a note about an action in the log (idempotent: `status` `logged` or `exists`)."""
        answer = self._call("POST", "/v1/notes", json=dict(body))
        answer.raise_for_status()
        return answer.json()

    def actions(self, since: int) -> dict[str, Any]:
        """`{latest, actions}` after `since`; `Gone` on 410."""
        answer = self._call("GET", "/v1/actions", params={"since": since})
        if answer.status_code == 410:
            detail = str(answer.json().get("detail", ""))
            found = re.search(r"latest (\d+)", detail)  # journal.TooOld's message: "..., latest N: list ..."
            raise Gone(int(found.group(1)) if found else None, detail)
        answer.raise_for_status()
        return answer.json()

    def latest(self) -> int:
        """The newest action's number (asks from far ahead: the 410 says it)."""
        try:
            return int(self.actions(2**62)["latest"])
        except Gone as exc:
            if exc.latest is None:
                raise
            return exc.latest

    def queued(self) -> set[str]:
        """The job ids waiting in the service's queue (`GET /v1/queue`)."""
        answer = self._call("GET", "/v1/queue")
        answer.raise_for_status()
        return {str(j["job_id"]) for j in answer.json()["jobs"]}

    def allocations(self) -> list[dict[str, Any]]:
        answer = self._call("GET", "/v1/allocations")
        answer.raise_for_status()
        return answer.json()

    def close(self) -> None:
        self.http.close()
