"""`hetplan catalog`: import node-shape catalogs (SkyPilot price lists, on-prem fleets) and show them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import typer
from rich.table import Table

from hetplan.catalog import CLOUDS, DEFAULT_CATALOG, import_onprem, import_skypilot, load_catalog, load_default_catalog
from hetplan.cli.common import choices, console, contract_errors, warn
from hetplan.contracts.catalog import CATALOG
from hetplan.gpus import UnknownGpuError, normalize_gpu

Cloud = choices("Cloud", list(CLOUDS))

app = typer.Typer(help="Node-shape catalogs: import cloud price lists and on-prem fleets, show them.",
                  no_args_is_help=True)

DEFAULT_CAPTION = (
    "on-demand US$/h: SkyPilot price catalog snapshot (skypilot-org/skypilot-catalog), "
    "see hetplan/data/catalog/PROVENANCE.md"
)


@app.command("import")
def import_catalog(
    out: Path = typer.Option(..., "--out", help="Catalog to write (.csv or .parquet)."),
    skypilot: Path | None = typer.Option(None, "--skypilot", help="A SkyPilot vms.csv price catalog."),
    onprem: Path | None = typer.Option(None, "--onprem", help="An on-prem fleet (.yaml or .csv)."),
    region: str | None = typer.Option(None, "--region", help="SkyPilot: keep only this region."),
    cloud: Cloud | None = typer.Option(None, "--cloud", help=f"SkyPilot: {'|'.join(CLOUDS)} (default: detected)."),
) -> None:
    """Import a SkyPilot price list or an on-prem fleet as a catalog; write nothing if the input is bad."""
    if (skypilot is None) == (onprem is None):
        raise typer.BadParameter("give exactly one of --skypilot FILE or --onprem FILE", param_hint="--skypilot")
    if onprem is not None and (region or cloud):
        raise typer.BadParameter("--region and --cloud apply to --skypilot only", param_hint="--region")
    if cloud is not None and cloud not in CLOUDS:
        raise typer.BadParameter(f"unknown cloud {cloud!r}; one of {', '.join(CLOUDS)}", param_hint="--cloud")
    with contract_errors():
        if skypilot is not None:
            imported = import_skypilot(skypilot, region=region, cloud=cloud)
        else:
            assert onprem is not None
            imported = import_onprem(onprem)
        warn(imported.warnings)
        CATALOG.write(imported.shapes, out)
    console.print(f"[green]wrote[/] {len(imported.shapes)} node shapes to {out}", highlight=False)


@app.command("show")
def show(
    file: Path | None = typer.Argument(None, help="Catalog, on-prem fleet or SkyPilot vms.csv (default: shipped)."),
    gpu_type: str | None = typer.Option(None, "--gpu-type", help="Show only this GPU type (any spelling)."),
) -> None:
    """Print a catalog sorted by GPU type, then price per GPU-hour."""
    wanted = None
    if gpu_type is not None:
        try:
            wanted = normalize_gpu(gpu_type)
        except UnknownGpuError as exc:
            raise typer.BadParameter(str(exc), param_hint="--gpu-type") from None
    with contract_errors():
        shapes = load_default_catalog() if file is None else load_catalog(file)
    if wanted is not None:
        shapes = shapes[shapes["gpu_type"] == wanted]
    if shapes.empty:
        console.print(f"no node shapes with GPU type {wanted}", highlight=False)
        return
    console.print(_table(shapes, _caption(shapes, file)))


def _caption(shapes: pd.DataFrame, file: Path | None) -> str:
    if file is None or file.resolve() == DEFAULT_CATALOG.resolve():
        return DEFAULT_CAPTION
    sources = sorted(shapes["source"].dropna().unique())
    return f"US$/h from {file}" + (f" (sources: {', '.join(sources)})" if sources else "")


def _table(shapes: pd.DataFrame, caption: str) -> Table:
    view = shapes.assign(per_gpu=shapes["price_per_hour"] / shapes["gpus"])
    view = view.sort_values(["gpu_type", "per_gpu", "name"], kind="stable")
    table = Table(caption=caption, caption_justify="left")
    table.add_column("name", overflow="fold")
    table.add_column("gpu_type")
    for header in ("gpus", "vcpus", "mem_gb", "$/h", "$/GPU-h", "vCPU/GPU", "GB/GPU", "available"):
        table.add_column(header, justify="right")
    for row in view.itertuples(index=False):
        table.add_row(
            row.name,
            row.gpu_type,
            str(row.gpus),
            str(row.vcpus),
            f"{row.mem_gb:g}",
            f"{row.price_per_hour:.4f}",
            f"{row.per_gpu:.4f}",
            f"{row.vcpus / row.gpus:.4g}",
            f"{row.mem_gb / row.gpus:.4g}",
            "-" if pd.isna(row.available) else str(row.available),
        )
    return table
