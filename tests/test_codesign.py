"""Planning for a workload: candidates, replays, the choice rule, the record in plan.json, the CLI."""

import json
import math
import os

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from hetplan.cli import app
from hetplan.codesign import decide, plan_workload, propose, workload_from_trace
from hetplan.codesign.candidates import PROPORTIONAL, STATUS_QUO
from hetplan.contracts import CURVES, ContractError, load_plan
from hetplan.planner import build_problem
from hetplan.planner import sizes
from planning_helpers import MODELS, catalog, curves, jobs  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def planned(curves, catalog):
    workload = workload_from_trace(jobs())
    problem = build_problem(curves, catalog, workload.demand, budget=60.0)
    return plan_workload(problem, workload)


def test_the_status_quo_is_a_candidate_and_the_winner_never_loses_in_sample(planned):
    table = planned.candidates
    quo = table[table["candidate"] == STATUS_QUO].iloc[0]
    winner = table[table["chosen"]].iloc[0]
    assert quo["policy"] == PROPORTIONAL and table["chosen"].sum() == 1
    assert winner["avg_jct_h"] <= quo["avg_jct_h"]
    assert (table["cost_per_hour"] <= 60.0 + 1e-6).all() and len(table) >= 5
    assert table["candidate"].is_unique


def test_plan_json_records_the_objective_every_candidate_and_the_winner(planned):
    planning = planned.result.plan.planning
    assert planning["objective"] == "jct" and planning["winner"] == planned.winner
    assert len(planning["candidates"]) == len(planned.candidates)
    assert planning["workload"]["jobs"] == 40 and planning["workload"]["draws"] == 3  # traced, Poisson, stressed
    assert planning["workload"]["stressed_draws"] == 1 and planning["decision"]["reason"]
    json.dumps(planning)  # JSON-able, NaN as null
    assert set(planned.result.hints["plan_id"]) <= {planned.result.plan.plan_id}


CHOICE_COLUMNS = ["candidate", "core_avg_jct_h", "cost_per_hour", "rejected", "refused_quo_jobs", "lead_se",
                  "worst_draw_speedup", "hosts_up_to"]
QUO = ("status quo", 10.0, 100, 5, 0, 0.0, 1.0, 16)


@pytest.mark.parametrize(("rows", "objective", "target", "host_gpus", "winner"), [
    # the status quo stays unless beaten by more than the margin ...
    ([QUO, ("a", 9.9, 90, 5, 0, 9.0, 1.01, 16)], "jct", None, None, "status quo"),
    ([QUO, ("a", 9.0, 90, 5, 0, 9.0, 1.05, 16)], "jct", None, None, "a"),
    # ... and by more than the noise (2 standard errors of the paired lead)
    ([QUO, ("a", 9.0, 90, 5, 0, 1.5, 1.05, 16)], "jct", None, None, "status quo"),
    # ... and never worse than 0.97x on any draw
    ([QUO, ("a", 8.0, 90, 5, 0, 9.0, 0.95, 16)], "jct", None, None, "status quo"),
    # a candidate that refuses a job the status quo runs is never chosen
    ([QUO, ("a", 1.0, 90, 8, 3, 9.0, 2.0, 8)], "jct", None, None, "status quo"),
    # hosting the jobs the status quo refuses: preferred when it costs its jobs at most 3 % ...
    ([QUO, ("a", 8.0, 90, 5, 0, 9.0, 1.2, 16), ("b", 8.2, 90, 0, 0, 9.0, 1.2, 32)], "jct", None, None, "b"),
    # ... declined when it costs more
    ([QUO, ("a", 8.0, 90, 5, 0, 9.0, 1.2, 16), ("b", 9.0, 90, 0, 0, 9.0, 1.1, 32)], "jct", None, None, "a"),
    # --max-job-gpus insists on a size: the status quo that cannot host it sets no floor
    ([QUO, ("a", 8.0, 90, 5, 0, 9.0, 1.2, 16), ("b", 30.0, 90, 0, 0, -9.0, 0.3, 32)], "jct", None, 32, "b"),
    # cost: the cheapest that meets the target, ties to the faster
    ([QUO, ("a", 12.0, 40, 5, 0, 0.0, 0.8, 16), ("b", 11.0, 40, 5, 0, 0.0, 0.9, 16),
      ("c", 30.0, 10, 5, 0, 0.0, 0.3, 16)], "cost", 12.0, None, "b"),
])
def test_the_choice_rule(rows, objective, target, host_gpus, winner):
    table = pd.DataFrame(rows, columns=CHOICE_COLUMNS)
    assert table.loc[decide(table, objective, target, host_gpus=host_gpus).index, "candidate"] == winner


def test_a_declined_size_is_said_with_its_cost_and_how_to_insist():
    table = pd.DataFrame([QUO, ("a", 8.0, 90, 5, 0, 9.0, 1.2, 16), ("b", 16.0, 90, 0, 0, 9.0, 1.2, 32)],
                         columns=CHOICE_COLUMNS)
    decision = decide(table, "jct")
    assert table.loc[decision.index, "candidate"] == "a"
    assert "declines 5 larger jobs" in decision.declined and "2.00x" in decision.declined
    assert "--max-job-gpus 32" in decision.declined


def test_the_status_quo_says_why_it_stays():
    table = pd.DataFrame([QUO, ("a", 9.0, 90, 5, 0, 1.5, 1.05, 16)], columns=CHOICE_COLUMNS)
    decision = decide(table, "jct")
    assert decision.index == 0 and "does not beat it" in decision.reason and "(a, 1.11x" in decision.reason


def test_a_jct_target_nobody_reaches_is_a_one_line_error():
    table = pd.DataFrame([("status quo", 10.0, 100.0, 0)],
                         columns=["candidate", "avg_jct_h", "cost_per_hour", "rejected"])
    with pytest.raises(ContractError, match="no candidate reaches an average JCT of 1 h; the fastest"):
        decide(table, "cost", 1.0)


def test_the_cost_objective_buys_less_for_a_looser_target(curves, catalog):
    workload = workload_from_trace(jobs())
    problem = build_problem(curves, catalog, workload.demand, budget=60.0)
    quo = plan_workload(problem, workload).row(STATUS_QUO)
    cheap = plan_workload(problem, workload, objective="cost", max_avg_jct=float(quo["avg_jct_h"]) * 1.5)
    chosen = cheap.row(cheap.winner)
    assert chosen["avg_jct_h"] <= quo["avg_jct_h"] * 1.5 and chosen["cost_per_hour"] < quo["cost_per_hour"]


def test_unprofiled_models_are_planned_never_dropped(curves, catalog):
    workload = workload_from_trace(jobs(models=[*MODELS, "bert"]))
    problem = build_problem(curves, catalog, workload.demand, budget=60.0)
    plan = plan_workload(problem, workload)
    assert plan.result.plan.needs_profiling == ["bert"] and plan.workload.summary["jobs"] == 40
    bert = problem.defaults.curves.query("model == 'bert'")
    assert set(bert["method"]) == {"default"} and bert["cpus_per_gpu"].max() == 3.0
    # nobody measured what cores do for bert: it is hinted the whole GPU-proportional share, as the status quo
    nodes = plan.result.nodes.assign(share=lambda f: f["vcpus"] / f["gpus"])
    rows = plan.result.hints[plan.result.hints["model"] == "bert"]
    assert len(rows)
    for row in rows.itertuples():
        assert row.cpus_per_gpu in set(nodes.loc[nodes["gpu_type"] == row.gpu_type, "share"])


@pytest.mark.parametrize(("giant_gpus", "dropped"), [
    (16, 0),  # larger than every node (8 GPUs): planned and replayed as gangs (or declined, and said), none left out
    (64, 0),  # the status quo hosts no 64-GPU job: it is still a candidate, and refuses them
    (4096, 3),  # no GPU type 60 $/h buys has 4,096 GPUs: left out of the replays, and counted
])
def test_jobs_larger_than_every_shape_are_replayed_as_gangs_where_a_type_can_host_them(curves, catalog, giant_gpus,
                                                                                         dropped):
    trace = jobs().assign(num_gpus=lambda f: np.where(f.index < 3, giant_gpus, f["num_gpus"]))
    workload = workload_from_trace(trace)
    problem = build_problem(curves, catalog, workload.demand, budget=60.0)
    plan = plan_workload(problem, workload)
    assert plan.workload.summary.get("dropped_jobs", 0) == dropped and plan.workload.summary["jobs"] == 40 - dropped
    assert any(f"{dropped} of 40 jobs left out" in w for w in plan.warnings) == bool(dropped)
    winner, quo = plan.row(plan.winner), plan.row(STATUS_QUO)
    assert quo is not None and winner["refused_quo_jobs"] == 0  # it runs every job the status quo runs
    if winner["rejected"]:  # never silently: the jobs it declines are counted, and what hosting them costs
        assert f"declines {int(winner['rejected'])} larger jobs" in plan.decision.declined
        assert plan.result.plan.planning["decision"]["declined"] == plan.decision.declined
        return
    if dropped:
        return
    giants = plan.result.allocation[plan.result.allocation["num_gpus"] == giant_gpus]
    assert len(giants) and giants["gpus"].sum() > 0  # the MILP values the giants' work
    record = plan.result.plan.planning["host_sizes"]
    assert record["largest_seen"] == giant_gpus and record["hosts_up_to"] >= giant_gpus and record["not_hosted"] == []
    assert hosting_of(problem, plan.candidate(plan.winner)).up_to >= giant_gpus


def hosting_of(problem, candidate):
    return sizes.hosting_of(problem.shapes, candidate.counts)


@pytest.mark.parametrize(("budget", "max_job_gpus", "gpus", "quo_hosts"), [
    (30.0, None, 32, False),  # the status quo's single shape at 30 $/h hosts no 32-GPU job: still a candidate
    (150.0, None, 32, True),
    (60.0, 48, 48, False),  # --max-job-gpus above the workload's largest job
])
def test_the_milps_mixes_host_the_largest_job_and_others_decline_it_by_name(curves, catalog, budget, max_job_gpus,
                                                                            gpus, quo_hosts):
    trace = jobs().assign(num_gpus=lambda f: np.where(f.index < 2, 32, f["num_gpus"]))
    problem = build_problem(curves, catalog, workload_from_trace(trace).demand, budget=budget,
                            max_job_gpus=max_job_gpus)
    candidates = propose(problem)
    assert problem.host.gpus == gpus and len(candidates) >= 5
    names = {c.name for c in candidates}
    assert {STATUS_QUO, f"{STATUS_QUO} + hints"} <= names  # the floor is always there
    assert any(c.declines_above is not None for c in candidates)  # hosting the 32s is weighed, not assumed
    for candidate in candidates:
        hosting = hosting_of(problem, candidate)
        assert candidate.cost_per_hour <= budget + 1e-6
        if candidate.name.startswith(STATUS_QUO):
            assert (hosting.up_to >= 32) == quo_hosts
        elif candidate.declines_above is not None:
            assert candidate.name.endswith(f", up to {candidate.declines_above} GPUs")
            assert candidate.declines_above < 32
        else:
            assert hosting.up_to >= gpus, (candidate.name, hosting)
            assert candidate.result.plan.planning["host_sizes"]["not_hosted"] == []


def test_an_empty_workload_is_refused():
    with pytest.raises(ContractError, match="the workload has no jobs"):
        workload_from_trace(jobs().iloc[:0])


def test_draws_keep_the_jobs_and_the_mean_rate():
    workload = workload_from_trace(jobs(n=200), draws=3, stress=0)
    assert len(workload.draws) == 3 and all(len(d) == 200 for d in workload.draws)
    assert list(workload.draws[1]["job_id"]) == list(workload.draws[0]["job_id"])
    span = workload.draws[2]["arrival_s"].max() / 3600
    assert 199 / span == pytest.approx(workload.summary["jobs_per_hour"], rel=0.25)


def test_a_stressed_draw_resamples_with_more_large_jobs_at_the_same_rate():
    trace = jobs(n=400)
    workload = workload_from_trace(trace, draws=2, stress=1)
    assert len(workload.draws) == 3 and workload.summary["stressed_draws"] == 1
    stressed = workload.draws[2]
    assert len(stressed) == 400 and stressed["job_id"].is_unique
    assert set(stressed["job_id"].str.split("~").str[0]) <= set(trace["job_id"].astype(str))
    gpu_hours = (stressed["num_gpus"] * stressed["duration_s"]).mean()
    assert gpu_hours > 1.1 * (trace["num_gpus"] * trace["duration_s"]).mean()  # heavier: the tail drawn twice as often
    span = stressed["arrival_s"].max() / 3600
    assert 399 / span == pytest.approx(workload.summary["jobs_per_hour"], rel=0.25)


def test_candidates_cover_budget_fractions_speed_floors_and_gpu_types(curves, catalog):
    problem = build_problem(curves, catalog, workload_from_trace(jobs()).demand, budget=60.0)
    names = {c.name for c in propose(problem)}
    assert {STATUS_QUO, "milp 100% budget", "milp 25% budget"} <= names
    assert any(n.startswith("speed floor") for n in names) and any(n.startswith("only ") for n in names)


# ---------------------------------------------------------------------- the CLI

@pytest.fixture(scope="module")
def files(tmp_path_factory, curves, catalog):
    root = tmp_path_factory.mktemp("workload")
    CURVES.write(curves, root / "curves.parquet")
    catalog.to_csv(root / "catalog.csv", index=False)
    jobs().to_csv(root / "trace.csv", index=False)
    jobs().iloc[:0].to_csv(root / "empty.csv", index=False)
    return root


def plan_cli(root, *extra):
    args = ["plan", "--curves", str(root / "curves.parquet"), "--catalog", str(root / "catalog.csv"), "--no-mlflow",
            *extra]
    return CliRunner().invoke(app, args, env={"COLUMNS": "200"})


def test_cli_plans_for_a_workload_and_says_why(files):
    out = files / "out"
    result = plan_cli(files, "--workload", str(files / "trace.csv"), "--budget", "60", "--sweep", "30",
                      "--out-dir", str(out))
    assert result.exit_code == 0, result.output
    assert "predicted for the workload:" in result.output and "predicted avg JCT" in result.output
    assert "simulated gain" in result.output
    assert "prediction: predicted speedup over the status quo" in result.output
    assert "(nominal 90% interval: 3 draws + 8 held-back jobs" in result.output
    assert "warning: too few jobs to trust the prediction interval: 40 jobs" in result.output
    assert "calibrated on" in result.output and "hetplan/data/calibration" in result.output
    plan = load_plan(out / "plan.json")
    calibrated = plan.planning["prediction"]["calibrated_speedup"]
    assert calibrated["low"] <= calibrated["point"] <= calibrated["high"]
    assert plan.planning["prediction"]["calibration"]["rows"] >= 9
    assert plan.planning["objective"] == "jct" and plan.inputs["workload"].startswith("sha256:")
    host = plan.planning["host_sizes"]  # the workload's jobs are of 1, 2 and 4 GPUs: the margin is 4
    assert host["largest_seen"] == 4 and host["gpus"] == 4 and host["hosted"] == [1, 2, 4]
    assert "job sizes: hosts 1, 2, 4 GPUs" in result.output
    prediction = plan.planning["prediction"]
    assert prediction["nominal_coverage"] == 0.9 and prediction["trusted"] is False and prediction["warnings"]
    speedup = prediction["speedup_over_status_quo"]
    assert speedup["low"] <= min(prediction["speedup_by_draw"]) <= max(prediction["speedup_by_draw"]) <= speedup["high"]
    candidates = pd.read_csv(out / "candidates.csv")
    assert candidates["chosen"].sum() == 1 and STATUS_QUO in set(candidates["candidate"])
    assert all(isinstance(json.loads(counts), dict) for counts in candidates["node_counts"])
    frontier = pd.read_csv(out / "frontier.csv")
    assert set(frontier["budget"]) == {30.0, 60.0} and (out / "frontier.png").stat().st_size > 0
    baselines = pd.read_csv(out / "baselines.csv")
    assert json.loads(baselines.loc[baselines["name"] == STATUS_QUO, "node_counts"].iloc[0])


@pytest.mark.parametrize(("args", "message"), [
    (("--objective", "jct", "--budget", "60"), "the jct objective needs --workload"),
    (("--workload", "{trace}", "--objective", "cost", "--budget", "60"), "needs --max-avg-jct"),
    (("--workload", "{trace}"), "needs --budget"),
    (("--workload", "{trace}", "--objective", "cost", "--max-avg-jct", "5"), "needs --budget"),
    (("--workload", "{trace}", "--budget", "0"), "buys no useful node and there is no owned fleet"),
    (("--workload", "{trace}", "--budget", "60", "--engine", "ray"), "unknown replay engine 'ray'"),
    (("--workload", "{empty}", "--budget", "60"), "no data rows"),
    (("--workload", "{trace}", "--objective", "cost", "--max-avg-jct", "0.001", "--budget", "60"),
     "no candidate reaches an average JCT of 0.001 h"),
    (("--workload", "{trace}", "--budget", "60", "--calibration", "{trace}"),
     "trace.csv: no column predicted_jct_speedup"),
    (("--workload", "{trace}", "--budget", "60", "--calibration", "{empty}/missing.csv"), "missing.csv: cannot read"),
    (("--workload", "{trace}", "--budget", "60", "--replay-jobs", "-1"), "--replay-jobs"),
])
def test_cli_refuses_bad_workload_plans_in_one_line_and_writes_nothing(files, args, message):
    out = files / "refused"
    args = [a.format(trace=files / "trace.csv", empty=files / "empty.csv") for a in args]
    result = plan_cli(files, *args, "--out-dir", str(out))
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()


def test_cli_calibrates_on_the_evaluations_it_is_given_or_on_none(files):
    from test_calibration import evaluated

    summary = files / "summary.csv"
    evaluated(12, bias=0.5, noise=0.05).assign(setup="hetplan").to_csv(summary, index=False)
    out, bare = files / "calibrated", files / "bare"
    result = plan_cli(files, "--workload", str(files / "trace.csv"), "--budget", "60", "--calibration", str(summary),
                      "--out-dir", str(out))
    assert result.exit_code == 0, result.output
    prediction = load_plan(out / "plan.json").planning["prediction"]
    assert prediction["calibration"]["rows"] == 12 and prediction["calibration"]["source"] == str(summary)
    assert prediction["calibrated_speedup"]["point"] == pytest.approx(
        prediction["speedup_over_status_quo"]["point"] * 0.5, rel=0.05)  # the bias of those rows, applied
    result = plan_cli(files, "--workload", str(files / "trace.csv"), "--budget", "60", "--calibration", "none",
                      "--out-dir", str(bare))
    assert result.exit_code == 0, result.output
    assert load_plan(bare / "plan.json").planning["prediction"]["calibrated_speedup"] is None
    assert "calibrated on" not in result.output


def test_the_nightly_pipeline_names_the_models_its_last_plan_could_not_profile(tmp_path, curves, catalog):
    from hetplan.hints import HintStore
    from hetplan.pipeline import needs_profiling

    assert needs_profiling(tmp_path) == []
    workload = workload_from_trace(jobs(models=[*MODELS, "bert"]))
    plan = plan_workload(build_problem(curves, catalog, workload.demand, budget=60.0), workload)
    HintStore(tmp_path / "hints").publish(plan.result.plan, plan.result.hints)
    assert needs_profiling(tmp_path) == ["bert"]


def test_candidates_that_cannot_keep_up_are_pruned_before_simulation(curves, catalog):
    workload = workload_from_trace(jobs(n=60, gap_s=120.0))
    plan = plan_workload(build_problem(curves, catalog, workload.demand, budget=60.0), workload)
    table = plan.candidates
    quo = table[table["candidate"] == STATUS_QUO].iloc[0]
    pruned = table[table["pruned"]]
    assert len(pruned) and not quo["pruned"] and not table.loc[table["chosen"], "pruned"].any()
    assert (pruned["fluid_load"] > max(1.25, quo["fluid_load"])).all() and pruned["avg_jct_h"].isna().all()
    assert (table.loc[~table["pruned"], "fluid_load"] <= max(1.25, quo["fluid_load"]) + 1e-9).all()


def test_when_every_candidate_is_overloaded_the_plan_says_so_and_replays_no_longer_than_the_screen(curves, catalog):
    """Arrivals no budget-bound cluster keeps up with: every queue grows, so replaying longer only grows it; the
    replays sample the screen's size, the record and a warning say what the workload asks and what is served."""
    workload = workload_from_trace(jobs(n=160, gap_s=20.0))
    plan = plan_workload(build_problem(curves, catalog, workload.demand, budget=20.0), workload, screen_jobs=40,
                         screen=1)
    screen = plan.result.plan.planning["screen"]
    overload = screen["overloaded"]
    kept = plan.candidates[~plan.candidates["pruned"]]
    assert overload and overload["least_fluid_load"] == pytest.approx(kept["fluid_load"].min(), abs=1e-4)
    assert overload["least_fluid_load"] > 1
    assert overload["offered_reference_gpus"] > overload["served_reference_gpus"]
    assert screen["replay_sample"]["jobs"] <= 40 and screen["screen_sample"]["jobs"] <= 40
    assert any("every candidate is overloaded" in w and "raise --budget" in w for w in plan.warnings)
    # the screen and the replays thin draw 0 alike: its screen runs are the replays' runs, reused as they are
    from hetplan.codesign.plan import shortlist_for

    listed = shortlist_for(plan.problem, workload, screen_jobs=40, screen=1)
    assert listed.record["screen_sample"]["every"] == listed.record["replay_sample"]["every"] > 1
    reused = [run for run in listed.done if listed.stage[run[0]] == "replayed"]
    assert reused and all(run[1] == 0 and run not in listed.pending for run in reused)
    assert all(json.dumps(listed.done[run]) == json.dumps(listed.runs.summary(run)) for run in reused)
    calm_workload = workload_from_trace(jobs(n=160))  # one job every 15 minutes
    calm = plan_workload(build_problem(curves, catalog, calm_workload.demand, budget=60.0), calm_workload,
                         screen_jobs=40, screen=1)
    assert calm.result.plan.planning["screen"]["overloaded"] is None
    assert not any("overloaded" in w for w in calm.warnings)


def test_the_shortlisted_candidates_are_tried_again_with_the_fastest_gpu_type_first(planned):
    from hetplan.codesign.screen import SCREEN

    table = planned.candidates
    refined = [n for n in table["candidate"] if n.endswith(", fastest first")]
    assert 1 <= len(refined) <= SCREEN
    originals = table.set_index("candidate").loc[[n.removesuffix(", fastest first") for n in refined]]
    assert (originals["screen"] == "replayed").all() and (originals["policy"] != PROPORTIONAL).all()
    candidate = planned.candidate(refined[0])
    for _, rows in candidate.result.hints.groupby(["model", "num_gpus"]):
        rows = rows.sort_values("rank")
        assert list(rows["rank"]) == list(range(1, len(rows) + 1))
        assert rows["normalized_throughput"].is_monotonic_decreasing


def test_a_re_ranked_twin_takes_the_figures_its_co_adaptive_replay_would_repeat(planned):
    from hetplan.codesign.replay import replay
    from hetplan.sim.engine import SimConfig

    for name in (n for n in planned.candidates["candidate"] if n.endswith(", fastest first")):
        row, twin = planned.row(name), planned.candidate(name)
        [again] = replay(planned.problem, [twin], planned.workload.draws, SimConfig("las", 300.0))
        assert again.metrics == {m: row[m] for m in again.metrics}, name


@pytest.mark.parametrize(("policy", "throughputs", "steer"), [
    ("hint", (2.0, 1.0), False),          # co-adaptive: GPU types by throughput, the ranks only label
    ("hint", (0.0, 0.0), True),           # ... unless a class has no throughput: then its ranks are its speeds
    ("hint", None, False),                # no hints: every type alike
    ("proportional", (2.0, 1.0), True),   # placement only: the policy reads the ranks (as hint-static would)
])
def test_whether_the_order_of_a_candidates_hints_can_change_its_replay(planned, policy, throughputs, steer):
    from dataclasses import replace

    from hetplan.codesign.plan import ranks_steer
    from hetplan.sim.engine import SimConfig

    candidate = planned.candidate(planned.winner)
    hints = candidate.result.hints
    hints = hints.iloc[:0] if throughputs is None else hints.assign(
        expected_throughput=[throughputs[min(r, 2) - 1] for r in hints["rank"]])
    changed = replace(candidate, policy=policy, result=replace(candidate.result, hints=hints))
    assert ranks_steer(changed, SimConfig()) is steer


def test_replays_in_several_processes_are_those_of_one(planned):
    """Workers are spawned, never forked (replays run inside Airflow tasks, whose threads a fork inherits), and
    their figures are exactly those of one process."""
    from hetplan.codesign.replay import START_METHOD, replay
    from hetplan.sim.engine import SimConfig

    candidates = [r.candidate for r in planned.replayed if not r.pruned][:3]
    one, two = (replay(planned.problem, candidates, planned.workload.draws, SimConfig("las", 300.0), workers=w)
                for w in (1, 2))
    assert [(r.metrics, r.avg_jct_by_draw, r.rejected) for r in one] == \
        [(r.metrics, r.avg_jct_by_draw, r.rejected) for r in two] and len(one) == 3
    assert START_METHOD == "spawn"


def test_the_screen_replays_the_status_quo_and_the_best_few_and_says_so(curves, catalog, planned):
    """The screen ranks every unpruned candidate on draw 0 (here the whole draw: its runs are reused); the
    status quo and the SCREEN best are replayed on every draw, and the full replays choose the same winner."""
    from hetplan.codesign.screen import SCREEN

    table = planned.candidates
    assert set(table["screen"]) <= {"pruned", "screened out", "replayed", "twin: the original's figures"}
    originals = table[~table["candidate"].str.endswith(", fastest first")]
    replayed = originals[originals["screen"] == "replayed"]
    assert STATUS_QUO in set(replayed["candidate"]) and len(replayed) == SCREEN + 1
    out = originals[originals["screen"] == "screened out"]
    assert len(out) and out["avg_jct_h"].isna().all() and not out["chosen"].any()
    assert out["screen_score"].min() >= replayed.loc[replayed["candidate"] != STATUS_QUO, "screen_score"].max()
    screen = planned.result.plan.planning["screen"]
    assert screen["screen_sample"]["every"] == 1 and screen["confidence"]["winner"] == planned.winner
    runner_up = screen["confidence"].get("runner_up", "")  # another cluster, never the winner's own twin
    assert runner_up.removesuffix(", fastest first") != planned.winner.removesuffix(", fastest first")
    every = plan_workload(planned.problem, workload_from_trace(jobs()), screen=None)
    assert every.winner == planned.winner and (every.candidates["screen"] != "screened out").all()
    row, again = planned.row(planned.winner), every.row(planned.winner)
    assert [row[m] for m in ("avg_jct_h", "p95_jct_h")] == [again[m] for m in ("avg_jct_h", "p95_jct_h")]


def test_a_sample_keeps_the_mix_and_the_arrival_rate():
    from hetplan.codesign.screen import STRESS_THIN, sampled
    from hetplan.codesign.workload import jobs_per_hour

    draw = workload_from_trace(jobs(n=1000)).draws[0]
    (sample,), every = sampled([draw], 250)
    assert every == 4 and len(sample) == 250 and list(sample["job_id"]) == list(draw["job_id"][::4])
    assert jobs_per_hour(sample) == pytest.approx(jobs_per_hour(draw), rel=0.01)
    assert sampled([draw], 1000) == ((draw,), 1)
    (kept, stress), every = sampled([draw, draw], 250, stressed=1)  # a stressed draw: thinned STRESS_THIN x more
    assert every == 4 and len(kept) == 250 and len(stress) == math.ceil(1000 / (4 * STRESS_THIN))
    assert jobs_per_hour(stress) == pytest.approx(jobs_per_hour(draw), rel=0.02)
    assert sampled([draw, draw], 1000, stressed=1)[0] == (draw, draw)  # not thinned: the stressed draw whole


@pytest.mark.parametrize("engine", ["pool", "dask-threads", "dask-processes"])
def test_every_engine_replays_bit_for_bit_what_one_process_does(planned, engine):
    """Replay runs are pure: one process, the spawn pool and a Dask LocalCluster on 127.0.0.1 return equal
    summaries (the same floats, not approximately)."""
    from hetplan.codesign.engines import Dask, ProcessPool, Serial
    from hetplan.codesign.replay import Runs
    from hetplan.sim.engine import SimConfig

    candidates = tuple(r.candidate for r in planned.replayed if not r.pruned and r.metrics["avg_jct_h"] > 0)[:2]
    draws = tuple(d.iloc[:15] for d in planned.workload.draws)
    runs = Runs(planned.problem, candidates, draws, SimConfig("las", 300.0))
    engines = {"pool": ProcessPool(2), "dask-threads": Dask(workers=2, processes=False),
               "dask-processes": Dask(workers=2)}
    seen = []
    there = engines[engine].summaries(runs, runs.every(), lambda done, total, label: seen.append(label))
    here = Serial().summaries(runs, runs.every())
    assert list(here) == runs.every() and len(here) == len(seen) == 2 * len(draws) == 6
    assert [(run, json.dumps(there[run])) for run in here] == [(run, json.dumps(here[run])) for run in here]


def test_an_unknown_engine_is_refused():
    from hetplan.codesign.engines import engine_from

    with pytest.raises(ValueError, match="unknown replay engine 'ray'"):
        engine_from("ray")
    with pytest.raises(ValueError, match="--dask-address needs --engine dask"):
        engine_from("local", address="tcp://127.0.0.1:8786")


class _Pids:
    """Replay runs that say which process ran them (picklable: module level)."""

    def summary(self, run):
        import os

        return {"pid": os.getpid()}

    def label(self, run):
        return str(run)


def test_a_pool_held_open_serves_every_call_with_the_workers_it_started_once():
    from hetplan.codesign.engines import ProcessPool, held_open

    runs, which = _Pids(), [(i, 0) for i in range(6)]
    pool = ProcessPool(2)
    with held_open(pool, warm=True):
        assert pool.started
        with held_open(pool):  # nested: the inner block leaves the workers to the outer one
            first = {s["pid"] for s in pool.summaries(runs, which).values()}
        second = {s["pid"] for s in pool.summaries(runs, which).values()}
        assert pool.started
    assert not pool.started
    assert len(first | second) <= 2 and os.getpid() not in first  # two workers, both calls, not this process
    third = {s["pid"] for s in pool.summaries(runs, which).values()}  # not held: a pool of its own
    assert not third & (first | second) and not pool.started


class _Sleeper:
    """Replay runs that say they started (a file in `here`), then take a minute (picklable: module level)."""

    def __init__(self, here):
        self.here = here

    def summary(self, run):
        import pathlib
        import time

        (pathlib.Path(self.here) / f"{run[0]}-{run[1]}").touch()
        time.sleep(60)
        return {}

    def label(self, run):
        return str(run)


@pytest.mark.slow
def test_pool_workers_end_with_a_killed_parent(tmp_path):
    """kill -9 of a command mid-replay (a stopped `hetplan evaluate`) ends its pool workers too, instead of
    leaving them to finish minutes of replays for nobody."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text("import sys\nsys.path[:0] = [%r, %r]\nfrom test_codesign import _Sleeper\n"
                      "from hetplan.codesign.engines import ProcessPool\n"
                      "if __name__ == '__main__':\n"
                      "    ProcessPool(2).summaries(_Sleeper(%r), [(0, 0), (1, 0)])\n"
                      % (os.path.dirname(__file__), os.path.dirname(os.path.dirname(__file__)), str(tmp_path)))
    parent = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 90
    while not ((tmp_path / "0-0").exists() and (tmp_path / "1-0").exists()) and time.monotonic() < deadline:
        time.sleep(0.2)
    workers = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(parent.pid), "-f", "spawn_main"],
                                                  capture_output=True, text=True).stdout.split()]
    assert len(workers) == 2, "the pool's workers never started their replays"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in workers if os.path.exists(f"/proc/{pid}") and
                 "spawn_main" in open(f"/proc/{pid}/cmdline").read()]
    assert not alive, f"workers {alive} outlived their killed parent"
