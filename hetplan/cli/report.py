"""`hetplan report`: the one-page report (node mix, curves with knees, predicted JCT, what needs profiling) of a
plan made by `hetplan plan`, as the nightly DAG writes it for its runs."""

from __future__ import annotations

from pathlib import Path

import typer

from hetplan.cli.common import CurvesFile, console, contract_errors, curves_or_default


def report(
    plan_dir: Path | None = typer.Option(None, "--plan-dir", help="`hetplan plan`'s --out-dir (plan.json, "
                                         "baselines.csv); default: the newer of .hetplan/plan and "
                                         ".hetplan/current/plan (the nightly run's)."),
    curves: CurvesFile = None,
    workload: Path | None = typer.Option(None, "--workload", help="The trace it was planned for (ranks models "
                                         "by their share of its GPU demand)."),
    demand: Path = typer.Option(Path(".hetplan/demand.csv"), "--demand", help="The demand mix (without "
                                "--workload)."),
    out_dir: Path = typer.Option(Path(".hetplan/report"), "--out-dir", help="Where report.html and its pictures go."),
) -> None:
    """Write report.html and its pictures for a plan; nothing is written when an input is missing or broken."""
    from hetplan.report import render_report
    from hetplan.workspace import default_plan_dir

    plan_dir = plan_dir if plan_dir is not None else default_plan_dir()
    curves = curves_or_default(curves)
    with contract_errors():
        page = render_report(plan_dir, curves, out_dir, trace=workload, demand=demand)
    console.print(f"wrote {page} (node mix, curves with knees, predicted JCT, what needs profiling)",
                  highlight=False)
