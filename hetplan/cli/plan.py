"""`hetplan plan`: solve the cost-constrained GPU plan, compare it with the baselines, write its artifacts."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import typer
from rich.table import Table

from hetplan.cli.common import console, contract_errors, warn
from hetplan.contracts import CATALOG, CURVES, DEMAND, ContractError, Problem, fingerprint
from hetplan.contracts.table import Column, TableSchema, atomic_write_bytes
from hetplan.pipeline import write_plan_artifacts
from hetplan.planner import (
    InfeasibleError, PlanResult, build_problem, evaluate_baselines, frontier_table, plan_cluster, sweep,
)
from hetplan.planner.planner import require_allocation
from hetplan.planner.plots import plot_frontier, plot_node_mix

OWNED = TableSchema("owned fleet", (Column("name", "str"), Column("count", "int", min=0)), key=("name",))


def plan(
    curves: Path = typer.Option(Path(".hetplan/curves.parquet"), "--curves", help="Curve table from `hetplan fit`."),
    catalog: Path = typer.Option(Path(".hetplan/catalog.csv"), "--catalog", help="Node-shape catalog."),
    demand: Path = typer.Option(Path(".hetplan/demand.csv"), "--demand", help="Demand mix."),
    budget: float | None = typer.Option(None, "--budget", min=0.0, help="US$ per hour (throughput objective)."),
    objective: str = typer.Option("throughput", "--objective", help="throughput (max under budget) | cost "
                                  "(min cost for --target)."),
    target: float | None = typer.Option(None, "--target", min=0.0, help="Normalised throughput to reach (cost)."),
    fairness: float = typer.Option(0.0, "--fairness", min=0.0, max=1.0, help="Each class gets at least this "
                                   "fraction of its share of the normalised throughput."),
    owned: Path | None = typer.Option(None, "--owned", help="CSV name,count of nodes already owned."),
    demand_gpus: float | None = typer.Option(None, "--demand-gpus", min=0.0, help="Total GPU demand (default: "
                                             "what the budget buys at the cheapest GPU price)."),
    clouds: str = typer.Option("", "--clouds", help="Comma-separated clouds to buy from (default: all)."),
    solver: str = typer.Option("auto", "--solver", help="auto | gurobi | highs."),
    time_limit: float = typer.Option(60.0, "--time-limit", min=0.1),
    gap: float = typer.Option(1e-3, "--gap", min=0.0, help="Relative MIP gap to stop at."),
    sweep_budgets: str = typer.Option("", "--sweep", help="Comma-separated budgets: plot the Pareto frontier."),
    out_dir: Path = typer.Option(Path(".hetplan/plan"), "--out-dir", help="Where plan.json, hints and plots go."),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not log the planning run to MLflow."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri"),
) -> None:
    """Choose the node mix and the CPU/RAM split together; print hetplan beside its baselines."""
    if solver not in ("auto", "gurobi", "highs"):
        raise typer.BadParameter("one of auto, gurobi, highs", param_hint="--solver")
    if objective not in ("throughput", "cost"):
        raise typer.BadParameter("one of throughput, cost", param_hint="--objective")
    if objective == "throughput" and budget is None:
        raise typer.BadParameter("the throughput objective needs --budget", param_hint="--budget")
    if objective == "cost" and target is None:
        raise typer.BadParameter("the cost objective needs --target", param_hint="--target")
    with contract_errors():
        shapes = CATALOG.load(catalog)
        wanted = [c.strip() for c in clouds.split(",") if c.strip()]
        if wanted:
            shapes = shapes[shapes["cloud"].isin(wanted)]
        fleet = OWNED.load(owned).set_index("name")["count"].astype(int).to_dict() if owned else None
        problem = build_problem(CURVES.load(curves), shapes, DEMAND.load(demand), budget, demand_gpus, fleet)
        warn(problem.warnings)
        inputs = {"curves": fingerprint(curves), "catalog": fingerprint(catalog), "demand": fingerprint(demand)}
        try:
            result = plan_cluster(problem, objective=objective, target=target, fairness=fairness, solver=solver,
                                  time_limit=time_limit, gap=gap, inputs=inputs)
        except InfeasibleError as exc:
            raise ContractError([Problem(str(catalog), f"nothing could be planned: {exc}")]) from None
        require_allocation(problem, result, str(catalog))
        baselines = (evaluate_baselines(problem, result, solver, time_limit, fairness)
                     if objective == "throughput" else [])
        files = _write(result, shapes, baselines, out_dir)
        if sweep_budgets:
            files += _sweep(problem, [float(b) for b in sweep_budgets.split(",")], solver, time_limit, gap, fairness,
                            out_dir)
    _summary(result, baselines, out_dir)
    if not no_mlflow:
        from hetplan.planner.tracking import log_planning_run

        run = log_planning_run(result, files, {b.name: b.normalized_throughput for b in baselines}, tracking_uri)
        console.print(f"MLflow: planning run {run} in experiment hetplan-planning", highlight=False)


def _write(result: PlanResult, catalog: pd.DataFrame, baselines: list, out_dir: Path) -> list[Path]:
    files = write_plan_artifacts(result, catalog, baselines, out_dir)
    mix = out_dir / "node_mix.png"
    figure = plot_node_mix(result.nodes, result.allocation, f"{result.plan.plan_id}: "
                           f"{result.plan.cost_per_hour:.2f} $/h, {result.plan.objective:.1f} reference-GPU equivalents")
    figure.savefig(mix)
    plt.close(figure)
    return [*files, mix]


def _sweep(problem, budgets: list[float], solver: str, time_limit: float, gap: float, fairness: float,
           out_dir: Path) -> list[Path]:
    with console.status(f"sweeping {len(budgets)} budgets"):
        points = sweep(problem, budgets, solver, time_limit, gap, fairness)
    table = frontier_table(points)
    path = out_dir / "frontier.csv"
    atomic_write_bytes(path, table.to_csv(index=False).encode())
    png = out_dir / "frontier.png"
    figure = plot_frontier(table)
    figure.savefig(png)
    plt.close(figure)
    console.print(f"frontier over budgets {', '.join(f'{b:g}' for b in sorted(budgets))} -> {png}", highlight=False)
    return [path, png]


def _summary(result: PlanResult, baselines: list, out_dir: Path) -> None:
    plan = result.plan
    console.print(f"[bold]{plan.plan_id}[/]: {plan.cost_per_hour:.2f} $/h of {plan.budget_per_hour or '-'} budget; "
                  f"objective {plan.objective:.2f} (LP bound {plan.lp_bound:.2f}, gap {plan.gap:.2%}); "
                  f"{plan.solver} in {plan.solve_seconds:.2f} s", highlight=False)
    nodes = Table(title="node mix")
    for column in ("shape", "gpu_type", "add", "owned", "GPUs", "vCPU/GPU", "GB/GPU", "$/h each"):
        nodes.add_column(column, justify="left" if column in ("shape", "gpu_type") else "right")
    for r in result.nodes.itertuples():
        nodes.add_row(r.shape, r.gpu_type, str(r.added), str(r.owned), str((r.added + r.owned) * r.gpus),
                      f"{r.vcpus / r.gpus:g}", f"{r.mem_gb / r.gpus:g}", f"{r.price_per_hour:.2f}")
    console.print(nodes)
    if baselines:
        reference = next((b for b in baselines if b.name == "status quo"), None)
        table = Table(title="hetplan vs baselines (predicted from the curves)")
        for column in ("plan", "$/h", "normalised throughput", "per $/h", "vs status quo"):
            table.add_column(column, justify="left" if column == "plan" else "right")
        for b in baselines:
            ratio = f"{b.normalized_throughput / reference.normalized_throughput:.2f}x" if reference and \
                reference.normalized_throughput > 0 else "-"
            table.add_row(b.name, f"{b.cost_per_hour:.2f}", f"{b.normalized_throughput:.1f}", f"{b.per_dollar:.3f}", ratio)
        console.print(table)
    console.print(f"wrote {out_dir}/plan.json, hints.parquet, kueue.yaml, baselines.csv, node_mix.png", highlight=False)
