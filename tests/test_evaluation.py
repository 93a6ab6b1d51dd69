"""Out-of-sample evaluation: plan on one trace, replay another, four setups; loads by rho; the CLI."""

import math

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from hetplan.catalog import load_default_catalog
from hetplan.cli import app
from hetplan.contracts import CURVES, PROFILES
from hetplan.evaluation import ProblemInputs, evaluate, load_points
from hetplan.planning import ReplaySizes
from hetplan.reference import build_reference
from hetplan.sensitivity import fit_profiles
from hetplan.sim.setups import nodes_from_counts
from hetplan.sim.truth import TruthCurves

MODELS = ["res18", "transformer", "alexnet"]
GPU_TYPES = ["V100", "T4", "A100"]


def trace(n, seed, start=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"job_id": [f"j{start + i}" for i in range(n)],
                         "model": [MODELS[i % 3] for i in range(n)], "num_gpus": rng.choice([1, 1, 2, 4], size=n),
                         "arrival_s": (start + np.arange(n)) * 600.0,
                         "duration_s": rng.lognormal(np.log(3600), 0.8, size=n)})


@pytest.fixture(scope="module")
def inputs():
    derived = build_reference().derived
    profiles = derived[derived["model"].isin(MODELS) & derived["gpu_type"].isin(GPU_TYPES)]
    curves = fit_profiles(profiles).curves
    catalog = load_default_catalog()
    catalog = catalog[catalog["cloud"].isin(["aws", "gcp"]) & catalog["gpu_type"].isin(GPU_TYPES)]
    return profiles, curves, catalog.reset_index(drop=True)


@pytest.fixture(scope="module")
def result(inputs):
    profiles, curves, catalog = inputs
    truth = TruthCurves.from_profiles(profiles, fallback=curves)
    return evaluate(trace(30, 2, start=30), ProblemInputs(curves, catalog, 60.0), truth, plan_trace=trace(30, 1),
                    rhos=(0.5, 1.3))


def test_four_setups_replay_the_unseen_trace_at_each_rho(result):
    summary = result.summary
    assert len(summary) == 2 * 4 and set(summary["rho"]) == {0.5, 1.3}
    assert set(summary["setup"]) == {"status quo", "status quo + sensitivity-aware", "GPU-only mix", "hetplan"}
    assert (summary.loc[summary["setup"] == "status quo", "jct_speedup"] == 1.0).all()
    assert (summary["cost_per_hour"] <= 60.0 + 1e-6).all()
    assert (summary["completed"] + summary["rejected_too_big"] == 30).all() and (summary["replayed_one_in"] == 1).all()
    assert set(result.jobs["job_id"]) == {f"j{i}" for i in range(30, 60)}  # the replayed trace, not the planner's
    assert set(result.plans) == {"rho 0.5", "rho 1.3"} and all(p.prediction for p in result.plans.values())
    assert not any(w.startswith("in-sample") for w in result.warnings)
    for label, setups in result.setups.items():
        by_name = {s.name: s for s in setups}
        assert by_name["status quo + sensitivity-aware"].nodes == by_name["status quo"].nodes
        winner = result.plans[label].weighing.candidate(result.plans[label].winner)
        assert by_name["hetplan"].policy == winner.policy


def test_each_row_puts_the_planners_predicted_speedup_beside_the_realised_one(result):
    summary = result.summary.set_index(["rho", "setup"])
    for label, rho in (("rho 0.5", 0.5), ("rho 1.3", 1.3)):
        hetplan, quo = summary.loc[(rho, "hetplan")], summary.loc[(rho, "status quo")]
        predicted = result.plans[label].prediction.speedup
        assert hetplan["predicted_jct_speedup"] == pytest.approx(predicted.point)
        assert hetplan["predicted_low"] <= hetplan["predicted_jct_speedup"] <= hetplan["predicted_high"]
        assert hetplan["realised_over_predicted"] == pytest.approx(hetplan["jct_speedup"] / predicted.point)
        assert bool(hetplan["within_interval"]) == predicted.contains(hetplan["jct_speedup"])
        assert quo["predicted_jct_speedup"] == 1.0 and quo["realised_over_predicted"] == 1.0
        assert pd.isna(summary.loc[(rho, "GPU-only mix"), "within_interval"])
        assert math.isnan(summary.loc[(rho, "GPU-only mix"), "predicted_jct_speedup"])


def test_a_load_every_candidate_is_overloaded_by_is_replayed_on_a_sample_and_says_so(inputs):
    """Arrivals no 20 $/h cluster keeps up with: every queue grows with the trace, so the setups' truth replays
    sample as many jobs as a plan's replay (1 in m, same rate), and the summary and a warning say so."""
    profiles, curves, catalog = inputs
    truth = TruthCurves.from_profiles(profiles, fallback=curves)
    busy = trace(160, 3).assign(arrival_s=lambda f: np.arange(len(f)) * 60.0)  # a job a minute, ~2 GPU-hours each
    out = evaluate(busy, ProblemInputs(curves, catalog, 20.0), truth, sizes=ReplaySizes(1, 40, 40))
    (plan,) = out.plans.values()
    assert plan.result.plan.planning["screen"]["overloaded"]
    assert (out.summary["replayed_one_in"] == 4).all() and (out.summary["jobs"] == 40).all()
    assert any("every candidate is overloaded, so the setups' truth replays sample 40 of the trace's 160 jobs" in w
               for w in out.warnings)
    assert out.jobs.groupby("setup")["job_id"].nunique().eq(40).all()


def test_rho_sets_each_traces_rate_from_the_status_quos_gpu_time(inputs):
    profiles, curves, catalog = inputs
    truth = TruthCurves.from_profiles(profiles, fallback=curves)
    nodes = nodes_from_counts(catalog, {catalog["name"].iloc[0]: 4})
    plan_jobs, replay = trace(30, 1), trace(30, 2).assign(sim_model=lambda f: f["model"])
    points = load_points(plan_jobs, replay, truth, nodes, (0.5, 1.0), ())
    assert points[1].plan_rate == pytest.approx(2 * points[0].plan_rate)
    assert points[1].replay_rate == pytest.approx(2 * points[0].replay_rate)
    assert load_points(plan_jobs, replay, truth, nodes, (), ())[0].replay_rate is None


def test_the_same_trace_for_both_is_called_in_sample(inputs):
    profiles, curves, catalog = inputs
    truth = TruthCurves.from_profiles(profiles, fallback=curves)
    out = evaluate(trace(20, 1), ProblemInputs(curves, catalog, 60.0), truth, objective="throughput")
    assert any(w.startswith("in-sample") for w in out.warnings) and not out.plans
    assert set(out.summary["setup"]) >= {"status quo", "hetplan"}


def test_the_setups_truth_replays_are_the_same_on_a_process_pool(inputs, monkeypatch):
    """A long trace's setups replay in spawned processes (`PARALLEL_FROM_JOBS`): rows and jobs as in one."""
    import importlib

    from hetplan.codesign.engines import ProcessPool

    evaluation = importlib.import_module("hetplan.evaluation.evaluate")  # the package's `evaluate` is the function

    profiles, curves, catalog = inputs
    truth = TruthCurves.from_profiles(profiles, fallback=curves)

    def run():
        return evaluate(trace(20, 1), ProblemInputs(curves, catalog, 60.0), truth, objective="throughput",
                        schedulers=("las", "fifo"), engine=ProcessPool(2))

    serial = run()
    monkeypatch.setattr(evaluation, "PARALLEL_FROM_JOBS", 0)
    pooled = run()
    assert len(pooled.summary) == len(serial.summary) == 8
    pd.testing.assert_frame_equal(pooled.summary, serial.summary)
    pd.testing.assert_frame_equal(pooled.jobs, serial.jobs)
    assert list(pooled.summary["scheduler"]) == ["las"] * 4 + ["fifo"] * 4


# ---------------------------------------------------------------------- the CLI

@pytest.fixture(scope="module")
def cli_inputs(tmp_path_factory, inputs):
    profiles, curves, catalog = inputs
    root = tmp_path_factory.mktemp("evaluate")
    CURVES.write(curves, root / "curves.parquet")
    PROFILES.write(profiles, root / "profiles.csv")
    catalog.to_csv(root / "catalog.csv", index=False)
    trace(30, 2, start=30).to_csv(root / "trace.csv", index=False)
    trace(30, 1).to_csv(root / "plan.csv", index=False)
    return root


def evaluate_cli(root, *extra, trace_file="trace.csv"):
    args = ["evaluate", "--trace", str(root / trace_file), "--plan-trace", str(root / "plan.csv"), "--budget", "60",
            "--catalog", str(root / "catalog.csv"), "--curves", str(root / "curves.parquet"),
            "--truth", str(root / "profiles.csv"), *extra]
    if "--tracking-uri" not in extra:
        args.append("--no-mlflow")
    return CliRunner().invoke(app, args, env={"COLUMNS": "200"})


def test_cli_evaluate_prints_the_comparison_and_writes_tables_and_plots(cli_inputs):
    out = cli_inputs / "out"
    uri = f"sqlite:///{cli_inputs / 'mlflow.db'}"
    result = evaluate_cli(cli_inputs, "--rho", "1.3", "--out-dir", str(out), "--tracking-uri", uri)
    assert result.exit_code == 0, result.output
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("hetplan-evaluation").experiment_id])
    assert run.data.params["rho"] == "1.3" and run.data.metrics["status_quo.las.rho1.3.jct_speedup"] == 1.0
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"summary.csv", "jct_cdf_las_rho1.3.png"}
    assert "LAS, rho 1.3" in result.output and "hetplan at rho 1.3:" in result.output
    summary = pd.read_csv(out / "summary.csv")
    assert {"setup", "avg_jct_h", "jct_speedup", "rho"} <= set(summary.columns) and set(summary["rho"]) == {1.3}
    hetplan = summary[summary["setup"] == "hetplan"].iloc[0]
    assert hetplan["predicted_low"] <= hetplan["predicted_jct_speedup"] <= hetplan["predicted_high"]
    predicted = hetplan["predicted_jct_speedup"]
    assert hetplan["realised_over_predicted"] == pytest.approx(hetplan["jct_speedup"] / predicted)
    assert "real/pred" in result.output and f"{hetplan['predicted_jct_speedup']:.2f}x [" in result.output
    assert "planner's predicted speedup over the status quo" in result.output
    assert run.data.metrics["hetplan.las.rho1.3.predicted_jct_speedup"] == pytest.approx(
        hetplan["predicted_jct_speedup"])
    assert len(pd.read_csv(out / "jobs.csv")) == 30 * len(summary)
    assert (out / "jct_cdf_las_rho1.3.png").stat().st_size > 0 and (out / "utilisation_las_rho1.3.png").is_file()


@pytest.mark.parametrize("extra, message", [
    (("--load", "fast"), "--load: 'fast' is not a positive number"),
    (("--rho", "0"), "--rho: '0' is not a positive number"),
    (("--rho", "1", "--load", "3"), "give --rho or --load, not both"),
    (("--unknown-model", "bert"), "'bert' is not a truth model"),
    (("--objective", "fastest"), "'fastest' is not one of"),
    (("--max-job-gpus", "0"), "Invalid value for '--max-job-gpus'"),
    (("--max-job-gpus", "512"), "--max-job-gpus 512 needs 512 GPUs of one GPU type, and a budget of 60 $/h buys no "
                                "such cluster"),
])
def test_cli_evaluate_refuses_bad_options_and_writes_nothing(cli_inputs, extra, message):
    out = cli_inputs / "refused"
    result = evaluate_cli(cli_inputs, *extra, "--out-dir", str(out))
    assert result.exit_code != 0
    assert message in result.output, result.output
    assert not out.exists()


def test_cli_evaluate_names_the_bad_trace_row_and_writes_nothing(cli_inputs):
    bad = pd.read_csv(cli_inputs / "trace.csv")
    bad.loc[4, "duration_s"] = -1.0
    bad.to_csv(cli_inputs / "bad.csv", index=False)
    out = cli_inputs / "bad-out"
    result = evaluate_cli(cli_inputs, "--out-dir", str(out), trace_file="bad.csv")
    assert result.exit_code == 1
    assert "bad.csv:6:duration_s" in result.output
    assert not out.exists()


def test_an_owned_fleet_without_a_budget_is_its_own_status_quo(inputs):
    profiles, curves, catalog = inputs
    truth = TruthCurves.from_profiles(profiles, fallback=curves)
    fleet = pd.DataFrame([dict(name="own", gpu_type="V100", gpus=8, vcpus=64, mem_gb=488.0, count=2)])
    out = evaluate(trace(20, 2), ProblemInputs(curves, catalog, 0.0, fleet), truth, plan_trace=trace(20, 1),
                   rhos=(0.8,))
    by_setup = out.summary.set_index("setup")
    assert by_setup.loc["status quo", "gpus"] == 16 and by_setup.loc["status quo", "cost_per_hour"] == 0
    assert by_setup.loc["hetplan", "gpus"] == 16 and by_setup.loc["hetplan", "cost_per_hour"] == 0  # nothing to buy


@pytest.mark.parametrize(("plan_largest", "max_job_gpus", "replay_largest"), [
    (32, None, 32),  # the plan trace's largest job: hosted, or declined and said so with its cost
    (4, 24, 24),  # a size the plan trace never had, insisted on with --max-job-gpus: hosted
])
def test_hetplan_refuses_no_job_size_silently(inputs, plan_largest, max_job_gpus, replay_largest):
    """The catalog's largest node has 8 GPUs: the big jobs run as gangs over one GPU type where a plan hosts them."""
    profiles, curves, catalog = inputs
    truth = TruthCurves.from_profiles(profiles, fallback=curves)
    plan_jobs = trace(20, 1).assign(num_gpus=lambda f: np.where(f.index == 3, plan_largest, f["num_gpus"]))
    replay_jobs = trace(20, 2, start=20).assign(num_gpus=lambda f: np.where(f.index % 7 == 1, replay_largest,
                                                                             f["num_gpus"]))
    out = evaluate(replay_jobs, ProblemInputs(curves, catalog, 60.0, max_job_gpus=max_job_gpus), truth,
                   plan_trace=plan_jobs, rhos=(0.8,))
    hetplan = out.summary.set_index("setup").loc["hetplan"]
    planning = out.plans["rho 0.8"].result.plan.planning
    assert hetplan["rejected_too_big"] + hetplan["completed"] == 20
    hosts = planning["host_sizes"]["hosts_up_to"]
    assert max_job_gpus is None or hosts >= max_job_gpus  # insisted on: hosted
    if hosts >= replay_largest:
        assert hetplan["rejected_too_big"] == 0 and hetplan["completed"] == 20
    else:  # declined: the jobs it refuses are counted, and the plan says which and what hosting them would cost
        assert hetplan["rejected_too_big"] > 0 and "declines" in planning["decision"]["declined"]


def test_speedups_compare_only_the_jobs_every_setup_ran():
    """A setup that rejects a long job (too big for it) is not credited with that job's absence."""
    import numpy as np

    from hetplan.evaluation.evaluate import STATUS_QUO, with_ratios

    run = {"rho": 1.0, "load_jobs_per_h": np.nan, "scheduler": "las"}
    summary = pd.DataFrame([{**run, "setup": STATUS_QUO, "avg_jct_h": 4.0, "work_per_dollar": 1.0},
                            {**run, "setup": "small", "avg_jct_h": 1.0, "work_per_dollar": 1.0}])
    jobs = pd.DataFrame([{**run, "setup": setup, "job_id": job, "status": status, "jct_s": hours * 3600}
                         for setup, job, status, hours in [(STATUS_QUO, "a", "completed", 1.0),
                                                           (STATUS_QUO, "huge", "completed", 7.0),
                                                           ("small", "a", "completed", 0.5),
                                                           ("small", "huge", "rejected_too_big", np.nan)]])
    naive = with_ratios(summary)
    assert naive.loc[1, "jct_speedup"] == pytest.approx(4.0)  # 4 h over all it ran against 1 h over one job
    fair = with_ratios(summary, jobs)
    assert fair.loc[1, "jct_speedup"] == pytest.approx(2.0)  # job a alone: 1 h against 0.5 h
    assert list(fair["common_jobs"]) == [1, 1]
