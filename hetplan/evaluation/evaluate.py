"""Out-of-sample evaluation: plan on one trace, replay another, four setups side by side.

The planner sees `plan_trace` (its mix, its arrivals at each load) and the fitted curves; the setups replay
`trace` (jobs it has not seen, arrivals drawn with another seed) while jobs advance by the *truth* curves.
With the same trace for both the evaluation is in-sample, and says so. The four setups:

1. `status quo`: the owned fleet plus the best-value single shape bought with the budget; proportional;
2. `status quo + sensitivity-aware`: the same nodes with knee hints (Synergy-like, no plan);
3. `GPU-only mix`: the mix a CPU-blind planner buys (Gavel-like); proportional;
4. `hetplan`: the plan for the workload (`hetplan.codesign`) by the chosen objective, with its hints; with
   the `throughput` objective, the steady-state mix plan (`hetplan.planner`).

Loads: the traces' own arrivals; `loads` (jobs per hour, both traces); or `rhos`, the share of the status
quo's GPU time the arrivals ask for (each job's GPUs x its duration on the status quo's nodes at the
proportional share, truth speeds), a rate set for each trace. Ratios are against the status quo of the same
load and scheduler: `jct_speedup` = its average JCT / the setup's (above 1 is better).

Elastic (`ElasticEvaluation`, issue 31): jobs with GPU-count bounds (a Sia trace) run on a multi-GPU truth
(`hetplan.sim.scaling_truth`: Sia's measured step times, or the fitted scaling models alone, labelled `measured` /
`derived`), the planner weighs its candidates with the elastic scheduler, and every setup is replayed twice, with
the trace's fixed counts and with the elastic scheduler; each row puts the two side by side (`ELASTIC_COLUMNS`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from hetplan.allocator.stability import Stability
from hetplan.allocator.spec import Node, to_mib, to_milli
from hetplan.codesign import workload_from_trace
from hetplan.codesign.candidates import HINT, STATUS_QUO
from hetplan.codesign.engines import Engine, ProcessPool, Serial, held_open
from hetplan.codesign.screen import sampled
from hetplan.codesign.workload import Workload
from hetplan.contracts import ContractError, Problem, demand_from_trace
from hetplan.gangs import gang_speed, parts_needed
from hetplan.hints import HintSet
from hetplan.planner.baselines import GPU_ONLY, HETPLAN, SENSITIVITY_AWARE
from hetplan.planner.problem import PlanningProblem, build_problem
from hetplan.planner.solvers import SolverName
from hetplan.planning import NodeMix, Objective, PlanOutcome, PlanRequest, ReplaySizes, plan
from hetplan.planning.calibration import Calibration
from hetplan.planning.prediction import Prediction
from hetplan.planning.request import HOLDOUT
from hetplan.progress import Progress, nested
from hetplan.scheduler.elastic import ElasticRule
from hetplan.sim.engine import SimConfig, SimResult, simulate
from hetplan.sim.metrics import summarize
from hetplan.sim.scaling_truth import ScalingTruth
from hetplan.sim.setups import Setup, knee_hints
from hetplan.sim.truth import FITTED_FALLBACK, TruthCurves
from hetplan.sim.workload import MIX, prepare_workload, with_load

HOUR = 3600.0
PLAN_SEED_OFFSET = 0
REPLAY_SEED_OFFSET = 1000  # the replay's arrivals never repeat the planner's draws


@dataclass(frozen=True)
class LoadPoint:
    """One load the evaluation runs at: its label and the arrival rates of the two traces (None: as traced)."""

    rho: float | None
    plan_rate: float | None
    replay_rate: float | None

    @property
    def key(self) -> dict[str, float]:
        nan = float("nan")
        return {"rho": nan if self.rho is None else self.rho,
                "load_jobs_per_h": nan if self.replay_rate is None else self.replay_rate}


FIXED, ELASTIC = "fixed", "elastic"
MEASURED, DERIVED = "measured", "derived"
ELASTIC_COLUMNS = ("truth", "restarts_per_job", "restart_waste_share", "elastic_avg_jct_h", "elastic_p95_jct_h",
                   "elastic_completed", "elastic_restarts_per_job", "elastic_restart_waste_share",
                   "elastic_jct_ratio", "elastic_common_jobs")
"""What an elastic evaluation adds to each row: the multi-GPU truth's label, the fixed run's restarts per job and
restart waste share, the elastic run's figures, and `elastic_jct_ratio` = the fixed run's average JCT over the
elastic run's, over the jobs both completed (`elastic_common_jobs`; above 1: elastic is faster)."""


@dataclass(frozen=True)
class ElasticEvaluation:
    """An elastic evaluation's truth and rule: `truth` gives every job's speed on any GPU count (`label` says
    whether from measured step times or the fitted models alone), `rule` the elastic scheduler's knobs."""

    truth: ScalingTruth
    label: str = DERIVED
    rule: ElasticRule = ElasticRule(round_s=300.0)


@dataclass
class EvaluationResult:
    summary: pd.DataFrame  # one row per (load, scheduler, setup)
    jobs: pd.DataFrame  # one row per job and run
    timelines: pd.DataFrame  # resource use over time per run
    setups: dict[str, list[Setup]]  # by load label
    plans: dict[str, PlanOutcome]  # the workload plan behind `hetplan` at each load (not for `throughput`)
    report: dict[str, object] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def evaluate(trace: pd.DataFrame, problem_inputs: ProblemInputs, truth: TruthCurves | None, *,
             plan_trace: pd.DataFrame | None = None, objective: Objective | str = Objective.jct,
             rhos: Sequence[float] = (),
             loads: Sequence[float] = (), schedulers: Sequence[str] = ("las",), unknown_model: str = MIX,
             relabel_unknown: bool = False, seed: int = 0, round_s: float = 300.0, solver: SolverName = "auto",
             time_limit: float = 60.0, progress: Progress | None = None,
             stability: Stability | None = None, holdout: float = HOLDOUT,
             engine: Engine | None = None, calibration: Calibration | None = None,
             sizes: ReplaySizes = ReplaySizes(), elastic: ElasticEvaluation | None = None) -> EvaluationResult:
    """Plan on `plan_trace` (default: `trace`, in-sample), replay `trace`, at every load and scheduler.

    Jobs of models the truth lacks run as `unknown_model` (a truth model, or `mix`: one drawn per job). The
    planner then plans them on its stated defaults for unprofiled models; with `relabel_unknown` both traces
    are relabelled as the truth models they run as before anything sees them (the planner then knows them
    as what they are, by their fitted curves). The planner's replays run on `engine` (default: a local pool).

    Each row carries the planner's prediction next to what the replay realised (`with_predictions`): for
    `hetplan` under a workload objective its predicted avg JCT speedup over the status quo and that
    prediction's interval (`hetplan.planning.prediction`, `holdout` held back; calibrated on `calibration`'s
    earlier predictions where given), for the status quo 1. `sizes`: how much the planner replays (at a load
    that overloads every candidate, the setups' truth replays sample as many jobs: `replayed_one_in`).

    With `elastic`, the setups replay on its multi-GPU truth (`truth` is then not read), the planner plans for the
    elastic scheduler, and every setup replays with fixed counts and elastic ones side by side (module docstring);
    `rhos` and `relabel_unknown` are refused (they read the profile truth), as is a trace without batch sizes.
    """
    engine = engine or ProcessPool()
    warnings: list[str] = []
    if elastic is not None:
        _check_elastic(trace, plan_trace, rhos, relabel_unknown)
        problem_inputs = _elastic_catalog(problem_inputs, elastic.truth, warnings)
    with held_open(engine):  # one pool of workers for the plans' replays and the truth replays
        objective = Objective.parse(objective)
        request = PlanRequest(objective, scheduler=schedulers[0], round_s=round_s, solver=solver, time_limit=time_limit,
                              holdout=holdout, engine=engine, calibration=calibration, sizes=sizes,
                              elastic=elastic.rule if elastic is not None else None)
        if plan_trace is None:
            plan_trace = trace
            warnings.append("in-sample: the planner saw the trace it is evaluated on (give --plan-trace for an "
                            "out-of-sample evaluation)")
        replay = prepare_workload(trace, elastic.truth.model_names() if elastic else truth.models, unknown_model,
                                  seed)
        if relabel_unknown:
            plan_trace = prepare_workload(plan_trace, truth.models, unknown_model, seed + 1).jobs
            plan_trace = plan_trace.assign(model=plan_trace["sim_model"]).drop(columns="sim_model")
            replay = replace(replay, jobs=replay.jobs.assign(model=replay.jobs["sim_model"]))
            warnings.append("unknown models relabelled in both traces as the truth models they run as")
        problem = problem_inputs.problem(demand_from_trace(plan_trace))
        if elastic is None:
            truth = truth.extended(problem.defaults.curves)
        warnings += problem.warnings + replay.warnings
        steady = plan(problem, replace(request, objective=Objective.throughput, elastic=None))  # no replays
        status_quo = steady.baseline(STATUS_QUO)
        if status_quo is None:
            raise ValueError("no shape can run every job class at the proportional share: there is no status quo")
        quo_nodes = NodeMix.on_fleet(problem.shapes, status_quo.node_counts).nodes(problem.shapes)
        (elastic.truth if elastic else truth).require(replay.jobs["sim_model"], {n.gpu_type for n in quo_nodes})
        points = load_points(plan_trace, replay.jobs, truth, quo_nodes, rhos, loads)
        baselines = _baselines(problem, steady, quo_nodes)
        setups_by_load, plans, replayed, sampled_every = {}, {}, [], []
        for k, point in enumerate(points):
            label = _label(point)
            if progress:
                progress(k, len(points), f"planning for {label}")
            outcome = steady
            if objective.for_workload:
                at = replace(request, progress=nested(progress, f"planning for {label}"))
                outcome = plan(problem, at, _workload_at(plan_trace, point, seed))
                if outcome.weighing is not None:
                    plans[label] = outcome
                warnings += [f"planning for {label}: {w}" for w in outcome.warnings if w not in warnings]
            setups_by_load[label] = [*baselines, outcome.setup(HETPLAN, problem.shapes)]
            jobs_at = replay.jobs if point.replay_rate is None else with_load(replay.jobs, point.replay_rate,
                                                                                seed + REPLAY_SEED_OFFSET)
            jobs_at, every = _sampled_if_overloaded(jobs_at, outcome, label, warnings)
            replayed.append(jobs_at)
            sampled_every.append(every)
        runs = SetupRuns(points, replayed, list(setups_by_load.values()), tuple(schedulers),
                         elastic.truth if elastic else truth, round_s, stability or Stability(),
                         elastic.rule if elastic else None)
        replays = sum(len(jobs) * len(setups) for jobs, setups in zip(replayed, runs.setups)) * len(schedulers)
        small = replays * runs.modes < PARALLEL_FROM_JOBS \
            and not (isinstance(engine, ProcessPool) and engine.started)  # the plans' workers
        results = (Serial() if small else engine).summaries(runs, runs.every(), progress)
        rows, job_frames, timelines = [], [], []
        for run in runs.every():
            if runs.mode(run) == ELASTIC:
                continue
            point, setup, scheduler = runs.of(run)
            key = {**point.key, "scheduler": scheduler, "setup": setup.name}
            rows.append({**key, "replayed_one_in": sampled_every[run[0]], "policy": setup.policy, "gpus": setup.gpus,
                         "cost_per_hour": setup.cost_per_hour,
                         "predicted_mix": setup.predicted_mix, "winner": _winner(setup.name, plans.get(_label(point))),
                         **results[run]["summary"],
                         **_predicted(setup.name, _prediction_of(plans.get(_label(point))))})
            job_frames.append(results[run]["jobs"].assign(**key))
            timelines.append(results[run]["timeline"].assign(**key))
        all_jobs = pd.concat(job_frames, ignore_index=True)
        summary = with_predictions(with_ratios(pd.DataFrame(rows), all_jobs))
        report = {**replay.report, "stability": (stability or Stability()).to_dict()}
        if elastic is None:
            warnings += truth_warnings(truth, set(replay.jobs["sim_model"]),
                                       [s for setups in setups_by_load.values() for s in setups])
            return EvaluationResult(summary, all_jobs, pd.concat(timelines, ignore_index=True), setups_by_load,
                                    plans, report, warnings)
        summary, all_jobs, timeline = _with_elastic(runs, results, summary, all_jobs, pd.concat(timelines,
                                                                                                 ignore_index=True),
                                                    elastic.label)
        report["elastic"] = {"truth": elastic.label, "truth_sources": elastic.truth.sources(),
                             "rule": {k: getattr(elastic.rule, k) for k in elastic.rule.__dataclass_fields__}}
        warnings.append(f"elastic: job speeds on every GPU count come from the {_TRUTH_TEXT[elastic.label]}; job "
                        "work is the trace's (derived for a Sia import); simulated, not measured")
        return EvaluationResult(summary, all_jobs, timeline, setups_by_load, plans, report, warnings)


def _sampled_if_overloaded(jobs: pd.DataFrame, outcome: PlanOutcome, label: str,
                           warnings: list[str]) -> tuple[pd.DataFrame, int]:
    """The jobs the setups' truth replays run at one load, and 1 in how many of the trace's they are: all of them,
    unless the plan found every candidate overloaded (`hetplan.codesign.screen`); then every queue grows with the
    trace's length, and the truth replays sample as many jobs as the plan's replays did (`--replay-jobs`, capped
    at the screen's size) by the planner's rule (`screen.sampled`: 1 job in m, at the same rate and mix), saying
    so."""
    screen = outcome.weighing.screen if outcome.weighing is not None else {}
    sample = (screen.get("replay_sample") or {}).get("jobs")
    if not screen.get("overloaded") or not sample or len(jobs) <= sample:
        return jobs, 1
    (out,), every = sampled((jobs,), sample)
    warnings.append(f"{label}: every candidate is overloaded, so the setups' truth replays sample {len(out):,} of "
                    f"the trace's {len(jobs):,} jobs as the plan's replays did (1 in {every}, at the traced rate and "
                    "mix: the summary's replayed_one_in); their JCTs grow with the trace's length. --replay-jobs 0 "
                    "replays every job")
    return out, every


PARALLEL_FROM_JOBS = 10_000
"""Jobs replayed in all (every setup's) from which the setups' truth replays fan out over the engine (a spawned
worker costs about as much as replaying a few thousand jobs); below it too where the plans started the workers."""


@dataclass(frozen=True)
class SetupRuns:
    """The evaluation's truth replays, as an engine runs them (`hetplan.codesign.engines`): run (k, j) is
    load point k's setup j % (its setups) under scheduler (j // (its setups)) % (schedulers), with fixed counts,
    and with `elastic` a second block of as many runs (j from setups x schedulers on) with the elastic scheduler.
    Each is a pure function of these inputs, so the rows are the same whichever engine runs them."""

    points: list[LoadPoint]
    jobs: list[pd.DataFrame]  # the replayed jobs at each load point
    setups: list[list[Setup]]  # the setups at each load point
    schedulers: tuple[str, ...]
    truth: TruthCurves | ScalingTruth
    round_s: float
    stability: Stability
    elastic: ElasticRule | None = None

    @property
    def modes(self) -> int:
        """How many times each setup and scheduler replays: fixed counts, and elastic ones where asked."""
        return 1 if self.elastic is None else 2

    def every(self) -> list[tuple[int, int]]:
        return [(k, j) for k in range(len(self.points))
                for j in range(len(self.setups[k]) * len(self.schedulers) * self.modes)]

    def of(self, run: tuple[int, int]) -> tuple[LoadPoint, Setup, str]:
        k, j = run
        setups = self.setups[k]
        return self.points[k], setups[j % len(setups)], self.schedulers[(j // len(setups)) % len(self.schedulers)]

    def mode(self, run: tuple[int, int]) -> str:
        """`fixed` or `elastic`: how the run's jobs get their GPU counts."""
        return ELASTIC if run[1] >= len(self.setups[run[0]]) * len(self.schedulers) else FIXED

    def label(self, run: tuple[int, int]) -> str:
        point, setup, scheduler = self.of(run)
        return f"{setup.name} | {scheduler} | {_label(point)}" + (" | elastic" if self.mode(run) == ELASTIC else "")

    def summary(self, run: tuple[int, int]) -> dict:
        point, setup, scheduler = self.of(run)
        elastic = self.elastic if self.mode(run) == ELASTIC else None
        config = SimConfig(scheduler, self.round_s, stability=self.stability, elastic=elastic)
        result = simulate(self.jobs[run[0]], setup.nodes, self.truth, setup.policy, setup.hints, config)
        out = {"summary": summarize(result, setup.cost_per_hour), "jobs": result.jobs, "timeline": result.timeline}
        if self.elastic is not None:
            out["restarts"] = restart_figures(result)
        return out


def restart_figures(result: SimResult) -> dict[str, float]:
    """Restarts per job (preemptions, moves and count changes) and the share of the GPU-seconds the cluster lent
    that jobs held while restarting."""
    jobs, timeline = result.jobs, result.timeline
    held = float(np.sum(timeline["gpus"].to_numpy()[:-1] * np.diff(timeline["time_s"].to_numpy())))
    restarts = jobs["preemptions"] + jobs["migrations"] + jobs["rescales"]
    return {"restarts_per_job": float(restarts.mean()) if len(jobs) else float("nan"),
            "restart_waste_share": float(jobs["restart_waste_gpu_s"].sum()) / held if held > 0 else float("nan")}


_TRUTH_TEXT = {MEASURED: "measured multi-GPU step times (Sia's placements; the fitted scaling models where none "
                         "were measured)",
               DERIVED: "fitted multi-GPU scaling models alone (derived: no measured step time read)"}


def _check_elastic(trace: pd.DataFrame, plan_trace: pd.DataFrame | None, rhos: Sequence[float],
                   relabel_unknown: bool) -> None:
    """Refuse what an elastic evaluation cannot run, naming the option (`ContractError`)."""
    if rhos:
        raise ContractError([Problem("--rho", "--elastic takes --load or the traced arrivals (rho reads the "
                                              "profile truth)")])
    if relabel_unknown:
        raise ContractError([Problem("--relabel-unknown", "not with --elastic (a Sia trace names its models)")])
    for option, jobs in (("--trace", trace), ("--plan-trace", plan_trace)):
        if jobs is not None and "batch_size" not in jobs:
            raise ContractError([Problem(option, "--elastic needs a trace with batch sizes and GPU-count bounds "
                                                 "(a Sia workload: --format sia)")])


def _elastic_catalog(inputs: ProblemInputs, truth: ScalingTruth, warnings: list[str]) -> ProblemInputs:
    """`inputs` with the catalog's shapes of GPU types the multi-GPU truth has no speeds for left out, saying so;
    `ContractError` naming --catalog where none is left."""
    catalog = inputs.catalog
    known = catalog["gpu_type"].isin(truth.gpu_types())
    if not known.any():
        raise ContractError([Problem("--catalog", f"--elastic: no shape of a GPU type the multi-GPU truth has "
                                                  f"({', '.join(truth.gpu_types())})")])
    if not known.all():
        left = sorted(set(catalog.loc[~known, "gpu_type"].astype(str)))
        warnings.append(f"elastic: {int((~known).sum())} catalog shapes left out, of GPU types the multi-GPU truth "
                        f"has no speeds for ({', '.join(left)})")
    return replace(inputs, catalog=catalog[known].reset_index(drop=True))


def _with_elastic(runs: SetupRuns, results: dict, summary: pd.DataFrame, jobs: pd.DataFrame,
                  timeline: pd.DataFrame, label: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The summary with `ELASTIC_COLUMNS` (each row's elastic run beside its fixed one), and the per-job and
    timeline frames of both runs with a `counts` column (`fixed` / `elastic`)."""
    extra, job_frames, timelines = [], [jobs.assign(counts=FIXED)], [timeline.assign(counts=FIXED)]
    for run in runs.every():
        if runs.mode(run) == FIXED:
            continue
        point, setup, scheduler = runs.of(run)
        got = results[run]
        base = results[(run[0], run[1] - len(runs.setups[run[0]]) * len(runs.schedulers))]  # its fixed twin
        key = {**point.key, "scheduler": scheduler, "setup": setup.name}
        job_frames.append(got["jobs"].assign(**key, counts=ELASTIC))
        timelines.append(got["timeline"].assign(**key, counts=ELASTIC))
        ratio, common = _common_ratio(base["jobs"], got["jobs"])
        extra.append({"truth": label, **base["restarts"],
                      "elastic_avg_jct_h": got["summary"]["avg_jct_h"],
                      "elastic_p95_jct_h": got["summary"]["p95_jct_h"],
                      "elastic_completed": got["summary"]["completed"],
                      "elastic_restarts_per_job": got["restarts"]["restarts_per_job"],
                      "elastic_restart_waste_share": got["restarts"]["restart_waste_share"],
                      "elastic_jct_ratio": ratio, "elastic_common_jobs": common})
    summary = pd.concat([summary, pd.DataFrame(extra, index=summary.index, columns=list(ELASTIC_COLUMNS))], axis=1)
    return summary, pd.concat(job_frames, ignore_index=True), pd.concat(timelines, ignore_index=True)


def _common_ratio(fixed: pd.DataFrame, elastic: pd.DataFrame) -> tuple[float, int]:
    """The fixed run's average JCT over the elastic run's on the jobs both completed, and how many those are."""
    def done(jobs: pd.DataFrame) -> pd.Series:
        ran = jobs[jobs["status"] == "completed"]
        return pd.Series(ran["jct_s"].to_numpy(float), index=ran["job_id"].astype(str))

    a, b = done(fixed), done(elastic)
    common = a.index.intersection(b.index)
    if not len(common):
        return float("nan"), 0
    return float(a[common].mean() / b[common].mean()), len(common)


@dataclass(frozen=True)
class ProblemInputs:
    """What the planning problem is built from, but the demand (which comes from the plan trace)."""

    curves: pd.DataFrame
    catalog: pd.DataFrame
    budget: float
    fleet: pd.DataFrame | None = None
    declarations: dict | None = None
    max_job_gpus: int | None = None  # the largest job every plan hosts, at least (`hetplan.planner.sizes`)

    def problem(self, demand: pd.DataFrame) -> PlanningProblem:
        return build_problem(self.curves, self.catalog, demand, self.budget, fleet=self.fleet,
                             declarations=self.declarations, max_job_gpus=self.max_job_gpus)


def load_points(plan_trace: pd.DataFrame, replay_jobs: pd.DataFrame, truth: TruthCurves, quo_nodes: Sequence[Node],
                rhos: Sequence[float], loads: Sequence[float]) -> list[LoadPoint]:
    """The loads to run at: each rho as a rate per trace, each load for both traces, else the traced arrivals."""
    if rhos:
        plan_jobs = plan_trace.assign(sim_model=[_truth_model(m, truth) for m in plan_trace["model"]])
        per_plan_job = gpu_hours_per_job(plan_jobs, truth, quo_nodes)
        per_replay_job = gpu_hours_per_job(replay_jobs, truth, quo_nodes)
        gpus = sum(n.gpus for n in quo_nodes)
        return [LoadPoint(float(rho), rho * gpus / per_plan_job, rho * gpus / per_replay_job) for rho in rhos]
    if loads:
        return [LoadPoint(None, float(load), float(load)) for load in loads]
    return [LoadPoint(None, None, None)]


def gpu_hours_per_job(jobs: pd.DataFrame, truth: TruthCurves, nodes: Sequence[Node]) -> float:
    """Mean GPU-hours a job of `jobs` (with `sim_model`) takes on `nodes` at the proportional share: its GPUs x
    its duration over its truth speed, the speed averaged over the node shapes that fit it, weighted by GPUs.
    A job larger than every node runs as a gang on the shapes of a GPU type that has its GPUs (per-GPU speed
    `hetplan.gangs.gang_speed`, as the simulator runs it); jobs nothing fits count zero."""
    shapes = {(n.gpu_type, n.gpus, n.cpus, n.mem_gb): 0 for n in nodes}
    per_type: dict[str, int] = {}
    for n in nodes:
        shapes[(n.gpu_type, n.gpus, n.cpus, n.mem_gb)] += n.gpus
        per_type[n.gpu_type] = per_type.get(n.gpu_type, 0) + n.gpus
    largest = max((n.gpus for n in nodes), default=0)
    total = 0.0
    for model, num_gpus, duration in zip(jobs["sim_model"], jobs["num_gpus"], jobs["duration_s"]):
        gang = num_gpus > largest
        speeds, weights = [], []
        for (gpu, gpus, cpus, mem), weight in shapes.items():
            if gpus >= num_gpus:
                share_cpu, share_mem = to_milli(cpus) * num_gpus // gpus, to_mib(mem) * num_gpus // gpus
                speeds.append(truth.speed(str(model), gpu, int(num_gpus), share_cpu, share_mem))
                weights.append(weight)
            elif gang and per_type[gpu] >= num_gpus:  # per GPU, at one GPU's proportional share
                part = truth.speed(str(model), gpu, 1, to_milli(cpus) // gpus, to_mib(mem) // gpus)
                speeds.append(gang_speed([part] * parts_needed(num_gpus, gpus)))
                weights.append(weight)
        if speeds:
            total += num_gpus * duration / float(np.average(speeds, weights=weights)) / HOUR
    return total / max(1, len(jobs))


def _truth_model(model: str, truth: TruthCurves) -> str:
    by_fold = {m.casefold(): m for m in truth.models}
    return by_fold.get(str(model).strip().casefold(), str(model))


def _workload_at(plan_trace: pd.DataFrame, point: LoadPoint, seed: int) -> Workload:
    """The workload the planner sees at `point`: the plan trace at its rate (as traced when None)."""
    jobs = plan_trace if point.plan_rate is None else with_load(plan_trace, point.plan_rate, seed + PLAN_SEED_OFFSET)
    return workload_from_trace(jobs, seed=seed)


def _winner(setup: str, planned: PlanOutcome | None) -> str:
    """The candidate a workload plan chose, on hetplan's row (what `--calibration` reads: a plan that kept the
    status quo predicts 1x exactly); empty elsewhere."""
    return planned.winner if setup == HETPLAN and planned is not None else ""


PREDICTED = ("predicted_jct_speedup", "predicted_low", "predicted_high", "calibrated_low", "calibrated_high")


def _prediction_of(outcome: PlanOutcome | None) -> Prediction | None:
    return outcome.prediction if outcome is not None else None


def _predicted(setup: str, prediction: Prediction | None) -> dict[str, float]:
    """The planner's predicted avg JCT speedup over the status quo and its interval, for a setup's row: 1 for
    the status quo, the prediction for hetplan, NaN where the planner predicted no JCT (the other baselines,
    a steady plan)."""
    if setup == STATUS_QUO:
        return dict.fromkeys(PREDICTED, 1.0)
    if setup == HETPLAN and prediction is not None:
        s, c = prediction.speedup, prediction.calibrated
        return dict(zip(PREDICTED, (s.point, s.low, s.high, *((c.low, c.high) if c else (math.nan, math.nan)))))
    return dict.fromkeys(PREDICTED, float("nan"))


def with_predictions(summary: pd.DataFrame) -> pd.DataFrame:
    """Add `realised_over_predicted` (the replayed `jct_speedup` over the predicted one), `within_interval`
    and `within_calibrated` (whether the replayed speedup lies in the prediction's interval, its calibrated
    one; empty where there is none)."""
    predicted, realised = summary["predicted_jct_speedup"], summary["jct_speedup"]

    def within(low: str, high: str) -> pd.Series:
        inside = (realised >= summary[low]) & (realised <= summary[high])
        return inside.astype("boolean").where(summary[low].notna(), pd.NA)

    return summary.assign(realised_over_predicted=realised / predicted,
                          within_interval=within("predicted_low", "predicted_high"),
                          within_calibrated=within("calibrated_low", "calibrated_high"))


def _baselines(problem: PlanningProblem, steady: PlanOutcome, quo_nodes: Sequence[Node]) -> list[Setup]:
    """The three baselines (a baseline the budget cannot buy is left out)."""
    status_quo = steady.baseline(STATUS_QUO)
    setups = [Setup(STATUS_QUO, tuple(quo_nodes), "proportional", HintSet.empty(), status_quo.cost_per_hour,
                    status_quo.value),
              Setup(SENSITIVITY_AWARE, tuple(quo_nodes), HINT,
                    knee_hints(problem.defaults.curves, problem.classes, sorted({n.gpu_type for n in quo_nodes})),
                    status_quo.cost_per_hour, steady.baseline(SENSITIVITY_AWARE).value)]
    gpu_only = steady.baseline(GPU_ONLY)
    if gpu_only is not None and gpu_only.node_counts:
        setups.append(Setup(GPU_ONLY, NodeMix.on_fleet(problem.shapes, gpu_only.node_counts).nodes(problem.shapes),
                            "proportional", HintSet.empty(), gpu_only.cost_per_hour, gpu_only.value))
    return setups


def _label(point: LoadPoint) -> str:
    if point.rho is not None:
        return f"rho {point.rho:g}"
    return "traced load" if point.replay_rate is None else f"{point.replay_rate:g} jobs/h"


def truth_warnings(truth: TruthCurves, models: set[str], setups: list[Setup]) -> list[str]:
    """Where the truth cannot show model error (fitted curves standing in) or has no throughput at all."""
    gpu_types = {n.gpu_type for setup in setups for n in setup.nodes}
    fallback = sorted(f"{m} on {g}" for (m, g), grid in truth.grids.items()
                      if m in models and g in gpu_types and grid.source == FITTED_FALLBACK)
    out = []
    if fallback:
        out.append(f"{len(fallback)} truth curves are the planner's curves (no profiles): model error cannot show "
                   f"there ({', '.join(fallback[:6])}{', ...' if len(fallback) > 6 else ''})")
    if truth.gaps:
        out.append(f"{len(truth.gaps)} truth grid cells have no throughput ({', '.join(truth.gaps[:3])}"
                   f"{', ...' if len(truth.gaps) > 3 else ''}): a job granted such a share stops the simulation")
    return out


def with_ratios(summary: pd.DataFrame, jobs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Add `jct_speedup` and `work_per_dollar_ratio` against the status quo of the same load and scheduler.

    With `jobs` (the per-job frames), the speedup compares average JCTs over the jobs *every* setup of the run
    completed (`common_jobs`): a setup that could not run some jobs (larger than all its GPUs of one type) is
    not credited with the JCT of jobs it never ran. The jobs only some setups ran are counted apart: per setup,
    `refused_quo_jobs` (the status quo completed them, the setup did not), `extra_jobs` (the setup completed
    them, the status quo did not) and their average JCT `extra_avg_jct_h`.
    """
    keys = list(zip(summary["rho"].fillna(-1.0), summary["load_jobs_per_h"].fillna(-1.0), summary["scheduler"]))
    jct = summary["avg_jct_h"].to_numpy(float).copy()
    common = np.full(len(summary), -1)
    refused, extra = np.full(len(summary), -1), np.full(len(summary), -1)
    extra_jct = np.full(len(summary), np.nan)
    if jobs is not None and len(jobs):
        done = jobs[jobs["status"] == "completed"]
        done = done.assign(_run=list(zip(done["rho"].fillna(-1.0), done["load_jobs_per_h"].fillna(-1.0),
                                         done["scheduler"])))
        for run, group in done.groupby("_run", sort=False):
            ran = {name: set(g["job_id"]) for name, g in group.groupby("setup", sort=False)}
            shared = set.intersection(*ran.values())
            quo_ran = ran.get(STATUS_QUO, set())
            means = group[group["job_id"].isin(shared)].groupby("setup")["jct_s"].mean() / 3600
            for i, (key, name) in enumerate(zip(keys, summary["setup"])):
                if key == run and name in means:
                    jct[i], common[i] = float(means[name]), len(shared)
                    refused[i], only = len(quo_ran - ran[name]), ran[name] - quo_ran
                    extra[i] = len(only)
                    mine = group[(group["setup"] == name) & group["job_id"].isin(only)]
                    extra_jct[i] = float(mine["jct_s"].mean()) / 3600 if len(mine) else np.nan
    base = {k: (j, wpd) for k, j, wpd, name in zip(keys, jct, summary["work_per_dollar"], summary["setup"])
            if name == STATUS_QUO}
    nan = (float("nan"), float("nan"))
    out = summary.assign(
        jct_speedup=[base.get(k, nan)[0] / j for k, j in zip(keys, jct)],
        work_per_dollar_ratio=[wpd / base.get(k, nan)[1] if base.get(k, nan)[1] > 0 else float("nan")
                               for k, wpd in zip(keys, summary["work_per_dollar"])])
    if jobs is None:
        return out
    return out.assign(common_jobs=common, refused_quo_jobs=refused, extra_jobs=extra, extra_avg_jct_h=extra_jct)
