"""The harness: measure a workload at every point of a cores x RAM grid on one GPU, into profile records.

Per point: choose the cores, set the limits (`enforce`), start the workload through the launcher with its
`HETPLAN_*` variables, sample the GPU (`telemetry`) while the protocol meter (`protocol`) runs the warm-up
and the measured windows, stop the process group, and record the median samples/s, the spread of the
windows, and how the limits were enforced. A point that fails (exits, never reports, reports garbage,
times out, is OOM-killed) is recorded as failed with the reason, never as zero, and the grid goes on.
"""

from __future__ import annotations

import logging
import os
import signal
import statistics
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

import pandas as pd

from hetplan.contracts import PROFILES
from hetplan.contracts.table import CSV_SUFFIXES, PARQUET_SUFFIXES, ContractError, Problem
from hetplan.gpus import CPU_ONLY, UnknownGpuError, normalize_gpu
from hetplan.profiling.enforce import Enforcement, Sandbox, enforcement, launcher_argv, pick_cores
from hetplan.profiling.grid import Host, Point, format_cores, host_facts, make_grid
from hetplan.profiling.procs import cpu_use, observe
from hetplan.profiling.protocol import ENV_CORES, ENV_CPUS, ENV_MEM_GB, ENV_WORKERS, Schedule, run_command
from hetplan.profiling.telemetry import GpuInfo, GpuProbe, Sampler, Telemetry, detect_gpu
from hetplan.profiling.workloads import Workload, resolve_workload

log = logging.getLogger(__name__)

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
THROUGHPUT_UNIT = "samples/s"
CONTENDED = 0.2  # warn when other processes take more than this share of a point's cores


class GpuTypeError(ValueError):
    """The GPU type cannot be determined, or contradicts the GPU that is there."""


@dataclass(frozen=True)
class ProfileSettings:
    """How long to measure: warm-up, window length and count per point, and the per-point time limit.

    `timeout_s=None` allows `startup_s` for start-up plus twice the warm-up and windows.
    """

    warmup_s: float = 10.0
    measure_s: float = 10.0
    repeats: int = 3
    timeout_s: float | None = None
    startup_s: float = 120.0
    grace_s: float = 5.0
    telemetry_interval_s: float = 0.2

    @property
    def schedule(self) -> Schedule:
        return Schedule(self.warmup_s, self.measure_s, self.repeats)

    @property
    def point_timeout_s(self) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        return self.startup_s + 2 * (self.warmup_s + self.repeats * self.measure_s)


@dataclass(frozen=True)
class PointResult:
    """One measured (or failed) point: per-window samples/s, their median, and the conditions.

    `cpu_used`: cores the workload's processes kept busy over the windows; `background_cpu`: cores' worth
    of time *other* processes took on the point's cores meanwhile (a contended, untrustworthy measurement
    when large).
    """

    point: Point
    windows: tuple[float, ...]
    error: str | None
    enforcement: Enforcement
    telemetry: Telemetry | None
    batch_size: int | None
    measured_s: float
    started_at: datetime
    cpu_used: float | None = None
    background_cpu: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def throughput(self) -> float | None:
        """Median samples/s over the windows; None for a failed point."""
        return statistics.median(self.windows) if self.ok and self.windows else None

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the windows: 0 for one window; None for a failed point."""
        median = self.throughput
        return (max(self.windows) - min(self.windows)) / median if median else None


@dataclass(frozen=True)
class ProfileRun:
    """A grid profiled on one GPU type: the point results and their validated profile records."""

    workload: Workload
    gpu_type: str
    probe: GpuProbe
    host: Host
    results: list[PointResult]
    records: pd.DataFrame

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.results)


def resolve_gpu_type(requested: str, probe: GpuProbe) -> str:
    """The catalog GPU type to record: detected for "auto", else the one given, checked against the GPU found."""
    found = probe.gpu
    if requested.strip().upper() == CPU_ONLY:
        return CPU_ONLY
    if requested.strip().lower() == "auto":
        if found is None:
            raise GpuTypeError(f"cannot detect the GPU type ({probe.reason}); give it, e.g. --gpu-type T4")
        if found.gpu_type is None:
            raise GpuTypeError(f"GPU {found.name!r} maps to no catalog GPU type; give the type explicitly")
        return found.gpu_type
    try:
        canonical = normalize_gpu(requested)
    except UnknownGpuError as exc:
        raise GpuTypeError(str(exc)) from None
    if found is not None and found.gpu_type is not None and found.gpu_type != canonical:
        raise GpuTypeError(
            f"GPU type {canonical} was given, but GPU {found.index} is a {found.name} ({found.gpu_type})"
        )
    return canonical


def workload_env(workload: Workload, point: Point, cores: tuple[int, ...], gpu: GpuInfo | None) -> dict[str, str]:
    """The workload's environment: ours, thread pools sized to the cores, its own, then the `HETPLAN_*` facts."""
    env = dict(os.environ)
    env.update({name: str(point.cpus) for name in THREAD_VARS})
    env["PYTHONUNBUFFERED"] = "1"
    if gpu is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
    env.update(workload.env)
    env.update({
        ENV_CPUS: str(point.cpus),
        ENV_MEM_GB: f"{point.mem_gb:g}",
        ENV_WORKERS: str(point.cpus),
        ENV_CORES: format_cores(cores),
    })
    return env


def profile_point(workload: Workload, point: Point, *, settings: ProfileSettings, host: Host,
                  gpu: GpuInfo | None = None) -> PointResult:
    """Measure one point; never raises for a workload that misbehaves (that is a failed point)."""
    cores = pick_cores(point.cpus, host.cores, gpu.local_cores if gpu is not None else ())
    started_at = datetime.now(UTC)
    with Sandbox(point.cpus, point.mem_gb) as sandbox:
        argv = launcher_argv(cores, sandbox.joins, list(workload.command))
        sampler = Sampler(gpu.index, settings.telemetry_interval_s) if gpu is not None else nullcontext()
        with sampler:
            outcome = run_command(argv, env=workload_env(workload, point, cores, gpu), schedule=settings.schedule,
                                  timeout_s=settings.point_timeout_s, observe=lambda pid, _: observe(pid, cores),
                                  grace_s=settings.grace_s)
        oom = sandbox.oom_kills()
        start, end = outcome.observed.get("start"), outcome.observed.get("end")
        enforced = enforcement(cores, sandbox, end.affinity if end is not None else None)
    used, background = cpu_use(start, end) if start is not None and end is not None else (None, None)
    if background is not None and background > CONTENDED * point.cpus:
        log.warning("%s at %s: other processes took %.2f of its %d cores during the measurement (contended)",
                    workload.model, point, background, point.cpus)
    windows = outcome.meter.windows
    error = outcome.error
    if oom:
        cause = f"the kernel OOM killer stopped {oom} process{'es' if oom > 1 else ''} at the {point.mem_gb:g} GB limit"
        error = f"{cause} ({error})" if error else f"{cause} during measurement"
    rates = tuple(w.throughput for w in windows)
    if error is None and statistics.median(rates) <= 0:
        error = "no samples completed in the measured windows"
    telemetry = None
    if isinstance(sampler, Sampler) and windows:
        telemetry = sampler.summary(windows[0].start_t, windows[-1].end_t)
    return PointResult(
        point=point, windows=rates if error is None else (), error=error, enforcement=enforced,
        telemetry=telemetry if error is None else None, batch_size=outcome.meter.batch_size,
        measured_s=sum(w.seconds for w in windows) if error is None else 0.0, started_at=started_at,
        cpu_used=used if error is None else None, background_cpu=background if error is None else None,
    )


def profile_gpu_type(
    workload: Workload | str,
    *,
    cpus: str | Sequence[float],
    mem_gb: str | Sequence[float] | None = None,
    gpu_type: str = "auto",
    settings: ProfileSettings | None = None,
    gpu_index: int = 0,
    out: str | os.PathLike[str] | None = None,
    model: str | None = None,
    params: Mapping[str, object] | None = None,
    on_start: Callable[[Point], None] | None = None,
    on_done: Callable[[PointResult], None] | None = None,
) -> ProfileRun:
    """Profile `workload` over the grid `cpus` x `mem_gb` on this host's GPU: the API the Airflow DAG calls.

    Everything that can be checked is checked before the first point runs (grid vs host, GPU type vs the
    GPU found, workload, output suffix): those raise `GridError`, `GpuTypeError`, `WorkloadError` or
    `ContractError`. Failed points do not raise: see `ProfileRun.failed`. With `out`, the records are
    written atomically (CSV or Parquet by suffix) once every point is done.
    """
    settings = settings or ProfileSettings()
    if out is not None and Path(out).suffix.lower() not in CSV_SUFFIXES | PARQUET_SUFFIXES:
        raise ContractError([Problem(str(out), "output must end in .csv or .parquet")])
    host = host_facts()
    grid = make_grid(cpus if isinstance(cpus, str) else list(cpus),
                     mem_gb if mem_gb is None or isinstance(mem_gb, str) else list(mem_gb), host)
    if isinstance(workload, str):
        workload = resolve_workload(workload, model, params)
    probe = detect_gpu(gpu_index)
    resolved = resolve_gpu_type(gpu_type, probe)
    if resolved == CPU_ONLY:
        log.info("profiling on the CPU (label %s: no GPU type)", CPU_ONLY)
    elif probe.gpu is None:
        log.warning("no GPU telemetry (%s): GPU type %s as given, gpu_util and power_w left empty",
                    probe.reason, resolved)
    else:
        log.info("GPU %d: %s (%s), driver %s", probe.gpu.index, probe.gpu.name, resolved, probe.gpu.driver)
    if workload.prepare is not None:
        workload.prepare()
    results: list[PointResult] = []
    with _sigterm_unwinds():
        for point in grid.points():
            if on_start is not None:
                on_start(point)
            result = profile_point(workload, point, settings=settings, host=host, gpu=probe.gpu)
            if not result.ok:
                log.warning("%s at %s failed: %s", workload.model, point, result.error)
            results.append(result)
            if on_done is not None:
                on_done(result)
    records = records_frame(results, workload=workload, gpu_type=resolved, host=host, gpu=probe.gpu)
    if out is not None:
        PROFILES.write(records, out)
    return ProfileRun(workload, resolved, probe, host, results, records)


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While the grid runs, SIGTERM raises SystemExit (if nothing else handles it), so the running point's
    process group is stopped and its cgroups removed instead of being left behind."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def records_frame(results: Sequence[PointResult], *, workload: Workload, gpu_type: str, host: Host,
                  gpu: GpuInfo | None) -> pd.DataFrame:
    """Profile records (validated against PROFILES) with the measurement conditions as extra columns."""
    rows = []
    for r in results:
        t = r.telemetry
        rows.append({
            "model": workload.model,
            "gpu_type": gpu_type,
            "num_gpus": 1,
            "cpus_per_gpu": float(r.point.cpus),
            "mem_gb_per_gpu": r.point.mem_gb,
            "throughput": r.throughput,
            "throughput_unit": THROUGHPUT_UNIT,
            "batch_size": r.batch_size,
            "gpu_util": t.gpu_util if t else None,
            "power_w": t.power_w if t else None,
            "source": f"measured:{host.name}",
            "measured_at": r.started_at.isoformat(),
            "status": "ok" if r.ok else "failed",
            "error": r.error,
            "repeats": len(r.windows) if r.ok else None,
            "spread": r.spread,
            "cpu_enforced": r.enforcement.cpu_enforced,
            "mem_enforced": r.enforcement.mem_enforced,
            "enforcement": r.enforcement.detail,
            "cores": format_cores(r.enforcement.cores),
            "workers": r.point.cpus,
            "measured_s": round(r.measured_s, 3),
            "cpu_used": _round(r.cpu_used),
            "background_cpu": _round(r.background_cpu),
            "gpu_mem_gb": t.mem_gb if t else None,
            "gpu_name": gpu.name if gpu else None,
            "driver": gpu.driver if gpu else None,
            "cpu_model": host.cpu_model,
            "host_cores": len(host.cores),
            "workload": workload.description,
        })
    return PROFILES.validate(pd.DataFrame(rows), "<profile run>")


def _round(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None
