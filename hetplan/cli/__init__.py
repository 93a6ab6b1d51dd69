"""The `hetplan` command: one sub-command group per stage, each a thin layer over that stage's API."""

from __future__ import annotations

import logging

import typer

from hetplan.cli import catalog, data, trace, workspace
from hetplan.cli import fit as fit_cli
from hetplan.cli import plan as plan_cli
from hetplan.cli import profile as profile_cli
from hetplan.cli import hints as hints_cli
from hetplan.cli import serve as serve_cli

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
app.command("profile")(profile_cli.profile)
app.command("fit")(fit_cli.fit)
app.add_typer(fit_cli.curves_app, name="curves")
app.command("plan")(plan_cli.plan)
app.add_typer(hints_cli.app, name="hints")
app.command("publish")(hints_cli.publish)
app.command("serve")(serve_cli.serve)


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level.")) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def main() -> None:
    app()
