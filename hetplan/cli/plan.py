"""`hetplan plan`: choose the node mix and CPU/RAM split, for a demand mix or for a workload; write its artifacts.

Without `--workload` it solves the steady-state MILP (`throughput`: the most of the demand mix served per
hour; `throughput-sum`; `cost` for a mix target) and values the baselines with the same model. With
`--workload TRACE` it plans for those jobs (`hetplan.codesign`): the MILP proposes candidate clusters, the
simulator replays each, and the objective (`jct`, the default; `p95-jct`; `makespan`; `cost` with
`--max-avg-jct`) picks one, and its prediction comes with an interval (`hetplan.planning.prediction`).
Both go through `hetplan.planning.plan`; this module reads the files, prints and writes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from enum import Enum
from pathlib import Path

import typer
from rich.table import Table

from hetplan.cli.common import (
    CalibrationFiles, CurvesFile, DaskAddress, ReplayEngine, ReplayJobs, ScreenJobs, Shortlist, calibration, choices,
    console, contract_errors, curves_or_default, errors, read_trace, replay_engine, warn,
)
from hetplan.codesign import workload_from_trace
from hetplan.contracts import DEMAND, ContractError, Problem, demand_from_trace, fingerprint
from hetplan.fsio import atomic_write_bytes, save_figure
from hetplan.planner import SolveError, write_plan_artifacts
from hetplan.planner.baselines import STATUS_QUO
from hetplan.planner.entry import load_problem
from hetplan.planner.plots import plot_cost_jct, plot_frontier, plot_node_mix
from hetplan.planner.sizes import describe
from hetplan.planning import Objective, PlanOutcome, PlanRequest, ReplaySizes, RequestError, plan as plan_for
from hetplan.planning.request import HOLDOUT, solver_name
from hetplan.progress import Reporter
from hetplan.traces import FORMATS


WorkloadFormat = choices("WorkloadFormat", ["trace", *FORMATS])


class Solver(str, Enum):
    auto = "auto"
    gurobi = "gurobi"
    highs = "highs"


class Scheduler(str, Enum):
    las = "las"
    fifo = "fifo"
    srtf = "srtf"


def plan(
    curves: CurvesFile = None,
    catalog: Path = typer.Option(Path(".hetplan/catalog.csv"), "--catalog", help="Node-shape catalog."),
    demand: Path = typer.Option(Path(".hetplan/demand.csv"), "--demand", help="Demand mix (without --workload)."),
    workload: Path | None = typer.Option(None, "--workload", help="Recent jobs to plan for (a trace); the mix and "
                                         "the arrival rate come from it."),
    workload_format: WorkloadFormat = typer.Option("trace", "--workload-format", help=f"trace|{'|'.join(FORMATS)}."),
    budget: float | None = typer.Option(None, "--budget", min=0.0, help="US$ per hour to spend on added nodes."),
    objective: Objective | None = typer.Option(None, "--objective", help="With --workload: jct (default), p95-jct, "
                                               "makespan, cost (with --max-avg-jct), throughput. Without: throughput "
                                               "(default: the most of the demand mix served per hour), "
                                               "throughput-sum (with --fairness), cost (with --target)."),
    target: float | None = typer.Option(None, "--target", min=0.0, help="cost without a workload: reference GPUs "
                                        "of the mix to serve per hour."),
    max_avg_jct: float | None = typer.Option(None, "--max-avg-jct", min=0.0, help="cost with a workload: the "
                                             "average JCT (hours) the cheapest plan must reach."),
    fairness: float = typer.Option(0.0, "--fairness", min=0.0, max=1.0, help="throughput-sum: each class gets at "
                                   "least this fraction of its share of the normalised throughput."),
    owned: Path | None = typer.Option(None, "--owned", help="Owned fleet: CSV name,gpu_type,gpus,vcpus,mem_gb,count "
                                      "(or name,count naming catalog shapes)."),
    demand_gpus: float | None = typer.Option(None, "--demand-gpus", min=0.0, help="Total GPU demand: no plan "
                                             "allocates more GPUs (default: unbounded)."),
    max_job_gpus: int | None = typer.Option(None, "--max-job-gpus", min=1, help="The largest job (GPUs) the plan "
                                            "must host on one GPU type; an error if --budget cannot buy it "
                                            "(default, and at least: the workload's largest job, raised to the "
                                            "next power of two where the budget allows)."),
    clouds: str = typer.Option("", "--clouds", help="Comma-separated clouds to buy from (default: all)."),
    scheduler: Scheduler = typer.Option(Scheduler.las, "--scheduler", help="The cluster's scheduling policy, "
                                        "for the workload's replays."),
    solver: Solver = typer.Option(Solver.auto, "--solver"),
    time_limit: float = typer.Option(60.0, "--time-limit", min=0.1),
    gap: float = typer.Option(1e-3, "--gap", min=0.0, help="Relative MIP gap to stop at."),
    sweep_budgets: str = typer.Option("", "--sweep", help="Comma-separated budgets: the frontier (budget vs mix "
                                      "served; with --workload, cost vs average JCT)."),
    holdout: float = typer.Option(HOLDOUT, "--holdout", min=0.0, max=0.9, help="With --workload: the share of its "
                                  "jobs (the last to arrive) held back to check the prediction out of sample and "
                                  "widen its interval (0: none)."),
    out_dir: Path = typer.Option(Path(".hetplan/plan"), "--out-dir", help="Where plan.json, hints and plots go."),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not log the planning run to MLflow."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri"),
    engine: ReplayEngine = "local",
    dask_address: DaskAddress = None,
    calibration_files: CalibrationFiles = None,
    shortlist: Shortlist = None,
    screen_jobs: ScreenJobs = None,
    replay_jobs: ReplayJobs = None,
    elastic: bool = typer.Option(False, "--elastic", help="Plan for an elastic workload: the workload's replays run "
                                 "the elastic scheduler (every round chooses each job's GPU type and count within "
                                 "its bounds) by the fitted multi-GPU scaling models, so the plan buys the shapes "
                                 "elastic jobs use. Needs --workload with batch sizes and bounds (--workload-format "
                                 "sia); buys only GPU types those models know."),
) -> None:
    """Choose the node mix and the CPU/RAM split together; print hetplan beside its baselines."""
    from hetplan.scheduler.elastic import ElasticRule

    request = PlanRequest(objective, max_avg_jct, target, fairness, scheduler.value, solver=solver_name(solver.value),
                          time_limit=time_limit, gap=gap, sweep=tuple(_budgets(sweep_budgets)), holdout=holdout,
                          sizes=ReplaySizes(shortlist, screen_jobs, replay_jobs),
                          elastic=ElasticRule(round_s=PlanRequest.round_s) if elastic else None)
    _check(request, workload, workload_format, budget, owned)
    curves = curves_or_default(curves)
    with contract_errors():
        if workload:
            request = replace(request, calibration=calibration(calibration_files))
        jobs = read_trace(workload, workload_format)[0] if workload else None
        if elastic and jobs is not None and "batch_size" not in jobs:
            raise typer.BadParameter("--elastic needs a workload with batch sizes and GPU-count bounds (a Sia "
                                     "workload: --workload-format sia)", param_hint="--workload")
        mix = demand_from_trace(jobs) if jobs is not None else DEMAND.load(demand)
        problem, inputs = load_problem(curves, catalog, mix, budget, clouds=[c.strip() for c in clouds.split(",")],
                                       fleet=owned, demand_gpus=demand_gpus, max_job_gpus=max_job_gpus,
                                       gpu_types=_elastic_types() if elastic else None)
        inputs["workload" if workload else "demand"] = fingerprint(workload or demand)
        warn(problem.warnings)
        try:
            with Reporter("plan", errors) as step:
                recent = workload_from_trace(jobs, source="--workload") if jobs is not None else None
                at = replace(request, progress=step, engine=replay_engine(engine, dask_address) if recent else None)
                outcome = plan_for(problem, at, recent, inputs=inputs, source=str(catalog))
        except SolveError as exc:
            raise ContractError([Problem(str(catalog), str(exc))]) from None
        warn(outcome.warnings)
        files = _write(outcome, out_dir)
    _summary(outcome, out_dir)
    if not no_mlflow:
        from hetplan.planner.tracking import log_planning_run

        run = log_planning_run(outcome.result, files, {b.name: b.value for b in outcome.baselines}, tracking_uri,
                               outcome.metrics)
        console.print(f"MLflow: planning run {run} in experiment hetplan-planning", highlight=False)


def _check(request: PlanRequest, workload: Path | None, workload_format: str, budget: float | None,
           owned: Path | None) -> None:
    """Every bad combination of options, as a one-line error before anything is read or written."""
    if workload_format not in ("trace", *FORMATS):
        raise typer.BadParameter(f"one of trace, {', '.join(FORMATS)}", param_hint="--workload-format")
    try:
        request.check(workload=workload is not None, budget=budget, owned=owned is not None)
    except RequestError as exc:
        raise typer.BadParameter(exc.message, param_hint=exc.option) from None


def _elastic_types() -> list[str]:
    """The GPU types an elastic plan may buy: those the fitted scaling models know."""
    from hetplan.sim.scaling_truth import ScalingTruth

    return ScalingTruth.fitted().gpu_types()


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


def _write(outcome: PlanOutcome, out_dir: Path) -> list[Path]:
    result = outcome.result
    files = write_plan_artifacts(result, outcome.baselines, out_dir)
    figures = [("node_mix.png", plot_node_mix(result.nodes, result.allocation, f"{result.plan.plan_id}: "
                                              f"{result.plan.cost_per_hour:.2f} $/h"))]
    if outcome.candidates is not None:
        table = outcome.candidates.assign(node_counts=outcome.candidates["node_counts"].map(_json))
        atomic_write_bytes(out_dir / "candidates.csv", table.to_csv(index=False).encode())
        files.append(out_dir / "candidates.csv")
    if outcome.frontier is not None and len(outcome.frontier):
        frontier = outcome.frontier.copy()
        if "node_counts" in frontier:
            frontier["node_counts"] = frontier["node_counts"].map(_json)
        atomic_write_bytes(out_dir / "frontier.csv", frontier.to_csv(index=False).encode())
        files.append(out_dir / "frontier.csv")
        figure = plot_cost_jct(outcome.frontier) if outcome.candidates is not None else plot_frontier(outcome.frontier)
        figures.append(("frontier.png", figure))
    for name, figure in figures:
        save_figure(figure, out_dir / name)
        files.append(out_dir / name)
    return files


def _json(counts) -> str:
    return json.dumps(counts, sort_keys=True) if isinstance(counts, dict) else ""


def _summary(outcome: PlanOutcome, out_dir: Path) -> None:
    plan = outcome.result.plan
    budget = "no budget" if plan.budget_per_hour is None else f"{plan.budget_per_hour:.2f} $/h budget"
    console.print(f"[bold]{plan.plan_id}[/]: {plan.cost_per_hour:.2f} $/h of {budget}; {outcome.unit} "
                  f"{plan.objective:.2f} reference GPUs per hour; {plan.solver} in {plan.solve_seconds:.2f} s"
                  + (" [yellow](time limit reached: best plan found)[/]" if plan.timed_out else ""), highlight=False)
    nodes = Table(title="node mix")
    for column in ("shape", "gpu_type", "add", "owned", "GPUs", "vCPU/GPU", "GB/GPU", "$/h each"):
        nodes.add_column(column, justify="left" if column in ("shape", "gpu_type") else "right")
    for r in outcome.result.nodes.itertuples():
        nodes.add_row(r.shape, r.gpu_type, str(r.added), str(r.owned), str((r.added + r.owned) * r.gpus),
                      f"{r.vcpus / r.gpus:g}", f"{r.mem_gb / r.gpus:g}", f"{r.price_per_hour:.2f}")
    console.print(nodes)
    if outcome.candidates is not None:
        _candidate_table(outcome)
    elif outcome.baselines:
        _baseline_table(outcome)
    if plan.planning and "host_sizes" in plan.planning:
        console.print(describe(plan.planning["host_sizes"]), highlight=False, soft_wrap=True)
    if plan.needs_profiling:
        console.print(f"needs profiling (planned on the conservative default): {', '.join(plan.needs_profiling)}",
                      highlight=False)
    extra = ", candidates.csv" if outcome.candidates is not None else ""
    extra += ", frontier.csv, frontier.png" if outcome.frontier is not None and len(outcome.frontier) else ""
    console.print(f"wrote {out_dir}/plan.json, hints.parquet, kueue.yaml, baselines.csv, node_mix.png{extra}",
                  highlight=False)


def _candidate_table(outcome: PlanOutcome) -> None:
    frame = outcome.candidates
    planning = outcome.result.plan.planning or {}
    table = Table(title=f"candidates replayed on the workload ({planning.get('workload', {}).get('jobs', '?')} jobs, "
                  f"{planning.get('scheduler', '?')}; simulated with the planner's curves)")
    for column in ("candidate", "policy", "$/h", "GPUs", "mix served", "fluid load", "avg JCT h", "p95 JCT h",
                   "makespan h", ""):
        table.add_column(column, justify="left" if column in ("candidate", "policy", "") else "right")
    for r in frame.itertuples():
        figures = ("-", "-", "-") if r.pruned else (f"{r.avg_jct_h:.3g}", f"{r.p95_jct_h:.3g}", f"{r.makespan_h:.4g}")
        mark = "[bold green]chosen[/]" if r.chosen else ("pruned: overloaded" if r.pruned else "")
        table.add_row(r.candidate, r.policy, f"{r.cost_per_hour:.2f}", str(r.gpus), f"{r.mix_served:.1f}",
                      f"{r.fluid_load:.2f}", *figures, mark)
    console.print(table)
    console.print(f"predicted for the workload: {outcome.summary}", highlight=False, soft_wrap=True)
    if outcome.prediction is not None:
        console.print(f"prediction: {outcome.prediction.line()}", highlight=False, soft_wrap=True)


def _baseline_table(outcome: PlanOutcome) -> None:
    reference = next((b for b in outcome.baselines if b.name == STATUS_QUO), None)
    table = Table(title=f"hetplan vs baselines (predicted from the curves; {outcome.unit}, reference GPUs per hour)")
    for column in ("plan", "$/h", outcome.unit, "per $/h", "vs status quo", "per $ vs status quo"):
        table.add_column(column, justify="left" if column == "plan" else "right")
    for b in outcome.baselines:
        ok = reference is not None and reference.value > 0
        table.add_row(b.name, f"{b.cost_per_hour:.2f}", f"{b.value:.1f}", f"{b.per_dollar:.3f}",
                      f"{b.value / reference.value:.2f}x" if ok else "-",
                      f"{b.per_dollar / reference.per_dollar:.2f}x" if ok and reference.per_dollar > 0 else "-")
    console.print(table)
