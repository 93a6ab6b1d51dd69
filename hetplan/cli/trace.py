"""`hetplan trace`: import public job traces into hetplan's trace (and demand mix) files; export the cluster's own
job history (the allocator's journal) as one."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from hetplan.cli.common import CurvesFile, choices, console, contract_errors, curves_or_default, warn
from hetplan.contracts import DEMAND, PROFILES, TRACE, demand_from_trace
from hetplan.contracts.table import CSV_SUFFIXES, PARQUET_SUFFIXES, ContractError, Problem
from hetplan.traces import FORMATS, MAX_GPUS_OPTION_FORMATS, MODEL_OPTION_FORMATS, TraceImport, import_trace

ELASTIC = ", ".join(MAX_GPUS_OPTION_FORMATS)
SourceFormat = choices("SourceFormat", list(FORMATS))

app = typer.Typer(help="Import public job traces (Synergy, Gavel, Philly, Alibaba, Sia); export your allocator's jobs.",
                  no_args_is_help=True)


@app.callback()
def _trace() -> None:
    """Import public job traces into hetplan's trace contract, or export the jobs your allocator ran as one."""


@app.command("import")
def import_command(
    file: Path = typer.Argument(..., help="Trace file in the public format."),
    fmt: SourceFormat = typer.Option(..., "--format", help=f"Source format: {'|'.join(FORMATS)}."),
    out: Path = typer.Option(..., "--out", "-o", help="Trace to write (.csv or .parquet)."),
    model: str | None = typer.Option(
        None, "--model", help=f"Model name for formats without one ({', '.join(MODEL_OPTION_FORMATS)}); default unknown."
    ),
    demand_out: Path | None = typer.Option(None, "--demand-out", help="Also write the demand mix (.csv or .parquet)."),
    max_gpus: int | None = typer.Option(None, "--max-gpus", min=1, help=f"Elastic formats ({ELASTIC}): the most "
                                        "GPUs a job may grow to; default the largest GPU type of --nodes, else of "
                                        "Sia's paper cluster (24)."),
    nodes: Path | None = typer.Option(None, "--nodes", help="Elastic formats: your fleet (as `hetplan simulate "
                                      "--nodes`); its largest GPU type's total bounds every job."),
) -> None:
    """Import FILE, write the trace to OUT; print a summary and one warning per kind of handled job."""
    if fmt not in FORMATS:
        raise typer.BadParameter(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}", param_hint="--format")
    if model is not None and fmt not in MODEL_OPTION_FORMATS:
        raise typer.BadParameter(f"{fmt} traces name their own models", param_hint="--model")
    if model is not None and not model.strip():
        raise typer.BadParameter("must be a non-blank model name", param_hint="--model")
    if (max_gpus is not None or nodes is not None) and fmt not in MAX_GPUS_OPTION_FORMATS:
        raise typer.BadParameter(f"only for {', '.join(MAX_GPUS_OPTION_FORMATS)} traces (elastic jobs)",
                                 param_hint="--max-gpus/--nodes")
    if max_gpus is not None and nodes is not None:
        raise typer.BadParameter("give --max-gpus or --nodes, not both", param_hint="--max-gpus/--nodes")
    options: dict[str, object] = {"model": model} if model is not None else {}
    with contract_errors():
        _check_suffix(out, demand_out)
        if nodes is not None:
            gpu_type, options["max_gpus"] = largest_type(nodes)
            console.print(f"elastic bound: {options['max_gpus']} GPUs, the {gpu_type} total of {nodes}",
                          highlight=False, soft_wrap=True)
        elif max_gpus is not None:
            options["max_gpus"] = max_gpus
        result = import_trace(file, fmt, **options)
        demand = demand_from_trace(result.trace) if demand_out is not None else None
        TRACE.write(result.trace, out)
        if demand is not None and demand_out is not None:
            DEMAND.write(demand, demand_out)
    _summary(file, result, out, demand_out)
    warn(result.warnings)


def largest_type(nodes: Path) -> tuple[str, int]:
    """The GPU type of a fleet file with the most GPUs in all, and that total."""
    from hetplan.contracts.trace import gpu_totals

    totals = gpu_totals(_load_fleet(nodes))
    if not totals:
        raise ContractError([Problem(str(nodes), "the fleet has no GPU node")])
    return max(totals.items(), key=lambda item: (item[1], item[0]))


def _load_fleet(nodes: Path) -> list:
    from hetplan.allocator.nodes_io import NodeFileError, load_nodes

    try:
        return load_nodes(nodes)
    except NodeFileError as exc:
        raise ContractError([Problem(str(nodes), str(exc).removeprefix(f"{nodes}: "))]) from None


def _check_suffix(*paths: Path | None) -> None:
    """Refuse an output path without a known suffix before anything is written."""
    problems = [
        Problem(str(p), "output must end in .csv or .parquet")
        for p in paths
        if p is not None and p.suffix.lower() not in CSV_SUFFIXES | PARQUET_SUFFIXES
    ]
    if problems:
        raise ContractError(problems)


def _summary(source: Path, result: TraceImport, out: Path, demand_out: Path | None) -> None:
    trace = result.trace
    gpu_hours = float((trace["num_gpus"].astype(float) * trace["duration_s"]).sum()) / 3600.0
    console.print(
        f"[green]imported[/] {len(trace)} of {result.report['read']} jobs from {source} -> {out}"
        + (f" (demand mix -> {demand_out})" if demand_out is not None else ""),
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"GPU-hours at the reference allocation: {gpu_hours:,.1f}", highlight=False)
    models = Table("model", "jobs", "GPU-hours", title="models", title_justify="left")
    per_model = (trace["num_gpus"].astype(float) * trace["duration_s"] / 3600.0).groupby(trace["model"]).agg(
        ["count", "sum"]
    )
    for name, row in per_model.iterrows():
        models.add_row(str(name), str(int(row["count"])), f"{row['sum']:,.1f}")
    console.print(models)
    handled = {k: n for k, n in result.report.items() if k not in ("read", "imported") and n}
    if handled:
        reasons = Table("handling", "jobs", title="handled jobs", title_justify="left")
        for key, count in handled.items():
            reasons.add_row(key, str(count))
        console.print(reasons)


@app.command("export")
def export_command(
    out: Path = typer.Option(..., "--out", help="Trace to write (.csv or .parquet): `hetplan plan --workload` reads "
                             "it as is."),
    url: str | None = typer.Option(None, "--url", help="The running allocator, e.g. http://127.0.0.1:8080 (its "
                                   "GET /v1/jobs)."),
    db: Path | None = typer.Option(None, "--db", help="Or the allocator's SQLite database (read-only; it may run)."),
    curves: CurvesFile = None,
    profiles: Path = typer.Option(Path(".hetplan/profiles.csv"), "--profiles", help="Where no curve table exists "
                                  "yet: the profiles the durations are derived with."),
) -> None:
    """Write the jobs the allocator ran (done, on whole GPUs) as a trace: model, GPUs, arrival (first placement),
    run time, and the duration at the reference allocation derived from the curves (`hetplan.traces.history`)."""
    from hetplan.traces.history import workspace_speeds
    from hetplan.traces.sources import ALLOCATOR, read_source

    if (url is None) == (db is None):
        raise typer.BadParameter("give the allocator's --url or its --db (one of them)", param_hint="--url/--db")
    with contract_errors():
        _check_suffix(out)
        curves = curves_or_default(curves)
        known = PROFILES.load(profiles) if profiles.is_file() and not curves.is_file() else None
        speeds, how = workspace_speeds(curves, known)
        sourced = read_source(ALLOCATOR + (url or str(db)), speeds=speeds)
        TRACE.write(sourced.trace, out)
    trace = sourced.trace
    console.print(f"[green]exported[/] {len(trace)} jobs from {sourced.source} -> {out}: "
                  f"{float((trace['num_gpus'] * trace['run_s']).sum()) / 3600:,.1f} GPU-hours run; "
                  + (how or "durations at the reference allocation = run times (no curves)"),
                  highlight=False, soft_wrap=True)
    warn(sourced.warnings)
