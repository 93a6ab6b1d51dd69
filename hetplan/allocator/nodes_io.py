"""Nodes from where they live: node files (CSV, YAML, JSON), a plan's chosen nodes, and batches for `POST /v1/nodes`.

Node file columns/keys: `name,gpu_type,gpus,vcpus,mem_gb` (the catalog's and the owned fleet's names; `cpus` is
read as `vcpus`), optional `count` (that many nodes named `<name>-1` ... `<name>-<count>`, so an owned-fleet
file serves as is) and, in YAML/JSON, `labels`. Extra CSV columns (`price_per_hour`, `gpu_like`, ...) are
ignored. `mem_gb` is **GiB**, the unit of the catalog and fleet files, handed unchanged to `Node.mem_gb`.
A CSV in Kubernetes-style units is read as well, as Alibaba's GPU cluster trace writes its node list:
`sn,cpu_milli,memory_mib,gpu,model` (name, millicores, MiB, GPUs, GPU model).
A GPU type hetplan does not know is kept as an opaque type (`hetplan.gpus.canonical_gpu`), never refused.

Every problem raises `NodeFileError` with one line naming the file, the row (the CSV line, header = 1; the YAML or
JSON item, from 1) and the field. Nothing is partly read: a file either yields all its nodes or none.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from hetplan.allocator.spec import Node

MAX_NODES = 100_000  # as one `POST /v1/nodes` batch
MAX_COUNT = 10_000  # nodes one row may stand for
_KEYS = {"name", "gpu_type", "gpus", "vcpus", "cpus", "mem_gb", "count", "labels"}
MILLI_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")  # Alibaba cluster-trace-gpu-v2023 node lists


class NodeFileError(ValueError):
    """A node file (or plan) that cannot be read: the message is one `file:row:field: problem` line."""


def load_nodes(path: str | os.PathLike[str]) -> list[Node]:
    """All nodes of a CSV, YAML or JSON node file (a list, or `{"nodes": [...]}`), or `NodeFileError`."""
    source = Path(path)
    if not source.exists():
        raise NodeFileError(f"{source}: no such file (made by `hetplan init --workspace DIR` as fleet.csv; or "
                            f"write one: name,gpu_type,gpus,vcpus,mem_gb[,count])")
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise NodeFileError(f"{source}: cannot read: {exc}") from None
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark (a spreadsheet's CSV) is no part of the first column
    except UnicodeDecodeError as exc:
        raise NodeFileError(f"{source}: cannot read: not UTF-8 text (byte {exc.start})") from None
    try:
        return _parse(source, text)
    except csv.Error as exc:  # a field over the csv module's limit, ...: read lazily, row by row
        raise NodeFileError(f"{source}: not a valid CSV file: {exc}") from None


def _parse(source: Path, text: str) -> list[Node]:
    """The nodes of `load_nodes`'s file `source`, its `text` decoded."""
    suffix = source.suffix.lower()
    if suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        fields = set(reader.fieldnames or ())
        if set(MILLI_COLUMNS) <= fields and not fields & {"name", "gpu_type", "gpus"}:
            rows = ((str(line), _from_milli(f"{source}:{line}", row)) for line, row in enumerate(reader, start=2))
            nodes = _collect(str(source), _parse_rows(str(source), rows, csv_file=True))
            if not nodes:
                raise NodeFileError(f"{source}: no nodes")
            return nodes
        missing = [k for k in ("name", "gpu_type", "gpus", "mem_gb") if k not in fields]
        if "vcpus" not in fields and "cpus" not in fields:
            missing.insert(3, "vcpus")
        if missing:
            raise NodeFileError(f"{source}:1: missing column(s) {', '.join(missing)} "
                                "(expected name,gpu_type,gpus,vcpus,mem_gb[,count])")
        rows: Iterable[tuple[str, Any]] = ((str(line), row) for line, row in enumerate(reader, start=2))
    elif suffix in (".yaml", ".yml", ".json"):
        try:
            data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise NodeFileError(f"{source}: not valid {suffix[1:].upper()}: {' '.join(str(exc).split())}") from None
        except RecursionError:
            raise NodeFileError(f"{source}: not a node file: {suffix[1:].upper()} nested too deeply") from None
        items = data.get("nodes") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise NodeFileError(f"{source}: expected a list of nodes or a mapping with key 'nodes'")
        rows = ((f"item {i}", item) for i, item in enumerate(items, start=1))
    else:
        raise NodeFileError(f"{source}: unknown node file type {suffix or '(none)'!r}: use .csv, .yaml, .yml or .json")
    nodes = _collect(str(source), _parse_rows(str(source), rows, csv_file=suffix == ".csv"))
    if not nodes:
        raise NodeFileError(f"{source}: no nodes")
    return nodes


def nodes_from_plan(path: str | os.PathLike[str]) -> list[Node]:
    """The nodes a plan chose (added plus owned), `count` of each shape named `<shape>-<i>`, with the shape's
    capacity (not allocatable) as the plan records it. Placeholders until real nodes register under their names."""
    from hetplan.contracts import ContractError, load_plan

    source = Path(path)
    try:
        plan = load_plan(source)
    except (ContractError, OSError, ValueError) as exc:
        raise NodeFileError(f"{source}: not a plan: {' '.join(str(exc).split())}") from None
    counts: dict[str, int] = {}
    for shape, n in [*plan.node_counts.items(), *plan.owned_nodes.items()]:
        counts[shape] = counts.get(shape, 0) + int(n)
    rows = []
    for shape, n in counts.items():
        if n < 1:
            continue
        if shape not in plan.shapes:
            raise NodeFileError(f"{source}:shapes:{shape}: the plan does not record this shape "
                                "(written before plans carried their shapes; re-run `hetplan plan`)")
        s = plan.shapes[shape]
        rows.append((f"shape {shape}", {"name": shape, "gpu_type": s.gpu_type, "gpus": s.gpus, "vcpus": s.vcpus,
                                        "mem_gb": s.mem_gb, "count": n}))
    nodes = _collect(str(source), _parse_rows(str(source), rows, csv_file=False))
    if not nodes:
        raise NodeFileError(f"{source}: the plan chose no nodes")
    return nodes


def node_batches(nodes: Iterable[Node], max_body_bytes: int) -> Iterator[dict[str, Any]]:
    """`POST /v1/nodes` bodies (`{"upsert": [...]}`) each at most `max_body_bytes` long as JSON, in order.

    For fleets larger than the service's body limit (`hetplan serve --max-body`, 64 KiB by default): each batch
    is all-or-nothing on its own, so a failed batch can be re-sent alone (upserts are idempotent).
    """
    batch: list[str] = []
    size = len('{"upsert": []}')
    for node in nodes:
        item = json.dumps(node.to_dict())
        if len(item) + size + 2 > max_body_bytes:
            if not batch:
                raise ValueError(f"node {node.name}: one node is {len(item)} bytes, over the body limit "
                                 f"{max_body_bytes}")
            yield json.loads('{"upsert": [' + ", ".join(batch) + "]}")
            batch, size = [], len('{"upsert": []}')
        batch.append(item)
        size += len(item) + 2
    if batch:
        yield json.loads('{"upsert": [' + ", ".join(batch) + "]}")


# ------------------------------------------------------------------ rows to nodes


def _parse_rows(source: str, rows: Iterable[tuple[str, Any]], csv_file: bool) -> Iterator[tuple[str, Node]]:
    for where, row in rows:
        at = f"{source}:{where}"
        if not isinstance(row, Mapping):
            raise NodeFileError(f"{at}: expected a mapping of node fields, got {type(row).__name__}")
        if not csv_file:
            unknown = sorted(set(map(str, row)) - _KEYS)
            if unknown:
                raise NodeFileError(f"{at}:{unknown[0]}: unknown field (fields: {', '.join(sorted(_KEYS))})")
        if csv_file and None in row:
            raise NodeFileError(f"{at}: more values than columns")
        cpus_key = "vcpus" if "vcpus" in row else "cpus"
        name = _text(at, "name", row.get("name"))
        gpu_type = _text(at, "gpu_type", row.get("gpu_type"))
        gpus = _whole(at, "gpus", row.get("gpus"), 1)
        cpus = _number(at, cpus_key, row.get(cpus_key))
        mem_gb = _number(at, "mem_gb", row.get("mem_gb"))
        count_raw = row.get("count")
        count = None if count_raw in (None, "") else _whole(at, "count", count_raw, 0, MAX_COUNT)
        labels = row.get("labels") or {}
        if not isinstance(labels, Mapping):
            raise NodeFileError(f"{at}:labels: expected a mapping of label names to values")
        names = [name] if count is None else [f"{name}-{i}" for i in range(1, count + 1)]
        for node_name in names:
            try:
                yield at, Node(node_name, gpu_type, gpus, cpus, mem_gb, labels)
            except ValueError as exc:
                raise NodeFileError(f"{at}:{_field_of(str(exc))}: {exc}") from None


def _from_milli(at: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """A `sn,cpu_milli,memory_mib,gpu,model` row as a node row (cores, GiB)."""
    if None in row:
        raise NodeFileError(f"{at}: more values than columns")
    return {"name": _text(at, "sn", row["sn"]), "gpu_type": _text(at, "model", row["model"]),
            "gpus": _whole(at, "gpu", row["gpu"], 1),
            "vcpus": _number(at, "cpu_milli", row["cpu_milli"]) / 1000,
            "mem_gb": _number(at, "memory_mib", row["memory_mib"]) / 1024}


def _collect(source: str, parsed: Iterable[tuple[str, Node]]) -> list[Node]:
    seen: dict[str, str] = {}
    nodes: list[Node] = []
    for at, node in parsed:
        if node.name in seen:
            raise NodeFileError(f"{at}:name: node {node.name!r} again (first at {seen[node.name]})")
        seen[node.name] = at.removeprefix(f"{source}:")
        nodes.append(node)
        if len(nodes) > MAX_NODES:
            raise NodeFileError(f"{at}: more than {MAX_NODES} nodes in one file")
    return nodes


def _text(at: str, field: str, value: Any) -> str:
    if value is None or not str(value).strip():
        raise NodeFileError(f"{at}:{field}: missing")
    return str(value).strip()


_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
"""A decimal number as a file writes one: ASCII digits only (Python's float() would also take "٤", "４", "1_000",
" 4" or "nan"), an optional sign, point and exponent."""


def _float(at: str, field: str, value: Any) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise NodeFileError(f"{at}:{field}: missing")
    if isinstance(value, bool) or len(str(value)) > 40:
        raise NodeFileError(f"{at}:{field}: not a number: {str(value)[:40]!r}")
    if isinstance(value, str) and not _NUMBER.fullmatch(value):
        raise NodeFileError(f"{at}:{field}: not a number: {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise NodeFileError(f"{at}:{field}: not a number: {str(value)!r}") from None
    if not math.isfinite(number):
        raise NodeFileError(f"{at}:{field}: not a finite number: {str(value)!r}")
    return number


def _number(at: str, field: str, value: Any) -> float:
    number = _float(at, field, value)
    if not 0 < number <= 1e9:
        raise NodeFileError(f"{at}:{field}: must be a number > 0 and <= 1e9, got {str(value)!r}")
    return number


def _whole(at: str, field: str, value: Any, low: int, high: int = 1024) -> int:
    number = _float(at, field, value)
    if number != int(number) or not low <= number <= high:
        raise NodeFileError(f"{at}:{field}: must be a whole number from {low} to {high}, got {str(value)!r}")
    return int(number)


def _field_of(message: str) -> str:
    if "GPU type" in message:
        return "gpu_type"
    for field in ("gpus", "cpus", "mem_gb"):
        if f"{field} must" in message:
            return "vcpus" if field == "cpus" else field
    return "name"
