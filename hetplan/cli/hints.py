"""`hetplan publish` and `hetplan hints show`: put a plan's hint table into the store, look at what is there."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from hetplan.cli.common import console, contract_errors
from hetplan.contracts import load_plan
from hetplan.contracts.table import read_raw
from hetplan.hints import STORE_ENV, HintStore, PublishedHints, default_store_root, validate_hints

app = typer.Typer(help="Published hint tables (what the online allocator reads).", no_args_is_help=True)

_STORE_HELP = f"Hint store directory (default: ${STORE_ENV}, else .hetplan/hints)."


@app.callback()
def _hints() -> None:
    """Inspect published hint tables."""


def publish(
    plan: Path = typer.Option(..., "--plan", help="Plan JSON the hints were read off."),
    hints: Path = typer.Option(..., "--hints", help="Hint table (.csv or .parquet)."),
    store: Path | None = typer.Option(None, "--store", help=_STORE_HELP),
    keep: int = typer.Option(5, "--keep", min=1, help="Versions to keep (LATEST is never pruned)."),
) -> None:
    """Publish HINTS as version <plan_id> and switch LATEST to it, atomically; nothing changes on bad input."""
    root = store if store is not None else default_store_root()
    with contract_errors():
        loaded = load_plan(plan)
        raw, labels = read_raw(hints)
        typed = validate_hints(loaded, raw, labels)
        published = HintStore(root, keep=keep).publish(loaded, typed)
    console.print(f"[green]published[/] {published.version} ({len(published.hints)} hints) -> {published.path}; "
                  f"LATEST = {published.version}", highlight=False, soft_wrap=True)


@app.command("show")
def show(
    store: Path | None = typer.Option(None, "--store", help=_STORE_HELP),
    version: str | None = typer.Option(None, "--version", help="Version to show (default: LATEST)."),
    ranks: int | None = typer.Option(None, "--ranks", min=1, help="Only each class's first N GPU types by rank "
                                     "(default: every one)."),
) -> None:
    """Show a published hint table, ordered by model, GPUs and rank."""
    root = store if store is not None else default_store_root()
    with contract_errors():
        hint_store = HintStore(root)
        published = hint_store.load(version)
        latest = hint_store.latest_version()
    console.print(_table(published, latest, ranks))


def _table(published: PublishedHints, latest: str | None, ranks: int | None = None) -> Table:
    plan = published.plan
    frame = published.hints.sort_values(["model", "num_gpus", "rank"], kind="stable")
    if ranks is not None:
        frame = frame[frame["rank"] <= ranks]
    marker = " (LATEST)" if published.version == latest else ""
    budget = "" if plan.budget_per_hour is None else f" of ${plan.budget_per_hour:,.2f}/h"
    shown = "" if ranks is None else f" (rank <= {ranks} of {len(published.hints)} rows; --ranks to change)"
    table = Table(title=f"hints {published.version}{marker}{shown}", title_justify="left",
                  caption=f"plan {plan.plan_id} · solver {plan.solver} · cost ${plan.cost_per_hour:,.2f}/h{budget}",
                  caption_justify="left")
    for name in ("model", "GPUs", "rank", "gpu_type", "cpus/GPU", "GB/GPU", "throughput", "normalized", "per $"):
        table.add_column(name, justify="left" if name in ("model", "gpu_type") else "right")
    for row in frame.itertuples(index=False):
        table.add_row(str(row.model), str(row.num_gpus), str(row.rank), str(row.gpu_type),
                      f"{row.cpus_per_gpu:g}", f"{row.mem_gb_per_gpu:g}", f"{row.expected_throughput:,.4g}",
                      f"{row.normalized_throughput:.3f}", f"{row.throughput_per_dollar:,.4g}")
    return table
