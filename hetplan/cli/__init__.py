"""The `hetplan` command: one sub-command group per stage, each a thin layer over that stage's API.

Sub-commands are imported when they run, not when the command starts: `hetplan --help` lists them from the
table below without importing pandas, MLflow, scikit-learn or a solver (well under a second, where importing
every stage takes several).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, NamedTuple

import click
import typer
from typer.core import TyperGroup


class Lazy(NamedTuple):
    """Where a sub-command lives (`hetplan.cli.<module>.<attr>`: a command function or a Typer group)."""

    module: str
    attr: str
    help: str


# In pipeline order: inputs, measure, fit, plan, publish, serve, evaluate, simulate; then the data tools.
COMMANDS: dict[str, Lazy] = {
    "init": Lazy("workspace", "init", "Seed a workspace with the embedded defaults (refuses to overwrite one)."),
    "catalog": Lazy("catalog", "app", "Node-shape catalogs: import cloud price lists and on-prem fleets, show them."),
    "trace": Lazy("trace", "app", "Import public job traces (Synergy, Gavel, Philly, Alibaba)."),
    "profile": Lazy("profile", "profile", "Measure throughput at every cores x RAM point on this host's GPU."),
    "fit": Lazy("fit", "fit", "Fit a monotone throughput model per (model, GPU type)."),
    "curves": Lazy("fit", "curves_app", "Look at fitted sensitivity curves: knees, speedups, plots."),
    "plan": Lazy("plan", "plan", "Choose the node mix and the CPU/RAM split together, beside its baselines."),
    "publish": Lazy("hints", "publish", "Publish a plan's hint table into a hint store (atomically)."),
    "hints": Lazy("hints", "app", "Published hint tables (what the online allocator reads)."),
    "serve": Lazy("serve", "serve", "Run the online allocator service on a hint store."),
    "controller": Lazy("controller", "controller", "Apply the allocator's decisions to a Kubernetes cluster."),
    "webhook": Lazy("controller", "webhook", "Serve the Kubernetes admission webhook alone (no cluster rights)."),
    "report": Lazy("report", "report", "Write the one-page report of a plan: node mix, curves, predicted JCT."),
    "evaluate": Lazy("evaluate", "evaluate", "Plan on one trace, replay another: four setups side by side."),
    "simulate": Lazy("simulate", "simulate", "Replay a trace on a given fleet with one policy, no planning."),
    "data": Lazy("data", "app", "Check data files against hetplan's file contracts."),
}


def load_command(name: str) -> click.Command:
    """Import one sub-command and build its click command."""
    entry = COMMANDS[name]
    target = getattr(importlib.import_module(f"hetplan.cli.{entry.module}"), entry.attr)
    wrapper = typer.Typer(add_completion=False)  # completion is the top-level command's business
    if isinstance(target, typer.Typer):
        wrapper.add_typer(target, name=name)
    else:
        wrapper.command(name)(target)
    wrapper.command("_")(lambda: None)  # two commands: get_command returns the group, not the lone command
    return typer.main.get_command(wrapper).commands[name]  # type: ignore[attr-defined]


class LazyGroup(TyperGroup):
    """A Typer group whose sub-commands are imported when invoked; help lists them from `COMMANDS`."""

    _listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        if self._listing:  # the help page only needs the one-line help
            return click.Command(cmd_name, help=COMMANDS[cmd_name].help)
        return load_command(cmd_name)

    def format_help(self, ctx: click.Context, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="hetplan",
    cls=LazyGroup,
    help="Plan and schedule heterogeneous GPU clusters for DNN training under a budget.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level.")) -> None:
    from hetplan.progress import StderrHandler

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s",
                        handlers=[StderrHandler()])


def main() -> None:
    app()
