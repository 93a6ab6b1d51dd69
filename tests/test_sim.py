"""The simulator: truth curves, hand-computed JCTs, invariants under random traces, the four-way evaluation."""

from __future__ import annotations

import json

import zlib

import numpy as np
import pandas as pd
import pytest

from hetplan.allocator import Allocator
from hetplan.allocator.spec import Node, Reason, Rejection
from hetplan.catalog import load_default_catalog
from hetplan.contracts import PROFILES, ContractError
from hetplan.hints import HintSet
from hetplan.hints.index import HintEntry
from hetplan.reference import build_reference
from hetplan.sensitivity.curves import fit_profiles
from hetplan.sim.engine import SimConfig, SimulationError, Simulator, simulate
from hetplan.sim.metrics import summarize, utilisation
from hetplan.sim.setups import knee_hints, nodes_from_counts
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import prepare_workload, with_load

# A tiny literal truth: model "m" on a V100 at 1, 3, 6 cores per GPU (62.5 GiB): 50, 100, 200 samples/s, so
# the reference allocation (3 cores, 62.5 GiB) runs at speed 1 and 6 cores at speed 2. "flat" ignores cores.
TINY = pd.DataFrame({
    "model": ["m"] * 3 + ["flat"] * 3, "gpu_type": "V100", "num_gpus": 1,
    "cpus_per_gpu": [1.0, 3.0, 6.0] * 2, "mem_gb_per_gpu": 62.5,
    "throughput": [50.0, 100.0, 200.0, 10.0, 10.0, 10.0], "source": "published:test",
})


@pytest.fixture(scope="module")
def tiny_truth() -> TruthCurves:
    return TruthCurves.from_profiles(PROFILES.validate(TINY, "<tiny>"))


def trace(*jobs: tuple) -> pd.DataFrame:
    """(job_id, model, num_gpus, arrival_s, duration_s) tuples as a trace frame."""
    return pd.DataFrame(jobs, columns=["job_id", "model", "num_gpus", "arrival_s", "duration_s"])


def run(truth, jobs, nodes, scheduler="fifo", policy="proportional", hints=None, round_s=30.0, migration_s=0.0,
        resize_s=0.0):
    """Simulate with every invariant checked at each event; moves and re-sizes free unless asked (the hand
    computations below charge nothing)."""
    workload = prepare_workload(jobs, truth.models, unknown_model="m" if "m" in truth.models else "mix")
    config = SimConfig(scheduler, round_s, migration_s=migration_s, resize_s=resize_s, check_every=1)
    result = simulate(workload.jobs, nodes, truth, policy, hints, config)
    return result, result.jobs.set_index("job_id")


# ---------------------------------------------------------------------- truth curves

def test_truth_interpolates_between_grid_points_and_clamps_outside(tiny_truth):
    speed = tiny_truth.speed
    assert speed("m", "V100", 1, 3000, 64000) == pytest.approx(1.0)      # the reference allocation
    assert speed("m", "V100", 1, 6000, 64000) == pytest.approx(2.0)      # a grid point
    assert speed("m", "V100", 1, 4500, 64000) == pytest.approx(1.5)      # halfway 3 -> 6 cores
    assert speed("m", "V100", 1, 24000, 500000) == pytest.approx(2.0)    # above the grid: its edge
    assert speed("m", "V100", 1, 500, 64000) == pytest.approx(0.25)      # below: linear towards zero
    assert speed("m", "V100", 2, 12000, 128000) == pytest.approx(2.0)    # per GPU: 6 cores, 62.5 GiB each


def test_truth_fills_unmeasured_cells_from_the_points_they_dominate():
    sparse = pd.DataFrame({"model": "m", "gpu_type": "V100", "num_gpus": 1, "cpus_per_gpu": [3.0, 6.0, 3.0],
                           "mem_gb_per_gpu": [62.5, 20.0, 20.0], "throughput": [100.0, 80.0, 40.0]})
    truth = TruthCurves.from_profiles(PROFILES.validate(sparse, "<sparse>"))
    assert truth.speed("m", "V100", 1, 6000, 64000) == pytest.approx(1.0)  # (6, 62.5) unmeasured: best below


def test_truth_without_a_reference_point_is_refused():
    t4_only = TINY.assign(gpu_type="T4")
    with pytest.raises(ContractError, match="reference allocation"):
        TruthCurves.from_profiles(PROFILES.validate(t4_only, "<t4>"))


def test_truth_prefers_measured_over_derived_points_of_one_cell():
    mixed = TINY.assign(source="derived:guess")
    measured = TINY.iloc[[1]].assign(throughput=300.0, source="measured:host1")  # m at 3 cores, measured
    truth = TruthCurves.from_profiles(PROFILES.validate(pd.concat([mixed, measured]), "<mixed>"))
    assert truth.reference("m") == 300.0
    assert truth.sources() == {"measured:host1+derived": 1, "derived:guess": 1}


def test_a_share_the_truth_has_no_throughput_for_stops_with_a_clear_error():
    gap = pd.DataFrame({"model": "m", "gpu_type": "V100", "num_gpus": 1, "cpus_per_gpu": [3.0, 1.0],
                        "mem_gb_per_gpu": [62.5, 100.0], "throughput": [100.0, 40.0]})
    truth = TruthCurves.from_profiles(PROFILES.validate(gap, "<gap>"))
    assert truth.gaps == ["m on V100 at 1 cores, 62.5 GiB"]  # nothing measured at or below it
    workload = prepare_workload(trace(("a", "m", 1, 0, 10.0)), truth.models)
    with pytest.raises(SimulationError, match="no throughput with 1 cores and 62.5 GiB"):
        simulate(workload.jobs, [Node("n", "V100", 1, 1, 62.5)], truth, "proportional")


def test_round_boundaries_never_fall_behind_the_clock(tiny_truth):
    workload = prepare_workload(trace(("a", "m", 1, 0, 1.0)), tiny_truth.models)
    simulator = Simulator(workload.jobs, Allocator(ONE_V100, "proportional"), tiny_truth, SimConfig("las", 123.456))
    for k in range(1, 2000):
        now = np.nextafter(k * 123.456, np.inf)
        assert simulator.scheduler.next_round(now) >= now


def test_derived_truth_reproduces_the_published_v100_speedups():
    truth = TruthCurves.from_profiles(build_reference().derived)
    assert truth.speed("res18", "V100", 1, 9000, 64000) == pytest.approx(2.4)  # Synergy: res18 2.4x at 9 cores
    assert truth.speed("transformer", "V100", 1, 1000, 64000)  # 62.5 GiB == pytest.approx(1.0)


# ---------------------------------------------------------------------- hand-computed JCTs

ONE_V100 = [Node("n1", "V100", 1, 3, 62.5)]


@pytest.mark.parametrize("scheduler, expected", [
    # two 100 s jobs at t=0 and a 50 s job at t=10 on one GPU, rounds of 30 s
    ("fifo", {"a": (0, 100), "b": (100, 200), "c": (200, 250)}),
    # SRTF: at the 30 s round c (50 s left) outranks a (70 s left): c runs 30-80, a resumes 80-150, b 150-250
    ("srtf", {"a": (0, 150), "b": (150, 250), "c": (30, 80)}),
    # LAS: the least attained service runs each round; ties go to the earlier arrival
    ("las", {"a": (0, 240), "b": (30, 250), "c": (60, 170)}),
])
def test_hand_computed_jcts_on_one_gpu(tiny_truth, scheduler, expected):
    result, jobs = run(tiny_truth, trace(("a", "m", 1, 0, 100.0), ("b", "m", 1, 0, 100.0), ("c", "m", 1, 10, 50.0)),
                       ONE_V100, scheduler)
    for job, (start, finish) in expected.items():
        assert jobs.loc[job, "start_s"] == pytest.approx(start), job
        assert jobs.loc[job, "finish_s"] == pytest.approx(finish), job
    assert jobs["jct_s"].to_dict() == pytest.approx({j: f - a for (j, (_, f)), a in zip(expected.items(),
                                                                                        (0, 0, 10))})
    assert result.counts["completed"] == 3


def test_one_job_runs_at_its_truth_speed(tiny_truth):
    # a 1-GPU node with 6 cores: the proportional share is all 6 cores, speed 2
    _, jobs = run(tiny_truth, trace(("a", "m", 1, 5, 100.0)), [Node("n", "V100", 1, 6, 62.5)])
    assert jobs.loc["a", "jct_s"] == pytest.approx(50.0)
    assert jobs.loc["a", "mean_speed"] == pytest.approx(2.0)


def test_hints_give_a_sensitive_job_more_cores_than_its_proportional_share(tiny_truth):
    node = [Node("n", "V100", 2, 8, 125)]  # proportional: 4 cores per GPU -> speed 4/3
    hints = HintSet("h", {("m", 1): (HintEntry("V100", 1, 6.0, 62.5),)})
    _, proportional = run(tiny_truth, trace(("a", "m", 1, 0, 100.0)), node)
    _, hinted = run(tiny_truth, trace(("a", "m", 1, 0, 100.0)), node, policy="hint", hints=hints)
    assert proportional.loc["a", "jct_s"] == pytest.approx(100.0 / (4 / 3))
    assert hinted.loc["a", "jct_s"] == pytest.approx(50.0)
    assert hinted.loc["a", "share"] == "hinted"


def test_a_preempted_job_keeps_its_progress(tiny_truth):
    # SRTF on one GPU: the long job runs 0-30, waits while the short one runs 30-40, resumes 40-110
    _, jobs = run(tiny_truth, trace(("long", "m", 1, 0, 100.0), ("short", "m", 1, 20, 10.0)), ONE_V100, "srtf")
    assert jobs.loc["short", "finish_s"] == pytest.approx(40.0)
    assert jobs.loc["long", "finish_s"] == pytest.approx(110.0)
    assert jobs.loc["long", "preemptions"] == 1
    assert jobs.loc["long", "run_s"] == pytest.approx(100.0)
    assert jobs.loc["long", "queue_s"] == 0 and jobs.loc["long", "wait_s"] == pytest.approx(10.0)


def test_a_multi_gpu_job_waits_for_a_whole_node(tiny_truth):
    nodes = [Node("n1", "V100", 2, 6, 125)]
    _, jobs = run(tiny_truth, trace(("one", "m", 1, 0, 30.0), ("two", "m", 2, 1, 60.0)), nodes)
    assert jobs.loc["two", "start_s"] == pytest.approx(30.0)  # needs both GPUs: waits for "one" to finish
    assert jobs.loc["two", "finish_s"] == pytest.approx(90.0)


# ---------------------------------------------------------------------- bad input and accounting

def test_jobs_larger_than_any_node_are_rejected_and_counted(tiny_truth):
    result, jobs = run(tiny_truth, trace(("ok", "m", 1, 0, 10.0), ("huge", "m", 16, 0, 10.0)), ONE_V100)
    assert jobs.loc["huge", "status"] == "rejected_too_big"
    assert result.counts["rejected_too_big"] == 1 and result.counts["completed"] == 1
    assert summarize(result, 1.0)["rejected_too_big"] == 1


def test_unknown_models_are_mapped_and_counted(tiny_truth):
    jobs = trace(("a", "M", 1, 0, 1.0), ("b", "bert", 1, 0, 1.0), ("c", "gpt", 1, 0, 1.0))
    fixed = prepare_workload(jobs, tiny_truth.models, unknown_model="flat")
    assert fixed.jobs["sim_model"].tolist() == ["m", "flat", "flat"]  # names match case-insensitively
    assert fixed.report["mapped_unknown_model"] == 2 and "bert, gpt" in fixed.warnings[0]
    drawn = prepare_workload(jobs, tiny_truth.models, unknown_model="mix", seed=3)
    assert set(drawn.jobs["sim_model"]) <= {"m", "flat"}
    assert drawn.jobs["sim_model"].tolist() == prepare_workload(jobs, tiny_truth.models, "mix", 3).jobs[
        "sim_model"].tolist()
    with pytest.raises(ContractError, match="not a truth model"):
        prepare_workload(jobs, tiny_truth.models, unknown_model="bert")


@pytest.mark.parametrize("bad", [
    {"duration_s": 0.0},    # zero duration
    {"arrival_s": -5.0},    # negative time
    {"num_gpus": 0},        # no GPU
])
def test_bad_trace_rows_are_refused_with_the_row(tiny_truth, bad):
    jobs = trace(("a", "m", 1, 0, 10.0), ("b", "m", 1, 0, 10.0))
    for column, value in bad.items():
        jobs.loc[1, column] = value
    with pytest.raises(ContractError, match=f"<trace>:2:{next(iter(bad))}: must be"):  # the second job
        prepare_workload(jobs, tiny_truth.models)


def test_load_redraws_poisson_arrivals_in_trace_order():
    jobs = trace(*[(str(i), "m", 1, float(i), 1.0) for i in range(4000)])
    loaded = with_load(jobs, 120.0, seed=1)
    assert loaded["job_id"].tolist() == jobs["job_id"].tolist()
    gaps = np.diff(loaded["arrival_s"])
    assert (gaps >= 0).all() and loaded["arrival_s"].iloc[0] == 0
    assert gaps.mean() == pytest.approx(30.0, rel=0.05)  # 120 jobs/h
    with pytest.raises(ContractError, match="positive"):
        with_load(jobs, 0.0)


def test_utilisation_is_time_weighted():
    timeline = pd.DataFrame({"time_s": [0.0, 10.0, 30.0], "gpus": [2.0, 4.0, 0.0]})
    # 2 GPUs for 10 s, 4 for 20 s, 0 for 10 s, of 4 GPUs over 40 s
    assert utilisation(timeline, 4.0, "gpus", 0.0, 40.0) == pytest.approx((20 + 80) / 160)


# ---------------------------------------------------------------------- invariants under random traces

HETERO = [Node("v-0", "V100", 4, 12, 250), Node("v-1", "V100", 8, 24, 500), Node("t-0", "T4", 4, 48, 192),
          Node("a-0", "A100", 2, 32, 250)]


@pytest.mark.parametrize("scheduler", ["fifo", "srtf", "las"])
@pytest.mark.parametrize("policy", ["proportional", "hint", "first-fit"])
def test_random_traces_keep_every_invariant(scheduler, policy):
    truth = TruthCurves.from_profiles(build_reference().derived)
    rng = np.random.default_rng(zlib.crc32(f"{scheduler}/{policy}".encode()))
    n = 150
    jobs = pd.DataFrame({"job_id": [f"j{i}" for i in range(n)],
                         "model": rng.choice(sorted(truth.models), n), "num_gpus": rng.choice([1, 2, 4, 8, 16], n),
                         "arrival_s": np.sort(rng.uniform(0, 4 * 3600, n)), "duration_s": rng.exponential(3600, n)})
    hints = HintSet("h", {(m, g): (HintEntry("V100", 1, 9.0, 62.5), HintEntry("T4", 2, 6.0, 40.0))
                          for m in truth.models for g in (1, 2, 4, 8)})
    workload = prepare_workload(jobs, truth.models)
    result = simulate(workload.jobs, HETERO, truth, policy, hints, SimConfig(scheduler, 300.0, check_every=1))
    out = result.jobs
    too_big = out["num_gpus"] > 8
    assert (out.loc[too_big, "status"] == "rejected_too_big").all()
    assert (out.loc[~too_big, "status"] == "completed").all()  # every job finishes, once (checked as it runs)
    done = out[~too_big]
    assert (done["finish_s"] >= done["start_s"]).all() and (done["start_s"] >= done["arrival_s"] - 1e-9).all()
    # no job ran faster than its model's best speed on this cluster (a whole node's cores and RAM per GPU)
    best = {m: max(truth.speed(m, n.gpu_type, 1, round(n.cpus * 1000 / n.gpus), round(n.mem_gb * 1024 / n.gpus))
                   for n in HETERO) for m in truth.models}
    assert (done["mean_speed"] <= done["sim_model"].map(best) * (1 + 1e-9)).all()
    assert (done["wait_s"] >= done["queue_s"] - 1e-6).all()
    # GPU-seconds in the timeline equal the GPU-seconds jobs ran
    t = result.timeline
    held = np.diff(np.append(t["time_s"].to_numpy(), t["time_s"].iloc[-1]))
    assert (t["gpus"] * held).sum() == pytest.approx((done["run_s"] * done["num_gpus"]).sum(), rel=1e-9)
    assert (t["gpus"] <= result.capacity["gpus"]).all() and (t["cpus"] <= result.capacity["cpus"] + 1e-9).all()


def test_an_overcommitted_cluster_is_caught(tiny_truth):
    workload = prepare_workload(trace(("a", "m", 1, 0, 100.0)), tiny_truth.models)
    allocator = Allocator(ONE_V100, "proportional")
    simulator = Simulator(workload.jobs, allocator, tiny_truth, SimConfig("fifo", check_every=1))
    simulator.used[0] += 1  # the simulator's books disagree with the cluster's
    with pytest.raises(SimulationError, match="in use"):
        simulator.run()


class NeverPolicy:
    """A policy that places nothing: the simulator must stop with an error, not spin over empty rounds."""

    name = "never"
    strict = False
    rounds = None

    def place(self, job, state, hints):
        return Rejection(job.job_id, Reason.NO_CAPACITY, "never", hints.version, self.name)


def test_a_job_no_policy_will_place_stops_the_simulation(tiny_truth):
    workload = prepare_workload(trace(("a", "m", 1, 0, 100.0)), tiny_truth.models)
    simulator = Simulator(workload.jobs, Allocator(ONE_V100, NeverPolicy()), tiny_truth, SimConfig("las"))
    with pytest.raises(SimulationError, match="1 jobs wait on an idle cluster"):
        simulator.run()


# ---------------------------------------------------------------------- setups

@pytest.fixture(scope="module")
def planning_inputs():
    derived = build_reference().derived
    profiles = derived[derived["model"].isin(["res18", "transformer", "alexnet"])
                       & derived["gpu_type"].isin(["V100", "T4", "A100"])]
    return profiles, fit_profiles(profiles).curves


def test_knee_hints_ask_for_each_class_knee(planning_inputs):
    _, curves = planning_inputs
    classes = pd.DataFrame({"model": ["res18", "transformer"], "num_gpus": [1, 4]})
    hints = knee_hints(curves, classes, ["V100", "T4"])
    res18 = hints.lookup("res18", 1)
    knee = curves[(curves["model"] == "res18") & (curves["gpu_type"] == res18[0].gpu_type)].iloc[0]
    assert res18[0].cpus_per_gpu == knee["knee_cpus"] and res18[0].mem_gb_per_gpu == knee["knee_mem_gb"]
    assert [e.rank for e in res18] == [1, 2] and len(hints.lookup("transformer", 4)) == 2


def test_nodes_from_counts_builds_named_nodes():
    catalog = load_default_catalog()
    name = catalog["name"].iloc[0]
    nodes = nodes_from_counts(catalog, {name: 3})
    assert [n.name for n in nodes] == [f"{name}-{i}" for i in range(3)]
    assert {n.labels["hetplan/shape"] for n in nodes} == {name}


# ---------------------------------------------------------------------- co-adaptive rounds: costs, moves, gangs

def _grid_truth(speeds: dict[tuple[str, str], float]) -> TruthCurves:
    """A truth with one grid point per (model, GPU type): the speed relative to the model's V100 speed."""
    from hetplan.sim.truth import TruthGrid

    return TruthCurves({key: TruthGrid((1.0,), (1.0,), np.array([[value]]), "published:test")
                        for key, value in speeds.items()})


TWO_TYPES = _grid_truth({("flat", "V100"): 1.0, ("flat", "K80"): 0.8, ("picky", "V100"): 1.0, ("picky", "K80"): 0.2})
TWO_TYPE_HINTS = HintSet("h", {(m, 1): (HintEntry("V100", 1, 1.0, 1.0, 1.0), HintEntry("K80", 2, 1.0, 1.0, k80))
                               for m, k80 in (("flat", 0.8), ("picky", 0.2))})
ONE_EACH = [Node("v", "V100", 1, 4, 16), Node("k", "K80", 1, 4, 16)]


@pytest.mark.parametrize("policy, migration_s, expected", [
    # both arrive at 0, 100 reference-seconds each; the first round (t=0) gives the V100 to picky (5x faster
    # there), flat takes the K80 at 0.8
    # ... with moves free, flat moves up at the round after picky ends (t=120): 96 done, 4 left -> 124
    ("hint", 0.0, {"picky": 100.0, "flat": 124.0}),
    # ... a move pays when the speed gained over flat's expected remaining time (its age, 120 s) is at least
    # three times the move's cost at its new speed (`Stability.margin` 3): 0.2 x 120 = 24 >= 3 x 5 x 1.0: it
    # restarts for 5 s -> 129
    ("hint", 5.0, {"picky": 100.0, "flat": 129.0}),
    # ... 24 >= 3 x 7: it still moves (the age overestimates the 4 s it has left) -> 131
    ("hint", 7.0, {"picky": 100.0, "flat": 131.0}),
    # ... 24 < 3 x 10: flat stays on the K80 -> 125
    ("hint", 10.0, {"picky": 100.0, "flat": 125.0}),
    # placement only: flat (first in line) takes the V100, picky the K80 for life: 100 / 0.2 = 500
    ("hint-static", 5.0, {"flat": 100.0, "picky": 500.0}),
])
def test_hand_computed_co_adaptive_rounds_charge_moves(policy, migration_s, expected):
    jobs = trace(("flat", "flat", 1, 0, 100.0), ("picky", "picky", 1, 0, 100.0))
    result, out = run(TWO_TYPES, jobs, ONE_EACH, "fifo", policy, TWO_TYPE_HINTS, round_s=30.0,
                      migration_s=migration_s)
    for job, finish in expected.items():
        assert out.loc[job, "finish_s"] == pytest.approx(finish), job
    moved = expected["flat"] in (124.0, 129.0, 131.0)
    assert out.loc["flat", "migrations"] == int(moved) and result.counts["migrations"] == int(moved)
    assert out.loc["flat", "gpu_types"] == ("K80+V100" if moved else out.loc["flat", "gpu_type"])


def test_a_job_larger_than_any_node_runs_as_a_gang_at_the_stated_scaling():
    truth = _grid_truth({("m", "V100"): 1.0})
    nodes = [Node(f"v{i}", "V100", 4, 16, 64) for i in range(3)]
    jobs = trace(("big", "m", 8, 0, 90.0), ("small", "m", 4, 0, 50.0), ("huge", "m", 16, 0, 10.0))
    for policy in ("hint", "hint-static", "proportional", "first-fit"):  # every policy runs gangs
        result, out = run(truth, jobs, nodes, "fifo", policy, HintSet.empty(), round_s=30.0)
        assert out.loc["huge", "status"] == "rejected_too_big", policy  # more GPUs than the cluster has
        assert out.loc["big", "finish_s"] == pytest.approx(100.0), policy  # 90 / 0.9 (two nodes: GANG_SCALING)
        assert result.counts["gangs"] == 1 and out.loc["small", "finish_s"] == pytest.approx(50.0), policy


def test_co_adaptive_random_traces_keep_every_invariant_with_costs():
    """Random jobs, gangs included, moved and re-sized with costs: nothing overcommitted at any event, every job
    finishes once, GPU-seconds held equal GPU-seconds lent (all checked inside the simulator at every event)."""
    truth = TruthCurves.from_profiles(build_reference().derived)
    nodes = HETERO + [Node("v-2", "V100", 8, 24, 500)]
    rng = np.random.default_rng(7)
    n = 150
    jobs = pd.DataFrame({"job_id": [f"j{i}" for i in range(n)], "model": rng.choice(sorted(truth.models), n),
                         "num_gpus": rng.choice([1, 2, 4, 8, 16], n), "arrival_s": np.sort(rng.uniform(0, 4 * 3600, n)),
                         "duration_s": rng.exponential(3600, n)})
    hints = HintSet("h", {(m, g): (HintEntry("V100", 1, 9.0, 62.5, 2.0), HintEntry("T4", 2, 6.0, 40.0, 1.0))
                          for m in truth.models for g in (1, 2, 4, 8)})
    workload = prepare_workload(jobs, truth.models)
    result = simulate(workload.jobs, nodes, truth, "hint", hints,
                      SimConfig("las", 300.0, migration_s=30.0, resize_s=5.0, check_every=1))
    out = result.jobs
    assert (out["status"] == "completed").all()  # 16-GPU jobs run as V100 gangs (20 V100s)
    assert result.counts["gangs"] > 0 and result.counts["resizes"] + result.counts["migrations"] > 0
    assert (out["finish_s"] >= out["start_s"]).all() and (out["start_s"] >= out["arrival_s"] - 1e-9).all()


def test_cli_simulate_writes_tables_and_plots_and_refuses_bad_nodes(tmp_path):
    from typer.testing import CliRunner

    from hetplan.cli import app

    profiles = build_reference().derived
    profiles = profiles[profiles["gpu_type"].isin(["V100", "T4"]) & profiles["model"].isin(["res18", "transformer"])]
    profiles.to_csv(tmp_path / "profiles.csv", index=False)
    rng = np.random.default_rng(1)
    trace(*[(f"j{i}", str(rng.choice(["res18", "transformer"])), int(rng.choice([1, 2])), float(i * 600), 3600.0)
            for i in range(30)]).to_csv(tmp_path / "trace.csv", index=False)
    (tmp_path / "nodes.csv").write_text("name,gpu_type,gpus,vcpus,mem_gb\nv0,V100,4,24,240\nt0,T4,4,48,192\n")
    args = ["simulate", "--trace", str(tmp_path / "trace.csv"), "--nodes", str(tmp_path / "nodes.csv"),
            "--truth", str(tmp_path / "profiles.csv"), "--out-dir", str(tmp_path / "out"), "--no-mlflow"]
    result = CliRunner().invoke(app, [*args, "--move-budget", "2", "--return-window-h", "1", "--no-spread-moves"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["stability"] == {"margin": 3.0, "return_window_s": 3600.0, "return_margin": 8.0, "budget": 2,
                                   "spread": False}
    summary = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert summary.loc[0, "hints"] == "ORACLE: read off the truth" and summary.loc[0, "completed"] == 30
    jobs = pd.read_csv(tmp_path / "out" / "jobs.csv")
    assert {"job_id", "jct_s", "queue_s", "gpu_types", "migrations", "resizes"} <= set(jobs.columns)
    assert len(jobs) == 30 and (jobs["jct_s"] >= 3600 * 0.3).all()
    assert (tmp_path / "out" / "jct_cdf.png").stat().st_size > 0
    (tmp_path / "bad.csv").write_text("name,gpu_type,gpus,vcpus,mem_gb\nv0,V100,two,24,240\n")
    bad = CliRunner().invoke(app, [*args[:3], "--nodes", str(tmp_path / "bad.csv"), *args[5:7], "--out-dir",
                                   str(tmp_path / "out2"), "--no-mlflow"])
    assert bad.exit_code == 1 and "bad.csv" in bad.output and "gpus" in bad.output
    assert not (tmp_path / "out2").exists()


def test_scheduling_orders_are_registered_like_policies(tiny_truth):
    from hetplan.sim.engine import SCHEDULERS, register_scheduler

    assert list(SCHEDULERS)[:3] == ["fifo", "srtf", "las"]
    register_scheduler("lifo-test", lambda j, dt: (-j.arrival, j.idx))
    try:
        _, out = run(tiny_truth, trace(("a", "m", 1, 0, 100.0), ("b", "m", 1, 0, 100.0), ("c", "m", 1, 10, 50.0)),
                     ONE_V100, "lifo-test")
        # newest first: c (t=10) preempts a at the 30 s round and runs 30-80; a resumes 80-150; b 150-250
        assert [out.loc[j, "finish_s"] for j in "cab"] == pytest.approx([80.0, 150.0, 250.0])
        with pytest.raises(ValueError, match="already registered"):
            register_scheduler("las", lambda j, dt: ())
    finally:
        del SCHEDULERS["lifo-test"]
    with pytest.raises(ValueError, match="unknown scheduler"):
        SimConfig("lifo-test")


def test_an_invariant_failure_names_the_node_its_jobs_and_the_last_action_never_an_input(monkeypatch):
    from hetplan.allocator.cluster import Cluster
    from hetplan.sim.engine import InvariantError

    jobs = trace(("flat", "flat", 1, 0, 100.0), ("picky", "picky", 1, 0, 100.0))
    real = Cluster.check
    monkeypatch.setattr(Cluster, "check", lambda self: real(self) + ["v free capacity out of step with its "
                                                                     "allocations"])  # an injected bug
    with pytest.raises(InvariantError) as caught:
        run(TWO_TYPES, jobs, ONE_EACH, "fifo", "hint", TWO_TYPE_HINTS, round_s=30.0)
    message = str(caught.value)
    assert "node v: jobs" in message and "last action: t=0 s" in message and "picky@v" in message
    assert "profiles" not in message and "not in the inputs" in message
