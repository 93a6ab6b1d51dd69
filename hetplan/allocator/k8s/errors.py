"""An error as one log line (the controller's and the node sync's warnings)."""

from __future__ import annotations

import json

LIMIT = 300


def one_line(exc: BaseException) -> str:
    """A kubernetes `ApiException` as `HTTP <status> <reason>: <the API server's message>` (its str holds headers
    and the whole body); anything else as `<type>: <message>`; whitespace folded, at most 300 characters."""
    status = getattr(exc, "status", None)
    if status is not None and hasattr(exc, "reason"):
        body = getattr(exc, "body", None)
        try:
            message = str(json.loads(body).get("message", "")) if body else ""
        except (ValueError, AttributeError):
            message = ""
        text = f"HTTP {status} {exc.reason}{': ' + message if message else ''}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= LIMIT else text[:LIMIT] + "..."
