"""`hetplan data`: check any file against its contract."""

from __future__ import annotations

from pathlib import Path

import typer

from hetplan.cli.common import choices, console, contract_errors
from hetplan.contracts import KINDS, validate_file

Kind = choices("Kind", list(KINDS))

app = typer.Typer(help="Check data files against hetplan's file contracts.", no_args_is_help=True)


@app.command("validate")
def validate(
    file: Path = typer.Argument(..., help="CSV, Parquet (tables) or JSON (plan) file."),
    kind: Kind = typer.Option(..., "--kind", help=f"Contract: {'|'.join(KINDS)}."),
) -> None:
    """Print every problem as `file:row:column: message`; exit 1 if there is any."""
    if kind not in KINDS:
        raise typer.BadParameter(f"unknown kind {kind!r}; one of {', '.join(KINDS)}", param_hint="--kind")
    with contract_errors():
        validate_file(str(file), kind)
    console.print(f"[green]ok[/] {file} is a valid {kind} file")


@app.command("rebuild")
def rebuild() -> None:
    """Regenerate the derived tables shipped in hetplan/data/ from the upstream copies (developers only)."""
    from hetplan.catalog.default import DEFAULT_CATALOG, write_default_catalog
    from hetplan.catalog.fleet import write_default_fleet
    from hetplan.reference import build_reference, write_reference

    with contract_errors():
        paths = write_reference(build_reference())
        write_default_catalog()
        paths += [DEFAULT_CATALOG, write_default_fleet()]
    for path in paths:
        console.print(f"wrote {path}")
