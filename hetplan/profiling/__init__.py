"""The profiler: measure training throughput against CPU cores and RAM per GPU, on each GPU type.

    from hetplan.profiling import ProfileSettings, profile_gpu_type
    run = profile_gpu_type("image-pipeline", cpus="1,2", mem_gb="4,8", gpu_type="T4", out="profiles.csv")
    run.failed  # points recorded as failed (status=failed, error=..., no throughput)

## What a point is
One (cores, RAM) allocation for one GPU. The workload runs pinned to that many cores (CPU affinity set
before its first instruction, inherited by every worker; plus a cgroup CPU-time cap where writable) and
under a cgroup memory limit where writable (v2 `memory.max`, or v1 `memory.limit_in_bytes`). What was
enforced is recorded per point (`cpu_enforced`, `mem_enforced`, `enforcement`), and the affinity of every
live worker is read back from /proc at the end of the measurement. No limit is ever claimed that was not
written and read back. Cores come from this host's allowed set: the GPU's NUMA-local ones first, then the
lowest ids. A grid that asks for more cores or RAM than the host has is refused before anything runs.
Nothing outlives the harness: a SIGTERM stops the running point's process group and removes its
cgroups; after a SIGKILL the workload dies with it (parent-death signal) and the next run removes the
stale cgroups, killing anything left in them.

## The records
Profile records (`hetplan.contracts.PROFILES`), one per point: `num_gpus=1`, `throughput` in samples/s,
`source=measured:<hostname>`, `measured_at`, `status`, `error`, `repeats`, `spread`, `batch_size` (when
reported), `gpu_util` and `power_w` (means over the measured windows, NVML), plus the conditions:
`cpu_enforced`, `mem_enforced`, `enforcement` (in words), `cores` (ids), `workers`, `measured_s`,
`cpu_used` (cores the workload kept busy), `background_cpu` (cores' worth of time other processes took
on the same cores: a contended measurement when large; the harness warns), `gpu_mem_gb` (GPU memory used,
GiB), `gpu_name`, `driver`, `cpu_model`, `host_cores`, `workload`.

## The progress protocol (for your own training command)
Print, on stdout, one line per progress update and flush it:

    {"hetplan": 1, "samples": 12800}

`samples` is the cumulative number of training samples done so far (a number >= 0 that never decreases);
an optional `"batch_size": 64` is copied into the records. All other stdout lines are ignored. The harness
timestamps lines as they arrive. Warm-up runs for `warmup_s` from the first report (so imports, data
loading and compilation are never timed); then come `repeats` back-to-back windows of at least
`measure_s` each, each starting and ending on a report; throughput is samples/s per window, the record
holds the median (`throughput`), the window count (`repeats`) and `spread` = (max - min) / median.
Once the windows are done the harness stops the command: SIGTERM to its process group, SIGKILL after a
grace period. A command that exits non-zero, exits before one window completes, never reports, prints a
malformed report (bad JSON after `{"hetplan"`, another version, samples not a finite number >= 0 or going
backwards), exceeds the point's time limit, or is OOM-killed gives a failed point with that reason.

The command gets these environment variables (and runs with stdin closed):

| variable | value |
|---|---|
| `HETPLAN_CPUS` | cores for this point |
| `HETPLAN_MEM_GB` | RAM for this point, GiB |
| `HETPLAN_WORKERS` | data-loading workers to start: the core count (the main process shares those cores) |
| `HETPLAN_CORES` | the core ids it is pinned to, as a Linux cpu list (`0-3`) |
| `OMP_NUM_THREADS`, `MKL_NUM_THREADS`, `OPENBLAS_NUM_THREADS` | the core count (see below) |
| `CUDA_VISIBLE_DEVICES` | the UUID of the profiled GPU (when NVML found one), with `CUDA_DEVICE_ORDER=PCI_BUS_ID` |
| `PYTHONUNBUFFERED` | `1` |

`HETPLAN_WORKERS` equals the core count rather than one less: a GPU training loop mostly waits on the GPU,
so its main process shares the workers' cores. The thread-pool variables are set because many libraries
(OpenMP, BLAS) size their pools from the host's core count, not from the affinity.

Python workloads need not print: `module:function` or `file.py:function` is run by
`hetplan.profiling.entry`, which calls `function(report, **params)` with `report(n)` = n more samples
done, or iterates a generator function's yielded sample counts (see `entry`). The built-ins
(`image-pipeline`, `token-batch`, `resnet18`, `resnet50`) are such entry points (see `workloads`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Grid": "grid", "GridError": "grid", "Host": "grid", "Point": "grid", "host_facts": "grid", "make_grid": "grid",
    "Enforcement": "enforce", "pick_cores": "enforce",
    "GpuInfo": "telemetry", "GpuProbe": "telemetry", "Telemetry": "telemetry", "detect_gpu": "telemetry",
    "ProtocolError": "protocol", "Reporter": "protocol", "Schedule": "protocol", "allocation": "protocol",
    "parse_line": "protocol",
    "GpuTypeError": "harness", "PointResult": "harness", "ProfileRun": "harness", "ProfileSettings": "harness",
    "profile_gpu_type": "harness", "profile_point": "harness", "records_frame": "harness",
    "resolve_gpu_type": "harness",
    "BUILTINS": "workloads", "Workload": "workloads", "WorkloadError": "workloads",
    "builtin_workload": "workloads", "command_workload": "workloads", "entry_workload": "workloads",
    "resolve_workload": "workloads",
}
__all__ = [
    "BUILTINS", "Enforcement", "GpuInfo", "GpuProbe", "GpuTypeError", "Grid", "GridError", "Host", "Point",
    "PointResult", "ProfileRun", "ProfileSettings", "ProtocolError", "Reporter", "Schedule", "Telemetry",
    "Workload", "WorkloadError", "allocation", "builtin_workload", "command_workload", "detect_gpu",
    "entry_workload", "host_facts", "make_grid", "parse_line", "pick_cores", "profile_gpu_type", "profile_point",
    "records_frame", "resolve_gpu_type", "resolve_workload",
]

if TYPE_CHECKING:
    from hetplan.profiling.enforce import Enforcement, pick_cores
    from hetplan.profiling.grid import Grid, GridError, Host, Point, host_facts, make_grid
    from hetplan.profiling.harness import (
        GpuTypeError, PointResult, ProfileRun, ProfileSettings, profile_gpu_type, profile_point, records_frame,
        resolve_gpu_type,
    )
    from hetplan.profiling.protocol import ProtocolError, Reporter, Schedule, allocation, parse_line
    from hetplan.profiling.telemetry import GpuInfo, GpuProbe, Telemetry, detect_gpu
    from hetplan.profiling.workloads import (
        BUILTINS, Workload, WorkloadError, builtin_workload, command_workload, entry_workload, resolve_workload,
    )


def __getattr__(name: str) -> Any:
    # Imported on first use: workload processes import this package and should not pay for pandas.
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"hetplan.profiling.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'hetplan.profiling' has no attribute {name!r}")
