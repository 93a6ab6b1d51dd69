"""A minimal hook for the running hetplan allocator: ask it to reload the published hint table."""

from __future__ import annotations

import json
import urllib.request


class AllocatorHook:
    """POST `<base_url>/v1/hints/reload` (with a bearer token when given); return the decoded reply."""

    def __init__(self, base_url: str, token: str = "", timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def reload_hints(self) -> dict:
        request = urllib.request.Request(f"{self.base_url}/v1/hints/reload", data=b"{}", method="POST",
                                         headers={"Content-Type": "application/json"})
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 (configured URL)
            body = response.read()
        return json.loads(body) if body else {}
