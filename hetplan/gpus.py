"""The GPU types hetplan knows, and how the many spellings of their names map to one canonical name.

Clouds, NVML, Kubernetes node labels and papers all spell GPUs differently ("Tesla V100-SXM2-16GB",
"NVIDIA-A100-SXM4-80GB", "A100-80GB", "V100M32", "RTX2080Ti"). Every stage of hetplan speaks the
canonical names below; `normalize_gpu` is the one place that translates.

The list is open: a type hetplan does not know (A800, H800, a vendor's own series name) is kept under a
cleaned spelling of its own name by `canonical_gpu` (upper case, dashes, no vendor prefix) so that files
naming it are read, not refused; the planner then plans it by its curves, a declared speed ratio
(`GpuDeclaration`), or else like the slowest GPU type it has curves for (`hetplan.planner.defaults`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class GpuType:
    """One canonical GPU type: its name and memory (GB) as NVIDIA's datasheet gives them."""

    name: str
    memory_gb: int


GPU_TYPES: tuple[GpuType, ...] = (
    GpuType("K80", 12),
    GpuType("M60", 8),
    GpuType("P100", 16),
    GpuType("V100", 16),
    GpuType("V100-32GB", 32),
    GpuType("T4", 16),
    GpuType("RTX2080Ti", 11),
    GpuType("RTX6000", 24),
    GpuType("A6000", 48),
    GpuType("A10", 24),
    GpuType("A10G", 24),
    GpuType("L4", 24),
    GpuType("L40S", 48),
    GpuType("A100", 40),
    GpuType("A100-80GB", 80),
    GpuType("H100", 80),
    GpuType("H200", 141),
    GpuType("GH200", 96),
)
GPU_NAMES: frozenset[str] = frozenset(g.name for g in GPU_TYPES)

REFERENCE: tuple[str, float, float] = ("V100", 3.0, 62.5)
"""The reference allocation, hetplan's unit of work: a V100 with Synergy's GPU-proportional share (24 cores
and 500 GB over 8 GPUs: 3 cores and 62.5 GB per GPU). Trace durations are times on it; normalised
throughput counts reference GPUs."""

CPU_ONLY = "CPU"
"""The label of measurements taken without a GPU (a workload on the host's CPU): never a GPU type. No catalog
shape has it, so the planner plans no node on its curves."""

# Ordered: the first pattern that matches the cleaned name wins, so specific names come before prefixes.
_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"^GH200", "GH200"),
    (r"^H200($|-)", "H200"),
    (r"^H100($|-)", "H100"),
    (r"^A100-.*80", "A100-80GB"),
    (r"^A100($|-)", "A100"),
    (r"^A10G", "A10G"),
    (r"^A10($|-)", "A10"),
    (r"^L40S", "L40S"),
    (r"^L4($|-)", "L4"),
    (r"^V100(M32|.*32)", "V100-32GB"),
    (r"^V100", "V100"),
    (r"^T4($|-)", "T4"),
    (r"^P100", "P100"),
    (r"^K80", "K80"),
    (r"^M60", "M60"),
    (r"^(RTX-?)?A6000", "A6000"),
    (r"^RTX-?6000$", "RTX6000"),
    (r"^RTX-?2080-?TI", "RTX2080Ti"),
)
_VENDOR_PREFIXES = ("NVIDIA-", "TESLA-", "GEFORCE-", "QUADRO-")


class UnknownGpuError(ValueError):
    """A GPU name that maps to no canonical type."""

    def __init__(self, name: str, opaque: bool = True) -> None:
        if opaque:
            super().__init__(f"unknown GPU type {name!r} (known: {', '.join(sorted(GPU_NAMES))})")
        else:
            super().__init__(f"{name!r} is not a GPU type name (letters, digits, '.', '+', '-')")
        self.name = name


@lru_cache(maxsize=1024)
def _match(name: str) -> str | None:
    cleaned = _clean(name)
    for pattern, canonical in _PATTERNS:
        if re.search(pattern, cleaned):
            return canonical
    return None


def _clean(name: str) -> str:
    cleaned = re.sub(r"[\s_]+", "-", name.strip().upper())
    for prefix in _VENDOR_PREFIXES:
        if cleaned.startswith(prefix):
            cleaned = cleaned[len(prefix) :]
    return cleaned


OPAQUE_NAME = re.compile(r"^[A-Z0-9][A-Z0-9.+-]{0,63}$")


def canonical_gpu(name: str, memory_gb: float | None = None) -> str:
    """The canonical name of a known GPU type, else the cleaned name of an unknown (opaque) one.

    Raises `UnknownGpuError` only for a name that cannot be a GPU type at all (empty, or characters other
    than letters, digits, '.', '+' and '-' after cleaning).
    """
    try:
        return normalize_gpu(name, memory_gb)
    except UnknownGpuError:
        cleaned = _clean(str(name)) if name is not None else ""
        if not OPAQUE_NAME.match(cleaned):
            raise UnknownGpuError(str(name), opaque=False) from None
        return cleaned


def normalize_gpu(name: str, memory_gb: float | None = None) -> str:
    """Return the canonical GPU type for any common spelling of `name`.

    `memory_gb`, when known (a cloud's GpuInfo, NVML), tells the 40 GB A100 from the 80 GB one and the
    16 GB V100 from the 32 GB one when the name alone does not. Raises `UnknownGpuError`.
    """
    canonical = _match(str(name)) if name is not None else None
    if canonical is None:
        raise UnknownGpuError(str(name))
    if memory_gb is not None:
        if canonical == "A100" and memory_gb >= 70:
            return "A100-80GB"
        if canonical == "V100" and memory_gb >= 30:
            return "V100-32GB"
    return canonical


GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
"""The Kubernetes node label NVIDIA's GPU feature discovery sets to the GPU's product name (`K8S_PRODUCT`)."""

# The value NVIDIA's GPU feature discovery writes to the node label `nvidia.com/gpu.product` for the common
# board of each type (SXM where there is one); schedulers select GPU types by it.
K8S_PRODUCT: dict[str, str] = {
    "K80": "Tesla-K80", "M60": "Tesla-M60", "P100": "Tesla-P100-PCIE-16GB", "V100": "Tesla-V100-SXM2-16GB",
    "V100-32GB": "Tesla-V100-SXM2-32GB", "T4": "Tesla-T4", "RTX2080Ti": "NVIDIA-GeForce-RTX-2080-Ti",
    "RTX6000": "Quadro-RTX-6000", "A6000": "NVIDIA-RTX-A6000", "A10": "NVIDIA-A10", "A10G": "NVIDIA-A10G",
    "L4": "NVIDIA-L4", "L40S": "NVIDIA-L40S", "A100": "NVIDIA-A100-SXM4-40GB", "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "H100": "NVIDIA-H100-80GB-HBM3", "H200": "NVIDIA-H200", "GH200": "NVIDIA-GH200-480GB",
}


def gpu_label(name: str) -> str:
    """What a profiling run is labelled: a GPU type's canonical name, or `CPU_ONLY` for the host's CPU."""
    return CPU_ONLY if str(name).strip().upper() == CPU_ONLY else normalize_gpu(name)


def is_known_gpu(name: str) -> bool:
    """True when `name` normalises to a canonical GPU type."""
    return _match(str(name)) is not None


@dataclass(frozen=True)
class GpuDeclaration:
    """What an input file says about a GPU type hetplan does not know: the known type it runs like, how fast
    relative to that type, and its memory. Declared in a catalog or fleet file's optional columns
    `gpu_like`, `gpu_speed` (default 1.0) and `gpu_memory_gb`."""

    name: str
    like: str
    speed: float = 1.0
    memory_gb: float | None = None

