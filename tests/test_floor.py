"""The floor a plan must clear: paired figures against the status quo, the held-back verdict, the mix shift, and
the overruling of a winner the held-back jobs do not bear out."""

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from hetplan.codesign import plan_workload, workload_from_trace
from hetplan.codesign.candidates import STATUS_QUO
from hetplan.codesign.objectives import FLOOR, NOISE_Z, beats
from hetplan.codesign.versus import versus
from hetplan.planner import build_problem
from hetplan.planning.planned import _fallback
from hetplan.planning.prediction import HELD_BACK_Z, HeldBack, mix_shift
from planning_helpers import catalog, curves, jobs  # noqa: F401 (fixtures)

NAN = float("nan")


@pytest.mark.parametrize(("mine", "quo", "speedup", "refused", "extra"), [
    ([[1.0, 2.0, 3.0]], [[2.0, 4.0, 6.0]], 2.0, 0, 0),  # twice as fast on every job
    ([[1.0, 2.0, NAN]], [[2.0, 4.0, 6.0]], 2.0, 1, 0),  # the third job refused: counted, not averaged
    ([[1.0, 2.0, 5.0]], [[2.0, 4.0, NAN]], 2.0, 0, 1),  # a job only the candidate ran: counted apart
    ([[2.0, 2.0], [4.0, 4.0]], [[2.0, 2.0], [2.0, 2.0]], 2 / 3, 0, 0),  # per draw 1x and 0.5x: mean JCTs 3 vs 2
])
def test_versus_pairs_jobs_on_the_same_draws(mine, quo, speedup, refused, extra):
    paired = versus([np.array(d) for d in mine], [np.array(d) for d in quo])
    assert paired.speedup == pytest.approx(speedup) and paired.refused == refused and paired.extra_jobs == extra


def test_the_worst_draw_and_the_lead_in_standard_errors():
    rng = np.random.default_rng(0)
    quo = [rng.lognormal(1.0, 0.5, 400) for _ in range(3)]
    faster = [q * 0.8 for q in quo[:2]] + [quo[2] * 1.1]  # 1.25x on two draws, 0.91x on the third
    paired = versus(faster, quo)
    assert paired.worst == pytest.approx(1 / 1.1) and not beats(paired)  # below the floor on one draw
    steady = versus([q * 0.8 for q in quo], quo)
    assert steady.lead_se > 10 and beats(steady)

    def noisy(q: np.ndarray) -> np.ndarray:  # 1.03x on every draw's mean, job by job all noise
        a = q * rng.lognormal(0.0, 0.8, len(q))
        return a * (q.mean() / 1.03) / a.mean()

    paired = versus([noisy(q) for q in quo], quo)
    assert paired.speedup == pytest.approx(1.03) and paired.worst == pytest.approx(1.03)  # margin and floor pass
    assert paired.lead_se < NOISE_Z and not beats(paired)  # the noise gate alone refuses it
    assert beats(paired, z=paired.lead_se * 0.99)


def test_pairing_refuses_draws_that_do_not_match():
    with pytest.raises(ValueError, match="same draws"):
        versus([np.ones(3)], [np.ones(3), np.ones(3)])
    with pytest.raises(ValueError, match="not the same draw"):
        versus([np.ones(3)], [np.ones(4)])


def frame(models, gpus, durations, arrivals):
    return pd.DataFrame({"model": models, "num_gpus": gpus, "duration_s": durations, "arrival_s": arrivals})


@pytest.mark.parametrize(("rest", "distance", "load", "differs"), [
    (frame(["a", "b"], [1, 1], [10.0, 10.0], [0.0, 3600.0]), 0.0, 1.0, False),  # the same mix and load
    (frame(["c", "c"], [1, 1], [10.0, 10.0], [0.0, 3600.0]), 1.0, 1.0, True),  # nothing in common
    (frame(["a", "b"], [1, 1], [20.0, 20.0], [0.0, 3600.0]), 0.0, 2.0, True),  # twice the offered work
])
def test_the_held_back_mix_shift(rest, distance, load, differs):
    first = frame(["a", "b"], [1, 1], [10.0, 10.0], [0.0, 3600.0])
    shift = mix_shift(first, rest)
    assert shift.distance == pytest.approx(distance) and shift.load_ratio == pytest.approx(load)
    assert shift.differs == differs and (shift.log_error > 0) == differs  # widened by how far past the limits


def held(checked) -> HeldBack:
    return HeldBack(20, "w", 1.2, 1.0, 1.0, 1.2, checked)


def test_the_held_back_verdict_names_what_fell_short():
    rng = np.random.default_rng(1)
    quo = [rng.lognormal(1.0, 0.3, 200) for _ in range(2)]
    check = held({"good": versus([q * 0.7 for q in quo], quo), "flat": versus([q * 1.02 for q in quo], quo),
                  STATUS_QUO: versus(quo, quo)})
    assert check.verdict("good") is None and check.verdict(STATUS_QUO) is None and check.verdict("unchecked") is None
    line = check.verdict("flat")
    assert "realised 0.98x the status quo" in line and f"floor {FLOOR:g}x" in line and f"({HELD_BACK_Z:g} standard" \
        in line


@pytest.fixture(scope="module")
def planned(curves, catalog):
    workload = workload_from_trace(jobs(60))
    return plan_workload(build_problem(curves, catalog, workload.demand, budget=60.0), workload)


def test_an_overruled_winner_gives_way_to_the_status_quo_and_the_plan_says_why(planned):
    assert planned.winner != STATUS_QUO  # the replays chose a plan
    quo = [np.ones(10)]
    no_better = held({planned.winner: versus(quo, quo), f"{STATUS_QUO} + hints": versus(quo, quo),
                      STATUS_QUO: versus(quo, quo)})
    against = no_better.verdict(planned.winner)
    name, reason = _fallback(planned, no_better, against)
    assert name == STATUS_QUO and "overruled by the held-back check" in reason
    overruled = planned.with_winner(name, reason)
    record = overruled.result.plan.planning
    assert overruled.winner == STATUS_QUO and record["winner"] == STATUS_QUO
    assert record["decision"]["overruled"] == planned.winner and record["decision"]["reason"] == reason
    assert overruled.candidates["chosen"].sum() == 1 and overruled.row(STATUS_QUO)["chosen"]
    assert overruled.result.plan.node_counts == overruled.candidate(STATUS_QUO).result.plan.node_counts
    assert math.isclose(overruled.speedup(), 1.0)


def test_an_overruled_winner_gives_way_to_the_status_quo_with_hints_where_they_beat_it_on_both(planned):
    hinted = f"{STATUS_QUO} + hints"
    row, quo_row = planned.row(hinted), planned.row(STATUS_QUO)
    rng = np.random.default_rng(2)
    quo = [rng.lognormal(1.0, 0.3, 200)]
    check = held({planned.winner: versus(quo, quo), hinted: versus([q * 0.7 for q in quo], quo),
                  STATUS_QUO: versus(quo, quo)})
    # the replays: the hints 1.25x the status quo on its jobs, ahead by many standard errors, on every draw
    table = planned.candidates.copy()
    at = table.index[table["candidate"] == hinted][0]
    column = "core_avg_jct_h" if "core_avg_jct_h" in table else "avg_jct_h"
    table.loc[at, [column, "lead_se", "worst_draw_speedup", "refused_quo_jobs"]] = [
        float(quo_row[column]) / 1.25, 10.0, 1.2, 0]
    assert row is not None
    name, reason = _fallback(replace(planned, candidates=table), check, check.verdict(planned.winner))
    assert name == hinted and reason.startswith(f"{hinted}: {planned.winner} was overruled by the held-back check")
