"""Import an on-premises fleet (YAML or CSV) as node shapes, and load any catalog by what the file is.

YAML::

    source: onprem:dc1            # optional, default "onprem:<file stem>"
    prices: {per_gpu_hour: {V100: 0.9, A100: 1.6}, per_vcpu_hour: 0.02, per_gb_hour: 0.003}
    shapes:
      - {name: dc1-v100x8, gpu_type: V100, gpus: 8, vcpus: 48, mem_gb: 384, available: 12}

CSV: `name,gpu_type,gpus,vcpus,mem_gb,price_per_gpu_hour,price_per_vcpu_hour,price_per_gb_hour[,available]`.
A shape's price per hour = gpus x GPU price + vcpus x vCPU price + mem_gb x GB price (an internal charge-back
rate; 0 for hardware that costs nothing more to use).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from hetplan.catalog.skypilot import CatalogImport, import_skypilot
from hetplan.contracts.catalog import CATALOG
from hetplan.contracts.table import Column, ContractError, Problem, RowLabels, TableSchema, decode_text, read_input, read_raw
from hetplan.gpus import UnknownGpuError, canonical_gpu

logger = logging.getLogger(__name__)

YAML_SUFFIXES = frozenset({".yaml", ".yml"})
TOP_KEYS = frozenset({"source", "prices", "shapes"})
PRICE_KEYS = frozenset({"per_gpu_hour", "per_vcpu_hour", "per_gb_hour"})
SHAPE_KEYS = ("name", "gpu_type", "gpus", "vcpus", "mem_gb")
OPTIONAL_SHAPE_KEYS = ("available",)

_CATALOG_COLUMNS = {c.name: c for c in CATALOG.columns}
_SHAPE_COLUMNS = tuple(_CATALOG_COLUMNS[key] for key in SHAPE_KEYS)
_AVAILABLE = _CATALOG_COLUMNS["available"]
_PRICE_COLUMNS = tuple(Column(f"price_per_{unit}_hour", "float", min=0) for unit in ("gpu", "vcpu", "gb"))

ONPREM_SHAPES = TableSchema("on-prem shape list", (*_SHAPE_COLUMNS, _AVAILABLE), key=("name",))
ONPREM_CSV = TableSchema("on-prem shape table", (*_SHAPE_COLUMNS, *_PRICE_COLUMNS, _AVAILABLE), key=("name",))


def import_onprem(path: str | os.PathLike[str]) -> CatalogImport:
    """Read an on-prem fleet from YAML or CSV (by suffix) and price its shapes; raise `ContractError` if bad."""
    if Path(path).suffix.lower() in YAML_SUFFIXES:
        return _import_yaml(path)
    return _import_csv(path)


def load_catalog(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Load a node-shape catalog from whatever `path` is: hetplan's own catalog CSV or Parquet, an on-prem YAML
    or CSV, or a SkyPilot `vms.csv` (its import warnings are logged). Raise `ContractError` if it is unusable."""
    source = Path(path)
    if source.suffix.lower() in YAML_SUFFIXES:
        return import_onprem(path).shapes
    if source.suffix.lower() == ".csv" and source.is_file():
        columns = set(_csv_header(source))
        if "price_per_gpu_hour" in columns:
            return import_onprem(path).shapes
        if {"InstanceType", "AcceleratorName"} <= columns:
            imported = import_skypilot(path)
            for message in imported.warnings:
                logger.warning("%s", message)
            return imported.shapes
    return CATALOG.load(path)


def _csv_header(path: Path) -> list[str]:
    with path.open("rb") as handle:
        first = handle.readline(65536)
    try:
        return [c.strip().strip('"') for c in first.decode("utf-8-sig").strip().split(",")]
    except UnicodeDecodeError:
        return []


def _import_csv(path: str | os.PathLike[str]) -> CatalogImport:
    raw, labels = read_raw(path)
    typed = ONPREM_CSV.validate(raw, labels)
    price = (
        typed["gpus"].astype(float) * typed["price_per_gpu_hour"]
        + typed["vcpus"].astype(float) * typed["price_per_vcpu_hour"]
        + typed["mem_gb"] * typed["price_per_gb_hour"]
    )
    frame = typed[["name", "gpu_type", "gpus", "vcpus", "mem_gb"]].copy()
    frame["price_per_hour"] = price.round(6)
    frame["available"] = typed["available"]
    frame["source"] = f"onprem:{Path(path).stem}"
    return CatalogImport(CATALOG.validate(frame, labels), [])


def _import_yaml(path: str | os.PathLike[str]) -> CatalogImport:
    name = str(path)
    document, root = _read_yaml(name)
    problems: list[Problem] = []
    if not isinstance(document, dict):
        raise ContractError([Problem(name, "the top level must be a mapping with 'prices' and 'shapes'", 1)])
    for key in sorted(set(map(str, document)) - TOP_KEYS):
        problems.append(Problem(name, f"unknown key (expected {', '.join(sorted(TOP_KEYS))})", _line(root, key), key))
    source = document.get("source", f"onprem:{Path(name).stem}")
    if not isinstance(source, str) or not source.strip():
        problems.append(Problem(name, "must be a non-empty text", _line(root, "source"), "source"))
    per_gpu, per_vcpu, per_gb = _prices(name, document.get("prices"), _child(root, "prices"), problems)
    shapes = document.get("shapes")
    shape_nodes = _items(_child(root, "shapes"))
    if not isinstance(shapes, list) or not shapes:
        problems.append(Problem(name, "missing or empty list of shapes", _line(root, "shapes"), "shapes"))
        raise ContractError(problems)
    lines = [node.start_mark.line + 1 if node is not None else None for node in shape_nodes]
    lines += [None] * (len(shapes) - len(lines))
    records = [_shape_record(name, i, shape, lines[i], problems) for i, shape in enumerate(shapes)]
    labels = RowLabels(name, [line or i + 1 for i, line in enumerate(lines)])
    frame = pd.DataFrame.from_records(records, columns=[*SHAPE_KEYS, *OPTIONAL_SHAPE_KEYS])
    try:
        typed = _with_shape_index(lambda: ONPREM_SHAPES.validate(frame, labels), labels)
    except ContractError as exc:  # report these with the structural problems, each cell once
        reported = {(p.row, p.column) for p in problems}
        problems += [p for p in exc.problems if (p.row, p.column) not in reported and (p.row, None) not in reported]
        raise ContractError(problems) from None
    if problems:
        raise ContractError(problems)
    for pos, gpu_type in enumerate(typed["gpu_type"]):
        if gpu_type not in per_gpu:
            problems.append(labels.problem(pos, "gpu_type", f"shapes[{pos}]: no prices.per_gpu_hour for {gpu_type}"))
    if problems:
        raise ContractError(problems)
    out = typed[list(SHAPE_KEYS)].copy()
    price = typed["gpus"].astype(float) * typed["gpu_type"].map(per_gpu).astype(float)
    out["price_per_hour"] = (price + typed["vcpus"].astype(float) * per_vcpu + typed["mem_gb"] * per_gb).round(6)
    out["available"] = typed["available"]
    out["source"] = source.strip()
    return CatalogImport(_with_shape_index(lambda: CATALOG.validate(out, labels), labels), [])


def _read_yaml(name: str) -> tuple[Any, yaml.Node | None]:
    text = decode_text(name, read_input(name), "YAML")
    try:
        return yaml.safe_load(text), yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ContractError([Problem(name, f"not valid YAML: {reason}", mark.line + 1 if mark else None)]) from exc


def _child(node: yaml.Node | None, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if key_node.value == key:
                return value_node
    return None


def _line(node: yaml.Node | None, key: str) -> int | None:
    """The line (1-based) where `key` is written in mapping `node`, if it is."""
    if isinstance(node, yaml.MappingNode):
        for key_node, _ in node.value:
            if key_node.value == key:
                return key_node.start_mark.line + 1
    return None


def _items(node: yaml.Node | None) -> list[yaml.Node]:
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _price(value: Any) -> float | None:
    """A price as a float, or None when it is not a finite non-negative number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _prices(
    name: str, prices: Any, node: yaml.Node | None, problems: list[Problem]
) -> tuple[dict[str, float], float, float]:
    """Parse `prices`: per-GPU-type, per-vCPU and per-GB hourly prices (the latter two default to 0)."""
    if not isinstance(prices, dict):
        problems.append(Problem(name, "missing 'prices' mapping (per_gpu_hour, per_vcpu_hour, per_gb_hour)",
                                None, "prices"))
        return {}, 0.0, 0.0
    for key in sorted(set(map(str, prices)) - PRICE_KEYS):
        problems.append(Problem(name, f"unknown key (expected {', '.join(sorted(PRICE_KEYS))})",
                                _line(node, key), f"prices.{key}"))
    rates: list[float] = []
    for key in ("per_vcpu_hour", "per_gb_hour"):
        value = _price(prices.get(key, 0.0))
        if value is None:
            problems.append(Problem(name, f"must be a non-negative number, got {prices.get(key)!r}",
                                    _line(node, key), f"prices.{key}"))
        rates.append(value or 0.0)
    per_gpu: dict[str, float] = {}
    table = prices.get("per_gpu_hour")
    table_node = _child(node, "per_gpu_hour")
    if not isinstance(table, dict) or not table:
        problems.append(Problem(name, "missing mapping of GPU type -> price per GPU-hour",
                                _line(node, "per_gpu_hour"), "prices.per_gpu_hour"))
        return per_gpu, rates[0], rates[1]
    for gpu, value in table.items():
        where = (_line(table_node, str(gpu)), f"prices.per_gpu_hour.{gpu}")
        try:
            canonical = canonical_gpu(str(gpu))
        except UnknownGpuError as exc:
            problems.append(Problem(name, str(exc), *where))
            continue
        price = _price(value)
        if price is None:
            problems.append(Problem(name, f"must be a non-negative number, got {value!r}", *where))
            continue
        per_gpu[canonical] = price
    return per_gpu, rates[0], rates[1]


def _shape_record(name: str, index: int, shape: Any, line: int | None, problems: list[Problem]) -> dict[str, Any]:
    """Check one entry of `shapes` for missing and unknown keys; return it as a record."""
    if not isinstance(shape, dict):
        problems.append(Problem(name, f"shapes[{index}]: must be a mapping of {', '.join(SHAPE_KEYS)}", line))
        return {}
    for key in SHAPE_KEYS:
        if key not in shape:
            problems.append(Problem(name, f"shapes[{index}]: missing key", line, key))
    allowed = set(SHAPE_KEYS) | set(OPTIONAL_SHAPE_KEYS)
    for key in sorted(set(map(str, shape)) - allowed):
        problems.append(Problem(name, f"shapes[{index}]: unknown key (expected {', '.join(sorted(allowed))})",
                                line, key))
    return {key: _cell(shape.get(key)) for key in allowed}


def _cell(value: Any) -> Any:
    """YAML booleans are not numbers: pass them on as text so that validation rejects them."""
    return str(value) if isinstance(value, bool) else value


def _with_shape_index(validate: Callable[[], pd.DataFrame], labels: RowLabels) -> pd.DataFrame:
    """Run `validate`; prefix each problem's message with the shape it is about (`shapes[i]`)."""
    try:
        return validate()
    except ContractError as exc:
        index = {line: i for i, line in enumerate(labels.rows)}
        raise ContractError([
            Problem(p.file, f"shapes[{index[p.row]}]: {p.message}" if p.row in index else p.message, p.row, p.column)
            for p in exc.problems
        ]) from None
