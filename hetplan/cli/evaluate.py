"""`hetplan evaluate`: the same trace and budget, four ways of buying and allocating, simulated side by side."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hetplan.cli.common import EXIT_INVALID, console, contract_errors, errors, warn
from hetplan.contracts import CATALOG, CURVES, PROFILES, TRACE
from hetplan.contracts.table import ContractError, Problem, atomic_write_bytes
from hetplan.sim.engine import SCHEDULERS, SimulationError
from hetplan.sim.evaluate import EvaluationResult, evaluate as run_evaluation
from hetplan.sim.plots import plot_jct_cdf, plot_utilisation
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import MIX
from hetplan.traces import FORMATS, import_trace

TRACE_CONTRACT = "trace"


def evaluate(
    trace: Path = typer.Option(..., "--trace", help="Trace file: hetplan's trace contract or a public format."),
    fmt: str = typer.Option(TRACE_CONTRACT, "--format", help=f"{TRACE_CONTRACT}|{'|'.join(FORMATS)}."),
    budget: float = typer.Option(..., "--budget", min=0.0, help="US$ per hour every setup may spend."),
    policy: str = typer.Option("las", "--policy", help=f"Scheduling policies, comma-separated: "
                               f"{'|'.join(SCHEDULERS)}."),
    load: str = typer.Option("", "--load", help="Loads in jobs/h, comma-separated (Poisson arrivals); "
                             "default: the trace's own arrival times."),
    catalog: Path = typer.Option(Path(".hetplan/catalog.csv"), "--catalog", help="Node-shape catalog."),
    curves: Path = typer.Option(Path(".hetplan/curves.parquet"), "--curves",
                                help="Fitted curves (the planner's view)."),
    truth: Path = typer.Option(Path(".hetplan/profiles.csv"), "--truth",
                               help="Profiles the simulator treats as truth."),
    clouds: str = typer.Option("", "--clouds", help="Comma-separated clouds to buy from (default: all)."),
    unknown_model: str = typer.Option(MIX, "--unknown-model", help="Truth model for jobs of models the truth "
                                      f"lacks, or {MIX!r}: one drawn at random (seeded)."),
    fairness: float = typer.Option(1.0, "--fairness", min=0.0, max=1.0, help="Planner floor: each class's share "
                                   "of the normalised throughput (1: plan for the trace's own mix)."),
    round_s: float = typer.Option(300.0, "--round-s", min=1.0, help="Scheduling round (s): preemption points."),
    seed: int = typer.Option(0, "--seed", help="Seed for arrivals and model draws."),
    solver: str = typer.Option("auto", "--solver", help="auto | gurobi | highs."),
    time_limit: float = typer.Option(60.0, "--time-limit", min=0.1),
    out_dir: Path = typer.Option(Path(".hetplan/evaluation"), "--out-dir", help="Where tables and plots go."),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not log the evaluation to MLflow."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri"),
) -> None:
    """Plan hetplan and the three baselines for TRACE's mix under BUDGET, replay TRACE on each, compare."""
    schedulers = _names(policy, SCHEDULERS, "--policy")
    if fmt not in (TRACE_CONTRACT, *FORMATS):
        raise typer.BadParameter(f"one of {TRACE_CONTRACT}, {', '.join(FORMATS)}", param_hint="--format")
    if solver not in ("auto", "gurobi", "highs"):
        raise typer.BadParameter("one of auto, gurobi, highs", param_hint="--solver")
    with contract_errors():
        if out_dir.exists() and not out_dir.is_dir():
            raise ContractError([Problem(str(out_dir), "--out-dir exists and is not a directory")])
        loads = _loads(load)
        jobs, import_report, import_warnings = _read_trace(trace, fmt)
        shapes = CATALOG.load(catalog)
        wanted = [c.strip() for c in clouds.split(",") if c.strip()]
        if wanted:
            shapes = shapes[shapes["cloud"].isin(wanted)]
        fitted = CURVES.load(curves)
        truth_curves = TruthCurves.from_profiles(PROFILES.load(truth), fallback=fitted)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            task = bar.add_task("planning the four setups", total=None)

            def step(done: int, total: int, label: str) -> None:
                bar.update(task, completed=done, total=total, description=f"simulating {label}")

            try:
                result = run_evaluation(jobs, shapes, fitted, truth_curves, budget, schedulers=schedulers,
                                        loads=loads, unknown_model=unknown_model, seed=seed, round_s=round_s,
                                        fairness=fairness, solver=solver, time_limit=time_limit,
                                        progress=step)  # type: ignore[arg-type]
            except SimulationError as exc:  # e.g. a truth with no throughput at a share a policy granted
                raise ContractError([Problem(str(truth), str(exc))]) from None
    report = {**{f"import_{k}": v for k, v in import_report.items()}, **result.report,
              "truth_sources": truth_curves.sources()}
    files = _write(result, report, import_warnings + result.warnings, out_dir)
    _print(result)
    warn(import_warnings + result.warnings)
    console.print(f"wrote {', '.join(str(f) for f in files)}", highlight=False, soft_wrap=True)
    if not no_mlflow:
        from hetplan.sim.tracking import EXPERIMENT, log_evaluation_run

        params = {"trace": str(trace), "format": fmt, "budget": budget, "policies": ",".join(schedulers),
                  "loads": load or "trace", "clouds": clouds or "all", "unknown_model": unknown_model,
                  "fairness": fairness, "round_s": round_s, "seed": seed, "solver": solver}
        try:
            run = log_evaluation_run(result, params, files, tracking_uri)
        except Exception as exc:  # the files are written; say that MLflow did not take them, and fail
            errors.print(f"[red]error:[/] MLflow logging failed ({type(exc).__name__}: {exc}); the files above "
                         "are complete", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_INVALID) from None
        console.print(f"MLflow: evaluation run {run} in experiment {EXPERIMENT}", highlight=False)


def _names(value: str, allowed: tuple[str, ...], option: str) -> list[str]:
    names = list(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        raise typer.BadParameter(f"comma-separated, each one of {', '.join(allowed)}", param_hint=option)
    return names


def _loads(value: str) -> list[float | None]:
    if not value.strip():
        return [None]
    loads = []
    for item in value.split(","):
        try:
            number = float(item)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise ContractError([Problem("--load", f"{item.strip()!r} is not a positive number of jobs per hour")])
        loads.append(number)
    return list(dict.fromkeys(loads))


def _read_trace(path: Path, fmt: str):
    if fmt == TRACE_CONTRACT:
        return TRACE.load(path), {}, []
    imported = import_trace(path, fmt)
    return imported.trace, imported.report, imported.warnings


def _write(result: EvaluationResult, report: dict, warnings: list[str], out_dir: Path) -> list[Path]:
    """Every table and plot, each written atomically (nothing is written before the whole evaluation ran)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "summary.csv", out_dir / "jobs.csv", out_dir / "report.json"]
    atomic_write_bytes(files[0], result.summary.to_csv(index=False, lineterminator="\n").encode())
    atomic_write_bytes(files[1], result.jobs.to_csv(index=False, lineterminator="\n").encode())
    setups = [{"name": s.name, "policy": s.policy, "hints": s.hints.version, "node_counts": s.node_counts,
               "gpus": s.gpus, "cost_per_hour": s.cost_per_hour} for s in result.setups]
    atomic_write_bytes(files[2], json.dumps({"report": report, "warnings": warnings, "setups": setups},
                                            indent=2).encode())
    capacity = {s.name: s.capacity for s in result.setups}
    for load, scheduler in _runs(result):
        tag = f"{scheduler}_{'trace' if math.isnan(load) else f'{load:g}jph'}"
        title = f"{scheduler.upper()}, load {'as traced' if math.isnan(load) else f'{load:g} jobs/h'}"
        plots = ((f"jct_cdf_{tag}.png", plot_jct_cdf(_of_run(result.jobs, load, scheduler), f"JCT, {title}")),
                 (f"utilisation_{tag}.png", plot_utilisation(_of_run(result.timelines, load, scheduler), capacity,
                                                             f"Utilisation, {title}")))
        for name, fig in plots:
            path = out_dir / name
            fig.savefig(path.with_suffix(".tmp.png"))
            plt.close(fig)
            path.with_suffix(".tmp.png").replace(path)
            files.append(path)
    return files


def _runs(result: EvaluationResult) -> list[tuple[float, str]]:
    """The (load, scheduler) pairs of an evaluation, in run order (load NaN: the trace's own arrivals)."""
    pairs = result.summary[["load_jobs_per_h", "scheduler"]].drop_duplicates()
    return [(float(load), str(scheduler)) for load, scheduler in pairs.itertuples(index=False)]


def _of_run(frame, load: float, scheduler: str):
    same_load = frame["load_jobs_per_h"].isna() if math.isnan(load) else frame["load_jobs_per_h"] == load
    return frame[same_load & (frame["scheduler"] == scheduler)]


def _print(result: EvaluationResult) -> None:
    for load, scheduler in _runs(result):
        rows = _of_run(result.summary, load, scheduler)
        title = f"{scheduler.upper()} at {'the traced load' if math.isnan(load) else f'{load:g} jobs/h'}"
        table = Table("setup", "GPUs", "$/h", "avg JCT h", "median h", "p99 h", "makespan h", "queue h", "wait h",
                      "GPU util", "CPU util", "work/$", "JCT speedup", "work/$ ratio", "too big", title=title,
                      title_justify="left")
        for r in rows.itertuples():
            table.add_row(r.setup, str(r.gpus), f"{r.cost_per_hour:.1f}", f"{r.avg_jct_h:.3g}", f"{r.median_jct_h:.3g}",
                          f"{r.p99_jct_h:.3g}", f"{r.makespan_h:.4g}", f"{r.avg_queue_h:.3g}", f"{r.avg_wait_h:.3g}",
                          f"{r.gpu_util:.0%}", f"{r.cpu_util:.0%}", f"{r.work_per_dollar:.3g}", f"{r.jct_speedup:.2f}x",
                          f"{r.work_per_dollar_ratio:.2f}x", str(r.rejected_too_big))
        console.print(table)
    console.print("JCT speedup = status quo avg JCT / setup avg JCT; work/$ = reference GPU-hours completed per "
                  "US$ over the makespan; queue = arrival to first start, wait = all time not running. Speeds come "
                  "from the truth profiles (where a warning says so, from the fitted curves), the plans from the "
                  "fitted curves.",
                  highlight=False, soft_wrap=True)
