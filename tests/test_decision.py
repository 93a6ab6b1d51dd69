"""The plan's decision in words (`hetplan.decision`), on literal plans small enough to check by hand: what to rent,
the expected JCT against the status quo with one interval, the status quo defined, why (from the curves), and a
plan that keeps the status quo said plainly."""

from __future__ import annotations

from datetime import datetime, timezone

import pandas as pd
import pytest

from hetplan.contracts.plan import Plan
from hetplan.decision import expected, say

SHAPES = {"cloud:8xh100": {"gpu_type": "H100", "gpus": 8, "vcpus": 208, "mem_gb": 1800, "price_per_hour": 24.0},
          "cloud:8xv100": {"gpu_type": "V100", "gpus": 8, "vcpus": 64, "mem_gb": 488, "price_per_hour": 4.4},
          "dgx-a100": {"gpu_type": "A100", "gpus": 8, "vcpus": 256, "mem_gb": 1024, "price_per_hour": 0.0}}


def _plan(winner: str, node_counts: dict[str, int], interval: dict | None = None) -> Plan:
    candidates = [{"candidate": "status quo", "avg_jct_h": 7.5, "node_counts": {"cloud:8xv100": 10}},
                  {"candidate": "status quo + hints", "avg_jct_h": 7.4, "node_counts": {"cloud:8xv100": 10}},
                  {"candidate": "speed floor 0.75", "avg_jct_h": 1.2, "node_counts": {"cloud:8xh100": 2}}]
    planning = {"winner": winner, "margin": 0.02, "candidates": candidates,
                "prediction": {"avg_jct_h": interval, "nominal_coverage": 0.9} if interval else {}}
    cost = sum(SHAPES[s]["price_per_hour"] * n for s, n in node_counts.items())
    return Plan(plan_id="p", created_at=datetime(2026, 12, 4, tzinfo=timezone.utc), budget_per_hour=50.0,
                cost_per_hour=cost, node_counts=node_counts, objective=1.0, lp_bound=1.0, gap=0.0, solver="highs",
                solve_seconds=0.1, owned_nodes={"dgx-a100": 2}, planning=planning,
                shapes={s: SHAPES[s] for s in {*node_counts, "dgx-a100"}})


CURVES = pd.DataFrame([  # res18 gains from cores on H100 (2x from 3 to 24 per GPU), transformer does not
    {"model": m, "gpu_type": "H100", "cpus_per_gpu": c, "mem_gb_per_gpu": 62.5, "throughput": t}
    for m, points in {"res18": ((3, 100.0), (12, 180.0), (24, 200.0)), "transformer": ((3, 50.0), (24, 50.0))}.items()
    for c, t in points])
SHARES = pd.Series({"res18": 0.6, "transformer": 0.4})


def test_a_plan_that_rents_says_what_for_how_much_and_the_jct_with_one_interval():
    plan = _plan("speed floor 0.75", {"cloud:8xh100": 2}, {"point": 1.2, "low": 0.8, "high": 1.9})
    said = say(plan, CURVES, SHARES)
    assert said.headline == ("Rent 2 x cloud:8xh100 (8 x H100, 208 vCPUs, 1800 GiB) for 48.00 $/h and keep your 2 "
                             "owned nodes: expected average JCT 1.2 h (90% likely between 0.8 and 1.9 h, simulated) "
                             "against 7.5 h for the status quo.")
    assert said.why == ("Because these models gain from CPU on these types: res18 (60% of the GPU demand) runs 2x "
                        "faster on H100 with 26 cores per GPU than with 3 (the curves).")
    assert said.status_quo.startswith("The status quo is your owned nodes plus 10 x cloud:8xv100: the single node "
                                      "shape that serves the most of your workload's mix for the budget")
    assert said.headline.count("between") == 1  # one interval


def test_a_plan_that_keeps_the_status_quo_says_so_and_why():
    plan = _plan("status quo", {"cloud:8xv100": 10})
    said = say(plan, CURVES, SHARES)
    assert said.headline == ("Keep what you have: the status quo, rent 10 x cloud:8xv100 (8 x V100, 64 vCPUs, 488 "
                             "GiB) for 44.00 $/h and keep your 2 owned nodes: expected average JCT 7.5 h; nothing "
                             "else hetplan simulated beat it by more than 2% and the noise of its replays.")
    assert said.why.startswith("Because it runs your jobs faster")  # V100's 8 cores per GPU: no model gains 10 %
    overruled = plan.planning | {"decision": {"reason": "the status quo: speed floor 0.75 was overruled by the "
                                              "held-back check (1.01x on the held-back jobs)"}}
    said = say(plan.model_copy(update={"planning": overruled}), CURVES, SHARES)
    assert said.headline.endswith("the noise of its replays (speed floor 0.75 was overruled by the held-back check "
                                  "(1.01x on the held-back jobs)).")


def test_a_plan_that_keeps_the_nodes_with_hints_says_what_the_hints_gain():
    said = say(_plan("status quo + hints", {"cloud:8xv100": 10}), CURVES, SHARES)
    assert said.headline == ("Keep your nodes and give each job hetplan's hints (cores and RAM per job): the status "
                             "quo, rent 10 x cloud:8xv100 (8 x V100, 64 vCPUs, 488 GiB) for 44.00 $/h and keep your "
                             "2 owned nodes: expected average JCT 7.4 h against 7.5 h without the hints.")


def test_the_expected_jct_is_on_the_status_quos_jobs_where_the_winner_runs_more():
    plan = _plan("speed floor 0.75", {"cloud:8xh100": 2}, {"point": 1.2, "low": 0.8, "high": 1.6})
    planning = dict(plan.planning)  # the winner also runs jobs too large for the status quo: slower on average
    planning["candidates"] = [c | {"core_avg_jct_h": 0.6} if c["candidate"] == "speed floor 0.75" else c
                              for c in planning["candidates"]]
    jct = expected(plan.model_copy(update={"planning": planning}))
    assert (jct.avg_jct_h, jct.low_h, jct.high_h) == pytest.approx((0.6, 0.4, 0.8))


def test_the_prediction_is_read_from_the_planning_record_and_absent_without_one():
    plan = _plan("speed floor 0.75", {"cloud:8xh100": 2}, {"point": 1.25, "low": 0.8, "high": 1.9})
    jct = expected(plan)
    assert (jct.avg_jct_h, jct.low_h, jct.high_h, jct.status_quo_avg_jct_h) == (1.25, 0.8, 1.9, 7.5)
    no_interval = expected(_plan("speed floor 0.75", {"cloud:8xh100": 2}))
    assert (no_interval.avg_jct_h, no_interval.low_h) == (1.2, None)  # the winner's replayed figure, no interval
    steady = _plan("speed floor 0.75", {}).model_copy(update={"planning": None})
    assert expected(steady) is None
    baselines = pd.DataFrame({"name": ["status quo", "hetplan"], "value": [100.0, 130.0],
                              "node_counts": ['{"cloud:8xv100": 3}', "{}"]})
    said = say(steady, CURVES, SHARES, baselines)
    assert said.headline == ("Add no node (0 $/h) and keep your 2 owned nodes: it serves 130.0 reference GPUs of "
                             "your mix per hour, 1.30x the status quo.")
    assert said.status_quo.startswith("The status quo is your owned nodes plus 3 x cloud:8xv100:")


def test_the_node_mix_chart_labels_every_bar_with_its_node_counts():
    from hetplan.report import plot_node_mix

    fig = plot_node_mix(_plan("speed floor 0.75", {"cloud:8xh100": 2}, {"point": 1.2, "low": 0.8, "high": 1.9}))
    texts = [t.get_text().strip() for t in fig.axes[0].texts]
    assert "2 added nodes, 48.00 \\$/h" in texts and "2 owned nodes" in texts
    assert fig.axes[0].get_title().startswith("node mix: 2 nodes (16 GPUs) added for 48.00")
