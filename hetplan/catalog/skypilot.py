"""Import a SkyPilot price catalog (`vms.csv` of skypilot-org/skypilot-catalog) as node shapes.

Each cloud's file has its own column order, so columns are addressed by header name. A file has one row per
instance type and zone (or region); the import keeps GPU instance types only, checks and corrects the known
quirks of the source (see `hetplan/data/upstream/prices/PRICES_PROVENANCE.md`) and collapses the rows to one
shape per instance type. What it skips or corrects it says in `CatalogImport.warnings`; what makes the file
unusable (a non-numeric cell, a missing column) raises `ContractError` naming every such cell.
"""

from __future__ import annotations

import ast
import logging
import math
import os
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from hetplan.catalog import gcp
from hetplan.contracts.catalog import CATALOG
from hetplan.contracts.table import ContractError, Problem, RowLabels, read_raw
from hetplan.gpus import UnknownGpuError, normalize_gpu

logger = logging.getLogger(__name__)

CLOUDS: tuple[str, ...] = ("aws", "gcp", "azure", "lambda")

# Plausible on-demand price of one GPU for one hour, in US$. The cheapest cloud GPUs (T4, fractional shares
# aside) rent for about 0.1-0.5 $/GPU-h and the dearest (H100/H200 on-demand) for about 12-13 $/GPU-h; a price
# outside these bounds is a placeholder or an error in the source (GCP writes 700.0 for TPUs in regions that do
# not offer them), not an offer.
MIN_PRICE_PER_GPU_HOUR = 0.05
MAX_PRICE_PER_GPU_HOUR = 15.0

# Known errors in the source, corrected on import: (cloud, InstanceType) -> (GPU count as the source gives it,
# the real GPU count, why). A correction applies only while the source still carries the wrong value.
GPU_COUNT_CORRECTIONS: dict[tuple[str, str], tuple[int, int, str]] = {
    ("azure", "Standard_ND96isr_H100_v5"): (12, 8, "the ND H100 v5 size has 8 H100 GPUs, per Azure's VM size docs"),
}

REQUIRED_COLUMNS: tuple[str, ...] = (
    "InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "Price", "Region",
)
NUMERIC_COLUMNS: tuple[str, ...] = ("AcceleratorCount", "vCPUs", "MemoryGiB", "Price", "SpotPrice")
_NON_NEGATIVE = frozenset({"AcceleratorCount", "vCPUs", "MemoryGiB", "SpotPrice"})
_GCP_ZONE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")
_MAX_NAMES = 8


@dataclass(frozen=True)
class CatalogImport:
    """The result of an import: the validated catalog frame and what was skipped or corrected, one line each."""

    shapes: pd.DataFrame
    warnings: list[str]


@dataclass(frozen=True)
class Offer:
    """One parsed source row: an instance type (or, on GCP, an accelerator) offered in one zone or region."""

    line: int
    instance: str
    accelerator: str | None
    gpus: float | None
    gpu_memory_gb: float | None
    vcpus: float | None
    mem_gb: float | None
    price: float | None
    spot: float | None
    region: str | None
    zone: str | None


def import_skypilot(
    path: str | os.PathLike[str], region: str | None = None, cloud: str | None = None
) -> CatalogImport:
    """Read a SkyPilot `vms.csv`, keep its GPU instance types and return one shape per instance type.

    `cloud` (aws|gcp|azure|lambda) is detected from the header when not given. With `region`, only that
    region's rows count; without, each shape takes its cheapest on-demand price over all regions and zones
    and records that region. Raises `ContractError` for unusable input.
    """
    name = str(path)
    raw, labels = read_raw(path)
    short = Path(name).name
    cloud = _resolve_cloud(name, raw, cloud)
    offers = _parse(raw, labels)
    regions = sorted({o.region for o in offers if o.region})
    if region is not None:
        if region not in regions:
            shown = ", ".join(regions) or "none"
            message = f"no rows for region {region!r}; the file has: {shown}"
            raise ContractError([Problem(name, message, column="Region")])
        offers = [o for o in offers if o.region == region]
    warnings: list[str] = []
    if cloud == "gcp":
        offers, gcp_warnings = gcp.combine_gcp_offers(offers)
        warnings += gcp_warnings
    offers, dup_warnings = _drop_duplicates(offers)
    warnings += dup_warnings
    kept, found_warnings = _classify(name, cloud, offers)
    warnings += found_warnings
    shapes = _collapse(name, cloud, kept)
    result = CatalogImport(shapes, [f"{short}: {w}" for w in warnings])
    logger.debug("imported %d %s shapes from %s (%d warnings)", len(shapes), cloud, name, len(warnings))
    return result


def detect_cloud(columns: Sequence[str], instance_types: Sequence[str] = (), zones: Sequence[str] = ()) -> str:
    """Tell the cloud of a SkyPilot `vms.csv` from its header (and, to tell GCP from AWS, its rows).

    Azure's header has `Generation`; GCP's and AWS's have `AvailabilityZone`, and a GCP file has accelerator
    rows with an empty `InstanceType` or zones named like `us-central1-a`; Lambda's has neither.
    """
    if "Generation" in columns:
        return "azure"
    if "AvailabilityZone" in columns:
        if any(not str(t).strip() for t in instance_types) or any(_GCP_ZONE.match(str(z)) for z in zones):
            return "gcp"
        return "aws"
    return "lambda"


def _resolve_cloud(name: str, raw: pd.DataFrame, cloud: str | None) -> str:
    missing = [c for c in REQUIRED_COLUMNS if c not in raw.columns]
    if missing:
        raise ContractError(
            [Problem(name, "missing required column (is this a SkyPilot vms.csv?)", 1, c) for c in missing]
        )
    if cloud is None:
        zones = raw["AvailabilityZone"].tolist() if "AvailabilityZone" in raw.columns else []
        detected = detect_cloud(list(raw.columns), raw["InstanceType"].fillna("").tolist(), zones)
        logger.debug("%s: detected cloud %s", name, detected)
        return detected
    if cloud not in CLOUDS:
        raise ContractError([Problem(name, f"unknown cloud {cloud!r}; one of {', '.join(CLOUDS)}")])
    return cloud


def _parse(raw: pd.DataFrame, labels: RowLabels) -> list[Offer]:
    """Turn every source row into an `Offer`; raise `ContractError` naming every non-numeric cell."""
    problems: list[Problem] = []
    offers: list[Offer] = []
    for pos, row in enumerate(raw.to_dict("records")):
        numbers: dict[str, float | None] = {}
        for column in NUMERIC_COLUMNS:
            text = _text(row.get(column))
            numbers[column] = None
            if text is None:
                continue
            try:
                value = float(text)
            except ValueError:
                problems.append(labels.problem(pos, column, f"not a number: {text!r}"))
                continue
            if not math.isfinite(value):
                problems.append(labels.problem(pos, column, f"not a finite number: {text!r}"))
            elif column in _NON_NEGATIVE and value < 0:
                problems.append(labels.problem(pos, column, f"must not be negative, got {text}"))
            else:
                numbers[column] = value
        accelerator = _text(row.get("AcceleratorName"))
        offers.append(
            Offer(
                line=labels.rows[pos],
                instance=_text(row.get("InstanceType")) or "",
                accelerator=accelerator,
                gpus=numbers["AcceleratorCount"],
                gpu_memory_gb=_gpu_memory_gb(row.get("GpuInfo")) if accelerator else None,
                vcpus=numbers["vCPUs"],
                mem_gb=numbers["MemoryGiB"],
                price=numbers["Price"],
                spot=numbers["SpotPrice"],
                region=_text(row.get("Region")),
                zone=_text(row.get("AvailabilityZone")),
            )
        )
    if problems:
        raise ContractError(problems)
    return offers


def _text(value: object) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value).strip()
    return text or None


def _gpu_memory_gb(info: object) -> float | None:
    """Memory of one GPU from SkyPilot's `GpuInfo` (a Python literal dict; on Azure just the GPU name)."""
    text = _text(info)
    if text is None or not text.startswith("{"):
        return None
    try:
        parsed = ast.literal_eval(text)
        mib = parsed["Gpus"][0]["MemoryInfo"]["SizeInMiB"]
        return float(mib) / 1024.0
    except (ValueError, SyntaxError, TypeError, KeyError, IndexError, MemoryError, RecursionError):
        logger.debug("unreadable GpuInfo %r", text[:80])
        return None


def _drop_duplicates(offers: list[Offer]) -> tuple[list[Offer], list[str]]:
    """Keep the first row for each instance type and zone (or region); warn when the rows disagree."""
    groups: dict[tuple[str, str | None, str | None], list[Offer]] = defaultdict(list)
    for offer in offers:
        groups[(offer.instance, offer.region, offer.zone)].append(offer)
    warnings: list[str] = []
    kept: list[Offer] = []
    for (instance, region, zone), group in groups.items():
        kept.append(group[0])
        if len(group) == 1 or not instance:
            kept.extend(group[1:])
            continue
        if any(_differs(group[0], other) for other in group[1:]):
            lines = ", ".join(str(o.line) for o in group)
            where = zone or region
            warnings.append(f"{instance} in {where}: {len(group)} conflicting rows (lines {lines}); kept the first")
    kept.sort(key=lambda o: o.line)
    return kept, warnings


def _differs(a: Offer, b: Offer) -> bool:
    return any(getattr(a, f.name) != getattr(b, f.name) for f in fields(Offer) if f.name != "line")


@dataclass
class _Shape:
    offer: Offer
    gpu_type: str
    gpus: int


def _classify(name: str, cloud: str, offers: list[Offer]) -> tuple[list[_Shape], list[str]]:
    """Keep the offers that are priced GPU shapes; warn about (or, for bad cells, raise on) the rest."""
    problems: list[Problem] = []
    warnings: list[str] = []
    no_price: list[str] = []
    unknown: Counter[str] = Counter()
    fractional: list[str] = []
    implausible: list[str] = []
    corrected: Counter[str] = Counter()
    cpu_only = 0
    kept: list[_Shape] = []
    for offer in offers:
        if not offer.instance:
            problems.append(Problem(name, "missing value", offer.line, "InstanceType"))
            continue
        if offer.price is None:
            no_price.append(offer.instance)
            continue
        if offer.accelerator is None or not offer.gpus:
            cpu_only += 1
            continue
        try:
            gpu_type = normalize_gpu(offer.accelerator, offer.gpu_memory_gb)
        except UnknownGpuError:
            unknown[offer.accelerator] += 1
            continue
        gpus = offer.gpus
        correction = GPU_COUNT_CORRECTIONS.get((cloud, offer.instance))
        if correction is not None and gpus == correction[0]:
            gpus = correction[1]
            corrected[offer.instance] += 1
        if gpus != int(gpus):
            fractional.append(f"{offer.instance} ({gpus:g} GPUs)")
            continue
        per_gpu = offer.price / gpus
        if offer.price <= 0 or not MIN_PRICE_PER_GPU_HOUR <= per_gpu <= MAX_PRICE_PER_GPU_HOUR:
            implausible.append(f"{offer.instance} ({offer.price:g} $/h, {per_gpu:.4g} $/GPU-h)")
            continue
        problems += _host_problems(name, offer)
        kept.append(_Shape(offer, gpu_type, int(gpus)))
    if problems:
        raise ContractError(problems)
    for instance, rows in corrected.items():
        wrong, right, why = GPU_COUNT_CORRECTIONS[(cloud, instance)]
        warnings.append(f"{instance}: corrected AcceleratorCount {wrong} -> {right} ({_rows(rows)}): {why}")
    if no_price:
        warnings.append(f"skipped {_rows(len(no_price))} with no on-demand Price: {_names(no_price)}")
    if unknown:
        shown = ", ".join(f"{gpu!r} ({_rows(n)})" for gpu, n in sorted(unknown.items()))
        warnings.append(f"skipped {_rows(sum(unknown.values()))} with an unknown GPU type: {shown}")
    if fractional:
        warnings.append(f"skipped {_rows(len(fractional))} with a fractional GPU count: {_names(fractional)}")
    if implausible:
        warnings.append(
            f"skipped {_rows(len(implausible))} with an implausible price (outside {MIN_PRICE_PER_GPU_HOUR:g}-"
            f"{MAX_PRICE_PER_GPU_HOUR:g} $/GPU-h): {_names(implausible)}"
        )
    logger.debug("%s: skipped %d CPU-only rows", name, cpu_only)
    if not kept:
        raise ContractError([Problem(name, f"no priced GPU instance types left ({cpu_only} CPU-only rows)")])
    return kept, warnings


def _host_problems(name: str, offer: Offer) -> list[Problem]:
    problems: list[Problem] = []
    for column, value in (("vCPUs", offer.vcpus), ("MemoryGiB", offer.mem_gb)):
        if value is None:
            problems.append(Problem(name, f"missing value for GPU instance type {offer.instance}", offer.line, column))
        elif value <= 0:
            problems.append(Problem(name, f"must be positive, got {value:g}", offer.line, column))
    if offer.vcpus is not None and offer.vcpus != int(offer.vcpus):
        problems.append(Problem(name, f"not a whole number: {offer.vcpus:g}", offer.line, "vCPUs"))
    return problems


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _names(items: list[str]) -> str:
    unique = list(dict.fromkeys(items))
    shown = ", ".join(unique[:_MAX_NAMES])
    return shown + (f" and {len(unique) - _MAX_NAMES} more" if len(unique) > _MAX_NAMES else "")


def _collapse(name: str, cloud: str, kept: list[_Shape]) -> pd.DataFrame:
    """One shape per instance type: its cheapest on-demand offer, and the cheapest spot price in that region."""
    by_instance: dict[str, list[_Shape]] = defaultdict(list)
    for shape in kept:
        by_instance[shape.offer.instance].append(shape)
    records: list[dict[str, object]] = []
    lines: list[int] = []
    for instance, group in by_instance.items():
        best = min(group, key=lambda s: s.offer.price or 0.0)  # min() keeps the first of equal prices
        spots = [s.offer.spot for s in group if s.offer.region == best.offer.region and s.offer.spot is not None]
        records.append(
            {
                "name": f"{cloud}:{instance}",
                "gpu_type": best.gpu_type,
                "gpus": best.gpus,
                "vcpus": int(best.offer.vcpus or 0),
                "mem_gb": best.offer.mem_gb,
                "price_per_hour": best.offer.price,
                "available": None,
                "source": f"skypilot:{cloud}",
                "cloud": cloud,
                "region": best.offer.region,
                "spot_price_per_hour": min(spots) if spots else None,
            }
        )
        lines.append(best.offer.line)
    frame = pd.DataFrame.from_records(records, columns=CATALOG.column_names)
    return CATALOG.validate(frame, RowLabels(name, lines))
