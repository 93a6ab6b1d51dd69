"""`hetplan init`: seed a workspace with the embedded defaults and show what is in it."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from hetplan.cli.common import console, contract_errors, warn
from hetplan.workspace import InitSummary, init_workspace


def init(
    workspace: Path = typer.Option(Path(".hetplan"), "--workspace", "-w", help="Directory to seed."),
    force: bool = typer.Option(False, "--force", help="Overwrite the seeded files of an existing workspace."),
) -> None:
    """Write the default catalog and owned fleet, the derived profiles, a reference workload and its demand mix.

    Refuses (exit 1, nothing written) when the workspace already has any of those files, unless --force."""
    with contract_errors():
        summary = init_workspace(workspace, force=force)
    warn(summary.warnings)
    _show(summary)


def _show(summary: InitSummary) -> None:
    ws = summary.workspace
    files = Table(title=f"workspace {ws.root}", show_lines=False)
    for column in ("file", "rows", "what"):
        files.add_column(column)
    sources = ", ".join(sorted(summary.profiles["source"].unique()))
    files.add_row(str(ws.catalog), str(len(summary.catalog)), "node shapes from real cloud price lists")
    files.add_row(str(ws.fleet), "", "owned fleet: [bold yellow]DERIVED[/] 1/50 sample of Alibaba PAI's 2020 GPU "
                  "machines")
    files.add_row(str(ws.profiles), str(len(summary.profiles)), f"[bold yellow]DERIVED[/] profiles ({sources})")
    files.add_row(str(ws.published_profiles), "", "published Synergy V100 table (published:synergy)")
    files.add_row(str(ws.trace), str(len(summary.trace)), "workload: Gavel's Philly-derived trace (0e4a51)")
    files.add_row(str(ws.demand), str(len(summary.demand)), "demand mix (share of GPU-seconds) from that trace")
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
    console.print("[bold yellow]note:[/] the profiles are derived (Synergy's V100 pipeline x GPU speed ratios), "
                  "not measured; run the profiler on real GPUs to replace them.")
