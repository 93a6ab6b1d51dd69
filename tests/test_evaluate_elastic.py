"""`hetplan evaluate --elastic`: every setup replayed with fixed and elastic GPU counts side by side on a multi-GPU
truth, and the planner weighing its candidates with the elastic scheduler (issue 31, item 4). Real HiGHS, real
simulator, a slice of Sia's Philly workload 2 (jobs of 4-16 GPUs that may run on 1-24)."""

import json
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from hetplan.catalog import load_default_catalog
from hetplan.cli import app
from hetplan.codesign import workload_from_trace
from hetplan.codesign.engines import Serial
from hetplan.contracts import CURVES, PROFILES
from hetplan.evaluation import ELASTIC_COLUMNS, ElasticEvaluation, ProblemInputs, evaluate
from hetplan.planning import PlanRequest, ReplaySizes, plan
from hetplan.reference import build_reference
from hetplan.scheduler.elastic import ElasticRule
from hetplan.sensitivity import fit_profiles
from hetplan.sim.scaling_truth import ScalingTruth
from hetplan.traces.sia import import_sia

SIA_WORKLOAD = Path("hetplan/data/upstream/traces/sia_philly_workload-2.csv")
MODELS = ["res18", "transformer", "deepspeech", "res50"]  # what a Sia import names cifar10, bert, ... as
GPU_TYPES = ["V100", "T4", "A100"]
JOBS = 30


@pytest.fixture(scope="module")
def inputs():
    derived = build_reference().derived
    profiles = derived[derived["model"].isin(MODELS) & derived["gpu_type"].isin(GPU_TYPES)]
    catalog = load_default_catalog()
    catalog = catalog[catalog["cloud"].isin(["aws", "gcp"]) & catalog["gpu_type"].isin(GPU_TYPES)]
    trace = import_sia(SIA_WORKLOAD).trace.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    return profiles, fit_profiles(profiles).curves, catalog.reset_index(drop=True), trace


@pytest.fixture(scope="module")
def result(inputs):
    _, curves, catalog, trace = inputs
    return evaluate(trace.iloc[JOBS:2 * JOBS], ProblemInputs(curves, catalog, 40.0), None,
                    plan_trace=trace.iloc[:JOBS], elastic=ElasticEvaluation(ScalingTruth.fitted()), engine=Serial(),
                    sizes=ReplaySizes(2, JOBS, JOBS), holdout=0)


def test_each_setup_has_its_elastic_run_beside_its_fixed_one(result):
    summary = result.summary
    assert len(summary) == 4 and set(ELASTIC_COLUMNS) <= set(summary.columns)
    assert (summary["truth"] == "derived").all()
    assert (summary["elastic_completed"] == JOBS).all()  # elastic jobs shrink to fit: none refused
    # counts can grow from 4-16 up to 24 GPUs: elastic changes the JCTs of every setup
    assert (summary["elastic_avg_jct_h"] != summary["avg_jct_h"]).all()
    assert ((summary["restart_waste_share"] >= 0) & (summary["elastic_restart_waste_share"] < 1)).all()
    counts = result.jobs.groupby("counts")["job_id"].count()
    assert counts.to_dict() == {"fixed": JOBS * 4, "elastic": JOBS * 4}
    assert set(result.timelines["counts"]) == {"fixed", "elastic"}
    assert any("fitted multi-GPU scaling models alone" in w for w in result.warnings)


def test_the_ratio_is_fixed_over_elastic_on_the_jobs_both_completed(result):
    """An invariant read back off jobs.csv: each row's ratio is its two runs' mean JCT over their common jobs."""
    for row in result.summary.itertuples():
        jobs = result.jobs[(result.jobs["setup"] == row.setup) & (result.jobs["status"] == "completed")]
        fixed = jobs[jobs["counts"] == "fixed"].set_index("job_id")["jct_s"]
        elastic = jobs[jobs["counts"] == "elastic"].set_index("job_id")["jct_s"]
        common = fixed.index.intersection(elastic.index)
        assert row.elastic_common_jobs == len(common)
        assert row.elastic_jct_ratio == pytest.approx(fixed[common].mean() / elastic[common].mean())
        elastic_only = result.jobs[(result.jobs["setup"] == row.setup) & (result.jobs["counts"] == "elastic")]
        assert row.elastic_restarts_per_job == pytest.approx(
            (elastic_only["preemptions"] + elastic_only["migrations"] + elastic_only["rescales"]).mean())


def test_the_planner_weighs_an_elastic_workload_with_the_elastic_scheduler(result, inputs):
    (outcome,) = result.plans.values()
    planning = outcome.result.plan.planning
    assert planning["elastic"]["round_s"] == 300.0 and "scaling models" in planning["elastic"]["speeds"]
    _, curves, catalog, trace = inputs
    problem = ProblemInputs(curves, catalog, 40.0).problem(workload_from_trace(trace.iloc[:JOBS]).demand)
    workload = workload_from_trace(trace.iloc[:JOBS], seed=0)
    request = PlanRequest(scheduler="las", engine=Serial(), holdout=0, sizes=ReplaySizes(2, JOBS, JOBS))
    fixed_plan = plan(problem, request, workload)
    fixed = fixed_plan.weighing.candidates.set_index("candidate")
    elastic = plan(problem, PlanRequest(**{**request.__dict__, "elastic": ElasticRule(round_s=300.0)}),
                   workload).weighing.candidates.set_index("candidate")
    replayed = fixed.index[fixed["screen"] == "replayed"].intersection(elastic.index[elastic["screen"] == "replayed"])
    assert len(replayed) >= 2
    assert not fixed.loc[replayed, "avg_jct_h"].equals(elastic.loc[replayed, "avg_jct_h"])
    assert "elastic" not in (fixed_plan.result.plan.planning or {})  # the fixed plan's record as it was


# ---------------------------------------------------------------------- the CLI

@pytest.fixture(scope="module")
def cli_inputs(tmp_path_factory, inputs):
    profiles, curves, catalog, _ = inputs
    root = tmp_path_factory.mktemp("evaluate-elastic")
    CURVES.write(curves, root / "curves.parquet")
    PROFILES.write(profiles, root / "profiles.csv")
    catalog.to_csv(root / "catalog.csv", index=False)
    raw = pd.read_csv(SIA_WORKLOAD).sort_values("time", kind="stable")
    raw.iloc[:JOBS].to_csv(root / "plan.csv", index=False)
    raw.iloc[JOBS:2 * JOBS].to_csv(root / "trace.csv", index=False)
    import_sia(root / "trace.csv").trace.drop(columns="batch_size").to_csv(root / "contract.csv", index=False)
    return root


def evaluate_cli(root: Path, *extra: str):
    args = ["evaluate", "--trace", str(root / "trace.csv"), "--plan-trace", str(root / "plan.csv"), "--format", "sia",
            "--budget", "40", "--catalog", str(root / "catalog.csv"), "--curves", str(root / "curves.parquet"),
            "--truth", str(root / "profiles.csv"), "--shortlist", "2", "--screen-jobs", str(JOBS),
            "--replay-jobs", str(JOBS), "--holdout", "0", *extra]
    if "--tracking-uri" not in extra:
        args.append("--no-mlflow")
    return CliRunner().invoke(app, args, env={"COLUMNS": "220"})


def test_cli_evaluate_elastic_writes_both_columns_and_logs_them(cli_inputs):
    out = cli_inputs / "out"
    uri = f"sqlite:///{cli_inputs / 'mlflow.db'}"
    result = evaluate_cli(cli_inputs, "--elastic", "--truth-placements", "shipped", "--out-dir", str(out),
                          "--tracking-uri", uri)
    assert result.exit_code == 0, result.output
    summary = pd.read_csv(out / "summary.csv")
    assert set(ELASTIC_COLUMNS) <= set(summary.columns) and (summary["truth"] == "measured").all()
    assert (summary["elastic_avg_jct_h"] != summary["avg_jct_h"]).all()
    assert "fixed vs elastic GPU counts (truth: measured)" in result.output and "fixed/elastic" in result.output
    assert set(pd.read_csv(out / "jobs.csv")["counts"]) == {"fixed", "elastic"}
    assert (out / "jct_cdf_las_trace_elastic.png").stat().st_size > 0 and (out / "jct_cdf_las_trace.png").is_file()
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("hetplan-evaluation").experiment_id])
    quo = summary[summary["setup"] == "status quo"].iloc[0]
    assert run.data.params["elastic"] == "measured"
    assert run.data.metrics["status_quo.las.trace.elastic_jct_ratio"] == pytest.approx(quo["elastic_jct_ratio"])


@pytest.mark.parametrize("extra, message", [
    (("--truth-placements", "shipped"), "--truth-placements: only with --elastic"),
    (("--elastic", "--truth-placements", "/tmp/steps"), "`shipped` (the measured table shipped with hetplan)"),
    (("--elastic", "--rho", "1"), "--rho: not with --elastic"),
    (("--elastic", "--relabel-unknown"), "--relabel-unknown: not with --elastic"),
    (("--elastic", "--format", "trace", "--plan-format", "sia", "--trace", "contract.csv"),
     "--trace: --elastic needs a trace with batch sizes"),
])
def test_cli_evaluate_elastic_refuses_bad_combinations_in_one_line(cli_inputs, extra, message):
    out = cli_inputs / "refused"
    extra = tuple(str(cli_inputs / e) if e == "contract.csv" else e for e in extra)
    refused(evaluate_cli(cli_inputs, *extra, "--out-dir", str(out)), message, out)


def refused(result, message: str, out: Path) -> None:
    """Exit 2 with `message` on one line (rich's box and wrapping undone), nothing written to `out`."""
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.replace("│", " ").split()), result.output
    assert not out.exists()


# ---------------------------------------------------------------------- hetplan plan --elastic

def plan_cli(root: Path, *extra: str):
    args = ["plan", "--catalog", str(root / "catalog.csv"), "--curves", str(root / "curves.parquet"), "--budget", "40",
            "--holdout", "0", "--shortlist", "2", "--screen-jobs", str(JOBS), "--replay-jobs", str(JOBS),
            "--no-mlflow", *extra]
    return CliRunner().invoke(app, args, env={"COLUMNS": "220"})


def test_cli_plan_elastic_records_that_its_replays_chose_gpu_counts(cli_inputs):
    out = cli_inputs / "plan-out"
    result = plan_cli(cli_inputs, "--workload", str(cli_inputs / "plan.csv"), "--workload-format", "sia", "--elastic",
                      "--out-dir", str(out))
    assert result.exit_code == 0, result.output
    planning = json.loads((out / "plan.json").read_text())["planning"]
    assert planning["elastic"]["round_s"] == 300.0 and planning["winner"]


@pytest.mark.parametrize("extra, message", [
    (("--elastic",), "--elastic: needs --workload and a workload objective"),
    (("--elastic", "--workload", "contract.csv", "--objective", "throughput"), "--elastic: needs --workload and a "
                                                                              "workload objective"),
    (("--elastic", "--workload", "contract.csv"), "--workload: --elastic needs a workload with batch sizes"),
])
def test_cli_plan_elastic_refuses_bad_combinations_in_one_line(cli_inputs, extra, message):
    out = cli_inputs / "plan-refused"
    extra = tuple(str(cli_inputs / e) if e == "contract.csv" else e for e in extra)
    refused(plan_cli(cli_inputs, *extra, "--out-dir", str(out)), message, out)
