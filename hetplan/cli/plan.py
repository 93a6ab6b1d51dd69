"""`hetplan plan`: solve the cost-constrained GPU plan, compare it with the baselines, write its artifacts."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import matplotlib.pyplot as plt
import typer
from rich.table import Table

from hetplan.cli.common import console, contract_errors, warn
from hetplan.contracts import DEMAND, ContractError, Problem, fingerprint
from hetplan.contracts.table import atomic_write_bytes
from hetplan.planner import SolveError, frontier_table, sweep, write_plan_artifacts
from hetplan.planner.baselines import STATUS_QUO
from hetplan.planner.entry import Planned, load_problem, plan_with_baselines
from hetplan.planner.plots import plot_frontier, plot_node_mix


class Objective(str, Enum):
    throughput = "throughput"
    throughput_sum = "throughput-sum"
    cost = "cost"


class Solver(str, Enum):
    auto = "auto"
    gurobi = "gurobi"
    highs = "highs"


MILP_OBJECTIVE = {Objective.throughput: "mix", Objective.throughput_sum: "sum", Objective.cost: "cost"}


def plan(
    curves: Path = typer.Option(Path(".hetplan/curves.parquet"), "--curves", help="Curve table from `hetplan fit`."),
    catalog: Path = typer.Option(Path(".hetplan/catalog.csv"), "--catalog", help="Node-shape catalog."),
    demand: Path = typer.Option(Path(".hetplan/demand.csv"), "--demand", help="Demand mix."),
    budget: float | None = typer.Option(None, "--budget", min=0.0, help="US$ per hour to spend on added nodes."),
    objective: Objective = typer.Option(Objective.throughput, "--objective", help="throughput: the most of the "
                                        "demand mix served per hour; throughput-sum: the most normalised throughput "
                                        "summed over classes (with --fairness); cost: the cheapest plan serving "
                                        "--target."),
    target: float | None = typer.Option(None, "--target", min=0.0, help="Reference GPUs of the mix to serve per "
                                        "hour (cost)."),
    fairness: float = typer.Option(0.0, "--fairness", min=0.0, max=1.0, help="throughput-sum: each class gets at "
                                   "least this fraction of its share of the normalised throughput."),
    owned: Path | None = typer.Option(None, "--owned", help="Owned fleet: CSV name,gpu_type,gpus,vcpus,mem_gb,count "
                                      "(or name,count naming catalog shapes)."),
    demand_gpus: float | None = typer.Option(None, "--demand-gpus", min=0.0, help="throughput-sum: total GPU "
                                             "demand behind the per-class caps (default: what the budget buys)."),
    clouds: str = typer.Option("", "--clouds", help="Comma-separated clouds to buy from (default: all)."),
    solver: Solver = typer.Option(Solver.auto, "--solver"),
    time_limit: float = typer.Option(60.0, "--time-limit", min=0.1),
    gap: float = typer.Option(1e-3, "--gap", min=0.0, help="Relative MIP gap to stop at."),
    sweep_budgets: str = typer.Option("", "--sweep", help="Comma-separated budgets: plot the Pareto frontier."),
    out_dir: Path = typer.Option(Path(".hetplan/plan"), "--out-dir", help="Where plan.json, hints and plots go."),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not log the planning run to MLflow."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri"),
) -> None:
    """Choose the node mix and the CPU/RAM split together; print hetplan beside its baselines."""
    budgets = _budgets(sweep_budgets)
    if objective != Objective.cost and budget is None and owned is None:
        raise typer.BadParameter(f"the {objective.value} objective needs --budget (or an --owned fleet)",
                                 param_hint="--budget")
    if objective == Objective.cost and target is None:
        raise typer.BadParameter("the cost objective needs --target", param_hint="--target")
    with contract_errors():
        problem, inputs = load_problem(curves, catalog, DEMAND.load(demand), budget,
                                       clouds=[c.strip() for c in clouds.split(",")], fleet=owned,
                                       demand_gpus=demand_gpus)
        inputs["demand"] = fingerprint(demand)
        warn(problem.warnings)
        try:
            planned = plan_with_baselines(problem, objective=MILP_OBJECTIVE[objective], target=target,  # type: ignore[arg-type]
                                          fairness=fairness, solver=solver.value, time_limit=time_limit, gap=gap,  # type: ignore[arg-type]
                                          inputs=inputs, source=str(catalog))
            points = sweep(problem, budgets, solver.value, time_limit, gap, MILP_OBJECTIVE[objective], fairness) \
                if budgets else []  # type: ignore[arg-type]
        except SolveError as exc:
            raise ContractError([Problem(str(catalog), str(exc))]) from None
        files = _write(planned, out_dir)
        if points:
            files += _write_sweep(points, out_dir)
    _summary(planned, out_dir)
    if not no_mlflow:
        from hetplan.planner.tracking import log_planning_run

        run = log_planning_run(planned.result, files, {b.name: b.value for b in planned.baselines}, tracking_uri)
        console.print(f"MLflow: planning run {run} in experiment hetplan-planning", highlight=False)


def _budgets(text: str) -> list[float]:
    budgets = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            value = float(item)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise typer.BadParameter(f"{item!r} is not a budget in US$ per hour", param_hint="--sweep")
        budgets.append(value)
    return budgets


def _write(planned: Planned, out_dir: Path) -> list[Path]:
    result = planned.result
    files = write_plan_artifacts(result, planned.baselines, out_dir)
    mix = out_dir / "node_mix.png"
    figure = plot_node_mix(result.nodes, result.allocation, f"{result.plan.plan_id}: "
                           f"{result.plan.cost_per_hour:.2f} $/h, {result.plan.objective:.1f} reference GPUs of work")
    figure.savefig(mix)
    plt.close(figure)
    return [*files, mix]


def _write_sweep(points, out_dir: Path) -> list[Path]:
    table = frontier_table(points)
    path = out_dir / "frontier.csv"
    atomic_write_bytes(path, table.to_csv(index=False).encode())
    png = out_dir / "frontier.png"
    figure = plot_frontier(table)
    figure.savefig(png)
    plt.close(figure)
    console.print(f"frontier over budgets {', '.join(f'{p.budget:g}' for p in points)} -> {png}", highlight=False)
    return [path, png]


def _summary(planned: Planned, out_dir: Path) -> None:
    plan = planned.result.plan
    budget = "no budget" if plan.budget_per_hour is None else f"{plan.budget_per_hour:.2f} $/h budget"
    console.print(f"[bold]{plan.plan_id}[/]: {plan.cost_per_hour:.2f} $/h of {budget}; {plan.objective_kind} "
                  f"objective {plan.objective:.2f} (LP bound {plan.lp_bound:.2f}, gap {plan.gap:.2%}); "
                  f"{plan.solver} in {plan.solve_seconds:.2f} s"
                  + (" [yellow](time limit reached: best plan found)[/]" if plan.timed_out else ""), highlight=False)
    nodes = Table(title="node mix")
    for column in ("shape", "gpu_type", "add", "owned", "GPUs", "vCPU/GPU", "GB/GPU", "$/h each"):
        nodes.add_column(column, justify="left" if column in ("shape", "gpu_type") else "right")
    for r in planned.result.nodes.itertuples():
        nodes.add_row(r.shape, r.gpu_type, str(r.added), str(r.owned), str((r.added + r.owned) * r.gpus),
                      f"{r.vcpus / r.gpus:g}", f"{r.mem_gb / r.gpus:g}", f"{r.price_per_hour:.2f}")
    console.print(nodes)
    if planned.baselines:
        _baseline_table(planned)
    console.print(f"wrote {out_dir}/plan.json, hints.parquet, kueue.yaml, baselines.csv, node_mix.png", highlight=False)


def _baseline_table(planned: Planned) -> None:
    reference = planned.baseline(STATUS_QUO)
    unit = "mix served" if planned.model.objective == "mix" else "normalised throughput"
    table = Table(title=f"hetplan vs baselines (predicted from the curves; {unit}, reference GPUs per hour)")
    for column in ("plan", "$/h", unit, "per $/h", "vs status quo", "per $ vs status quo"):
        table.add_column(column, justify="left" if column == "plan" else "right")
    for b in planned.baselines:
        ok = reference is not None and reference.value > 0
        table.add_row(b.name, f"{b.cost_per_hour:.2f}", f"{b.value:.1f}", f"{b.per_dollar:.3f}",
                      f"{b.value / reference.value:.2f}x" if ok else "-",
                      f"{b.per_dollar / reference.per_dollar:.2f}x" if ok and reference.per_dollar > 0 else "-")
    console.print(table)

