"""NVML telemetry: which GPU this is (mapped to a catalog GPU type), and its utilisation, memory and power.

`detect_gpu` answers a `GpuProbe`: the GPU's facts, or why there are none (no NVML library, no driver,
no device at that index). `Sampler` polls one GPU in a background thread; `Sampler.summary(start, end)`
averages the samples that fall in the measured windows.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hetplan.gpus import UnknownGpuError, normalize_gpu

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    """One NVML device: its NVML index, name, canonical type, memory, driver, UUID and NUMA-local cores."""

    index: int
    name: str
    gpu_type: str | None
    memory_gb: float
    driver: str
    uuid: str
    local_cores: tuple[int, ...] = ()


@dataclass(frozen=True)
class GpuProbe:
    """The answer of `detect_gpu`: `gpu` when a device was found, else `reason`."""

    gpu: GpuInfo | None
    reason: str = ""


def _nvml() -> Any:
    import pynvml  # nvidia-ml-py; imported late so the profiler runs where it is not installed

    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def detect_gpu(index: int = 0) -> GpuProbe:
    """Probe GPU `index` through NVML; never raises for a missing GPU, library or driver."""
    try:
        nvml = _nvml()
    except ImportError:
        return GpuProbe(None, "nvidia-ml-py (pynvml) is not installed")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return GpuProbe(None, f"NVML unavailable: {exc}")
    try:
        count = nvml.nvmlDeviceGetCount()
        if not 0 <= index < count:
            return GpuProbe(None, f"no GPU at NVML index {index} ({count} found)")
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(nvml.nvmlDeviceGetName(handle))
        memory_gb = nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30  # GiB, as every memory figure in hetplan
        try:
            gpu_type: str | None = normalize_gpu(name, memory_gb)
        except UnknownGpuError:
            gpu_type = None
        return GpuProbe(GpuInfo(
            index=index, name=name, gpu_type=gpu_type, memory_gb=memory_gb,
            driver=_text(nvml.nvmlSystemGetDriverVersion()), uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            local_cores=_local_cores(nvml, handle),
        ))
    except nvml.NVMLError as exc:
        return GpuProbe(None, f"NVML error while probing GPU {index}: {exc}")
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _local_cores(nvml: Any, handle: Any) -> tuple[int, ...]:
    """The cores on the GPU's NUMA node (NVML's ideal CPU affinity), or () when NVML cannot say."""
    words = max(1, ((os.cpu_count() or 1) + 63) // 64)
    try:
        masks = nvml.nvmlDeviceGetCpuAffinity(handle, words)
    except (nvml.NVMLError, AttributeError):
        return ()
    return tuple(i * 64 + bit for i, mask in enumerate(masks) for bit in range(64) if int(mask) >> bit & 1)


@dataclass(frozen=True)
class Sample:
    """One telemetry sample (monotonic time; None where the GPU does not report that quantity)."""

    t: float
    util: float | None
    mem_gb: float | None
    power_w: float | None


@dataclass(frozen=True)
class Telemetry:
    """Telemetry over a measured span: mean GPU utilisation (%), mean power (W), peak memory used (GB)."""

    gpu_util: float | None
    power_w: float | None
    mem_gb: float | None
    samples: int


@dataclass
class Sampler:
    """Polls one GPU every `interval_s` in a daemon thread while the context is open."""

    index: int
    interval_s: float = 0.2
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        nvml = _nvml()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:  # telemetry is lost, the measurement is not
            log.warning("NVML failed to start (%s): no telemetry for this point", exc)
            return self
        self._thread = threading.Thread(target=self._run, args=(nvml,), name="hetplan-nvml", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is None:
            return
        self._thread.join(timeout=5.0)
        nvml = _nvml()
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()

    def _run(self, nvml: Any) -> None:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(self.index)
        except nvml.NVMLError as exc:
            log.warning("NVML cannot open GPU %d (%s): no telemetry for this point", self.index, exc)
            return
        while not self._stop.is_set():
            self.samples.append(Sample(time.monotonic(), *_read(nvml, handle)))
            self._stop.wait(self.interval_s)

    def summary(self, start: float, end: float) -> Telemetry:
        """Average the samples taken between `start` and `end` (monotonic seconds)."""
        inside = [s for s in list(self.samples) if start <= s.t <= end]
        return Telemetry(
            gpu_util=_mean([s.util for s in inside]),
            power_w=_mean([s.power_w for s in inside]),
            mem_gb=max((s.mem_gb for s in inside if s.mem_gb is not None), default=None),
            samples=len(inside),
        )


def _read(nvml: Any, handle: Any) -> tuple[float | None, float | None, float | None]:
    values: list[float | None] = []
    for read in (
        lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
        lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30,  # GiB
        lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
    ):
        try:
            values.append(read())
        except nvml.NVMLError:
            values.append(None)
    return values[0], values[1], values[2]


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
