"""The `hetplan` command: one sub-command group per stage, each a thin layer over that stage's API."""

from __future__ import annotations

import logging

import typer

from hetplan.cli import catalog, data, evaluate, fit, hints, plan, profile, serve, simulate, trace, workspace

app = typer.Typer(
    name="hetplan",
    help="Plan and schedule heterogeneous GPU clusters for DNN training under a budget.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
# In pipeline order: inputs, measure, fit, plan, publish, serve, evaluate, simulate; then the data tools.
app.command("init")(workspace.init)
app.add_typer(catalog.app, name="catalog")
app.add_typer(trace.app, name="trace")
app.command("profile")(profile.profile)
app.command("fit")(fit.fit)
app.add_typer(fit.curves_app, name="curves")
app.command("plan")(plan.plan)
app.command("publish")(hints.publish)
app.add_typer(hints.app, name="hints")
app.command("serve")(serve.serve)
app.command("evaluate")(evaluate.evaluate)
app.command("simulate")(simulate.simulate)
app.add_typer(data.app, name="data")


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level.")) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def main() -> None:
    app()
