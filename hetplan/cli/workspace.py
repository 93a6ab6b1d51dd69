"""`hetplan init`: seed a workspace with your fleet, trace and catalog (else the embedded defaults); show it."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from hetplan.cli.common import choices, console, contract_errors, warn
from hetplan.traces import FORMATS
from hetplan.workspace import InitSummary, Seed, default_curves, init_workspace

TraceFormat = choices("TraceFormat", ["trace", *FORMATS])


def init(
    workspace: Path = typer.Option(Path(".hetplan"), "--workspace", "-w", help="Directory to seed."),
    fleet: str | None = typer.Option(None, "--fleet", help="Your owned fleet: CSV name,gpu_type,gpus,vcpus,mem_gb,"
                                     "count (or name,count naming catalog shapes). Default: a derived PAI sample."),
    trace: str | None = typer.Option(None, "--trace", help="Your workload: a trace file (job_id,model,num_gpus,"
                                     "arrival_s,duration_s), an http(s) URL of one, or your cluster's job history: "
                                     "allocator:http://HOST:PORT or allocator:PATH/allocator.db. Default: Gavel's "
                                     "Philly-derived trace."),
    catalog: str | None = typer.Option(None, "--catalog", help="Node shapes to buy or rent (hetplan catalog "
                                       "import). Default: real AWS, GCP, Azure and Lambda prices."),
    trace_format: TraceFormat = typer.Option("trace", "--trace-format", help=f"The --trace file's format: "
                                             f"trace|{'|'.join(FORMATS)}."),
    curves: Path | None = typer.Option(None, "--curves", help="For an allocator's job history: the curves its run "
                                       "times are converted with (default: the workspace's current curves, else "
                                       "its profiles)."),
    force: bool = typer.Option(False, "--force", help="Overwrite the workspace's files, yours included."),
) -> None:
    """Seed a workspace: your fleet, trace and catalog where given, the embedded defaults for the rest.

    Every file is validated before anything is written; a file already in the workspace is kept (a file of
    yours is never overwritten: a different one given for its place is refused, unless --force). Refuses (exit 1,
    nothing written) when the workspace has every file and no file is given, unless --force."""
    seed = Seed(fleet, trace, catalog, str(trace_format), curves or default_curves(workspace))
    with contract_errors():
        summary = init_workspace(workspace, force=force, seed=seed)
    warn(summary.warnings)
    _show(summary)


def _show(summary: InitSummary) -> None:
    ws = summary.workspace
    files = Table(title=f"workspace {ws.root}", show_lines=False)
    for column in ("file", "rows", "what"):
        files.add_column(column)
    files.add_column("from")
    sources = ", ".join(sorted(summary.profiles["source"].unique()))
    origin = summary.origins
    fleet = ("owned fleet: [bold yellow]DERIVED[/] 1/50 sample of Alibaba PAI's 2020 GPU machines"
             if origin.get(ws.fleet.name, "").startswith("embedded") else "owned fleet")
    rows = [(ws.catalog, len(summary.catalog), "node shapes to buy or rent"), (ws.fleet, "", fleet),
            (ws.profiles, len(summary.profiles), f"profiles ({sources})"),
            (ws.published_profiles, "", "published Synergy V100 table (published:synergy)"),
            (ws.trace, len(summary.trace), "workload (jobs)"),
            (ws.demand, len(summary.demand), "demand mix (share of GPU-seconds) from the workload")]
    for path, count, what in rows:
        files.add_row(str(path), str(count), what, escape(origin.get(path.name, "")))
    console.print(files)

    shapes = summary.catalog.assign(per_gpu=summary.catalog["price_per_hour"] / summary.catalog["gpus"])
    by_gpu = shapes.groupby("gpu_type").agg(shapes=("name", "size"), cheapest=("per_gpu", "min"))
    table = Table(title="GPU types in the catalog (cheapest $/GPU-hour)")
    table.add_column("gpu_type")
    table.add_column("shapes", justify="right")
    table.add_column("$/GPU-h", justify="right")
    table.add_column("derived profiles", justify="right")
    derived_counts = summary.profiles.groupby("gpu_type").size()
    for gpu, row in by_gpu.iterrows():
        table.add_row(str(gpu), str(row["shapes"]), f"{row['cheapest']:.2f}", str(derived_counts.get(gpu, 0)))
    console.print(table)
    if any(str(s).startswith("derived:") for s in summary.profiles["source"].unique()):
        console.print("[bold yellow]note:[/] the profiles are derived (Synergy's V100 pipeline x GPU speed ratios), "
                      "not measured; run the profiler on real GPUs to replace them.")
    if not summary.written:
        console.print(f"nothing to write: {ws.root} already holds these files", highlight=False)
