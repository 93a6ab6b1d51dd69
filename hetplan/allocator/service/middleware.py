"""What a request goes through before a route sees it: the body limit (413 before anything is parsed) and
per-route request metrics (ASGI middleware), and strict JSON bodies (`JSONRoute`)."""

from __future__ import annotations

import gc
import json
import math
import re
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import pydantic_core
from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
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
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                await _plain_error(send, 413, f"request body exceeds the limit of {limit} bytes")
                return
            if not message.get("more_body", False):
                break
        # one copy of a large body, in a worker thread (bytes.join copies without the GIL), not on the event loop
        body = await run_in_threadpool(b"".join, chunks) if size > THREADED_BODY_BYTES else b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
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


THREADED_BODY_BYTES = 64 * 1024
"""A JSON body larger than this is parsed, checked and validated in a worker thread (`JSONRoute`), not on the event
loop: a 32 MiB `/filter` body takes a second of CPU, which would make every other request wait."""


def parse_json(body: bytes) -> Any:
    """Parse a JSON body strictly (see `JSONRequest`): `json.JSONDecodeError` for text that is no JSON, and an
    `HTTPException` 422 naming where a number that is no finite float is."""
    try:
        parsed = pydantic_core.from_json(body)
    except ValueError as exc:
        raise _decode_error(str(exc), body.decode(errors="replace")) from None
    if not all_finite(parsed):
        where = non_finite(parsed) or []
        raise HTTPException(422, [{"type": "finite_number", "loc": ["body", *where],
                                   "msg": "Input should be a finite number"}])
    return parsed


class JSONRequest(Request):
    """A request whose JSON body is parsed strictly (pydantic's parser): text that is no UTF-8, or a `\\u` escape
    that is a lone surrogate (which Python's `json` lets through, and SQLite and the answer's encoding then fail on),
    is a JSON decode error like any other (FastAPI: 422). So is nesting deeper than the parser's limit (a few
    hundred levels). A number that is no finite float (`NaN`, `Infinity`, `1e309`, which the parser reads as inf)
    anywhere in the body is a 422 naming where it is (`non_finite`), before any model sees it: it could otherwise
    reach an untyped part of a body (a v1.Node handed back by `/filter`) and fail the answer's encoding. Duplicate
    keys: the last wins, as in Go's encoding/json (kube-scheduler) and Python's json.

    `JSONRoute` may have parsed (and validated) a large body already, in a worker thread: then `json()` hands back
    that value, or raises what the parse raised."""

    _json: Any
    _failed: Exception | None = None

    async def body(self) -> bytes:
        """The body, without a copy when it came in one piece (`BodyLimit` replays it so): Starlette's joins the
        piece with the stream's closing empty chunk, a copy of up to 32 MiB on the event loop."""
        if not hasattr(self, "_body"):
            chunks = [chunk async for chunk in self.stream() if chunk]
            self._body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return self._body

    async def json(self) -> Any:
        if self._failed is not None:
            raise self._failed
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


_paused = 0  # large bodies being handled (`old_generation_paused`), under `_paused_lock`
_paused_lock = threading.Lock()  # each event loop is one thread, but a process may run several (test clients)
_thresholds = gc.get_threshold()


@contextmanager
def old_generation_paused() -> Iterator[None]:
    """No collection of the oldest generation while a large body is handled (entered and left on the event loop).

    A 32 MiB body parses into about a million objects; each full collection then walks them all, 0.1-0.3 s with
    every thread stopped, several times a request. Young collections go on (cycles among new objects are still
    freed); the parsed body itself is freed by reference counting when the request ends, and the thresholds come
    back when the last large body is done: the count of bodies in flight and the threshold change together under
    a lock, so that concurrent bodies (on one event loop, or several) neither restore it early nor keep it."""
    global _paused, _thresholds
    with _paused_lock:
        if _paused == 0:
            _thresholds = gc.get_threshold()
            gc.set_threshold(_thresholds[0], _thresholds[1], 1 << 30)
        _paused += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused -= 1
            if _paused == 0:
                gc.set_threshold(*_thresholds)


_SCALARS = frozenset({str, int, bool, type(None)})
_SCALARS_FLOAT = _SCALARS | {float}


def all_finite(value: Any) -> bool:
    """Whether every float in `value` (parsed JSON: dicts, lists, scalars) is finite. The cheap pass over a large
    body: containers only, no paths kept; a container of scalars costs one `set(map(type, ...))` at C speed."""
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is not dict and type(value) is not list:
        return True
    stack = [value]
    pop, push, isfinite = stack.pop, stack.extend, math.isfinite
    while stack:
        item = pop()
        values = item.values() if type(item) is dict else item
        kinds = set(map(type, values))
        if kinds <= _SCALARS:
            continue
        if float in kinds and not all(isfinite(v) for v in values if type(v) is float):
            return False
        if dict in kinds or list in kinds:
            push([v for v in values if type(v) is dict or type(v) is list])
    return True


def non_finite(value: Any) -> list[str | int] | None:
    """The path (keys and indices) to the first float in `value` that is NaN or infinite, None if there is none
    (`all_finite` says whether to look: this walk keeps a path per container, at twice its cost)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return list(path)
            continue
        if isinstance(item, dict):
            keys, values = list(item), list(item.values())
        elif isinstance(item, list):
            keys, values = range(len(item)), item
        else:
            continue
        if set(map(type, values)) <= _SCALARS_FLOAT and all(map(math.isfinite, (v for v in values
                                                                  if type(v) is float))):
            continue  # scalars and finite floats only (at C speed): nothing under it to look at
        stack.extend((v, (*path, k)) for k, v in reversed(list(zip(keys, values))) if type(v) not in _SCALARS)
    return None


MAX_ERRORS = 50
"""A 422 lists at most this many errors (and says how many more there were)."""


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 (`{"detail": [{"loc", "msg", "type"}]}`) without the `input` and `ctx` it would echo: the
    input may be a huge or non-finite number (which no JSON encoder writes: once a 500) or a large part of the body.
    A JSON decode error keeps its reason in `msg`."""
    errors = exc.errors()
    total = getattr(exc, "total", len(errors))  # a body read in the worker process sends its first errors only
    detail = []
    for error in errors[:MAX_ERRORS]:
        msg = str(error.get("msg", ""))
        ctx = error.get("ctx")
        if error.get("type") == "json_invalid" and isinstance(ctx, dict) and ctx.get("error"):
            msg = f"{msg}: {str(ctx['error'])[:200]}"
        detail.append({"type": str(error.get("type", "")), "loc": [x if isinstance(x, int) else str(x)
                                                                    for x in error.get("loc", ())], "msg": msg})
    if total > MAX_ERRORS:
        detail.append({"type": "too_many_errors", "loc": ["body"], "msg": f"and {total - MAX_ERRORS} more errors"})
    return JSONResponse({"detail": detail}, status_code=422)


_WHERE = re.compile(r" at line (\d+) column (\d+)\Z")


def _decode_error(message: str, text: str) -> json.JSONDecodeError:
    """pydantic's "... at line L column C" as a `JSONDecodeError` at that offset (FastAPI's `loc`: body, offset)."""
    where = _WHERE.search(message)
    if where is None:
        return json.JSONDecodeError(message, text, 0)
    line, column = int(where[1]), int(where[2])
    start = 0
    for _ in range(line - 1):
        start = text.index("\n", start) + 1
    return json.JSONDecodeError(message[:where.start()], text, min(start + column - 1, len(text)))


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class JSONRoute(APIRoute):
    """A route whose request body, when it takes one, is JSON: a body of another (or no) Content-Type is refused
    (415) instead of being validated as bytes, and the JSON is parsed by `JSONRequest`. A body over
    `THREADED_BODY_BYTES` is parsed, checked and validated against the route's body model in a worker thread: the
    event loop only hands FastAPI the validated model (which it takes as is)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def json_body(request: Request) -> Response:
            strict = JSONRequest(request.scope, request.receive)
            body = await strict.body()
            if body and not _is_json(strict.headers.get("content-type")):
                raise HTTPException(415, "the body must be JSON (Content-Type: application/json)")
            if len(body) <= THREADED_BODY_BYTES:
                return await handler(strict)
            with old_generation_paused():
                try:
                    strict._json = await self.read_large(strict, body)
                except (json.JSONDecodeError, HTTPException) as exc:
                    strict._failed = exc  # FastAPI turns it into its 422 when it asks for the JSON
                return await handler(strict)

        return json_body

    async def read_large(self, request: Request, body: bytes) -> Any:
        """Read a body over `THREADED_BODY_BYTES`: here, `_read` in a worker thread (a route class may do more)."""
        return await run_in_threadpool(self._read, body)

    def _read(self, body: bytes) -> Any:
        """Parse and check a body, and validate it against the route's one body model (not the embedded kind):
        the model instance, which FastAPI then passes through; `RequestValidationError` as FastAPI would raise."""
        parsed = parse_json(body)
        if self._embed_body_fields or self.body_field is None:
            return parsed
        value, errors = self.body_field.validate(parsed, {}, loc=("body",))
        if errors:
            raise RequestValidationError(errors, body=parsed)
        return value


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    """A 405 whose `Allow` lists every method the path answers: Starlette's names only the first route matching the
    path (`GET /v1/nodes` and `POST /v1/nodes` are two routes), and RFC 9110 wants them all."""
    from starlette.routing import Match

    allowed: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches({**request.scope, "method": "\x00"})
        if match is Match.PARTIAL and getattr(route, "methods", None):
            allowed |= set(route.methods)
    if "GET" in allowed:
        allowed.add("HEAD")
    return JSONResponse({"detail": "Method Not Allowed"}, status_code=405,
                        headers={"Allow": ", ".join(sorted(allowed))})
