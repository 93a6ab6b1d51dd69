"""The profiler: protocol, windows, grid checks, enforcement seen from inside the workload, failures, CLI."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from hetplan.cli import app
from hetplan.contracts import PROFILES, ContractError
from hetplan.profiling import (
    GpuProbe, GpuTypeError, GridError, ProfileSettings, ProtocolError, Reporter, Schedule, WorkloadError,
    Workload, command_workload, detect_gpu, entry_workload, host_facts, make_grid, parse_line, pick_cores,
    profile_gpu_type, resolve_gpu_type, resolve_workload,
)
from hetplan.profiling.enforce import cgroup_mounts, remove_stale
from hetplan.profiling.grid import Host, Point, format_cores, parse_cores
from hetplan.profiling.harness import workload_env
from hetplan.profiling.protocol import Meter, Report
from hetplan.profiling.procs import Observation, cpu_use
from hetplan.profiling.telemetry import GpuInfo, Sample, Sampler
from hetplan.profiling.workloads.images import crop_box

HOST = host_facts()
FAST = ProfileSettings(warmup_s=0.2, measure_s=0.3, repeats=2, timeout_s=30, grace_s=2)
GPU = "T4"  # no GPU on the test machines: the type comes from the caller, as from --gpu-type

# Workload functions run by `hetplan.profiling.entry` in the profiled process (file.py:function form).
WORKLOADS = '''
import json, os, time
import multiprocessing as mp

def _mask(path):
    with open(path, "w") as handle:
        handle.write(",".join(str(c) for c in sorted(os.sched_getaffinity(0))))

def _spin(path, stop):
    _mask(path)
    while not stop.is_set():
        sum(range(1000))

def masks(report, out_dir, workers=2):
    """Each worker and the main process write the cores they may run on, as the kernel tells them."""
    folder = os.path.join(out_dir, "cpus" + os.environ["HETPLAN_CPUS"])
    os.makedirs(folder, exist_ok=True)
    context = mp.get_context("fork")
    stop = context.Event()
    procs = [context.Process(target=_spin, args=(os.path.join(folder, f"worker{i}"), stop), daemon=True)
             for i in range(workers)]
    for proc in procs:
        proc.start()
    _mask(os.path.join(folder, "main"))
    while True:
        time.sleep(0.01)
        report(10)

def limits(report, out_dir):
    """Write the memory limit this process is under, read from its own cgroups."""
    from hetplan.profiling.enforce import cgroup_mounts, remove_stale
    found = {}
    for mount in cgroup_mounts():
        for name in ("memory.max", "memory.limit_in_bytes"):
            path = mount.own / name
            if path.exists():
                found[name] = path.read_text().strip()
    with open(os.path.join(out_dir, "limits.json"), "w") as handle:
        json.dump({"limits": found, "env": os.environ["HETPLAN_MEM_GB"]}, handle)
    while True:
        time.sleep(0.01)
        report(1)

def hog(report, mb):
    """Touch `mb` MiB before reporting anything."""
    blocks = [b"\\x01" * (1 << 20) for _ in range(mb)]
    while True:
        time.sleep(0.01)
        report(len(blocks))

def steps(n=1000):
    """The generator form: yield samples per step."""
    for _ in range(n):
        time.sleep(0.005)
        yield 4
'''


@pytest.fixture
def wl(tmp_path: Path) -> Path:
    path = tmp_path / "wl.py"
    path.write_text(WORKLOADS)
    return path


def _sh(script: str, model: str = "cmd") -> Workload:
    return command_workload(textwrap.dedent(script), model)


LOOP = 'i=0; while true; do i=$((i+8)); echo "{\\"hetplan\\": 1, \\"samples\\": $i}"; sleep 0.02; done'


# --- protocol and windows -------------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "expected"), [
    ('{"hetplan": 1, "samples": 128}', (128.0, None)),
    ('  {"hetplan": 1, "samples": 12.5, "batch_size": 64}\n', (12.5, 64)),
    ("epoch 1 loss 0.3", None),
    ('{"loss": 0.3}', None),
    ('{"tool": "hetplan"}', None),
    ("", None),
])
def test_parse_line_reads_reports_and_ignores_other_output(line: str, expected: object) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize(("line", "reason"), [
    ('{"hetplan": 1, "samples": ', "not JSON"),
    ('{"hetplan": 2, "samples": 3}', "unsupported protocol version"),
    ('{"hetplan": 1, "samples": "lots"}', "finite number"),
    ('{"hetplan": 1, "samples": -1}', "finite number"),
    ('{"hetplan": 1, "samples": NaN}', "finite number"),
    ('{"hetplan": 1, "samples": true}', "finite number"),
    ('{"hetplan": 1}', "finite number"),
    ('{"hetplan": 1, "samples": 3, "batch_size": 0}', "batch_size"),
])
def test_parse_line_rejects_garbled_reports(line: str, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        parse_line(line)


def test_meter_discards_warmup_and_measures_back_to_back_windows() -> None:
    meter = Meter(Schedule(warmup_s=2, measure_s=3, repeats=2))
    # t: 0 1 2 3 4 5 6 7 8; 100 samples/s during warm-up, then 10/s
    for t, samples in [(0, 0), (1, 100), (2, 200), (3, 210), (4, 220), (5, 230), (6, 240), (7, 250), (8, 260)]:
        meter.add(Report(float(t), float(samples)))
    assert [(w.start_t, w.end_t) for w in meter.windows] == [(2, 5), (5, 8)]
    assert [w.throughput for w in meter.windows] == [10.0, 10.0]
    assert meter.done


def test_meter_refuses_samples_that_go_backwards() -> None:
    meter = Meter(Schedule(0, 1, 1))
    meter.add(Report(0.0, 10.0))
    with pytest.raises(ProtocolError, match="backwards"):
        meter.add(Report(0.5, 9.0))


def test_reporter_prints_cumulative_lines_and_flushes_the_last() -> None:
    out = io.StringIO()
    report = Reporter(out, min_interval_s=3600, batch_size=4)
    for _ in range(5):
        report(4)
    report.flush()
    lines = [parse_line(x) for x in out.getvalue().splitlines()]
    assert lines == [(4.0, 4), (20.0, 4)]  # the first at once, then rate-limited until flush
    with pytest.raises(ValueError):
        report(-1)


# --- grid, cores, cgroups --------------------------------------------------------------------------------

def test_grid_is_sorted_and_checked_against_the_host() -> None:
    host = Host("h", (0, 1, 2, 3), 16.0, "cpu")
    grid = make_grid("4,1,2,2", "8, 4", host)
    assert grid.cpus == (1, 2, 4) and grid.mem_gb == (4.0, 8.0) and len(grid.points()) == 6
    assert make_grid([1], None, host).mem_gb == (16.0,)
    with pytest.raises(GridError, match="asks for 8 cores but this host has 4 usable cores"):
        make_grid("1,8", "4", host)
    with pytest.raises(GridError, match="whole number"):
        make_grid("1.5", "4", host)
    with pytest.raises(GridError, match="32 GB but this host has 16.0 GB"):
        make_grid("1", "32", host)
    with pytest.raises(GridError, match="not a number"):
        make_grid("1,two", "4", host)


def test_too_many_cores_is_an_error_before_anything_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    workload = _sh(f"touch {marker}; {LOOP}")
    with pytest.raises(GridError, match="usable core"):
        profile_gpu_type(workload, cpus=f"1,{len(HOST.cores) + 1}", mem_gb="1", gpu_type=GPU, settings=FAST)
    assert not marker.exists()


def test_pick_cores_prefers_the_gpu_local_cores() -> None:
    assert pick_cores(2, (0, 1, 2, 3)) == (0, 1)
    assert pick_cores(2, (0, 1, 2, 3), preferred=(2, 3)) == (2, 3)
    assert pick_cores(3, (0, 1, 2, 3), preferred=(3, 9)) == (0, 1, 3)


def test_core_lists_round_trip() -> None:
    assert format_cores((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    assert parse_cores("0-3,8,10-11") == frozenset({0, 1, 2, 3, 8, 10, 11})


def test_cgroup_mounts_reads_v2_and_hybrid_layouts(tmp_path: Path) -> None:
    v2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
    [mount] = cgroup_mounts(v2, "0::/user.slice/session-1.scope\n")
    assert (mount.version, mount.own) == (2, Path("/sys/fs/cgroup/user.slice/session-1.scope"))
    hybrid = (
        "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    mounts = cgroup_mounts(hybrid, "4:memory:/docker/abc\n1:cpu,cpuacct:/x\n0::/\n")
    assert [(m.version, str(m.own)) for m in mounts] == [
        (2, "/sys/fs/cgroup/unified"), (1, "/sys/fs/cgroup/cpu/x"), (1, "/sys/fs/cgroup/memory")]


# --- GPU type and NVML -----------------------------------------------------------------------------------

def test_without_nvml_there_is_no_gpu_and_auto_is_refused() -> None:
    probe = detect_gpu()  # the real pynvml: nvmlInit() fails on a machine without the NVIDIA driver
    if probe.gpu is not None:
        pytest.skip(f"this machine has a GPU ({probe.gpu.name})")
    assert probe.reason
    with pytest.raises(GpuTypeError, match="cannot detect the GPU type"):
        resolve_gpu_type("auto", probe)
    assert resolve_gpu_type("Tesla T4", probe) == "T4"
    with pytest.raises(GpuTypeError, match="unknown GPU type"):
        resolve_gpu_type("TPUv4", probe)


def test_a_gpu_type_that_contradicts_the_gpu_found_is_refused() -> None:
    h200 = GpuProbe(GpuInfo(0, "NVIDIA H200", "H200", 150.1, "570.1", "GPU-1"))
    assert resolve_gpu_type("auto", h200) == "H200"
    with pytest.raises(GpuTypeError, match="T4 was given, but GPU 0 is a NVIDIA H200"):
        resolve_gpu_type("T4", h200)


def test_no_gpu_is_said_once_per_run(caplog: pytest.LogCaptureFixture) -> None:
    if detect_gpu().gpu is not None:
        pytest.skip("this machine has a GPU")
    with caplog.at_level(logging.WARNING, logger="hetplan.profiling"):
        run = profile_gpu_type(_sh(LOOP), cpus="1,2" if len(HOST.cores) > 1 else "1", mem_gb="1",
                               gpu_type=GPU, settings=FAST)
    assert sum("no GPU telemetry" in r.getMessage() for r in caplog.records) == 1
    assert run.records["gpu_util"].isna().all() and run.records["power_w"].isna().all()


def test_telemetry_is_averaged_over_the_measured_windows_only() -> None:
    sampler = Sampler(0)
    sampler.samples += [Sample(0.5, 99.0, 1.0, 300.0), Sample(1.0, 50.0, 2.0, 100.0), Sample(2.0, None, 3.0, 200.0),
                        Sample(3.0, 70.0, 2.5, None), Sample(9.0, 0.0, 9.0, 10.0)]
    summary = sampler.summary(1.0, 3.0)
    assert (summary.gpu_util, summary.power_w, summary.mem_gb, summary.samples) == (60.0, 150.0, 3.0, 3)


def test_cpu_use_splits_the_cores_busy_time_between_the_workload_and_others() -> None:
    start = Observation(10.0, group_cpu_s=5.0, cores_busy_s=100.0, affinity={})
    end = Observation(14.0, group_cpu_s=11.0, cores_busy_s=108.0, affinity={})
    assert cpu_use(start, end) == (1.5, 0.5)


# --- enforcement, seen from inside the workload ----------------------------------------------------------

def test_workers_run_on_exactly_the_points_cores(tmp_path: Path, wl: Path) -> None:
    grid = [c for c in (1, 2) if c <= len(HOST.cores)]
    workload = entry_workload(f"{wl}:masks", "masks", {"out_dir": str(tmp_path), "workers": 2})
    run = profile_gpu_type(workload, cpus=grid, mem_gb=[1], gpu_type=GPU, settings=FAST)
    assert run.failed == 0
    for result in run.results:
        n = result.point.cpus
        folder = tmp_path / f"cpus{n}"
        seen = {p.name: parse_cores(p.read_text()) for p in folder.iterdir()}
        assert sorted(seen) == ["main", "worker0", "worker1"]
        assert all(len(cores) == n for cores in seen.values()), seen
        assert all(cores == frozenset(result.enforcement.cores) for cores in seen.values())
        # The harness's own check read the same from /proc: launcher-exec'd main + 2 workers (+ fork helpers).
        assert "verified on" in result.enforcement.detail and result.enforcement.cpu_enforced
        # Two spinning workers never get more than the N cores' worth of CPU time, and keep those cores busy.
        assert result.cpu_used is not None and result.background_cpu is not None
        assert result.cpu_used <= n * 1.05 + 0.05
        assert result.cpu_used + result.background_cpu >= 0.7 * n


def test_the_memory_limit_is_real_or_reported_as_not_enforced(tmp_path: Path, wl: Path) -> None:
    workload = entry_workload(f"{wl}:limits", "limits", {"out_dir": str(tmp_path)})
    run = profile_gpu_type(workload, cpus="1", mem_gb="0.5", gpu_type=GPU, settings=FAST)
    [result] = run.results
    seen = json.loads((tmp_path / "limits.json").read_text())
    assert seen["env"] == "0.5"
    limits = [int(v) for v in seen["limits"].values() if v != "max" and int(v) < 2**50]
    if result.enforcement.mem_enforced:
        assert any(0.99 * 2**29 <= v <= 2**29 for v in limits), seen
        assert "memory 0.5 GiB (cgroup" in result.enforcement.detail
    else:
        assert not any(v <= 2**29 for v in limits), seen
        assert "memory not limited by cgroup" in result.enforcement.detail
    assert bool(run.records.loc[0, "mem_enforced"]) == result.enforcement.mem_enforced


def test_a_workload_over_its_memory_limit_is_a_failed_point(wl: Path) -> None:
    run = profile_gpu_type(entry_workload(f"{wl}:hog", "hog", {"mb": 1024}), cpus="1", mem_gb="0.25",
                           gpu_type=GPU, settings=FAST)
    [result] = run.results
    if not result.enforcement.mem_enforced:
        pytest.skip("no writable cgroup memory controller here: the limit is recorded as not enforced")
    assert not result.ok and "OOM killer" in (result.error or "")


def test_no_cgroups_are_left_behind(wl: Path) -> None:
    profile_gpu_type(_sh(LOOP), cpus="1", mem_gb="1", gpu_type=GPU, settings=FAST)
    for mount in cgroup_mounts():
        leftovers = [p.name for p in mount.own.glob(f"hetplan-{os.getpid()}-*")]
        assert leftovers == [], mount


HARNESS = """
import sys
from hetplan.profiling import ProfileSettings, command_workload, profile_gpu_type
marker = sys.argv[1]
loop = 'echo $$ > ' + marker + '; while true; do echo "{\\"hetplan\\": 1, \\"samples\\": 1}"; sleep 0.05; done'
profile_gpu_type(command_workload(loop, "x"), cpus="1", mem_gb="1", gpu_type="T4",
                 settings=ProfileSettings(warmup_s=600, measure_s=1, repeats=1, timeout_s=900))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_harness_leaves_no_workload_running(tmp_path: Path, sig: signal.Signals) -> None:
    script, marker = tmp_path / "harness.py", tmp_path / "workload.pid"
    script.write_text(HARNESS)
    harness = subprocess.Popen([sys.executable, str(script), str(marker)])
    try:
        deadline = time.monotonic() + 20
        while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        workload = int(marker.read_text())
        harness.send_signal(sig)
        harness.wait(timeout=20)
        deadline = time.monotonic() + 10
        while _running(workload) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(workload)
    finally:
        if harness.poll() is None:
            harness.kill()
    for mount in cgroup_mounts():  # SIGTERM: removed on the way out; SIGKILL: by the next harness
        remove_stale(mount.own)
        assert not list(mount.own.glob(f"hetplan-{harness.pid}-*"))


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# --- failures are points, not crashes --------------------------------------------------------------------

@pytest.mark.parametrize(("script", "reason"), [
    ('echo "CUDA error: out of memory" >&2; exit 3', "exited with code 3 before reporting progress: CUDA error"),
    ('echo "epoch 1"; echo "loss 0.5"', "exited without reporting progress; last output: epoch 1 | loss 0.5"),
    ('echo \'{"hetplan": 1, "samples": "lots"}\'; sleep 5', "malformed progress line"),
    ('echo \'{"hetplan": 1, "samples": 9}\'; echo \'{"hetplan": 1, "samples": 3}\'; sleep 5', "went backwards"),
    ('echo \'{"hetplan": 1, "samples": 9}\'', "before one measured window completed"),
    ("sleep 30", "timed out after 1.5 s (0 progress reports"),
    ('i=0; while true; do echo "{\\"hetplan\\": 1, \\"samples\\": 5}"; sleep 0.02; done', "no samples completed"),
    ("exec /nonexistent/trainer", "exited with code 127"),
])
def test_misbehaving_commands_give_failed_points_with_reasons(script: str, reason: str) -> None:
    settings = ProfileSettings(warmup_s=0.2, measure_s=0.3, repeats=2, timeout_s=1.5, grace_s=1)
    run = profile_gpu_type(_sh(script), cpus="1", mem_gb="1", gpu_type=GPU, settings=settings)
    [row] = run.records.to_dict("records")
    assert row["status"] == "failed" and reason in row["error"], row["error"]
    assert pd.isna(row["throughput"])  # never a zero


def test_a_failing_point_does_not_stop_the_others() -> None:
    if len(HOST.cores) < 2:
        pytest.skip("needs two cores")
    script = f'if [ "$HETPLAN_CPUS" = 1 ]; then echo "too slow" >&2; exit 1; fi; {LOOP}'
    run = profile_gpu_type(_sh(script), cpus="1,2", mem_gb="1", gpu_type=GPU, settings=FAST)
    assert list(run.records["status"]) == ["failed", "ok"] and run.failed == 1
    assert run.records.loc[1, "throughput"] > 0


# --- records ---------------------------------------------------------------------------------------------

def test_records_validate_and_carry_the_measurement_conditions(tmp_path: Path, wl: Path) -> None:
    out = tmp_path / "profiles.parquet"
    run = profile_gpu_type(entry_workload(f"{wl}:steps", "gen"), cpus="1", mem_gb="1,2", gpu_type="Tesla T4",
                           settings=FAST, out=out)
    frame = PROFILES.load(out)
    assert len(frame) == 2 and (frame["status"] == "ok").all()
    assert (frame["source"] == f"measured:{socket.gethostname()}").all()
    assert (frame["gpu_type"] == "T4").all() and (frame["num_gpus"] == 1).all()
    assert list(frame["repeats"]) == [2, 2] and (frame["spread"] >= 0).all()
    # ~4 samples every 5 ms (plus scheduling): a few hundred samples/s, not a made-up number
    assert frame["throughput"].between(50, 1000).all(), frame["throughput"]
    for column in ("cpu_enforced", "mem_enforced", "enforcement", "cores", "measured_s", "cpu_used", "background_cpu",
                   "cpu_model", "workload"):
        assert column in frame.columns
    assert run.records["measured_at"].notna().all()


def test_environment_sizes_thread_pools_and_cannot_override_the_allocation() -> None:
    mine = command_workload("true", "m", env={"OMP_NUM_THREADS": "7", "HETPLAN_CPUS": "64"})
    env = workload_env(mine, Point(2, 8.0), (0, 1), None)
    assert (env["HETPLAN_CPUS"], env["HETPLAN_WORKERS"], env["HETPLAN_MEM_GB"], env["HETPLAN_CORES"]) == (
        "2", "2", "8", "0-1")
    assert env["OMP_NUM_THREADS"] == "7" and env["OPENBLAS_NUM_THREADS"] == "2"
    assert "CUDA_VISIBLE_DEVICES" not in mine.env
    builtin = resolve_workload("image-pipeline", params={"data_dir": "/nonexistent"})
    assert workload_env(builtin, Point(2, 8.0), (0, 1), None)["OPENBLAS_NUM_THREADS"] == "1"  # NumPy step: 1 thread


def test_unknown_workloads_are_refused() -> None:
    with pytest.raises(WorkloadError, match="unknown workload"):
        resolve_workload("resnet-1001")
    with pytest.raises(WorkloadError, match="module:function"):
        entry_workload("no_colon")


# --- built-in workloads ----------------------------------------------------------------------------------

TINY_IMAGES = {"images": 8, "width": 96, "height": 72, "crop": 32, "batch_size": 4}


def test_image_pipeline_runs_with_one_worker_per_core(tmp_path: Path) -> None:
    params = {**TINY_IMAGES, "data_dir": str(tmp_path)}
    run = profile_gpu_type("image-pipeline", cpus="1", mem_gb="1", gpu_type=GPU, settings=FAST, params=params)
    [result] = run.results
    assert result.ok and result.throughput and result.throughput > 0, result.error
    assert len(list(tmp_path.glob("jpegs-8-96x72-*/*.jpg"))) == 8
    assert run.records.loc[0, "workload"].startswith("builtin:image-pipeline")


def test_token_batch_runs() -> None:
    params = {"batch_size": 4, "seq_len": 32, "corpus_tokens": 10_000, "vocab": 1000}
    run = profile_gpu_type("token-batch", cpus="1", mem_gb="1", gpu_type=GPU, settings=FAST, params=params)
    assert run.failed == 0 and run.records.loc[0, "throughput"] > 0


def test_resnet_workload_trains_on_cpu_when_torch_is_installed(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    params = {**TINY_IMAGES, "data_dir": str(tmp_path), "batch_size": 2, "device": "cpu", "classes": 10}
    settings = ProfileSettings(warmup_s=0.5, measure_s=1.0, repeats=1, timeout_s=120)
    run = profile_gpu_type("resnet18", cpus="1", mem_gb="2", gpu_type=GPU, settings=settings, params=params)
    assert run.failed == 0, run.results[0].error


def test_resnet_workload_says_it_needs_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(WorkloadError, match="needs torch"):
            resolve_workload("resnet50")
    else:
        assert resolve_workload("resnet50").model == "resnet50"


@given(st.integers(8, 2000), st.integers(8, 2000), st.integers(0, 2**32 - 1))
def test_random_resized_crop_box_stays_inside_the_image(width: int, height: int, seed: int) -> None:
    x0, y0, x1, y1 = crop_box(width, height, np.random.default_rng(seed))
    assert 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height
    aspect = (x1 - x0) / (y1 - y0)
    full = (x0, y0, x1, y1) == (0, 0, width, height)
    assert full or 3 / 4 * 0.9 <= aspect <= 4 / 3 * 1.1 or min(x1 - x0, y1 - y0) < 8


# --- CLI -------------------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_writes_records_and_exits_3_when_points_failed(tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    script = f'if [ "$HETPLAN_CPUS" = 1 ]; then exit 1; fi; {LOOP}' if len(HOST.cores) > 1 else "exit 1"
    cpus = "1,2" if len(HOST.cores) > 1 else "1"
    result = runner.invoke(app, ["profile", "--cmd", script, "--model", "mine", "--gpu-type", "V100", "--cpus", cpus,
                                 "--mem-gb", "1", "--repeats", "1", "--warmup-s", "0.2", "--measure-s", "0.3",
                                 "--out", str(out)])
    assert result.exit_code == 3, result.output
    frame = PROFILES.load(out)
    assert frame.loc[0, "status"] == "failed" and "exited with code 1" in frame.loc[0, "error"]
    assert (frame["model"] == "mine").all() and (frame["gpu_type"] == "V100").all()


def test_cli_all_points_measured_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "p.parquet"
    result = runner.invoke(app, ["profile", "--cmd", LOOP, "--model", "mine", "--gpu-type", "T4", "--cpus", "1",
                                 "--mem-gb", "1", "--repeats", "1", "--warmup-s", "0.2", "--measure-s", "0.3",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert PROFILES.load(out).loc[0, "throughput"] > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--cpus", "1,999"], "usable core"),
    (["--cpus", "1", "--gpu-type", "auto"], "cannot detect the GPU type"),
    (["--cpus", "1", "--model", ""], "needs --model"),
    (["--cpus", "1", "--workload", "token-batch"], "exactly one of"),
])
def test_cli_refuses_bad_options_before_running(tmp_path: Path, args: list[str], message: str) -> None:
    if "auto" in args and detect_gpu().gpu is not None:
        pytest.skip("this machine has a GPU")
    marker, out = tmp_path / "ran", tmp_path / "p.csv"
    base = {"--cmd": f"touch {marker}; {LOOP}", "--model": "m", "--gpu-type": "T4", "--mem-gb": "1", "--out": str(out)}
    for key, value in zip(args[::2], args[1::2], strict=True):
        base[key] = value
    result = runner.invoke(app, ["profile", *[x for kv in base.items() for x in kv]])
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    assert not marker.exists() and not out.exists()


def test_cli_refuses_an_output_it_cannot_write_before_running(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = runner.invoke(app, ["profile", "--cmd", f"touch {marker}", "--model", "m", "--gpu-type", "T4",
                                 "--cpus", "1", "--mem-gb", "1", "--out", str(tmp_path / "p.txt")])
    assert result.exit_code == 1 and "must end in .csv or .parquet" in result.output
    assert not marker.exists()


def test_api_refuses_an_output_suffix_before_running() -> None:
    with pytest.raises(ContractError):
        profile_gpu_type(_sh(LOOP), cpus="1", mem_gb="1", gpu_type=GPU, out="x.json")
