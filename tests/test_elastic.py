"""Elastic GPU counts (issue 31): the round's policy (`scheduler.elastic`), its mechanism (`Allocator.reconfigure`),
the multi-GPU truth (`sim.scaling_truth`) and the simulator and CLI running them."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pandas as pd
import pytest
from typer.testing import CliRunner

from hetplan.allocator import Allocator
from hetplan.allocator.core import part_number
from hetplan.allocator.spec import Allocation, Job, Node
from hetplan.cli import app
from hetplan.scaling.data import load_profile
from hetplan.scheduler.elastic import (
    Config, ElasticJob, ElasticRule, RoundStats, TypeShape, allowed, choose, configs, counts, value,
)
from hetplan.sim.engine import SimConfig, SimulationError, host_shares, simulate
from hetplan.sim.scaling_truth import RATIO, ScalingTruth, placement_types
from hetplan.sim.truth import TruthCurves
from hetplan.sim.workload import prepare_workload
from hetplan.traces.sia import import_sia

SIA_WORKLOAD = "hetplan/data/upstream/traces/sia_philly_workload-2.csv"


@pytest.mark.parametrize("shape, low, high, expected", [
    (TypeShape(24, 4), 1, 24, [(1, 1), (2, 1), (4, 1), (8, 2), (12, 3), (16, 4), (20, 5), (24, 6)]),
    (TypeShape(16, 8), 1, 4, [(1, 1), (2, 1), (4, 1)]),
    (TypeShape(16, 8), 3, 3, [(3, 1)]),  # a rigid job's count, though not a power of two
    (TypeShape(24, 4), 6, 6, [(6, 2)]),
    (TypeShape(16, 8), 2, 16, [(2, 1), (4, 1), (8, 1), (16, 2)]),
    (TypeShape(8, 8), 12, 24, []),  # more than the type has
])
def test_counts_are_powers_of_two_then_whole_nodes(shape, low, high, expected):
    assert [(c.gpus, c.nodes) for c in counts(shape, low, high)] == expected


def _job(job_id="j", current=None, changes=0, age_s=0.0, since_s=0.0, restart_s=30.0, attained=0.0, scale=None,
         types=None, low=1, high=16, power=1.0) -> ElasticJob:
    types = types or {"T4": TypeShape(8, 4), "A100": TypeShape(8, 8)}
    scale = scale or {"T4": 1.0, "A100": 3.0}
    rates = {c: scale[c.gpu_type] * c.gpus ** power for c in configs(types, low, high)}
    return ElasticJob(job_id, rates, current, restart_s, age_s, attained, changes, since_s)


@pytest.mark.parametrize("job, expected_max, only_current", [
    (_job(), 8, False),  # not running: anything
    (_job(current=Config("T4", 2, 1), changes=1, age_s=600, since_s=600), 4, False),  # at most 2x a round
    (_job(current=Config("T4", 2, 1), changes=4, age_s=600, since_s=600), 2, True),  # budget spent
    (_job(current=Config("T4", 2, 1), changes=4, age_s=3 * 3600, since_s=600), 4, False),  # one more an hour
])
def test_allowed_bounds_growth_and_changes(job, expected_max, only_current):
    options = allowed(job, ElasticRule())
    assert max(c.gpus for c in options) == expected_max
    assert (options == [job.current]) is only_current


@pytest.mark.parametrize("job, config, expected", [
    (_job(), Config("A100", 1, 1), 1.0),  # its best single GPU, never ran, no service yet
    (_job(), Config("T4", 4, 1), (4 / 3) ** 0.5),
    (_job(attained=3 * 3600.0), Config("A100", 1, 1), 0.5),  # 3 GPU-hours attained: weight 1/2
    (_job(current=Config("T4", 1, 1), since_s=60.0, restart_s=60.0), Config("A100", 1, 1), 0.0),  # can't pay yet
    (_job(current=Config("T4", 1, 1), since_s=240.0, restart_s=60.0), Config("A100", 1, 1), 0.75 ** 0.5),
    (_job(current=Config("T4", 1, 1), since_s=60.0, restart_s=60.0), Config("T4", 1, 1), (1 / 3) ** 0.5),
])
def test_value_prices_speed_up_service_and_restart(job, config, expected):
    assert value(job, config, ElasticRule()) == pytest.approx(expected)


def test_choose_spreads_before_it_grows():
    """Concave utility: two perfectly scaling jobs on 4 GPUs get 2 each, not 4 and 0."""
    types = {"T4": TypeShape(4, 4)}
    jobs = [_job(f"j{i}", types=types, scale={"T4": 1.0}) for i in range(2)]
    assert {c.gpus for c in choose(jobs, types).values()} == {2}


def test_choose_uses_idle_gpus_and_comparative_advantage():
    types = {"T4": TypeShape(4, 4), "A100": TypeShape(4, 4)}
    alone = choose([_job(types=types, scale={"T4": 1.0, "A100": 2.0})], types)
    assert alone["j"] == Config("A100", 4, 1)  # every useful GPU, on its faster type
    pair = choose([_job("fan", types=types, scale={"T4": 1.0, "A100": 5.0}),
                   _job("flat", types=types, scale={"T4": 1.0, "A100": 1.1})], types)
    assert pair["fan"].gpu_type == "A100" and pair["flat"].gpu_type == "T4"


def test_choose_keeps_a_job_that_just_restarted():
    types = {"T4": TypeShape(8, 4), "A100": TypeShape(8, 8)}
    job = _job(current=Config("T4", 2, 1), since_s=60.0, restart_s=250.0, age_s=4000.0, changes=1, types=types)
    paying = ElasticRule(hold_restarts=0)  # the pay rule alone
    assert choose([job], types, paying)["j"] == Config("T4", 2, 1)  # A100 is 3x faster but cannot pay 250 s yet
    job.since_s = 4000.0
    assert choose([job], types, paying)["j"].gpu_type == "A100"
    assert choose([job], types)["j"] == Config("T4", 2, 1)  # held: 4,000 s < 20 x 250 s
    job.since_s = 5000.0
    assert choose([job], types)["j"].gpu_type == "A100"


def test_a_held_job_is_neither_changed_nor_stopped():
    types = {"T4": TypeShape(4, 4)}
    old = _job("old", current=Config("T4", 4, 1), since_s=100.0, restart_s=50.0, age_s=1e5, attained=1e6,
               types=types, scale={"T4": 1.0})
    new = _job("new", types=types, scale={"T4": 1.0})
    assert choose([old, new], types, ElasticRule(hold_restarts=20))["old"] == Config("T4", 4, 1)  # 100 s < 1,000 s
    freed = choose([old, new], types, ElasticRule(hold_restarts=1))
    assert freed["new"] is not None  # once free to go, least attained service makes room for the newcomer


def test_choose_invariants_on_random_rounds():
    rng = random.Random(7)
    for _ in range(30):
        types = {"T4": TypeShape(rng.choice([4, 8, 24]), 4), "A100": TypeShape(rng.choice([8, 16]), 8)}
        jobs = []
        for i in range(rng.randint(1, 25)):
            low = rng.choice([1, 1, 2, 4])
            job = _job(f"j{i}", types=types, low=low, high=rng.choice([low, 8, 16, 24]), power=rng.uniform(0.3, 1),
                       scale={"T4": rng.uniform(0.5, 1), "A100": rng.uniform(1, 4)}, attained=rng.uniform(0, 1e4))
            if rng.random() < 0.5 and job.rates:
                job.current, job.since_s, job.age_s = rng.choice(sorted(job.rates)), rng.uniform(0, 1e4), 1e4
            jobs.append(job)
        stats = RoundStats()
        chosen = choose(jobs, types, stats=stats)
        assert stats.fallbacks == 0 and set(chosen) == {j.job_id for j in jobs}
        for t, shape in types.items():
            assert sum(c.gpus for c in chosen.values() if c is not None and c.gpu_type == t) <= shape.gpus
        for job in jobs:
            c = chosen[job.job_id]
            assert c is None or c in allowed(job, ElasticRule())


def _allocator() -> Allocator:
    return Allocator([Node(f"n{i}", "T4", 4, 32, 128) for i in range(3)], "first-fit")


def test_reconfigure_grows_gangs_stops_and_keeps_the_books():
    allocator = _allocator()
    actions, short = allocator.reconfigure([(Job("a", "m", 2), "T4"), (Job("b", "m", 1), "T4")])
    assert short == [] and {a.kind for a in actions} == {"start"}
    actions, short = allocator.reconfigure([(Job("a", "m", 8), "T4"), (Job("b", "m", 1), "T4")])
    running = allocator.running()
    assert short == [] and sum(p.gpus for p in running["a"]) == 8 and len(running["a"]) == 2  # a gang now
    assert [a.kind for a in actions] == ["migrate"]  # b kept its place: no action
    actions, _ = allocator.reconfigure([(Job("a", "m", 8), "T4"), (Job("b", "m", 1), None)])
    assert [(a.kind, a.job_id) for a in actions] == [("stop", "b")]
    assert not allocator.cluster.check() and allocator.cluster.free_gpus_total() == 4


def test_reconfigure_that_finds_no_room_keeps_the_old_place():
    allocator = _allocator()
    allocator.reconfigure([(Job(f"s{i}", "m", 1), "T4") for i in range(3)] + [(Job("a", "m", 2), "T4")])
    # 3 singles and a pair on 12 GPUs: a's growth to 8 needs two whole nodes, which the singles may hold
    before = allocator.running()["a"]
    _, short = allocator.reconfigure([(Job(f"s{i}", "m", 1), "T4") for i in range(3)] + [(Job("a", "m", 12), "T4")])
    assert short == ["a"] and allocator.running()["a"] == before
    assert not allocator.cluster.check()


@pytest.fixture(scope="module")
def truth() -> ScalingTruth:
    return ScalingTruth.from_placements()


def test_truth_reads_measured_steps_and_labels_what_it_derives(truth):
    table = load_profile()
    row = table[(table.model == "cifar10") & (table.gpu_type == "T4") & (table.placement == "22")].iloc[0]
    same = table[(table.model == "cifar10") & (table.gpu_type == "T4") & (table.placement == "22")
                 & (table.local_bsz == row.local_bsz)]
    assert truth.step_time("cifar10", "T4", 4, 2, float(row.local_bsz)) == pytest.approx(same.step_time_s.mean())
    assert truth.models[("ncf", "RTX2080Ti")].source == RATIO  # no 1-GPU step of ncf on an RTX 2080 Ti
    assert truth.sources()[RATIO] >= 1 and truth.sources()["measured"] == 18


@pytest.mark.parametrize("text, expected", [
    ("aws=T4,dgx-ext=A100", {"aws": ("T4", 4), "dgx-ext": ("A100", 8)}),
    ("mine=L4:2", {"mine": ("L4", 2)}),
    ("", {}),
])
def test_placement_types(text, expected):
    assert placement_types(text) == expected


@pytest.mark.parametrize("text", ["aws", "mine=L4", "aws=T4:0", "=T4"])
def test_placement_types_refuse_with_the_item(text):
    with pytest.raises(ValueError, match="--placement-types"):
        placement_types(text)


def _sia_nodes() -> list[Node]:
    return ([Node(f"t4-{i}", "T4", 4, 48, 192) for i in range(6)] + [Node(f"rtx-{i}", "RTX2080Ti", 8, 64, 256)
            for i in range(3)] + [Node(f"a100-{i}", "A100", 8, 128, 1024) for i in range(2)])


@pytest.fixture(scope="module")
def sia_jobs(truth) -> pd.DataFrame:
    trace = import_sia(SIA_WORKLOAD).trace
    jobs = prepare_workload(trace, truth.model_names()).jobs
    return jobs[jobs["application"] != "imagenet"].head(40).reset_index(drop=True)  # a short slice


def test_elastic_simulation_keeps_every_invariant(truth, sia_jobs):
    config = SimConfig(round_s=60, elastic=ElasticRule(hold_restarts=0), trace_restarts=True, check_every=1)
    result = simulate(sia_jobs, _sia_nodes(), truth, "first-fit", config=config)
    jobs = result.jobs
    assert (jobs["status"] == "completed").all()
    used = [[int(g) for g in s.split(">")] for s in jobs["gpu_counts"]]
    assert all(1 <= g <= m for counts_, m in zip(used, sia_jobs["max_gpus"]) for g in counts_)
    assert result.counts["rescales"] == int(jobs["rescales"].sum()) > 0
    assert (jobs["restart_waste_gpu_s"] >= 0).all()
    assert ((jobs["start_s"] - jobs["arrival_s"]) <= 60 + 1e-6).all()  # light load: each starts at the next round


def test_rigid_jobs_keep_their_count_under_the_elastic_scheduler(truth, sia_jobs):
    rigid = sia_jobs.assign(min_gpus=sia_jobs["num_gpus"], max_gpus=sia_jobs["num_gpus"])
    result = simulate(rigid, _sia_nodes(), truth, "first-fit",
                      config=SimConfig(round_s=60, elastic=ElasticRule(), check_every=5))
    assert (result.jobs["gpu_counts"] == rigid["num_gpus"].astype(str)).all()
    assert result.counts["rescales"] == 0


def test_an_elastic_job_too_big_for_every_type_is_rejected_by_its_least_count(truth, sia_jobs):
    jobs = sia_jobs.head(6).assign(min_gpus=[1, 1, 1, 1, 1, 32], max_gpus=32, num_gpus=[8, 8, 8, 8, 8, 32])
    result = simulate(jobs, _sia_nodes(), truth, "first-fit", config=SimConfig(round_s=60, elastic=ElasticRule()))
    assert list(result.jobs["status"]) == ["completed"] * 5 + ["rejected_too_big"]  # 32 > 24, the largest type


def test_elastic_needs_a_multi_gpu_truth(sia_jobs):
    truth = TruthCurves({}, {})
    with pytest.raises(SimulationError, match="multi-GPU truth"):
        simulate(sia_jobs, _sia_nodes(), truth, "first-fit", config=SimConfig(elastic=ElasticRule()))


def _placements_dir(tmp_path):
    """Sia's placements format, written back from the shipped table (T4 and A100 only)."""
    table = load_profile()
    for (model, gpu), rows in table[table.gpu_type.isin(["T4", "A100"])].groupby(["model", "gpu_type"]):
        cluster = {"T4": "aws", "A100": "dgx-ext"}[gpu]
        rows.rename(columns={"step_time_s": "step_time", "sync_time_s": "sync_time"})[
            ["placement", "local_bsz", "step_time", "sync_time"]].to_csv(
            tmp_path / f"{model}_placements-{cluster}.csv", index=False)
    return tmp_path


def test_cli_simulate_elastic_on_sia_placements(tmp_path):
    (tmp_path / "placements").mkdir()
    placements = _placements_dir(tmp_path / "placements")
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("name,gpu_type,gpus,vcpus,mem_gb,count\nt4,T4,4,48,192,4\na100,A100,8,128,1024,1\n")
    trace = tmp_path / "w.csv"
    pd.read_csv(SIA_WORKLOAD).query("application != 'imagenet'").head(25).to_csv(trace, index=False)
    out = tmp_path / "out"
    base = ["simulate", "--trace", str(trace), "--format", "sia", "--nodes", str(nodes), "--truth-placements",
            str(placements), "--round-s", "60", "--no-mlflow", "--out-dir"]
    run = CliRunner().invoke(app, base + [str(out), "--elastic", "--trace-restarts"])
    assert run.exit_code == 0, run.output
    jobs = pd.read_csv(out / "jobs.csv")
    assert {"gpu_counts", "rescales", "restart_waste_gpu_s"} <= set(jobs.columns) and len(jobs) == 25
    assert (jobs["status"] == "completed").all()
    assert pd.read_csv(out / "summary.csv")["scheduler"].iloc[0] == "elastic"
    bad = CliRunner().invoke(app, base + [str(tmp_path / "bad"), "--elastic", "--placement-types", "aws=T4:0"])
    assert bad.exit_code != 0 and not (tmp_path / "bad").exists()
    assert [line for line in bad.output.splitlines() if "error" in line] == [
        "error: --placement-types: 'aws=T4:0': GPUs per node must be a whole number >= 1"]


def test_cli_elastic_without_placements_is_refused(tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("name,gpu_type,gpus,vcpus,mem_gb,count\nt4,T4,4,48,192,1\n")
    result = CliRunner().invoke(app, ["simulate", "--trace", SIA_WORKLOAD, "--format", "sia", "--nodes", str(nodes),
                                      "--truth", str(nodes), "--elastic", "--no-mlflow", "--out-dir",
                                      str(tmp_path / "out")])
    assert result.exit_code != 0 and "--elastic" in result.output and not (tmp_path / "out").exists()


def test_a_starving_host_slows_compute_in_truth_and_in_the_priced_belief(truth):
    starve = {("cifar10", "T4"): lambda cores, mem: min(1.0, cores / 8)}  # a synthetic curve: 8 cores feed a GPU
    fed = truth.with_hosts(starve)
    parts = lambda cores: (Allocation("j", "cifar10", "n", "T4", 1, cores * 1000, 16 * 1024, None,  # noqa: E731
                                      "first-fit", "proportional"),)
    speeds = [fed.job_speed("cifar10", parts(c), 512, 1000.0) for c in (2, 4, 8, 16)]
    assert speeds[0] < speeds[1] < speeds[2] == speeds[3]  # slower while starved; all-reduce unchanged
    assert truth.job_speed("cifar10", parts(2), 512, 1000.0) == speeds[3]  # no host factors: every host feeds
    job = SimpleNamespace(truth_model="cifar10", batch=512.0, reference_rate=1000.0)
    option = [Config("T4", 1, 1)]
    blind, priced = fed.rates()(job, option), fed.rates({"T4": (2.0, 16.0)})(job, option)
    assert priced[option[0]] < blind[option[0]]


def test_host_shares_are_each_types_least_node_share():
    cluster = Allocator([Node("a", "T4", 4, 48, 192), Node("b", "T4", 4, 16, 256), Node("c", "A100", 8, 128, 1024)],
                        "first-fit").cluster
    assert host_shares(cluster) == {"T4": (4.0, 48.0), "A100": (16.0, 128.0)}


def test_a_priced_elastic_simulation_runs_on_a_truth_with_hosts(truth, sia_jobs):
    fed = truth.with_hosts({("cifar10", "T4"): lambda cores, mem: min(1.0, cores / 16)})
    result = simulate(sia_jobs.head(20), _sia_nodes(), fed, "first-fit",
                      config=SimConfig(round_s=60, elastic=ElasticRule(price_host=True), check_every=5))
    assert (result.jobs["status"] == "completed").all()


def test_a_running_gang_of_fixed_parts_changes_its_count_where_it_runs_never_its_type():
    """A gang of fixed parts is a pod per part: the controller re-counts its Job, it cannot move its pods. A choice
    of another type keeps it in place (short); a count on its own type keeps parts 0..k-1 where they are."""
    allocator = Allocator([Node(f"t{i}", "T4", 4, 48, 192) for i in range(2)]
                          + [Node(f"a{i}", "A100", 4, 96, 512) for i in range(2)], "first-fit")
    gang = Job("e", "m", 4, part_gpus=2)
    allocator.reconfigure([(gang, "T4")])
    before = allocator.running()["e"]
    actions, short = allocator.reconfigure([(replace(gang, num_gpus=8), "A100")])
    assert (actions, short, allocator.running()["e"]) == ([], ["e"], before)
    actions, short = allocator.reconfigure([(replace(gang, num_gpus=8), "T4")])
    after = sorted(allocator.running()["e"], key=part_number)
    assert short == [] and [a.kind for a in actions] == ["resize"]
    assert {a.gpu_type for a in after} == {"T4"} and len(after) == 4 and after[:2] == sorted(before, key=part_number)
    assert not allocator.cluster.check()
