"""What `/filter` and `/prioritize` need from an `ExtenderArgs` body (`ExtenderBody`), and reading a large body into
it in the worker process (`read_large`, run by `BodyWorker`).

Both paths end in `reduce_args`, so a body gets the same answer whichever reads it: a small body is parsed and
validated by FastAPI (or in a worker thread, `JSONRoute`) and reduced in the route's thread; one over
`PROCESS_BODY_BYTES` is parsed, checked, validated and reduced in the worker process, which hands back only the
reduction (the pod's class, the node names or their count, the candidates, the items re-encoded as one bytes) or
the error, in the form the service raises it (`raise_read_error`): the same 4xx with the same detail.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pydantic_core
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from hetplan.allocator.k8s import extender as k8s
from hetplan.allocator.k8s.pods import JOB_ID_KEY
from hetplan.allocator.service.middleware import MAX_ERRORS, parse_json
from hetplan.allocator.spec import Shape

PROCESS_BODY_BYTES = 1 << 20
"""An extender body over this many bytes is read in the worker process, not in a thread of the service."""


CandidateRow = tuple[str, "tuple[str, int, int, int] | None", "str | None", bool]
"""A `Candidate` of no known usage as plain values (name, shape, problem, neutral): a list of them unpickles 50
times faster than the dataclasses, and the unpickling holds the GIL."""


def candidate_row(c: k8s.Candidate) -> CandidateRow:
    shape = (c.shape.gpu_type, c.shape.gpus, c.shape.cpu_m, c.shape.mem_mib) if c.shape is not None else None
    return c.name, shape, c.problem, c.neutral


@dataclass(frozen=True)
class NodeItems:
    """Nodes mode: per item of the v1.NodeList, its candidate (`rows`) and `metadata.name`; for `/filter`'s answer,
    the items as JSON joined by commas (`encoded`, item i ends at `ends[i]`) and the NodeList without its items
    (`rest`)."""

    rows: list[CandidateRow]
    names: list[str]
    encoded: bytes = b""
    ends: tuple[int, ...] = ()
    rest: bytes = b"{}"

    def candidates(self) -> list[k8s.Candidate]:
        return [k8s.Candidate(name, Shape(*shape) if shape is not None else None, None, problem, neutral)
                for name, shape, problem, neutral in self.rows]


@dataclass(frozen=True)
class ExtenderBody:
    """An `ExtenderArgs` reduced to what the routes use. `pod` is None when the pod's request is no quantity
    (`pod_error`, the 400's detail). NodeNames mode: `name_count` names, listed in `names` unless over `limit`
    (then None: 413). Nodes mode: `nodes`."""

    pod: k8s.PodClass | None
    pod_error: str
    job: str | None  # the pod's `hetplan.io/job-id` annotation
    names: list[str] | None
    name_count: int
    known: int  # the nodes hetplan knew when the body was read
    limit: int  # the most NodeNames accepted then
    nodes: NodeItems | None


def encode_items(items: list[dict[str, Any]]) -> tuple[bytes, tuple[int, ...]]:
    """The items as JSON (as the answer's encoder writes them) joined by commas, and where each ends."""
    parts = [pydantic_core.to_json(item) for item in items]
    ends, end = [], -1
    for part in parts:
        end += len(part) + 1
        ends.append(end)
    return b",".join(parts), tuple(ends)


def reduce_args(args: k8s.ExtenderArgs, known: int, limit: int, encode: bool) -> ExtenderBody:
    """Reduce a validated body: the pod's class (or why it has none), the node names (Nodes wins when both are
    sent, as the routes always did), the candidates judged from a NodeList's items, and, with `encode` (`/filter`),
    the items re-encoded for the answer."""
    try:
        pod, pod_error = k8s.pod_class(args.pod), ""
    except ValueError as exc:
        pod, pod_error = None, f"Pod: {exc}"
    job = args.pod.metadata.annotations.get(JOB_ID_KEY) or None
    if args.nodes is not None:
        items = args.nodes.items
        nodes = NodeItems([candidate_row(k8s.node_candidate(raw)) for raw in items],
                          [k8s.item_name(raw) for raw in items])
        if encode:
            encoded, ends = encode_items(items)
            rest = pydantic_core.to_json(args.nodes.model_dump(exclude={"items"}))
            nodes = NodeItems(nodes.rows, nodes.names, encoded, ends, rest)
        return ExtenderBody(pod, pod_error, job, None, len(items), known, limit, nodes)
    names = args.node_names or []
    return ExtenderBody(pod, pod_error, job, names if len(names) <= limit else None, len(names), known, limit, None)


def read_large(body: bytes, known: int, limit: int, encode: bool) -> tuple[Any, ...]:
    """In the worker process: parse, check and validate `body` as `ExtenderArgs` (as `JSONRoute` would) and reduce
    it (`reduce_args`). ("ok", ExtenderBody), or the error, compact and picklable: ("json", msg, pos),
    ("http", status, detail) or ("invalid", errors (at most `MAX_ERRORS`, without their inputs), how many)."""
    gc.disable()  # about a million new objects, freed by reference counting: no collection walks them
    try:
        try:
            parsed = parse_json(body)
        except json.JSONDecodeError as exc:
            return "json", exc.msg, exc.pos
        except HTTPException as exc:
            return "http", exc.status_code, exc.detail
        try:
            args = k8s.ExtenderArgs.model_validate(parsed, from_attributes=True)  # as FastAPI validates a body
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False)
            return "invalid", [_compact(e) for e in errors[:MAX_ERRORS]], len(errors)
        del parsed
        return "ok", reduce_args(args, known, limit, encode)
    finally:
        gc.enable()


def spill(body: bytes) -> str:
    """Write `body` to a temporary file for the worker (`read_large_file`), and return its path. The file, not a
    pickle: pickling 32 MiB into the worker's queue is one copy under the GIL (80 ms seen), a file write is a
    system call without it. Call it in a thread; the caller deletes the file."""
    fd, path = tempfile.mkstemp(prefix="hetplan-body-")
    with os.fdopen(fd, "wb") as out:
        out.write(body)
    return path


def read_large_file(path: str, known: int, limit: int, encode: bool) -> tuple[Any, ...]:
    """`read_large` on the body in the file `path` (`spill`). Nodes mode with `encode`: the items' encoding goes
    back in a file beside it (`items_path`), not in the answer's pickle; the caller reads it (`fetch_items`). The
    body's file is left as it is, so a call retried on a fresh worker reads the body again."""
    read = read_large(Path(path).read_bytes(), known, limit, encode)
    if read[0] == "ok" and read[1].nodes is not None and encode:
        Path(items_path(path)).write_bytes(read[1].nodes.encoded)
        return "ok", replace(read[1], nodes=replace(read[1].nodes, encoded=b""))
    return read


def items_path(path: str) -> str:
    """Where `read_large_file` writes the items' encoding of the body in `path` (the caller deletes both)."""
    return path + ".items"


def fetch_items(path: str, body: ExtenderBody) -> ExtenderBody:
    """`body` with the items' encoding read from beside `path` when `read_large_file` wrote it (in a thread)."""
    if body.nodes is None or body.nodes.encoded or not body.nodes.ends:
        return body
    return replace(body, nodes=replace(body.nodes, encoded=Path(items_path(path)).read_bytes()))


def _compact(error: Any) -> dict[str, Any]:
    """A validation error as the 422 shows it (`middleware.validation_error`): type, loc under "body", msg, and a
    decode error's reason."""
    out = {"type": error["type"], "loc": ("body", *error["loc"]), "msg": error["msg"]}
    ctx = error.get("ctx")
    if error["type"] == "json_invalid" and isinstance(ctx, dict) and ctx.get("error"):
        out["ctx"] = {"error": str(ctx["error"])}
    return out


class TrimmedValidationError(RequestValidationError):
    """A `RequestValidationError` carrying only the first errors of `total` (`middleware.validation_error` says how
    many more there were)."""

    def __init__(self, errors: list[dict[str, Any]], total: int) -> None:
        super().__init__(errors)
        self.total = total


def raise_read_error(read: tuple[Any, ...]) -> None:
    """Raise what the service raises for the error `read_large` returned (nothing for "ok")."""
    kind = read[0]
    if kind == "json":
        error = json.JSONDecodeError(read[1], "", 0)
        error.pos = read[2]  # the offset in the body, which FastAPI's 422 names (the text stays in the worker)
        raise error
    if kind == "http":
        raise HTTPException(read[1], read[2])
    if kind == "invalid":
        raise TrimmedValidationError(read[1], read[2])
