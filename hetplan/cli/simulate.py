"""`hetplan simulate`: replay a trace on a given fleet with one allocator policy and scheduler, no planning."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import typer

from hetplan.allocator.stability import Stability
from hetplan.cli.common import (
    EXIT_INVALID, MoveBudget, MoveMargin, ReturnMargin, ReturnWindowH, SpreadMoves, console, contract_errors, errors,
    read_trace, stability, warn,
)
from hetplan.contracts import ContractError, Problem

TRACE_CONTRACT = "trace"


class PolicyName(str, Enum):
    hint = "hint"
    hint_static = "hint-static"
    proportional = "proportional"
    first_fit = "first-fit"


class SchedulerName(str, Enum):
    las = "las"
    fifo = "fifo"
    srtf = "srtf"


def simulate(
    trace: Path = typer.Option(..., "--trace", help="Trace to replay: hetplan's trace contract or a public format."),
    fmt: str = typer.Option(TRACE_CONTRACT, "--format", help="trace | a public format (see `hetplan trace`)."),
    nodes: Path = typer.Option(..., "--nodes", help="Fleet: CSV name,gpu_type,gpus,vcpus,mem_gb[,count] (GiB), "
                               "YAML or JSON."),
    truth: Path | None = typer.Option(None, "--truth", help="Profiles the simulator treats as truth (CPU/RAM curves, "
                                      "linear in GPUs)."),
    truth_placements: Path | None = typer.Option(
        None, "--truth-placements", help="Or: a directory of measured multi-GPU step times in Sia's placements format "
        "(<model>_placements-<cluster>.csv) as the truth of job speed on any GPU count and node count; the trace "
        "needs Sia's columns (--format sia). `shipped` takes the copy shipped with hetplan."),
    placement_types: str = typer.Option("", "--placement-types", help="With --truth-placements: each cluster's GPU "
                                        "type, e.g. aws=T4,azure=V100,dgx-ext=A100 (Sia's, the default; "
                                        "CLUSTER=TYPE:GPUS_PER_NODE for others)."),
    elastic: bool = typer.Option(False, "--elastic", help="The elastic scheduler: every round chooses each job's GPU "
                                 "type and GPU count within its bounds (min_gpus..max_gpus) by an integer program, "
                                 "restart-aware (needs --truth-placements). Jobs start at rounds."),
    trace_restarts: bool = typer.Option(False, "--trace-restarts", help="A restart costs the trace's per-job "
                                        "restart_s (Sia's per-model costs) instead of --migration-s."),
    hints: Path | None = typer.Option(None, "--hints", help="A hint table (parquet or CSV) the allocator uses."),
    curves: Path | None = typer.Option(None, "--curves", help="Fitted curves: the allocator uses their knees."),
    policy: PolicyName = typer.Option(PolicyName.hint, "--policy", help="Allocator policy."),
    scheduler: SchedulerName = typer.Option(SchedulerName.las, "--scheduler", help="Who runs first."),
    load: float | None = typer.Option(None, "--load", min=0.001, help="Redraw arrivals as a Poisson process of "
                                      "this many jobs/h (default: the trace's own times)."),
    round_s: float = typer.Option(300.0, "--round-s", min=1.0, help="Scheduling round (s)."),
    migration_s: float = typer.Option(30.0, "--migration-s", min=0.0, help="Checkpoint-and-restart cost of a "
                                      "move or a resume (s; a stated assumption)."),
    resize_s: float = typer.Option(5.0, "--resize-s", min=0.0, help="Cost of an in-place re-size (s)."),
    seed: int = typer.Option(0, "--seed", help="Seed for arrivals, model draws and the agnostic node draws."),
    move_margin: MoveMargin = Stability.margin,
    return_window_h: ReturnWindowH = Stability.return_window_s / 3600,
    return_margin: ReturnMargin = Stability.return_margin,
    move_budget: MoveBudget = Stability.budget,
    spread_moves: SpreadMoves = Stability.spread,
    out_dir: Path = typer.Option(Path(".hetplan/simulation"), "--out-dir", help="Where tables and plots go."),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not log the run to MLflow."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri"),
) -> None:
    """Replay TRACE on the fleet in NODES with one policy and scheduler; write summary.csv, jobs.csv and plots.

    Without --hints or --curves the allocator's hints are read off the truth itself: an ORACLE bound no real
    allocator has, labelled so in the summary (with --truth-placements, which has no CPU/RAM curves: no hints).
    jobs.csv has each job's GPU counts in order (gpu_counts), its count changes (rescales) and the GPU-seconds
    it held while restarting.
    """
    from hetplan.allocator.nodes_io import NodeFileError, load_nodes
    from hetplan.contracts import CURVES, PROFILES
    from hetplan.contracts.trace import gpu_totals
    from hetplan.progress import running
    from hetplan.sim.engine import InvariantError, SimConfig, SimulationError, simulate as run_simulation
    from hetplan.sim.metrics import summarize
    from hetplan.hints import HintSet
    from hetplan.scheduler.elastic import ElasticRule
    from hetplan.sim.scaling_truth import ScalingTruth, placement_types as parse_types
    from hetplan.sim.setups import knee_hints, read_hints, truth_hints
    from hetplan.sim.truth import TruthCurves
    from hetplan.sim.workload import prepare_workload

    with contract_errors():
        if hints is not None and curves is not None:
            raise ContractError([Problem("--hints", "give --hints or --curves, not both")])
        if out_dir.exists() and not out_dir.is_dir():
            raise ContractError([Problem(str(out_dir), "--out-dir exists and is not a directory")])
        try:
            fleet = load_nodes(nodes)
        except NodeFileError as exc:
            raise ContractError([Problem(str(nodes), str(exc).removeprefix(f"{nodes}: "))]) from None
        if (truth is None) == (truth_placements is None):
            raise ContractError([Problem("--truth", "give --truth or --truth-placements (one of them)")])
        if elastic and truth_placements is None:
            raise ContractError([Problem("--elastic", "needs --truth-placements (speeds on every GPU count)")])
        jobs, import_report, import_warnings = read_trace(trace, fmt, gpu_totals(fleet))
        if truth_placements is not None:
            try:
                clusters = parse_types(placement_types) or None
            except ValueError as exc:
                raise ContractError([Problem("--placement-types", str(exc).removeprefix("--placement-types: "))]) \
                    from None
            directory = None if str(truth_placements) == "shipped" else truth_placements
            try:
                truth_curves = ScalingTruth.from_placements(directory, clusters)
            except (OSError, ValueError) as exc:
                raise ContractError([Problem(str(truth_placements), str(exc).splitlines()[0])]) from None
            models = truth_curves.model_names()
        else:
            truth_curves = TruthCurves.from_profiles(PROFILES.load(truth))
            models = truth_curves.models
        workload = prepare_workload(jobs, models, seed=seed, load=load)
        classes = workload.jobs[["model", "sim_model", "num_gpus"]].drop_duplicates(["model", "num_gpus"])
        gpu_types = sorted({n.gpu_type for n in fleet})
        if hints is not None:
            hint_set, source = read_hints(hints), f"hint table {hints}"
        elif curves is not None:
            hint_set, source = knee_hints(CURVES.load(curves), classes, gpu_types), f"knees of {curves}"
        elif isinstance(truth_curves, ScalingTruth):
            hint_set, source = HintSet.empty(), "none (a multi-GPU truth has no CPU/RAM curves)"
        else:
            hint_set = truth_hints(truth_curves, classes, gpu_types)
            source = "ORACLE: read off the truth"
        config = SimConfig(scheduler.value, round_s, migration_s=migration_s, resize_s=resize_s,  # type: ignore[arg-type]
                           seed=seed, stability=stability(move_margin, return_window_h, return_margin, move_budget,
                                                          spread_moves),
                           elastic=ElasticRule(round_s=round_s) if elastic else None, trace_restarts=trace_restarts)
        with running("simulate", f"simulating {len(workload.jobs):,} jobs on {len(fleet):,} nodes", errors):
            try:
                result = run_simulation(workload.jobs, fleet, truth_curves, policy.value, hint_set, config)
            except InvariantError as exc:  # a bug: name what broke, not an input file
                raise ContractError([Problem("hetplan simulator", str(exc))]) from None
            except SimulationError as exc:
                raise ContractError([Problem(str(truth or truth_placements), str(exc))]) from None
    row = {"policy": policy.value, "scheduler": "elastic" if elastic else scheduler.value, "hints": source,
           "truth": "placements" if truth_placements is not None else "curves", "nodes": len(fleet),
           "gpus": int(result.capacity["gpus"]), **summarize(result, 0.0)}
    row.pop("work_per_dollar")
    files = _write(result, row, workload.warnings + import_warnings, out_dir, config.stability.to_dict())
    console.print(" ".join(f"{k}={_fmt(v)}" for k, v in row.items()), highlight=False, soft_wrap=True)
    warn(import_warnings + workload.warnings)
    console.print(f"wrote {', '.join(str(f) for f in files)}", highlight=False, soft_wrap=True)
    if not no_mlflow:
        try:
            run = _log(row, files, tracking_uri)
        except Exception as exc:  # the files are written; say that MLflow did not take them, and fail
            errors.print(f"[red]error:[/] MLflow logging failed ({type(exc).__name__}: {exc}); the files above "
                         "are complete", highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_INVALID) from None
        console.print(f"MLflow: simulation run {run}", highlight=False)


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _write(result, row: dict, warnings: list[str], out_dir: Path, stability: dict) -> list[Path]:
    """summary.csv, jobs.csv (one row per job), report.json and the JCT and utilisation plots, each atomically."""
    import pandas as pd

    from hetplan.fsio import atomic_write_bytes, save_figure
    from hetplan.sim.plots import plot_jct_cdf, plot_utilisation

    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = result.jobs.assign(setup=row["policy"])
    per_job = jobs[["job_id", "model", "num_gpus", "status", "arrival_s", "jct_s", "queue_s", "wait_s", "gpu_types",
                    "gpu_counts", "preemptions", "migrations", "resizes", "rescales", "restart_waste_gpu_s", "share"]]
    files = [out_dir / "summary.csv", out_dir / "jobs.csv", out_dir / "report.json"]
    atomic_write_bytes(files[0], pd.DataFrame([row]).to_csv(index=False, lineterminator="\n").encode())
    atomic_write_bytes(files[1], per_job.to_csv(index=False, lineterminator="\n").encode())
    atomic_write_bytes(files[2], json.dumps({"summary": row, "counts": result.counts, "stability": stability,
                                             "warnings": warnings},
                                            indent=2, default=str).encode())
    label = f"{row['policy']}, {row['scheduler'].upper()}"
    capacity = {row["policy"]: result.capacity}
    for name, fig in (("jct_cdf.png", plot_jct_cdf(jobs, f"JCT, {label}")),
                      ("utilisation.png", plot_utilisation(result.timeline.assign(setup=row["policy"]), capacity,
                                                           f"Utilisation, {label}"))):
        save_figure(fig, out_dir / name)
        files.append(out_dir / name)
    return files


def _log(row: dict, files: list[Path], uri: str | None) -> str:
    import math

    import mlflow

    from hetplan.tracking import experiment_id, tracking_uri

    uri = tracking_uri(uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=experiment_id(uri, "hetplan-simulation"))
    with mlflow.start_run(run_name=f"simulate-{row['policy']}-{row['scheduler']}") as run:
        mlflow.log_params({k: v for k, v in row.items() if isinstance(v, str)})
        mlflow.log_metrics({k: float(v) for k, v in row.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))})
        for path in files:
            mlflow.log_artifact(str(path))
        return run.info.run_id
