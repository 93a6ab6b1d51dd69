"""The nightly pipeline's steps as plain functions: what the Airflow DAGs call, one function per task.

Every step reads and writes files under one run directory, `<workspace>/runs/<run_key>/` (the run key is
the DAG run's logical date), so a retried task rewrites the same files and a re-run of a night is
idempotent. Steps take and return JSON-able values (paths as strings), so they travel as XComs.

    prepare(ws, fleet=F, trace=SRC)               -> seeds the workspace (your files, else the embedded defaults)
                                                     and refreshes its workload from SRC (file, URL, allocator)
    profile_gpu(ws, key, "T4", "token-batch", ...) -> measures one GPU type, else falls back to its last good
                                                     (skipped, in one line, where the host has no GPU)
    fit_step(ws, key, ["T4", "L4"], ...)          -> merged profiles -> curves (+ MLflow runs and models)
    plan_step(ws, key, budget=200, ...)           -> plan.json (with `stale_gpu_types`), hints, Kueue YAML, for the
                                                     workspace's workload on its owned fleet plus what 200 $/h rents
    publish_step(ws, key)                         -> the hint table published into `<workspace>/hints`
    report_step(ws, key, mlflow_run)              -> `<workspace>/report/report.html` and its pictures (+ MLflow)
    export_kueue(ws)                              -> `<workspace>/exports/<version>/kueue.yaml`

Profiles: the workspace's `profiles.csv` (derived, from `hetplan init`) is the base; a GPU type's fresh
measurements (or, when profiling fails, its last good measurements) replace the base's rows for the same
(model, GPU type) pairs. A GPU type whose profiling failed is listed in the plan's `stale_gpu_types`.
A host without a GPU never measures a GPU type: that type is skipped (its last good or derived profiles
stay); `CPU` (`hetplan.gpus.CPU_ONLY`) profiles the host's CPU under a label no catalog shape has.

After a publish, `<workspace>/current` links to the published run's directory (curves, plan, hints).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from hetplan.contracts import (
    CATALOG, CURVES, DEMAND, HINTS, PROFILES, TRACE, ContractError, Problem, demand_from_trace, fingerprint, load_plan,
)
from hetplan.fsio import atomic_write_bytes
from hetplan.gpus import CPU_ONLY, gpu_label
from hetplan.progress import Reporter

log = logging.getLogger(__name__)

CURRENT = "current"
MEASURED = "measured"
SKIPPED = "skipped"
STALE = "stale"


def run_dir(workspace: str | Path, run_key: str) -> Path:
    """The directory one pipeline run writes into."""
    return Path(workspace) / "runs" / run_key


def last_good_path(workspace: str | Path, gpu_type: str) -> Path:
    """Where a GPU type's last successful measurements are kept, across runs."""
    return Path(workspace) / "profiles" / "last_good" / f"{gpu_type}.csv"


def prepare(workspace: str | Path, *, fleet: str = "", trace: str = "", catalog: str = "") -> dict[str, str]:
    """Seed the workspace with what it lacks (`fleet`, `trace`, `catalog` where given, else the embedded defaults)
    and take its workload from the source `trace` (a file, a URL, `allocator:URL` or `allocator:DB`: the cluster's
    own job history, durations from the workspace's current curves); return its files.

    A file hetplan did not write is never replaced (`hetplan.workspace`): a source that differs from it fails
    this step, naming the file."""
    from hetplan.traces.sources import EmptyHistory
    from hetplan.workspace import Seed, Workspace, default_curves, init_workspace

    ws = Workspace(Path(workspace))
    seed = Seed(fleet or None, trace or None, catalog or None, curves=default_curves(ws.root))
    if fleet or trace or catalog or not all(p.is_file() for p in (ws.catalog, ws.profiles, ws.demand)):
        try:
            summary = init_workspace(ws.root, seed=seed)
        except EmptyHistory as exc:  # a new cluster has run nothing yet: plan the workspace's trace meanwhile
            log.warning("%s: planning %s until it has", exc, ws.trace)
            summary = init_workspace(ws.root, seed=replace(seed, trace=None))
        for warning in summary.warnings:
            log.warning("%s", warning)
        for path in summary.written:
            log.info("%s: written (%s)", path, summary.origins[path.name])
    needs = needs_profiling(ws.root)
    if needs:
        log.warning("the last published plan planned %d models on the unprofiled default; profile them (a "
                    "`workloads` entry running each model's training): %s", len(needs), ", ".join(needs))
    return {"catalog": str(ws.catalog), "profiles": str(ws.profiles), "demand": str(ws.demand),
            "needs_profiling": ",".join(needs)}


def needs_profiling(workspace: str | Path) -> list[str]:
    """The models the workspace's last published plan planned on the unprofiled default (none if unpublished)."""
    latest = Path(workspace) / "hints" / "LATEST"
    if not latest.is_file():
        return []
    from hetplan.hints import HintStore

    try:
        return list(HintStore(Path(workspace) / "hints").load().plan.needs_profiling)
    except (ContractError, OSError) as exc:
        log.warning("cannot read the last published plan (%s)", exc)
        return []


def profile_gpu(workspace: str | Path, run_key: str, gpu_type: str, workload: str, *, cpus: str | Sequence[float],
                mem_gb: str | Sequence[float] | None = None, warmup_s: float = 2.0, measure_s: float = 2.0,
                repeats: int = 2) -> dict[str, Any]:
    """Profile `workload` as GPU type `gpu_type`; on failure fall back to the type's last good profiles.

    Never raises for a failed measurement: returns (and writes beside the run) a status record
    `{"gpu_type", "status": "measured"|"stale"|"skipped", "profiles": path or None, "error"}`; "skipped" when
    the host has no GPU to measure `gpu_type` on (then its last good profiles, if any, are used as is).
    """
    from hetplan.profiling import ProfileSettings, profile_gpu_type
    from hetplan.profiling.telemetry import detect_gpu

    gpu = gpu_label(gpu_type)
    out_dir = run_dir(workspace, run_key) / "profiles"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{gpu}.csv"
    settings = ProfileSettings(warmup_s=warmup_s, measure_s=measure_s, repeats=repeats)
    if gpu != CPU_ONLY and (probe := detect_gpu()).gpu is None:
        good = last_good_path(workspace, gpu)
        log.info("%s not profiled: no GPU on this host (%s); its %s profiles stay", gpu, probe.reason,
                 "last good" if good.is_file() else "derived")
        status = {"gpu_type": gpu, "status": SKIPPED, "profiles": str(good) if good.is_file() else None,
                  "error": f"no GPU on this host ({probe.reason})"}
        atomic_write_bytes(out_dir / f"{gpu}.json", json.dumps(status, indent=2).encode())
        return status
    error = None
    try:
        run = profile_gpu_type(workload, cpus=cpus, mem_gb=mem_gb, gpu_type=gpu, settings=settings, out=out)
        if run.failed == len(run.results):
            reasons = sorted({r.error for r in run.results if r.error})
            error = f"all {run.failed} points failed: {'; '.join(reasons)}"
    except Exception as exc:  # a broken workload or grid must not stop the night: fall back
        error = f"{type(exc).__name__}: {exc}"
    if error is None:
        good = last_good_path(workspace, gpu)
        good.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(good, out.read_bytes())
        status = {"gpu_type": gpu, "status": MEASURED, "profiles": str(out), "error": None}
    else:
        out.unlink(missing_ok=True)
        good = last_good_path(workspace, gpu)
        fallback = str(good) if good.is_file() else None
        log.warning("profiling %s failed (%s); using %s", gpu, error, fallback or "the derived profiles")
        status = {"gpu_type": gpu, "status": STALE, "profiles": fallback, "error": error}
    atomic_write_bytes(out_dir / f"{gpu}.json", json.dumps(status, indent=2).encode())
    return status


def profile_statuses(workspace: str | Path, run_key: str, gpu_types: Sequence[str]) -> list[dict[str, Any]]:
    """The status record of each GPU type's profiling task; a type whose task never finished is stale."""
    out = []
    for gpu in (gpu_label(g) for g in gpu_types):
        path = run_dir(workspace, run_key) / "profiles" / f"{gpu}.json"
        if path.is_file():
            out.append(json.loads(path.read_text()))
        else:
            good = last_good_path(workspace, gpu)
            out.append({"gpu_type": gpu, "status": STALE, "profiles": str(good) if good.is_file() else None,
                        "error": "the profiling task did not finish"})
    return out


def merge_profiles(base: pd.DataFrame, updates: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """`base` with the rows of every (model, GPU type) pair found in `updates` replaced by the updates'."""
    frames = [u for u in updates if len(u)]
    if not frames:
        return base
    fresh = pd.concat(frames, ignore_index=True)
    pairs = set(zip(fresh["model"], fresh["gpu_type"]))
    keep = [pair not in pairs for pair in zip(base["model"], base["gpu_type"])]
    return pd.concat([base[keep], fresh], ignore_index=True)


def fit_step(workspace: str | Path, run_key: str, gpu_types: Sequence[str], *, models: Sequence[str] = (),
             keep_gpu_types: Sequence[str] = (), tracking_uri: str | None = None,
             mlflow: bool = True) -> dict[str, Any]:
    """Merge profiles (base + measured/last good), fit curves, log to MLflow; return paths and stale types.

    `models` / `keep_gpu_types` (empty: all) restrict what is fitted, e.g. for a small test run; the
    measured workloads' models are always kept.
    """
    from hetplan.sensitivity import fit_profiles

    here = run_dir(workspace, run_key)
    here.mkdir(parents=True, exist_ok=True)
    statuses = profile_statuses(workspace, run_key, gpu_types)
    updates = [PROFILES.load(s["profiles"]) for s in statuses if s["profiles"]]
    base = PROFILES.load(Path(workspace) / "profiles.csv")
    measured_models = {m for u in updates for m in u["model"]}
    if models:
        base = base[base["model"].isin(set(models) | measured_models)]
    if keep_gpu_types:
        wanted = {gpu_label(g) for g in keep_gpu_types} | {s["gpu_type"] for s in statuses}
        base = base[base["gpu_type"].isin(wanted)]
    profiles = merge_profiles(base.reset_index(drop=True), updates)
    profiles_path = PROFILES.write(profiles, here / "profiles.csv")
    profiles = PROFILES.load(profiles_path)
    with Reporter("fit") as progress:
        report = fit_profiles(profiles, progress=progress)
    if report.curves.empty:
        raise ContractError([Problem(str(profiles_path), "no (model, GPU type) could be fitted: "
                                     + "; ".join(str(s) for s in report.skipped))])
    curves_path = CURVES.write(report.curves, here / "curves.parquet")
    for skipped in report.skipped:
        log.warning("fit skipped: %s", skipped)
    result: dict[str, Any] = {
        "profiles": str(profiles_path), "curves": str(curves_path),
        "stale_gpu_types": sorted(s["gpu_type"] for s in statuses if s["status"] == STALE),
        "skipped_gpu_types": sorted(s["gpu_type"] for s in statuses if s["status"] == SKIPPED),
        "skipped": [str(s) for s in report.skipped], "mlflow_run": None,
    }
    if mlflow:
        from hetplan.sensitivity.tracking import log_fit_job

        with Reporter("fit, MLflow logging") as progress:
            job = log_fit_job(report, tracking_uri, run_name=f"nightly-{run_key}",
                              params={"profiles": str(profiles_path), "profiles_sha256": fingerprint(profiles_path),
                                      "run_key": run_key}, profiles=profiles, profiles_source=str(profiles_path),
                              progress=progress)
        result["mlflow_run"] = job.parent_run_id
        result["registered"] = len(job.registrations)
        result["unchanged"] = len(job.unchanged)
    return result


def plan_step(workspace: str | Path, run_key: str, *, budget: float, objective: str = "jct",
              stale_gpu_types: Sequence[str] = (), clouds: Sequence[str] = (), solver: str = "auto",
              time_limit: float = 60.0, tracking_uri: str | None = None, mlflow: bool = True,
              max_job_gpus: int | None = None) -> dict[str, Any]:
    """Plan from this run's curves on the workspace's owned fleet (`fleet.csv`, if any) plus what `budget`
    rents: for its workload (`trace.csv`) by a workload `objective` (`hetplan.planning.Objective`: jct,
    p95-jct, makespan), or for its demand mix (a steady objective, or no workload: `throughput`). Write the
    artifacts and `summary.txt` to `<run>/plan/`.

    The plan hosts the workspace trace's largest job (the fleet's history, also when planning for the demand
    mix) and `max_job_gpus` on one GPU type (`hetplan.planner.sizes`). This is one task; the nightly DAG runs a
    workload plan's stages as tasks instead (`shortlist_step`, `replay_step`, `choose_step`), to the same plan."""
    from hetplan.planning import plan

    setup = _plan_setup(workspace, run_key, budget, objective, clouds, solver, time_limit, max_job_gpus)
    with Reporter("plan") as progress:
        outcome = plan(setup.problem, replace(setup.request, progress=progress), setup.workload,
                       inputs=setup.inputs, source=setup.source)
    return _plan_outputs(workspace, run_key, outcome, stale_gpu_types, tracking_uri, mlflow)


SHORTLIST = "shortlist.pkl"
REPLAYS = "replays"


def shortlist_step(workspace: str | Path, run_key: str, *, budget: float, objective: str = "jct",
                   clouds: Sequence[str] = (), solver: str = "auto", time_limit: float = 60.0,
                   max_job_gpus: int | None = None) -> list[list[int]]:
    """Stage 1 of a workload plan: propose and screen the candidates (`hetplan.planning.shortlist`), keep
    the shortlist in `<run>/plan/stages/` and return the replay runs to do, [candidate, draw] each (none
    without a workload: the plan is then the steady-state one, made by `choose_step`)."""
    import pickle

    from hetplan.planning import shortlist

    setup = _plan_setup(workspace, run_key, budget, objective, clouds, solver, time_limit, max_job_gpus)
    stages = run_dir(workspace, run_key) / "plan" / "stages"
    if setup.workload is None:
        (stages / SHORTLIST).unlink(missing_ok=True)
        return []
    with Reporter("shortlist") as progress:
        listed = shortlist(setup.problem, replace(setup.request, progress=progress), setup.workload)
    for stale in (stages / REPLAYS).glob("*.json"):  # an earlier try's runs belong to an earlier shortlist
        stale.unlink()
    (stages / REPLAYS).mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(stages / SHORTLIST, pickle.dumps({"shortlist": listed, "setup": setup}))
    return [list(run) for run in listed.pending]


def replay_step(workspace: str | Path, run_key: str, run: Sequence[int]) -> str:
    """Stage 2: one replay run of the shortlist, its summary written to `<run>/plan/stages/replays/`."""
    listed = _shortlist(workspace, run_key)["shortlist"]
    key = (int(run[0]), int(run[1]))
    if key not in listed.pending:
        raise ContractError([Problem(str(run_dir(workspace, run_key) / "plan" / "stages" / SHORTLIST),
                                     f"run {list(run)} is not one of the shortlist's replay runs")])
    out = run_dir(workspace, run_key) / "plan" / "stages" / REPLAYS / f"{key[0]}-{key[1]}.json"
    log.info("replaying %s", listed.runs.label(key))
    atomic_write_bytes(out, json.dumps(listed.runs.summary(key)).encode())
    return str(out)


def choose_step(workspace: str | Path, run_key: str, *, budget: float, objective: str = "jct",
                stale_gpu_types: Sequence[str] = (), clouds: Sequence[str] = (), solver: str = "auto",
                time_limit: float = 60.0, tracking_uri: str | None = None, mlflow: bool = True,
                max_job_gpus: int | None = None) -> dict[str, Any]:
    """Stage 3: the plan from the shortlist and every replay run's summary (`hetplan.planning.finish`: the choice,
    the held-back check, the interval), written as `plan_step` writes it; the steady-state plan when
    `shortlist_step` found no workload."""
    if not (run_dir(workspace, run_key) / "plan" / "stages" / SHORTLIST).is_file():
        return plan_step(workspace, run_key, budget=budget, objective=objective, stale_gpu_types=stale_gpu_types,
                         clouds=clouds, solver=solver, time_limit=time_limit, tracking_uri=tracking_uri,
                         mlflow=mlflow, max_job_gpus=max_job_gpus)
    from hetplan.planning import finish

    kept = _shortlist(workspace, run_key)
    listed, setup = kept["shortlist"], kept["setup"]
    replays = run_dir(workspace, run_key) / "plan" / "stages" / REPLAYS
    missing = [list(run) for run in listed.pending if not (replays / f"{run[0]}-{run[1]}.json").is_file()]
    if missing:
        raise ContractError([Problem(str(replays), f"replay runs {missing} have no summary")])
    summaries = {run: json.loads((replays / f"{run[0]}-{run[1]}.json").read_text()) for run in listed.pending}
    with Reporter("choose") as progress:
        outcome = finish(setup.problem, replace(setup.request, progress=progress), setup.workload, listed, summaries,
                         setup.inputs)
    return _plan_outputs(workspace, run_key, outcome, stale_gpu_types, tracking_uri, mlflow)


@dataclass(frozen=True)
class _PlanSetup:
    """What a run plans: the problem, its inputs' fingerprints, the request and the workload (None: the
    demand mix)."""

    problem: Any  # hetplan.planner.problem.PlanningProblem (imported when a plan step runs)
    inputs: dict[str, str]
    request: Any  # hetplan.planning.PlanRequest
    workload: Any  # hetplan.codesign.Workload | None
    source: str


def _plan_setup(workspace: str | Path, run_key: str, budget: float, objective: str, clouds: Sequence[str],
                solver: str, time_limit: float, max_job_gpus: int | None) -> _PlanSetup:
    from hetplan.codesign import workload_from_trace
    from hetplan.planner.entry import load_problem
    from hetplan.planning import Objective, PlanRequest
    from hetplan.planning.calibration import shipped
    from hetplan.planning.request import solver_name
    from hetplan.workspace import Workspace

    try:
        wanted = Objective.parse(objective)
    except ValueError as exc:
        raise ContractError([Problem("objective", str(exc))]) from None
    request = PlanRequest(wanted, solver=solver_name(solver), time_limit=time_limit, calibration=shipped())
    ws = Workspace(Path(workspace))
    here = run_dir(ws.root, run_key)
    for_workload = wanted.for_workload and ws.trace.is_file()
    if not for_workload and wanted.needs_workload:
        log.info("no workload (%s): planning for the demand mix (throughput)", ws.trace)
        request = replace(request, objective=Objective.throughput)
    history = TRACE.load(ws.trace) if ws.trace.is_file() else None
    jobs = history if for_workload else None
    demand = demand_from_trace(jobs) if jobs is not None else DEMAND.load(ws.demand)
    problem, inputs = load_problem(here / "curves.parquet", ws.catalog, demand, budget, clouds=clouds,
                                   fleet=ws.fleet if ws.fleet.is_file() else None, max_job_gpus=max_job_gpus,
                                   history_gpus=int(history["num_gpus"].max()) if history is not None
                                   and len(history) else None)
    inputs["workload" if for_workload else "demand"] = fingerprint(ws.trace if for_workload else ws.demand)
    for warning in problem.warnings:
        log.warning("%s", warning)
    workload = workload_from_trace(jobs, source=str(ws.trace)) if jobs is not None else None
    return _PlanSetup(problem, inputs, request, workload, str(ws.catalog))


def _shortlist(workspace: str | Path, run_key: str) -> dict:
    import pickle

    path = run_dir(workspace, run_key) / "plan" / "stages" / SHORTLIST
    if not path.is_file():
        raise ContractError([Problem(str(path), "no shortlist: the shortlist task has not run for this run")])
    return pickle.loads(path.read_bytes())


def _plan_outputs(workspace: str | Path, run_key: str, outcome, stale_gpu_types: Sequence[str],
                  tracking_uri: str | None, mlflow: bool) -> dict[str, Any]:
    """Write `outcome` (`hetplan.planning.PlanOutcome`) to `<run>/plan/` and log it to MLflow."""
    from hetplan.planner import write_plan_artifacts

    here = run_dir(workspace, run_key)
    for warning in outcome.warnings:
        log.warning("%s", warning)
    result, baselines, metrics, summary = outcome.result, outcome.baselines, outcome.metrics, outcome.summary
    if outcome.prediction is not None:
        summary += f"\n{outcome.prediction.line()}"
    result = replace(result, plan=result.plan.model_copy(update={"stale_gpu_types": sorted(stale_gpu_types)}))
    files = write_plan_artifacts(result, baselines, here / "plan")
    atomic_write_bytes(here / "plan" / "summary.txt", (summary + "\n").encode())
    log.info("plan %s: %s", result.plan.plan_id, summary)
    out: dict[str, Any] = {"plan": str(files[0]), "hints": str(files[1]), "kueue": str(files[2]),
                           "plan_id": result.plan.plan_id, "stale_gpu_types": sorted(stale_gpu_types),
                           "needs_profiling": result.plan.needs_profiling, "summary": summary, "mlflow_run": None}
    if mlflow:
        from hetplan.planner.tracking import log_planning_run

        out["mlflow_run"] = log_planning_run(result, files, {b.name: b.value for b in baselines}, tracking_uri,
                                             metrics)
    return out


def publish_step(workspace: str | Path, run_key: str, keep: int = 5) -> dict[str, str]:
    """Publish this run's hint table into `<workspace>/hints`; a retry after a completed publish is a no-op."""
    from hetplan.hints import HintStore
    from hetplan.hints.store import VersionExistsError

    plan_dir = run_dir(workspace, run_key) / "plan"
    plan = load_plan(plan_dir / "plan.json")
    hints = HINTS.load(plan_dir / "hints.parquet")
    store = HintStore(Path(workspace) / "hints", keep=keep)
    try:
        published = store.publish(plan, hints)
    except VersionExistsError:
        published = store.load(plan.plan_id)  # published by an earlier try of this task
        log.info("version %s already published", plan.plan_id)
    point_current(workspace, run_key)
    return {"version": published.version, "store": str(store.root), "path": str(published.path)}


def report_step(workspace: str | Path, run_key: str, mlflow_run: str | None = None, *,
                tracking_uri: str | None = None, mlflow: bool = True) -> dict[str, Any]:
    """Write the run's one-page report (`hetplan.report`: node mix and cost, the top models' curves with knees,
    predicted JCT vs the status quo, what needs profiling) into `runs/<key>/report/`, linked as
    `<workspace>/report`; log it as artifacts (`report/`) of the run's planning run `mlflow_run` when given."""
    from hetplan.report import report_files, write_report

    page = write_report(workspace, run_key)
    out: dict[str, Any] = {**report_files(page), "link": str(Path(workspace) / "report" / page.name)}
    if mlflow and mlflow_run:
        from mlflow.tracking import MlflowClient

        from hetplan.tracking import tracking_uri as resolve

        MlflowClient(resolve(tracking_uri, workspace=workspace)).log_artifacts(mlflow_run, str(page.parent), "report")
        out["mlflow_run"] = mlflow_run
    return out


def point_current(workspace: str | Path, run_key: str) -> Path:
    """Point `<workspace>/current` at `runs/<run_key>` (a relative symlink, switched atomically)."""
    link = Path(workspace) / CURRENT
    tmp = link.with_name(f".{CURRENT}.{run_key}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(Path("runs") / run_key, target_is_directory=True)
    tmp.replace(link)
    return link


def export_kueue(workspace: str | Path, version: str | None = None, queue: str = "hetplan") -> dict[str, str]:
    """Write the Kueue YAML of a published version (default: LATEST) to `<workspace>/exports/<version>/`."""
    from hetplan.hints import HintStore
    from hetplan.planner import kueue_yaml

    ws = Path(workspace)
    published = HintStore(ws / "hints").load(version)
    out = ws / "exports" / published.version / "kueue.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, kueue_yaml(published.plan, CATALOG.load(ws / "catalog.csv"), published.hints,
                                       queue).encode())
    return {"version": published.version, "kueue": str(out)}

