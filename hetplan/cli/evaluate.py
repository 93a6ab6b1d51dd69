"""`hetplan evaluate`: plan on one trace, replay another, four ways of buying and allocating side by side."""

from __future__ import annotations

import json
from collections.abc import Collection
import math
from pathlib import Path

import typer
from rich.table import Table

from hetplan.allocator.stability import Stability
from hetplan.cli.common import (
    EXIT_INVALID, CalibrationFiles, CurvesFile, DaskAddress, MoveBudget, MoveMargin, ReplayEngine, ReplayJobs,
    ReturnMargin, ReturnWindowH, ScreenJobs, Shortlist, SpreadMoves, calibration, choices, console, contract_errors,
    curves_or_default, errors, read_trace, replay_engine, stability, warn,
)
from hetplan.contracts import CURVES, PROFILES, ContractError, Problem, gpu_declarations
from hetplan.fsio import atomic_write_bytes, save_figure
from hetplan.evaluation import ElasticEvaluation, EvaluationResult, ProblemInputs, evaluate as run_evaluation
from hetplan.evaluation.evaluate import DERIVED, ELASTIC, FIXED, MEASURED
from hetplan.planner.entry import read_catalog, read_fleet
from hetplan.planner.sizes import describe
from hetplan.planning import Objective, ReplaySizes
from hetplan.planning.request import HOLDOUT, SOLVER_NAMES
from hetplan.progress import Reporter
from hetplan.scheduler.elastic import ElasticRule
from hetplan.sim.engine import SCHEDULERS, InvariantError, SimulationError
from hetplan.sim.plots import plot_jct_cdf, plot_utilisation
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import MIX
from hetplan.traces import FORMATS

TRACE_CONTRACT = "trace"


TraceFormat = choices("TraceFormat", [TRACE_CONTRACT, *FORMATS])
Solver = choices("Solver", list(SOLVER_NAMES))
EvalObjective = choices("Objective", [o.value for o in Objective if o is not Objective.cost])
"""The objectives of the `hetplan` setup (`cost` needs a JCT target the evaluation does not take)."""


def evaluate(
    trace: Path = typer.Option(..., "--trace", help="Trace the setups replay: hetplan's trace contract or a public "
                               "format."),
    fmt: TraceFormat = typer.Option(TRACE_CONTRACT, "--format", help=f"{TRACE_CONTRACT}|{'|'.join(FORMATS)}."),
    plan_trace: Path | None = typer.Option(None, "--plan-trace", help="Trace the planner sees (default: --trace "
                                           "itself, an in-sample evaluation)."),
    plan_format: TraceFormat | None = typer.Option(None, "--plan-format", help="Format of --plan-trace (default: --format)."),
    budget: float = typer.Option(..., "--budget", min=0.0, help="US$ per hour every setup may spend."),
    objective: EvalObjective = typer.Option(Objective.jct.value, "--objective",
                                            help="The hetplan setup's planner objective."),
    policy: str = typer.Option("las", "--policy", help=f"Scheduling policies, comma-separated: "
                               f"{'|'.join(SCHEDULERS)} (the first is the one the planner plans for)."),
    rho: str = typer.Option("", "--rho", help="Loads as the share of the status quo's GPU time the arrivals ask for, "
                            "comma-separated (Poisson arrivals, a rate per trace)."),
    load: str = typer.Option("", "--load", help="Loads in jobs/h, comma-separated (Poisson arrivals); default: the "
                             "traces' own arrival times."),
    catalog: Path = typer.Option(Path(".hetplan/catalog.csv"), "--catalog", help="Node-shape catalog."),
    owned: Path | None = typer.Option(None, "--owned", help="Owned fleet (name,gpu_type,gpus,vcpus,mem_gb,count)."),
    curves: CurvesFile = None,
    truth: Path = typer.Option(Path(".hetplan/profiles.csv"), "--truth",
                               help="Profiles the simulator treats as truth (not read with --elastic)."),
    clouds: str = typer.Option("", "--clouds", help="Comma-separated clouds to buy from (default: all)."),
    unknown_model: str = typer.Option(MIX, "--unknown-model", help="Truth model for jobs of models the truth "
                                      f"lacks, or {MIX!r}: one drawn at random per job (seeded)."),
    relabel_unknown: bool = typer.Option(False, "--relabel-unknown", help="Relabel those jobs as their truth model "
                                         "in both traces (else the planner plans them on its unprofiled default)."),
    round_s: float = typer.Option(300.0, "--round-s", min=1.0, help="Scheduling round (s): preemption points."),
    holdout: float = typer.Option(HOLDOUT, "--holdout", min=0.0, max=0.9, help="The share of the plan trace's jobs "
                                  "(the last to arrive) the planner holds back to check its prediction and widen its "
                                  "interval (0: none); summary.csv puts the prediction beside the replay."),
    seed: int = typer.Option(0, "--seed", help="Seed for arrivals and model draws."),
    move_margin: MoveMargin = Stability.margin,
    return_window_h: ReturnWindowH = Stability.return_window_s / 3600,
    return_margin: ReturnMargin = Stability.return_margin,
    move_budget: MoveBudget = Stability.budget,
    spread_moves: SpreadMoves = Stability.spread,
    max_job_gpus: int | None = typer.Option(None, "--max-job-gpus", min=1, help="The largest job (GPUs) hetplan's "
                                            "plan must host on one GPU type (default, and at least: the plan "
                                            "trace's largest job, raised to the next power of two where the budget "
                                            "allows)."),
    solver: Solver = typer.Option("auto", "--solver", help="auto | gurobi | highs."),
    time_limit: float = typer.Option(60.0, "--time-limit", min=0.1),
    out_dir: Path = typer.Option(Path(".hetplan/evaluation"), "--out-dir", help="Where tables and plots go."),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not log the evaluation to MLflow."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri"),
    engine: ReplayEngine = "local",
    dask_address: DaskAddress = None,
    calibration_files: CalibrationFiles = None,
    shortlist: Shortlist = None,
    screen_jobs: ScreenJobs = None,
    replay_jobs: ReplayJobs = None,
    elastic: bool = typer.Option(False, "--elastic", help="Elastic GPU counts: every setup is replayed twice, with "
                                 "the trace's fixed counts and with the elastic scheduler (each round chooses every "
                                 "job's GPU type and count within its bounds), side by side; hetplan's planner "
                                 "weighs its candidates with the elastic scheduler. Needs a trace with batch sizes "
                                 "and bounds (--format sia); speeds on every GPU count come from --truth-placements "
                                 "(not --truth); takes --load or the traced arrivals, not --rho."),
    truth_placements: str | None = typer.Option(None, "--truth-placements", help="With --elastic: `shipped` reads "
                                                "Sia's measured multi-GPU step times shipped with hetplan as the "
                                                "truth (labelled measured); without it the truth is the fitted "
                                                "scaling models alone (labelled derived)."),
) -> None:
    """Plan hetplan and the three baselines on PLAN_TRACE under BUDGET, replay TRACE on each, compare.

    With --elastic, each setup is replayed with fixed counts and with elastic ones: summary.csv adds avg JCT
    elastic, the fixed/elastic ratio over the jobs both completed, restarts per job and the restart waste share
    of both, and the truth's label (measured / derived); jobs.csv says which run a row is (counts)."""
    schedulers = _names(policy, SCHEDULERS, "--policy")
    scaling = _elastic_truth(elastic, truth_placements, rho, relabel_unknown, round_s)
    for option, value in (("--format", fmt), ("--plan-format", plan_format or fmt)):
        if value not in (TRACE_CONTRACT, *FORMATS):
            raise typer.BadParameter(f"one of {TRACE_CONTRACT}, {', '.join(FORMATS)}", param_hint=option)
    if solver not in SOLVER_NAMES:
        raise typer.BadParameter(f"one of {', '.join(SOLVER_NAMES)}", param_hint="--solver")
    curves = curves_or_default(curves)
    with contract_errors():
        if out_dir.exists() and not out_dir.is_dir():
            raise ContractError([Problem(str(out_dir), "--out-dir exists and is not a directory")])
        rhos, loads = _numbers(rho, "--rho"), _numbers(load, "--load")
        if rhos and loads:
            raise ContractError([Problem("--rho", "give --rho or --load, not both")])
        jobs, import_report, import_warnings = read_trace(trace, fmt)
        plan_jobs = read_trace(plan_trace, plan_format or fmt)[0] if plan_trace else None
        if scaling is not None:
            for option, frame in (("--trace", jobs), ("--plan-trace", plan_jobs)):
                if frame is not None and "batch_size" not in frame:
                    raise typer.BadParameter("--elastic needs a trace with batch sizes and GPU-count bounds "
                                             "(a Sia workload: --format sia)", param_hint=option)
        shapes = read_catalog(catalog, [c.strip() for c in clouds.split(",")])
        fleet = read_fleet(owned, catalog) if owned else None
        fitted = CURVES.load(curves)
        inputs = ProblemInputs(fitted, shapes, budget, fleet, gpu_declarations(shapes, fleet), max_job_gpus)
        truth_curves = TruthCurves.from_profiles(PROFILES.load(truth), fallback=fitted) if scaling is None else None
        with Reporter("evaluate", errors) as progress:
            try:
                result = run_evaluation(jobs, inputs, truth_curves, plan_trace=plan_jobs,
                                        objective=Objective.parse(objective), rhos=rhos, loads=loads,
                                        schedulers=schedulers, unknown_model=unknown_model,
                                        relabel_unknown=relabel_unknown, seed=seed, round_s=round_s,
                                        solver=SOLVER_NAMES[solver], time_limit=time_limit, progress=progress,
                                        engine=replay_engine(engine, dask_address),
                                        stability=stability(move_margin, return_window_h, return_margin,
                                                            move_budget, spread_moves), holdout=holdout,
                                        calibration=calibration(calibration_files),
                                        sizes=ReplaySizes(shortlist, screen_jobs, replay_jobs),
                                        elastic=scaling)
            except InvariantError as exc:  # a bug: name what broke, not an input file
                raise ContractError([Problem("hetplan simulator", str(exc))]) from None
            except SimulationError as exc:  # e.g. a truth with no throughput at a share a policy granted
                raise ContractError([Problem(str(truth), str(exc))]) from None
    report = {**{f"import_{k}": v for k, v in import_report.items()}, **result.report,
              "truth_sources": (truth_curves or scaling.truth).sources()}
    files = _write(result, report, import_warnings + result.warnings, out_dir)
    _print(result)
    warn(import_warnings + result.warnings)
    console.print(f"wrote {', '.join(str(f) for f in files)}", highlight=False, soft_wrap=True)
    if not no_mlflow:
        from hetplan.evaluation.tracking import EXPERIMENT, log_evaluation_run

        params = {"trace": str(trace), "plan_trace": str(plan_trace or trace), "format": fmt, "budget": budget,
                  "objective": str(objective), "holdout": holdout, "policies": ",".join(schedulers), "rho": rho or "-",
                  "loads": load or "trace", "clouds": clouds or "all", "unknown_model": unknown_model,
                  "relabel_unknown": relabel_unknown, "round_s": round_s, "seed": seed, "solver": solver,
                  "max_job_gpus": max_job_gpus or "-",
                  "elastic": scaling.label if scaling is not None else "-"}
        try:
            run = log_evaluation_run(result, params, files, tracking_uri)
        except Exception as exc:  # the files are written; say that MLflow did not take them, and fail
            errors.print(f"[red]error:[/] MLflow logging failed ({type(exc).__name__}: {exc}); the files above "
                         "are complete", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_INVALID) from None
        console.print(f"MLflow: evaluation run {run} in experiment {EXPERIMENT}", highlight=False)


def _elastic_truth(elastic: bool, placements: str | None, rho: str, relabel_unknown: bool,
                   round_s: float) -> ElasticEvaluation | None:
    """The elastic evaluation asked for (None: none), or a usage error (exit 2) naming the option that does not
    go with it."""
    if not elastic:
        if placements is not None:
            raise typer.BadParameter("only with --elastic", param_hint="--truth-placements")
        return None
    if placements not in (None, "shipped"):
        raise typer.BadParameter(f"`shipped` (the measured table shipped with hetplan), got {placements!r}",
                                 param_hint="--truth-placements")
    if rho.strip():
        raise typer.BadParameter("not with --elastic (rho reads the profile truth): give --load or the traced "
                                 "arrivals", param_hint="--rho")
    if relabel_unknown:
        raise typer.BadParameter("not with --elastic (a Sia trace names its models)", param_hint="--relabel-unknown")
    from hetplan.sim.scaling_truth import ScalingTruth, shipped

    measured = placements == "shipped"
    truth = shipped() if measured else ScalingTruth.fitted()
    return ElasticEvaluation(truth, MEASURED if measured else DERIVED, ElasticRule(round_s=round_s))


def _names(value: str, allowed: Collection[str], option: str) -> list[str]:
    names = list(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        raise typer.BadParameter(f"comma-separated, each one of {', '.join(allowed)}", param_hint=option)
    return names


def _numbers(value: str, option: str) -> list[float]:
    numbers = []
    for item in (v for v in value.split(",") if v.strip()):
        try:
            number = float(item)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise ContractError([Problem(option, f"{item.strip()!r} is not a positive number")])
        numbers.append(number)
    return list(dict.fromkeys(numbers))


def _write(result: EvaluationResult, report: dict, warnings: list[str], out_dir: Path) -> list[Path]:
    """Every table and plot, each written atomically (nothing is written before the whole evaluation ran)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / "summary.csv", out_dir / "jobs.csv", out_dir / "report.json"]
    atomic_write_bytes(files[0], result.summary.to_csv(index=False, lineterminator="\n").encode())
    atomic_write_bytes(files[1], result.jobs.to_csv(index=False, lineterminator="\n").encode())
    setups = {label: [{"name": s.name, "policy": s.policy, "hints": s.hints.version, "node_counts": s.node_counts,
                       "gpus": s.gpus, "cost_per_hour": s.cost_per_hour} for s in setups]
              for label, setups in result.setups.items()}
    chosen = {label: {"winner": plan.winner, "objective": str(plan.objective),
                      "decision": (plan.result.plan.planning or {}).get("decision"),
                      "prediction": plan.prediction.to_dict() if plan.prediction is not None else None}
              for label, plan in result.plans.items()}
    atomic_write_bytes(files[2], json.dumps({"report": report, "warnings": warnings, "setups": setups,
                                             "plans": chosen}, indent=2).encode())
    capacity = {s.name: s.capacity for setups in result.setups.values() for s in setups}
    modes = [FIXED, ELASTIC] if "counts" in result.jobs else [FIXED]
    for (rho, load, scheduler), label in _runs(result).items():
        where = f"rho{rho:g}" if not math.isnan(rho) else ("trace" if math.isnan(load) else f"{load:g}jph")
        for mode in modes:
            tag = f"{scheduler}_{where}" + ("_elastic" if mode == ELASTIC else "")
            title = label + (", elastic counts" if mode == ELASTIC else "")
            jobs, timelines = (_of_mode(frame, mode) for frame in (result.jobs, result.timelines))
            plots = ((f"jct_cdf_{tag}.png", plot_jct_cdf(_of_run(jobs, rho, load, scheduler), f"JCT, {title}")),
                     (f"utilisation_{tag}.png", plot_utilisation(_of_run(timelines, rho, load, scheduler), capacity,
                                                                 f"Utilisation, {title}")))
            for name, fig in plots:
                save_figure(fig, out_dir / name)
                files.append(out_dir / name)
    return files


def _of_mode(frame, mode: str):
    """The rows of `frame` of the fixed or elastic runs (all of them where the evaluation was not elastic)."""
    return frame[frame["counts"] == mode] if "counts" in frame else frame


def _runs(result: EvaluationResult) -> dict[tuple[float, float, str], str]:
    """The (rho, load, scheduler) of each run, in run order, with a label (NaN: not set / as traced)."""
    out = {}
    for rho, load, scheduler in result.summary[["rho", "load_jobs_per_h", "scheduler"]].drop_duplicates().itertuples(
            index=False):
        where = f"rho {rho:g}" if not math.isnan(rho) else ("traced load" if math.isnan(load) else f"{load:g} jobs/h")
        out[(float(rho), float(load), str(scheduler))] = f"{scheduler.upper()}, {where}"
    return out


def _of_run(frame, rho: float, load: float, scheduler: str):
    def same(column, value):
        return frame[column].isna() if math.isnan(value) else frame[column] == value

    return frame[same("rho", rho) & same("load_jobs_per_h", load) & (frame["scheduler"] == scheduler)]


def _print(result: EvaluationResult) -> None:
    for (rho, load, scheduler), label in _runs(result).items():
        rows = _of_run(result.summary, rho, load, scheduler)
        table = Table("setup", "GPUs", "$/h", "avg JCT h", "median h", "p95 h", "p99 h", "makespan h", "queue h",
                      "GPU util", "CPU util", "work/$", "JCT speedup", "predicted", "real/pred",
                      "work/$ ratio", "too big", "only it ran", title=label, title_justify="left")
        for r in rows.itertuples():
            table.add_row(r.setup, str(r.gpus), f"{r.cost_per_hour:.1f}", f"{r.avg_jct_h:.3g}", f"{r.median_jct_h:.3g}",
                          f"{r.p95_jct_h:.3g}", f"{r.p99_jct_h:.3g}", f"{r.makespan_h:.4g}", f"{r.avg_queue_h:.3g}",
                          f"{r.gpu_util:.0%}", f"{r.cpu_util:.0%}", f"{r.work_per_dollar:.3g}", f"{r.jct_speedup:.2f}x",
                          _predicted_text(r), "-" if math.isnan(r.realised_over_predicted)
                          else f"{r.realised_over_predicted:.2f}", f"{r.work_per_dollar_ratio:.2f}x",
                          str(r.rejected_too_big), _only_text(r))
        console.print(table)
    if "elastic_avg_jct_h" in result.summary:
        _print_elastic(result)
    for label, plan in result.plans.items():
        console.print(f"hetplan at {label}: {plan.winner} ({plan.objective} objective); "
                      + describe((plan.result.plan.planning or {}).get("host_sizes") or {}), highlight=False,
                      soft_wrap=True)
        decision = (plan.result.plan.planning or {}).get("decision") or {}
        for line in (decision.get("reason"), decision.get("declined")):
            if line:
                console.print(f"  {line}", highlight=False, soft_wrap=True)
        if plan.prediction is not None:
            console.print(f"  planner's {plan.prediction.line()}", highlight=False, soft_wrap=True)
    console.print("JCT speedup = status quo avg JCT / setup avg JCT, over the jobs every setup ran; too big = jobs "
                  "a setup refused (larger than it hosts); only it ran = jobs a setup ran that the status quo did not, "
                  "and their avg JCT; work/$ = reference GPU-hours completed per "
                  "US$ over the makespan; queue = arrival to first start; predicted = the planner's avg JCT "
                  "speedup over the status quo (its curves, simulated on the plan trace) and its interval; "
                  "real/pred = JCT speedup / predicted. Speeds come from the truth profiles "
                  "(where a warning says so, from the planner's curves), the plans from the fitted curves.",
                  highlight=False, soft_wrap=True)


def _print_elastic(result: EvaluationResult) -> None:
    """Each run's setups with fixed counts beside elastic ones (the truth's label in the title)."""
    for (rho, load, scheduler), label in _runs(result).items():
        rows = _of_run(result.summary, rho, load, scheduler)
        truth = str(rows["truth"].iloc[0]) if len(rows) else "-"
        table = Table("setup", "GPUs", "avg JCT fixed h", "avg JCT elastic h", "fixed/elastic", "common jobs",
                      "restarts/job fixed", "restarts/job elastic", "restart waste fixed", "restart waste elastic",
                      title=f"{label}: fixed vs elastic GPU counts (truth: {truth})", title_justify="left")
        for r in rows.itertuples():
            table.add_row(r.setup, str(r.gpus), f"{r.avg_jct_h:.3g}", f"{r.elastic_avg_jct_h:.3g}",
                          "-" if math.isnan(r.elastic_jct_ratio) else f"{r.elastic_jct_ratio:.2f}x",
                          str(int(r.elastic_common_jobs)), f"{r.restarts_per_job:.2f}",
                          f"{r.elastic_restarts_per_job:.2f}", _share(r.restart_waste_share),
                          _share(r.elastic_restart_waste_share))
        console.print(table)
    console.print("fixed/elastic = avg JCT with the trace's fixed GPU counts / with elastic ones, over the jobs "
                  "both completed (common jobs; above 1: elastic is faster); restarts = preemptions, moves and "
                  "count changes; restart waste = the share of lent GPU-time jobs held while restarting. Truth: "
                  "measured = Sia's measured step times (fitted models where none were measured), derived = the "
                  "fitted scaling models alone; simulated, not measured.", highlight=False, soft_wrap=True)


def _share(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1%}"


def _only_text(row) -> str:
    """`37 (129 h)`: the jobs a setup ran that the status quo did not, with their average JCT; `-` for none."""
    extra = getattr(row, "extra_jobs", -1)
    if not extra or extra < 0:
        return "-"
    return f"{int(extra)} ({row.extra_avg_jct_h:.3g} h)"


def _predicted_text(row) -> str:
    """`1.30x [1.22, 1.40]`, or `-` where the planner predicted no JCT speedup."""
    if math.isnan(row.predicted_jct_speedup):
        return "-"
    if row.predicted_low == row.predicted_high == row.predicted_jct_speedup:
        return f"{row.predicted_jct_speedup:.2f}x"
    return f"{row.predicted_jct_speedup:.2f}x [{row.predicted_low:.2f}, {row.predicted_high:.2f}]"
