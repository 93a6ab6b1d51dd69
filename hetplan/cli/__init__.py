"""The `hetplan` command: one sub-command group per stage, each a thin layer over that stage's API."""

from __future__ import annotations

import logging

import typer

from hetplan.cli import catalog, data, trace, workspace

app = typer.Typer(
    name="hetplan",
    help="Plan and schedule heterogeneous GPU clusters for DNN training under a budget.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(catalog.app, name="catalog")
app.add_typer(data.app, name="data")
app.add_typer(trace.app, name="trace")
app.command("init")(workspace.init)


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level.")) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def main() -> None:
    app()
