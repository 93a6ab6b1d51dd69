"""GCP GPU VMs: which host machine types carry which GPUs, and how SkyPilot's two kinds of row price them.

SkyPilot's GCP `vms.csv` prices a GPU VM in two parts: a host row (an a2/a3/g2/n1 machine type, with empty
accelerator columns) and an accelerator row (empty `InstanceType`; `AcceleratorName`, `AcceleratorCount` and a
per-zone `Price`). A GPU VM costs host + accelerators in the same zone, e.g. a2-highgpu-1g in us-central1-a =
0.73948 + 2.93391 (1 x A100) = 3.67339 $/h. Which hosts carry which GPUs is GCP's machine-type definition, below.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import TYPE_CHECKING

from hetplan.gpus import UnknownGpuError, normalize_gpu

if TYPE_CHECKING:
    from hetplan.catalog.skypilot import Offer

logger = logging.getLogger(__name__)

# Accelerator-optimized machine types come with a fixed GPU: machine-type pattern -> GPU type; the count is the
# number in the name (a2-highgpu-4g: 4 x A100).
FIXED_GPU_MACHINES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"a2-highgpu-(\d+)g"), "A100"),
    (re.compile(r"a2-megagpu-(16)g"), "A100"),
    (re.compile(r"a2-ultragpu-(\d+)g"), "A100-80GB"),
    (re.compile(r"a3-highgpu-(\d+)g"), "H100"),
)

# G2 machine types: vCPUs in the name -> number of L4 GPUs.
G2_L4_GPUS: dict[int, int] = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}

# GCP Compute Engine docs, GPU machine types (N1 attachable GPUs table): GPU type -> {GPU count: most vCPUs the
# n1 host may have with that many GPUs}. The table's memory limits never bind for n1-standard (3.75 GB/vCPU).
N1_ATTACHABLE_GPUS: dict[str, dict[int, int]] = {
    "T4": {1: 48, 2: 48, 4: 96},
    "V100": {1: 12, 2: 24, 4: 48, 8: 96},
    "P100": {1: 16, 2: 32, 4: 64},
}

_G2 = re.compile(r"g2-standard-(\d+)")
_N1 = re.compile(r"n1-standard-(\d+)")


def attachable_gpus(machine_type: str, vcpus: float | None = None) -> list[tuple[str, int]]:
    """Every (GPU type, GPU count) a GCP host machine type is sold with; empty for a CPU-only machine type.

    `vcpus` (the host row's vCPUs) decides which N1 combinations are allowed; the name's number when not given.
    """
    for pattern, gpu in FIXED_GPU_MACHINES:
        match = pattern.fullmatch(machine_type)
        if match:
            return [(gpu, int(match.group(1)))]
    match = _G2.fullmatch(machine_type)
    if match:
        count = G2_L4_GPUS.get(int(match.group(1)))
        return [("L4", count)] if count else []
    match = _N1.fullmatch(machine_type)
    if match:
        host_vcpus = vcpus if vcpus is not None else float(match.group(1))
        return [
            (gpu, count)
            for gpu, limits in N1_ATTACHABLE_GPUS.items()
            for count, max_vcpus in limits.items()
            if host_vcpus <= max_vcpus
        ]
    return []


def is_fixed_gpu_machine(machine_type: str) -> bool:
    """True for machine types that always carry GPUs (a2, a3, g2), False for N1 hosts and CPU-only types."""
    return any(p.fullmatch(machine_type) for p, _ in FIXED_GPU_MACHINES) or bool(_G2.fullmatch(machine_type))


def combination_name(machine_type: str, gpu: str, count: int) -> str:
    """The instance name of a GPU VM: the machine type, plus `+<count>x<GPU>` for an N1 host with attached GPUs."""
    return f"{machine_type}+{count}x{gpu}" if _N1.fullmatch(machine_type) else machine_type


def combine_gcp_offers(offers: list[Offer]) -> tuple[list[Offer], list[str]]:
    """Price GCP GPU VMs as host + accelerator rows of the same zone; return the VM offers and warnings.

    A combination is offered only in zones where both its host row and its accelerator row exist. Rows that
    already name both an instance type and an accelerator pass through as they are; CPU-only hosts pass through
    for the caller to count. Accelerator rows are consumed.
    """
    accelerators: dict[tuple[str | None, str | None, str, int], Offer] = {}
    for offer in offers:
        if offer.instance or not offer.accelerator or not offer.gpus:
            continue
        try:
            gpu = normalize_gpu(offer.accelerator, offer.gpu_memory_gb)
        except UnknownGpuError:
            logger.debug("GCP accelerator row %d: unknown accelerator %r", offer.line, offer.accelerator)
            continue
        accelerators.setdefault((offer.region, offer.zone, gpu, int(offer.gpus)), offer)

    result: list[Offer] = []
    unpriced: dict[str, bool] = {}
    for host in offers:
        if not host.instance:
            continue
        combos = [] if host.accelerator else attachable_gpus(host.instance, host.vcpus)
        if not combos:
            result.append(host)
            continue
        for gpu, count in combos:
            name = combination_name(host.instance, gpu, count)
            accelerator = accelerators.get((host.region, host.zone, gpu, count))
            if is_fixed_gpu_machine(host.instance):
                unpriced[name] = unpriced.get(name, True) and accelerator is None
            if accelerator is None:
                continue
            result.append(replace(
                host,
                instance=name,
                accelerator=gpu,
                gpus=float(count),
                gpu_memory_gb=None,
                price=_sum(host.price, accelerator.price),
                spot=_sum(host.spot, accelerator.spot),
            ))
    missing = [name for name, never in unpriced.items() if never]
    warnings = [f"skipped {len(missing)} GPU machine types with no accelerator price in any of their zones: "
                f"{', '.join(missing)}"] if missing else []
    return result, warnings


def _sum(host: float | None, accelerator: float | None) -> float | None:
    if host is None or accelerator is None:
        return None
    return round(host + accelerator, 6)
