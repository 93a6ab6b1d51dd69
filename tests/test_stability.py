"""The stability rule of co-adaptive rounds (`hetplan.allocator.stability`, issue 21): moves pay over the expected
remaining time, a budget per job, no quick return, swaps that each member may make, the job with the fewest moves
sent down first; and random sequences of steps never exceed the budget."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from hetplan.allocator import Allocator
from hetplan.allocator.policies import get_policy
from hetplan.allocator.actions import Action
from hetplan.allocator.spec import Allocation, Job, Node
from hetplan.allocator.stability import MoveHistory, Stability, record, remaining_s, saved_s
from tests.test_rebalance import SPEEDS, hints, where

ONE_EACH = [Node("v", "V100", 1, 4, 16), Node("k", "K80", 1, 4, 16)]


def allocator(stability: Stability, nodes=ONE_EACH, hint_set=SPEEDS, now: list[float] | None = None) -> Allocator:
    alloc = Allocator(nodes, get_policy("hint", migration_s=30.0, horizon_s=300.0, stability=stability), hint_set)
    clock = now if now is not None else [0.0]
    alloc.clock = lambda: clock[0]
    return alloc


def on(job: str, model: str, node: str, gpu_type: str) -> Allocation:
    return Allocation(job, model, node, gpu_type, 1, 1000, 4000, "h1", "hint", "hinted", 1)


# ---------------------------------------------------------------------- the rule's parts

@pytest.mark.parametrize("history, now, horizon, expected", [
    (None, 100.0, 300.0, 300.0),                   # no history: one horizon
    (MoveHistory(0.0), 100.0, 300.0, 300.0),       # younger than a horizon: the floor
    (MoveHistory(0.0), 7200.0, 300.0, 7200.0),     # two hours old: two hours expected
])
def test_the_expected_remaining_time_is_the_age_floored_at_one_horizon(history, now, horizon, expected):
    assert remaining_s(history, now, horizon) == expected


@pytest.mark.parametrize("history, to, own_saved, now, to_best, admitted", [
    (None, "V100", 0.0, 0.0, True, True),                                    # no history: budget intact
    (MoveHistory(0.0, 3), "V100", 1e9, 0.0, True, True),                     # the 4th of 4: to its best type
    (MoveHistory(0.0, 3), "K80", 1e9, 0.0, False, False),                    # ... not to a slower one
    (MoveHistory(0.0, 4), "V100", 1e9, 0.0, True, False),                    # budget spent
    (MoveHistory(0.0, 1, (("V100", 100.0),)), "V100", 200.0, 3600.0, True, False),  # back within 6 h: 200 < 8 x 30
    (MoveHistory(0.0, 1, (("V100", 100.0),)), "V100", 240.0, 3600.0, True, True),   # ... unless it saves 8 x 30
    (MoveHistory(0.0, 1, (("V100", 100.0),)), "V100", 0.0, 100.0 + 6 * 3600, True, True),  # the window is over
    (MoveHistory(0.0, 1, (("K80", 100.0),)), "V100", 0.0, 3600.0, True, True),      # left another type
])
def test_a_job_may_move_within_its_budget_and_not_back_quickly(history, to, own_saved, now, to_best, admitted):
    rule = Stability(margin=2.0, return_window_s=6 * 3600.0, return_margin=8.0, budget=4)
    assert rule.admits(history, to, own_saved, now, 30.0, to_best) is admitted


@pytest.mark.parametrize("gain, remaining, moved_speed, pays", [
    (0.2, 300.0, 1.0, True),     # 60 >= 2 x 30 x 1.0
    (0.2, 299.0, 1.0, False),    # 59.8 < 60
    (0.0, 1e9, 0.0, False),      # a tie never moves
    (0.1, 300.0, 0.0, True),     # nothing moved that runs (a job being placed): any gain
])
def test_a_change_pays_when_the_speed_gained_over_the_remaining_time_covers_its_moves(gain, remaining, moved_speed,
                                                                                       pays):
    assert Stability(margin=2.0).pays(gain, remaining, moved_speed, 30.0) is pays


def test_saved_time_is_the_remaining_time_less_what_the_other_speed_needs():
    assert saved_s(3600.0, 0.8, 1.0) == pytest.approx(720.0)
    assert saved_s(3600.0, 1.0, 0.8) == pytest.approx(-900.0)
    assert saved_s(100.0, 0.0, 1.0) > 99.0  # off a type the hints do not list: nearly all of it


def test_record_books_starts_type_changes_and_keeps_stopped_jobs():
    v, k, v2 = on("a", "flat", "v", "V100"), on("a", "flat", "k", "K80"), on("a", "flat", "v2", "V100")
    history: dict[str, MoveHistory] = {}
    record(history, [Action("start", "a", (), (v,))], 10.0)
    record(history, [Action("migrate", "a", (v,), (k,))], 20.0)
    record(history, [Action("migrate", "a", (k,), (on("a", "flat", "k2", "K80"),))], 25.0)  # same type: no move
    record(history, [Action("stop", "a", (k,), ())], 30.0)
    record(history, [Action("start", "a", (), (v2,))], 40.0)  # restarts: its first start stays
    # one GPU held from 10 s to 30 s: 20 GPU-seconds attained (the scheduler's las order reads them back); it runs
    # again since 40 s; three restarts (two migrates, one stop)
    assert history == {"a": MoveHistory(10.0, 1, (("V100", 20.0),), attained=20.0, since=40.0, restarts=3)}
    two = Allocation("a", "flat", "v2", "V100", 2, 1000, 4000, "h1", "hint", "hinted", 1)
    record(history, [Action("resize", "a", (v2,), (two,))], 50.0)  # re-counted: a restart, 10 GPU-s at 1 GPU
    record(history, [Action("resize", "a", (two,), (replace(two, cpu_m=2000),))], 60.0)  # cores only: none
    assert history["a"] == MoveHistory(10.0, 1, (("V100", 20.0),), attained=30.0, since=50.0, restarts=4)
    assert MoveHistory.from_dict(history["a"].to_dict()) == history["a"]
    assert Stability().to_dict() == {"margin": 3.0, "return_window_s": 21600.0, "return_margin": 8.0, "budget": 3,
                                     "spread": True}


def test_the_types_left_are_bounded():
    history = {"a": MoveHistory(0.0)}
    parts = [on("a", "flat", n, t) for n, t in (("v", "V100"), ("k", "K80"))]
    for i in range(20):
        record(history, [Action("migrate", "a", (parts[i % 2],), (parts[(i + 1) % 2],))], float(i))
    assert history["a"].moves == 20 and len(history["a"].left) == 8 and history["a"].left[-1] == ("K80", 19.0)


# ---------------------------------------------------------------------- through the allocator

@pytest.mark.parametrize("age_a, age_b, swapped", [
    # flat on the V100, picky on the K80: the pair gains (1.0 - 0.2) + (0.8 - 1.0) = 0.6 of speed; the moves cost
    # 30 s at 0.8 (flat on the K80) + 30 s at 1.0 (picky on the V100) = 54, times margin 3 = 162
    (0.0, 0.0, True),        # 0.6 x 300 (the shorter expected remaining time, the floor) = 180 >= 162
    (3600.0, 0.0, True),     # the shorter is still picky's 300 s
])
def test_a_swap_pays_for_both_moves_over_the_shorter_expected_remaining_time(age_a, age_b, swapped):
    now = [0.0]
    alloc = allocator(Stability(), now=now)
    alloc.cluster.apply(on("a", "flat", "v", "V100"))
    alloc.cluster.apply(on("b", "picky", "k", "K80"))
    alloc.history.update(a=MoveHistory(-age_a), b=MoveHistory(-age_b))
    alloc.rebalance([Job("a", "flat", 1), Job("b", "picky", 1)])
    assert where(alloc) == ({"a": ("k",), "b": ("v",)} if swapped else {"a": ("v",), "b": ("k",)})


@pytest.mark.parametrize("history_a, history_b, swapped", [
    (MoveHistory(0.0), MoveHistory(0.0), True),
    (MoveHistory(0.0, 4), MoveHistory(0.0), False),                         # flat's budget is spent
    (MoveHistory(0.0, 3), MoveHistory(0.0), False),                         # flat's last move would be down
    (MoveHistory(0.0), MoveHistory(0.0, 3), True),                          # picky's last one is up: allowed
    (MoveHistory(0.0, 1, (("K80", -60.0),)), MoveHistory(0.0), False),       # flat left the K80 a minute ago
])
def test_each_member_of_a_swap_must_be_allowed_its_own_move(history_a, history_b, swapped):
    alloc = allocator(Stability(budget=4))
    alloc.cluster.apply(on("a", "flat", "v", "V100"))
    alloc.cluster.apply(on("b", "picky", "k", "K80"))
    alloc.history.update(a=history_a, b=history_b)
    alloc.rebalance([Job("a", "flat", 1), Job("b", "picky", 1)])
    assert where(alloc) == ({"a": ("k",), "b": ("v",)} if swapped else {"a": ("v",), "b": ("k",)})


def test_a_swapped_job_does_not_come_straight_back():
    """The ping-pong of issue 21: swapped down for a pair's gain, then up into a free GPU for its own, again."""
    now = [0.0]
    alloc = allocator(Stability(), now=now)
    alloc.cluster.apply(on("a", "flat", "v", "V100"))
    alloc.cluster.apply(on("b", "picky", "k", "K80"))
    alloc.history.update(a=MoveHistory(-7200.0), b=MoveHistory(0.0))
    alloc.rebalance([Job("a", "flat", 1), Job("b", "picky", 1)])
    assert where(alloc) == {"a": ("k",), "b": ("v",)}
    now[0] = 3600.0
    alloc.release("b")  # the V100 frees; flat (3 h old) would save 10800 x 0.2 = 2160 s > 8 x 30 ...
    alloc.rebalance([Job("a", "flat", 1)])
    assert where(alloc) == {"a": ("v",)}  # ... which clears the higher bar for a return
    alloc2 = allocator(Stability(return_margin=100.0), now=[3600.0])
    alloc2.cluster.apply(on("a", "flat", "k", "K80"))
    alloc2.history["a"] = MoveHistory(-7200.0, 1, (("V100", 0.0),))
    alloc2.rebalance([Job("a", "flat", 1)])
    assert where(alloc2) == {"a": ("k",)}  # 2160 < 100 x 30: it stays


@pytest.mark.parametrize("spread, history, gain, key", [
    (True, None, -0.2, (0, 0.2)),                   # sent down, never moved: first among those sent down
    (True, MoveHistory(0.0, 2), -0.2, (2, 0.2)),    # sent down after 2 moves: after every job with fewer
    (True, MoveHistory(0.0, 2), 0.3, (0, -0.3)),    # going up: by its gain alone, whatever its moves
    (False, MoveHistory(0.0, 2), -0.2, (0, 0.2)),   # before: the least speed lost first, moves or not
])
def test_who_goes_down_in_a_swap_is_the_job_with_the_fewest_moves_then_the_least_lost(spread, history, gain, key):
    assert Stability(spread=spread).swap_key(history, gain) == pytest.approx(key)


SPREAD = hints({"flat": {"V100": (1, 4, 1.0), "K80": (1, 4, 0.8)}, "mid": {"V100": (1, 4, 1.0), "K80": (1, 4, 0.7)},
                "picky": {"V100": (1, 4, 1.0), "K80": (1, 4, 0.2)}})


@pytest.mark.parametrize("spread, moves_a, moves_b, down", [
    # a (flat) and b (mid) on the V100s, picky on the K80: either pair pays (ages 0, 300 s floor: a 0.6 x 300 =
    # 180 >= 2 x 30 x 1.8, b 0.5 x 300 = 150 >= 2 x 30 x 1.7); a loses less speed (0.2 against 0.3)
    (True, 1, 0, "b"),    # b has moved less: b goes down
    (True, 0, 1, "a"),    # a has moved less and loses less
    (True, 1, 1, "a"),    # as many moves: the least lost
    (False, 1, 0, "a"),   # without spreading: the least lost, whatever the moves
])
def test_a_swap_sends_down_the_job_with_the_fewest_moves(spread, moves_a, moves_b, down):
    alloc = allocator(Stability(margin=2.0, spread=spread), [Node("v1", "V100", 1, 4, 16), Node("v2", "V100", 1, 4, 16),
                                                 Node("k", "K80", 1, 4, 16)], SPREAD)
    alloc.cluster.apply(on("a", "flat", "v1", "V100"))
    alloc.cluster.apply(on("b", "mid", "v2", "V100"))
    alloc.cluster.apply(on("c", "picky", "k", "K80"))
    alloc.history.update(a=MoveHistory(0.0, moves_a), b=MoveHistory(0.0, moves_b), c=MoveHistory(0.0))
    alloc.rebalance([Job("a", "flat", 1), Job("b", "mid", 1), Job("c", "picky", 1)])
    assert where(alloc)[down] == ("k",) and where(alloc)["c"] in {("v1",), ("v2",)}


# ---------------------------------------------------------------------- property: the budget holds

MODELS = hints({f"m{i}": {"V100": (1, 4, 1.0), "P100": (1, 4, 0.3 + 0.1 * i), "K80": (1, 4, 0.1 + 0.1 * i)}
                for i in range(6)})


@pytest.mark.parametrize("seed", range(8))
def test_random_sequences_of_steps_never_exceed_the_budget(seed):
    rng = random.Random(seed)
    budget = rng.choice([0, 1, 2, 3])
    now = [0.0]
    nodes = [Node(f"{t}-{i}", t, 1, 4, 16) for t in ("V100", "P100", "K80") for i in range(4)]
    alloc = allocator(Stability(margin=rng.choice([0.0, 1.0, 2.0]), return_window_s=rng.choice([0.0, 3600.0]),
                                budget=budget, spread=rng.random() < 0.7), nodes, MODELS, now)
    jobs: dict[str, Job] = {}
    moves: dict[str, int] = {}
    for step in range(60):
        now[0] += rng.choice([60.0, 600.0, 3600.0])
        for _ in range(rng.randint(0, 4)):
            job = Job(f"j{step}-{len(jobs)}", f"m{rng.randrange(6)}", 1)
            jobs[job.job_id] = job
        for job_id in rng.sample(sorted(jobs), k=min(len(jobs), rng.randint(0, 2))):
            alloc.release(job_id)
            del jobs[job_id]
        order = rng.sample(list(jobs.values()), k=len(jobs))
        for action in alloc.rebalance(order, preempt=rng.random() < 0.5):
            if action.kind == "migrate" and action.before[0].gpu_type != action.after[0].gpu_type:
                moves[action.job_id] = moves.get(action.job_id, 0) + 1
        assert not alloc.cluster.check()
        assert all(m <= budget for m in moves.values()), (budget, moves)
        assert all(alloc.history[j].moves == m for j, m in moves.items() if j in jobs)
