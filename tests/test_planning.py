"""Planning above the planner and co-design: the objective vocabulary, the node mix, the request's checks,
the prediction interval of a workload plan (real replays), and the nightly pipeline's use of them."""

import math
import re

import numpy as np
import pytest

from hetplan.codesign import workload_from_trace
from hetplan.codesign.candidates import STATUS_QUO
from hetplan.contracts import ContractError
from hetplan.planner import build_problem
from hetplan.planning import NodeMix, Objective, PlanRequest, ReplaySizes, RequestError, plan
from hetplan.planning.prediction import MIN_HELD_BACK, MIN_JOBS, NOMINAL, interval, split
from planning_helpers import catalog, curves, jobs  # noqa: F401 (fixtures)


# ---------------------------------------------------------------------- the vocabulary, the mix, the request

@pytest.mark.parametrize(("objective", "needs_workload", "for_workload", "milp", "metric"), [
    ("jct", True, True, "mix", "avg_jct_h"),
    ("p95-jct", True, True, "mix", "p95_jct_h"),
    ("makespan", True, True, "mix", "makespan_h"),
    ("cost", False, True, "cost", "cost_per_hour"),
    ("throughput", False, False, "mix", "mix_served"),
    ("throughput-sum", False, False, "sum", "mix_served"),
])
def test_one_objective_vocabulary_knows_its_kind_milp_and_metric(objective, needs_workload, for_workload, milp,
                                                                 metric):
    parsed = Objective.parse(objective)
    assert parsed.value == objective and str(parsed) == objective
    assert (parsed.needs_workload, parsed.for_workload, parsed.milp, parsed.metric) == (needs_workload, for_workload,
                                                                                       milp, metric)


def test_an_unknown_objective_names_the_allowed_ones():
    with pytest.raises(ValueError, match="must be one of jct, p95-jct, makespan, cost, throughput, throughput-sum"):
        Objective.parse("fastest")


def test_a_node_mix_adds_the_owned_fleet_to_the_added_nodes(catalog):
    shapes = catalog.assign(owned=[2 if i == 0 else 0 for i in range(len(catalog))])
    first, second = str(shapes.loc[0, "name"]), str(shapes.loc[1, "name"])
    mix = NodeMix.on_fleet(shapes, {first: 1, second: 3, str(shapes.loc[2, "name"]): 0})
    assert mix.total() == {first: 3, second: 3}
    assert mix.owned == {first: 2} and NodeMix.by_index(shapes, {0: 1, 1: 3}) == mix
    nodes = mix.nodes(shapes)
    assert len(nodes) == 6 and sum(n.labels["hetplan/shape"] == first for n in nodes) == 3


@pytest.mark.parametrize(("request_", "workload", "budget", "owned", "option", "message"), [
    (PlanRequest(Objective.jct), False, 60.0, False, "--objective", "the jct objective needs --workload"),
    (PlanRequest(Objective.cost), True, 60.0, False, "--max-avg-jct", "needs --max-avg-jct"),
    (PlanRequest(Objective.cost), False, 60.0, False, "--target", "needs --target"),
    (PlanRequest(), False, None, False, "--budget", "the throughput objective needs --budget"),
    (PlanRequest(), True, None, True, "--budget", "planning for a workload needs --budget"),
    (PlanRequest(sweep=(10.0, -1.0)), False, 60.0, False, "--sweep", "-1.0 is not a budget"),
    (PlanRequest(holdout=1.0), True, 60.0, False, "--holdout", "must be in [0, 1)"),
])
def test_a_request_names_the_option_that_does_not_fit(request_, workload, budget, owned, option, message):
    with pytest.raises(RequestError, match=re.escape(message)) as caught:
        request_.check(workload=workload, budget=budget, owned=owned)
    assert caught.value.option == option and str(caught.value.problems[0]).startswith(option)


def test_a_request_defaults_to_jct_with_a_workload_and_throughput_without():
    assert PlanRequest().resolved(True) is Objective.jct and PlanRequest().resolved(False) is Objective.throughput
    PlanRequest(Objective.cost, target=10.0).check(workload=False, budget=None, owned=False)  # cost needs no budget


# ---------------------------------------------------------------------- the interval, by hand

def test_the_interval_holds_the_draws_range_and_widens_with_the_held_back_error():
    draws_only = interval(1.3, [1.25, 1.36], 0.0)
    assert draws_only.low <= 1.25 and draws_only.high >= 1.36 and draws_only.contains(1.3)
    widened = interval(1.3, [1.25, 1.36], 0.1)
    assert widened.low < draws_only.low and widened.high > draws_only.high
    assert widened.high / 1.3 == pytest.approx(math.exp(1.6449 * math.hypot(np.std(np.log([1.25, 1.36]), ddof=1),
                                                                            0.1)))


def test_the_held_back_part_is_the_last_to_arrive():
    first, rest = split(jobs(10).iloc[::-1], 0.2)
    assert list(first["job_id"]) == [f"j{i}" for i in range(8)] and list(rest["job_id"]) == ["j8", "j9"]
    assert split(jobs(2), 0.2) is None and split(jobs(10), 0.0) is None


# ---------------------------------------------------------------------- the interval, from real replays

def planned(curves, catalog, n, holdout):
    workload = workload_from_trace(jobs(n))
    problem = build_problem(curves, catalog, workload.demand, budget=60.0)
    return plan(problem, PlanRequest(Objective.jct, holdout=holdout, workers=1), workload)


@pytest.fixture(scope="module")
def large(curves, catalog):
    return planned(curves, catalog, 100, 0.2), planned(curves, catalog, 100, 0.0)


def test_a_workload_plans_interval_contains_the_spread_of_its_arrival_draws(large):
    for outcome in large:
        prediction = outcome.prediction
        assert len(prediction.speedup_by_draw) == 3  # traced, Poisson, stressed
        assert prediction.speedup.low <= min(prediction.speedup_by_draw) <= max(prediction.speedup_by_draw) \
            <= prediction.speedup.high
        quo = outcome.weighing.row(STATUS_QUO)
        chosen = outcome.candidates.query("chosen").iloc[0]  # on the status quo's jobs: it runs every one here
        assert chosen["rejected"] == 0 and chosen["core_avg_jct_h"] == pytest.approx(chosen["avg_jct_h"])
        assert prediction.speedup.point == pytest.approx(quo["avg_jct_h"] / chosen["core_avg_jct_h"])
        assert prediction.avg_jct_h.low <= prediction.avg_jct_h.point <= prediction.avg_jct_h.high


def test_the_held_back_error_widens_the_interval_and_the_plan_records_it(large):
    held, draws_only = large
    check = held.prediction.held_back
    assert check is not None and check.jobs == 20 and draws_only.prediction.held_back is None
    assert check.speedup_error != 0 and math.isfinite(check.speedup_error)
    assert held.prediction.speedup.low < draws_only.prediction.speedup.low
    assert held.prediction.speedup.high > draws_only.prediction.speedup.high
    assert held.result.plan.plan_id and held.prediction.trusted and not held.warnings
    record = held.result.plan.planning["prediction"]
    assert record["nominal_coverage"] == NOMINAL and "held-back" in record["method"] and record["trusted"]
    assert record["held_back"]["jobs"] == 20 and record["speedup_over_status_quo"]["low"] < 1e9
    assert not draws_only.prediction.trusted and "no held-back check" in draws_only.warnings[0]


def test_a_workload_too_small_for_the_interval_says_so(curves, catalog):
    outcome = planned(curves, catalog, 30, 0.2)
    prediction = outcome.prediction
    assert prediction.jobs == 30 < MIN_JOBS and prediction.held_back.jobs == 6 < MIN_HELD_BACK
    assert not prediction.trusted and "too little data to trust it" in prediction.line()
    assert any(w.startswith("too few jobs to trust the prediction interval: 30 jobs") for w in outcome.warnings)
    assert outcome.result.plan.planning["prediction"]["trusted"] is False


def test_a_long_workload_is_checked_on_its_most_recent_jobs(curves, catalog):
    """The held-back check of a workload longer than one replay's sample (here 60 jobs replayed 1 in 2: 30) plans
    on the 24 most recent jobs but 6 and compares on those 6: its cost is one replay's whatever the trace's
    length."""
    workload = workload_from_trace(jobs(60))
    problem = build_problem(curves, catalog, workload.demand, budget=60.0)
    outcome = plan(problem, PlanRequest(Objective.jct, holdout=0.2, workers=1, sizes=ReplaySizes(replay_jobs=40)),
                   workload)
    assert outcome.result.plan.planning["screen"]["replay_sample"]["jobs"] == 30
    check = outcome.prediction.held_back
    assert check is not None and check.jobs == 6
    assert outcome.prediction.jobs == 60


def test_the_same_plan_call_makes_a_steady_plan_without_a_workload(curves, catalog):
    workload = workload_from_trace(jobs(20))
    problem = build_problem(curves, catalog, workload.demand, budget=60.0)
    outcome = plan(problem, PlanRequest(sweep=(30.0,)), None)
    assert outcome.objective is Objective.throughput and outcome.prediction is None and outcome.weighing is None
    assert outcome.baseline(STATUS_QUO) is not None and outcome.winner == "hetplan"
    assert outcome.mix.total() == NodeMix.of_plan(outcome.result.plan).total()
    assert set(outcome.frontier["budget"]) == {30.0}
    assert "predicted" in outcome.summary and outcome.setup("hetplan", problem.shapes).gpus > 0
    with pytest.raises(RequestError, match="needs --max-avg-jct"):
        plan(problem, PlanRequest(Objective.cost), workload)


# ---------------------------------------------------------------------- the nightly pipeline

def test_the_pipeline_refuses_an_unknown_objective_in_one_line(tmp_path):
    from hetplan.pipeline import plan_step

    with pytest.raises(ContractError) as caught:
        plan_step(tmp_path, "run", budget=10.0, objective="fastest")
    assert str(caught.value).startswith("objective: must be one of jct, p95-jct")
