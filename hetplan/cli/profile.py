"""`hetplan profile`: measure a workload's throughput over a cores x RAM grid on this host's GPU."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from hetplan.cli.common import console, contract_errors, warn
from hetplan.profiling import (
    BUILTINS, GpuTypeError, GridError, ProfileRun, ProfileSettings, WorkloadError, command_workload, host_facts,
    make_grid, profile_gpu_type, resolve_workload,
)
from hetplan.profiling.grid import Point
from hetplan.profiling.harness import PointResult

EXIT_POINTS_FAILED = 3


def profile(
    workload: str | None = typer.Option(
        None, "--workload",
        help=f"Built-in ({', '.join(BUILTINS)}) or a Python entry point module:function / file.py:function.",
    ),
    cmd: str | None = typer.Option(
        None, "--cmd", help='Your own training command (run by /bin/sh -c) printing {"hetplan": 1, "samples": N} lines.'
    ),
    model: str | None = typer.Option(None, "--model", help="Model name in the records (needed with --cmd)."),
    gpu_type: str = typer.Option("auto", "--gpu-type", help="auto (NVML) or a GPU type: T4, V100, A100, H100, ..."),
    gpu_index: int = typer.Option(0, "--gpu-index", min=0, help="NVML index of the GPU to profile."),
    cpus: str = typer.Option(..., "--cpus", help="Cores per GPU to measure, e.g. 1,2,4."),
    mem_gb: str | None = typer.Option(None, "--mem-gb", help="RAM per GPU (GiB), e.g. 8,16 (default: the host's RAM)."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Measured windows per point."),
    warmup_s: float = typer.Option(10.0, "--warmup-s", min=0, help="Warm-up from the first progress report."),
    measure_s: float = typer.Option(10.0, "--measure-s", min=0.01, help="Length of each measured window."),
    timeout_s: float | None = typer.Option(
        None, "--timeout-s", min=0.1, help="Time limit per point (default: start-up allowance + 2x the measuring time)."
    ),
    param: list[str] = typer.Option([], "--param", help="KEY=VALUE passed to the workload (JSON values); repeatable."),
    out: Path = typer.Option(..., "--out", help="Profile records to write (.csv or .parquet)."),
) -> None:
    """Profile a workload at every cores x RAM point; write profile records (source=measured:<host>).

    Exit codes: 0 every point measured; 3 some points failed (recorded as status=failed, file written);
    1 an output or contract problem; 2 bad options (nothing ran).
    """
    if (workload is None) == (cmd is None):
        raise typer.BadParameter("give exactly one of --workload or --cmd", param_hint="--workload/--cmd")
    if cmd is not None and not model:
        raise typer.BadParameter("--cmd needs --model (the name the records carry)", param_hint="--model")
    params = _params(param)
    if params and cmd is not None:
        raise typer.BadParameter("--param is for --workload; pass arguments in the command", param_hint="--param")
    try:
        points = make_grid(cpus, mem_gb, host_facts()).points()
    except GridError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cpus/--mem-gb") from None
    try:
        if cmd is not None:
            spec = command_workload(cmd, model or "")
        else:
            spec = resolve_workload(workload or "", model, params)
    except WorkloadError as exc:
        raise typer.BadParameter(str(exc), param_hint="--workload/--cmd") from None
    settings = ProfileSettings(warmup_s=warmup_s, measure_s=measure_s, repeats=repeats, timeout_s=timeout_s)
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=False)
    task = progress.add_task(f"profiling {escape(spec.model)}", total=len(points))

    def on_start(point: Point) -> None:
        progress.update(task, description=f"{escape(spec.model)}: {point}")

    def on_done(result: PointResult) -> None:
        progress.console.print(_line(result), highlight=False, soft_wrap=True)
        progress.advance(task)

    with contract_errors():
        try:
            with progress:
                run = profile_gpu_type(spec, cpus=cpus, mem_gb=mem_gb, gpu_type=gpu_type, settings=settings,
                                       gpu_index=gpu_index, out=out, on_start=on_start, on_done=on_done)
        except GpuTypeError as exc:
            raise typer.BadParameter(str(exc), param_hint="--gpu-type") from None
    _summary(run, out)
    if run.failed:
        raise typer.Exit(EXIT_POINTS_FAILED)


def _params(pairs: list[str]) -> dict[str, object]:
    params: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--param")
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip()] = value
    return params


def _line(result: PointResult) -> str:
    if result.ok:
        return (f"  {result.point}: [green]{result.throughput:,.1f}[/] samples/s "
                f"(spread {result.spread:.1%} over {len(result.windows)} windows)")
    return f"  {result.point}: [red]failed[/] {escape(result.error or '')}"


def _summary(run: ProfileRun, out: Path) -> None:
    table = Table("cores", "RAM GB", "samples/s", "spread", "CPU used", "others on its cores", "RAM limit",
                  "GPU util %", "status", title=f"{run.workload.model} on {run.gpu_type} ({run.host.name})",
                  title_justify="left")
    for r in run.results:
        util = r.telemetry.gpu_util if r.telemetry else None
        table.add_row(
            str(r.point.cpus), f"{r.point.mem_gb:g}",
            f"{r.throughput:,.1f}" if r.throughput is not None else "-",
            f"{r.spread:.1%}" if r.spread is not None else "-",
            f"{r.cpu_used:.2f}" if r.cpu_used is not None else "-",
            f"{r.background_cpu:.2f}" if r.background_cpu is not None else "-",
            "enforced" if r.enforcement.mem_enforced else "[yellow]not enforced[/]",
            f"{util:.0f}" if util is not None else "-", "ok" if r.ok else "[red]failed[/]",
        )
    console.print(table)
    unenforced = next((r for r in run.results if not r.enforcement.mem_enforced), None)
    if unenforced is not None:
        warn([f"RAM limits not enforced ({unenforced.enforcement.detail}); recorded as mem_enforced=False"])
    done = len(run.results) - run.failed
    console.print(f"[green]wrote[/] {len(run.results)} profile records ({done} measured, {run.failed} failed) "
                  f"-> {escape(str(out))}", highlight=False, soft_wrap=True)
