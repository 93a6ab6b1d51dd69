"""ASGI middleware: the request body limit (413 before anything is parsed) and per-route request metrics."""

from __future__ import annotations

import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hetplan.allocator.metrics import Metrics


class BodyLimit:
    """Refuse request bodies over a limit (413) before the application reads them.

    Checks Content-Length when given, and counts the streamed bytes either way (chunked bodies), buffering up
    to the limit; the application then reads the buffered body.
    """

    def __init__(self, app: ASGIApp, default: int, prefixes: dict[str, int] | None = None) -> None:
        self.app = app
        self.default = default
        self.prefixes = prefixes or {}

    def _limit(self, path: str) -> int:
        for prefix, limit in self.prefixes.items():
            if path.startswith(prefix):
                return limit
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit = self._limit(scope["path"])
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await _plain_error(send, 400, "Content-Length is not a number")
                    return
                if length > limit:
                    await _plain_error(send, 413, f"request body of {length} bytes exceeds the limit of {limit}")
                    return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > limit:
                await _plain_error(send, 413, f"request body exceeds the limit of {limit} bytes")
                return
            if not message.get("more_body", False):
                break
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _plain_error(send: Send, status: int, detail: str) -> None:
    payload = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})


class RequestMetrics:
    """Count requests and time them (by route template, so that the label set stays small)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe_http(scope["method"], route, status, time.perf_counter() - start)
