"""Elastic jobs in the trace contract, and `hetplan trace import --format sia` (Sia's workload files)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from hetplan.contracts import TRACE, ContractError
from hetplan.contracts.trace import DEFAULT_RESTART_S, check_fits, elastic_defaults, is_elastic, load_trace
from hetplan.resources import upstream_path
from hetplan.sim.workload import prepare_workload
from hetplan.traces import import_trace
from test_contracts import problems, write

SIA_WORKLOADS = [upstream_path("traces", f"sia_philly_workload-{i}.csv") for i in (2, 3)]
HEADER = "name,time,application,num_replicas,batch_size\n"

# V100 1-GPU step times (s) copied from the shipped tables: cifar10 at per-GPU batches 91 and 129, bert at 16,
# deepspeech2 at 240 (its largest measured batch), yolov3 at 16 (the ncf/yolov3 table).
CIFAR10_91, CIFAR10_129 = 0.10644906759262085, 0.10988125205039978
BERT_16 = 0.4392738938331604
DEEPSPEECH2_240 = 3.341525207866322
YOLOV3_16 = 0.3260984718799591

TINY_SIA = HEADER + """\
cifar10-0,498,cifar10,4,516
cifar10-1,500,cifar10,2,220
bert-2,600,bert,2,32
yolov3-3,700,yolov3,1,16
deepspeech2-4,900,deepspeech2,1,640
"""


def run_cli(*args: object):
    from hetplan.cli import app

    return CliRunner().invoke(app, ["trace", "import", *map(str, args)])


# --- the contract ------------------------------------------------------------------------------------------


def rows(**elastic: list) -> pd.DataFrame:
    n = len(next(iter(elastic.values()))) if elastic else 1
    base = {"job_id": [f"j{i}" for i in range(n)], "model": ["bert"] * n, "num_gpus": elastic.pop("num_gpus", [4] * n),
            "arrival_s": [0.0] * n, "duration_s": [60.0] * n}
    return pd.DataFrame({**base, **elastic})


@pytest.mark.parametrize(("columns", "error"), [
    ({}, None),  # an old trace: rigid jobs
    ({"min_gpus": [1], "max_gpus": [8]}, None),
    ({"min_gpus": [4], "max_gpus": [4]}, None),  # elastic columns that say rigid
    ({"min_gpus": [""], "max_gpus": [""], "restart_s": [""]}, None),  # blank = rigid, default restart
    ({"min_gpus": [1], "max_gpus": [8], "adapt_batch": [1], "restart_s": [0]}, None),
    ({"min_gpus": [8], "max_gpus": [2]}, "t.csv:1:min_gpus: 8 is above max_gpus 2"),
    ({"min_gpus": [1], "max_gpus": [2]}, "t.csv:1:num_gpus: 4 is outside [min_gpus 1, max_gpus 2]"),
    ({"min_gpus": [6], "max_gpus": [8]}, "t.csv:1:num_gpus: 4 is outside [min_gpus 6, max_gpus 8]"),
    ({"min_gpus": [1], "max_gpus": [""]}, "t.csv:1:max_gpus: missing value: an elastic job gives both"),
    ({"min_gpus": [""], "max_gpus": [8]}, "t.csv:1:min_gpus: missing value: an elastic job gives both"),
    ({"adapt_batch": [1]}, "t.csv:1:adapt_batch: only an elastic job"),
    ({"adapt_batch": [2]}, "t.csv:1:adapt_batch: must be at most 1, got 2"),
    ({"min_gpus": [0], "max_gpus": [8]}, "t.csv:1:min_gpus: must be at least 1, got 0"),
    ({"min_gpus": [1], "max_gpus": [8], "restart_s": [-1]}, "t.csv:1:restart_s: must be at least 0, got -1"),
    ({"min_gpus": [1], "max_gpus": ["2.5"]}, "t.csv:1:max_gpus: not a whole number: '2.5'"),
])
def test_contract_rows(columns: dict, error: str | None) -> None:
    frame = rows(**columns)
    if error is None:
        trace = TRACE.validate(frame, "t.csv")
        assert list(trace.columns[:9]) == TRACE.column_names
        return
    with pytest.raises(ContractError) as exc:
        TRACE.validate(frame, "t.csv")
    assert [p for p in problems(exc) if p.startswith(error)], problems(exc)
    assert all("\n" not in p for p in problems(exc))


def test_every_bad_row_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    text = ("job_id,model,num_gpus,arrival_s,duration_s,min_gpus,max_gpus\n"
            "a,bert,2,0,10,1,4\nb,bert,2,0,10,4,1\nc,bert,8,0,10,1,4\n")
    with pytest.raises(ContractError) as exc:
        TRACE.load(write(tmp_path, text, "t.csv"))
    assert [p.split(": ")[0] for p in problems(exc)] == [f"{tmp_path / 't.csv'}:3:min_gpus",
                                                        f"{tmp_path / 't.csv'}:4:num_gpus"]
    out = tmp_path / "out.csv"
    with pytest.raises(ContractError):
        TRACE.write(pd.DataFrame(rows(min_gpus=[8], max_gpus=[2])), out)
    assert not out.exists()


def test_old_traces_write_unchanged_and_read_as_rigid(tmp_path: Path) -> None:
    old = rows(num_gpus=[1, 2])
    TRACE.write(old, tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text().splitlines()[0] == "job_id,model,num_gpus,arrival_s,duration_s"
    trace = TRACE.load(tmp_path / "t.csv")
    assert not is_elastic(trace).any()
    filled, warnings = elastic_defaults(trace)
    assert filled["min_gpus"].tolist() == filled["max_gpus"].tolist() == [1, 2] and warnings == []
    assert filled["adapt_batch"].tolist() == [0, 0] and filled["restart_s"].tolist() == [120.0, 120.0]  # bert


def test_restart_defaults_per_model_else_flat_said_so() -> None:
    trace = TRACE.validate(pd.DataFrame({
        "job_id": ["a", "b", "c", "d", "e"], "model": ["imagenet", "res50", "NCF", "bert", "vit"],
        "num_gpus": [2] * 5, "arrival_s": [0.0] * 5, "duration_s": [1.0] * 5, "min_gpus": [1, 1, "", 1, 1],
        "max_gpus": [4, 4, "", 4, 4], "restart_s": ["", "", "", 7, ""],
    }))
    filled, warnings = elastic_defaults(trace)
    assert filled["restart_s"].tolist() == [250.0, 250.0, 15.0, 7.0, DEFAULT_RESTART_S]  # res50: imagenet's network
    assert warnings == [f"1 job of models without a known restart cost (vit) take the flat {DEFAULT_RESTART_S:g} s"]


@pytest.mark.parametrize(("totals", "error"), [
    ({"T4": 24, "A100": 16}, None),
    ({"A100": 16}, "g.csv:2:max_gpus: 24 is above every GPU type's total (largest: 16 A100)"),
    ({"T4": 4, "V100": 8}, "g.csv:2:max_gpus: 24 is above every GPU type's total (largest: 8 V100)"),
])
def test_bounds_must_fit_the_cluster(totals: dict[str, int], error: str | None) -> None:
    trace = TRACE.validate(rows(num_gpus=[64, 2], min_gpus=["", 1], max_gpus=["", 24]))  # row 1 rigid: not judged
    if error is None:
        check_fits(trace, totals, "g.csv")
        return
    with pytest.raises(ContractError) as exc:
        check_fits(trace, totals, "g.csv")
    assert problems(exc) == [error]


def test_load_trace_names_the_files_own_rows(tmp_path: Path) -> None:
    path = write(tmp_path, "job_id,model,num_gpus,arrival_s,duration_s,min_gpus,max_gpus\n\na,bert,2,0,10,1,32\n",
                 "t.csv")
    assert len(load_trace(path)) == 1
    with pytest.raises(ContractError) as exc:
        load_trace(path, {"T4": 24})
    assert problems(exc) == [f"{path}:3:max_gpus: 32 is above every GPU type's total (largest: 24 T4)"]


def test_prepare_workload_carries_elastic_columns_and_keeps_rigid_jobs() -> None:
    rigid = rows(num_gpus=[1, 2])
    before = prepare_workload(rigid, ["bert"])
    assert before.warnings == [] and before.jobs["min_gpus"].tolist() == before.jobs["max_gpus"].tolist() == [1, 2]
    assert before.jobs[["job_id", "model", "sim_model", "num_gpus", "arrival_s", "duration_s"]].equals(
        prepare_workload(rigid[["job_id", "model", "num_gpus", "arrival_s", "duration_s"]], ["bert"]).jobs[
            ["job_id", "model", "sim_model", "num_gpus", "arrival_s", "duration_s"]])
    elastic = prepare_workload(rows(num_gpus=[2], min_gpus=[1], max_gpus=[4]).assign(model="x"), ["bert"])
    assert elastic.jobs["restart_s"].tolist() == [DEFAULT_RESTART_S]
    assert any("flat 30 s" in w for w in elastic.warnings)


# --- the Sia import ----------------------------------------------------------------------------------------


def test_tiny_sia_file_checked_by_hand(tmp_path: Path) -> None:
    result = import_trace(write(tmp_path, TINY_SIA), "sia", max_gpus=8)
    trace = result.trace.set_index("job_id")
    assert trace["model"].tolist() == ["res18", "res18", "transformer", "yolov3", "deepspeech"]
    assert trace["application"].tolist() == ["cifar10", "cifar10", "bert", "yolov3", "deepspeech2"]
    assert trace["num_gpus"].tolist() == [4, 2, 2, 1, 1] and trace["arrival_s"].tolist() == [498, 500, 600, 700, 900]
    assert (trace["min_gpus"] == 1).all() and (trace["max_gpus"] == 8).all() and (trace["adapt_batch"] == 0).all()
    assert trace["restart_s"].tolist() == [50.0, 50.0, 120.0, 80.0, 25.0]
    assert (trace["duration_source"] == "derived:sia-epochs@v100-1gpu").all()
    # epochs x samples per epoch x step time / (GPUs x per-GPU batch)
    expected = {
        "cifar10-0": 100 * 50_048 * CIFAR10_129 / (4 * 129),  # a measured batch
        "cifar10-1": 100 * 50_048 * ((CIFAR10_91 + CIFAR10_129) / 2) / (2 * 110),  # 110 is halfway from 91 to 129
        "bert-2": 2 * 88_644 * BERT_16 / (2 * 16),
        "yolov3-3": 50 * 16_552 * YOLOV3_16 / 16,
        "deepspeech2-4": 80 * 7_140 * DEEPSPEECH2_240 / 240,  # 640 per GPU is past the measured 240: timed there
    }
    assert trace["duration_s"].to_dict() == pytest.approx(expected, rel=1e-12)
    assert result.report == {"read": 5, "imported": 5, "rejected_unknown_model": 0, "kept_opaque_model": 1,
                             "per_gpu_batch_clipped": 1}
    assert any("(yolov3)" in w and "kept_opaque_model" in w for w in result.warnings)
    assert any("durations are derived" in w for w in result.warnings)


def test_unknown_application_is_rejected_and_counted(tmp_path: Path) -> None:
    result = import_trace(write(tmp_path, HEADER + "a,0,cifar10,1,128\nb,5,gpt2,2,8\n"), "sia")
    assert result.trace["job_id"].tolist() == ["a"] and result.report["rejected_unknown_model"] == 1
    assert result.trace["max_gpus"].tolist() == [24]  # Sia's cluster's largest GPU type, said so
    assert any("Sia's cluster's largest GPU type" in w for w in result.warnings)


@pytest.mark.parametrize(("line", "error"), [
    ("a,10,cifar10,32,4096", "f.csv:2:num_replicas: 32 is above max_gpus 24"),
    ("a,10,cifar10,0,4096", "f.csv:2:num_replicas: must be at least 1, got 0"),
    ("a,10,cifar10,2.5,4096", "f.csv:2:num_replicas: not a whole number: '2.5'"),
    ("a,-1,cifar10,2,4096", "f.csv:2:time: must be at least 0, got -1"),
    ("a,ten,cifar10,2,4096", "f.csv:2:time: not a number: 'ten'"),
    (",10,cifar10,2,4096", "f.csv:2:name: missing value"),
    ("a,10,,2,4096", "f.csv:2:application: missing value"),
    ("a,10,cifar10,2,0", "f.csv:2:batch_size: must be at least 1, got 0"),
])
def test_bad_sia_rows_named_by_file_row_field(tmp_path: Path, line: str, error: str) -> None:
    path = write(tmp_path, HEADER + line + "\n")
    with pytest.raises(ContractError) as exc:
        import_trace(path, "sia")
    assert len(problems(exc)) == 1 and problems(exc)[0].startswith(f"{tmp_path}/{error}"), problems(exc)
    out = tmp_path / "out.csv"
    result = run_cli("--format", "sia", path, "-o", out)
    assert result.exit_code == 1 and not out.exists()
    assert [line for line in result.output.splitlines() if line.startswith("error:")] == \
        [f"error: {p}" for p in problems(exc)]


def test_duplicate_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ContractError) as exc:
        import_trace(write(tmp_path, HEADER + "a,0,bert,1,12\na,1,bert,1,12\n"), "sia")
    assert problems(exc) == [f"{tmp_path / 'f.csv'}:3:name: duplicate job name 'a'"]


@pytest.mark.parametrize("path", SIA_WORKLOADS, ids=lambda p: p.name)
def test_shipped_philly_workloads_import_whole(path: Path) -> None:
    raw = pd.read_csv(path)
    result = import_trace(path, "sia")
    trace = result.trace
    assert result.report["imported"] == len(raw) == 160 and result.dropped == 0
    assert trace["job_id"].tolist() == raw["name"].tolist()
    assert trace["arrival_s"].tolist() == raw["time"].astype(float).tolist()
    assert trace["num_gpus"].tolist() == raw["num_replicas"].tolist()
    assert (trace["min_gpus"] <= trace["num_gpus"]).all() and (trace["num_gpus"] <= trace["max_gpus"]).all()
    assert is_elastic(trace).all() and (trace["duration_s"] > 0).all()
    assert set(trace["model"]) <= {"res18", "res50", "transformer", "deepspeech", "yolov3", "ncf"}
    # the same model and per-GPU batch on more GPUs: the same work, so a proportionally shorter duration
    work = trace["duration_s"] * trace["num_gpus"]
    per_gpu = trace["batch_size"] / trace["num_gpus"]
    for _, group in trace.assign(work=work, per_gpu=per_gpu).groupby(["application", "per_gpu"]):
        assert group["work"].max() == pytest.approx(group["work"].min(), rel=1e-9)


def test_cli_imports_with_a_bound_from_the_fleet(tmp_path: Path) -> None:
    fleet = write(tmp_path, "name,gpu_type,gpus,vcpus,mem_gb,count\nt4,T4,4,48,192,3\na100,A100,8,128,1024,2\n",
                  "fleet.csv")
    out = tmp_path / "trace.csv"
    result = run_cli("--format", "sia", SIA_WORKLOADS[0], "-o", out, "--nodes", fleet)
    assert result.exit_code == 0, result.output
    assert "elastic bound: 16 GPUs, the A100 total" in result.output and "imported 160 of 160" in result.output
    trace = TRACE.load(out)
    assert (trace["max_gpus"] == 16).all() and (trace["min_gpus"] == 1).all()
    imported = import_trace(SIA_WORKLOADS[0], "sia", max_gpus=16).trace
    pd.testing.assert_frame_equal(trace[TRACE.column_names], imported[TRACE.column_names])  # the contract's columns


@pytest.mark.parametrize(("args", "error"), [
    (["--format", "gavel", "--max-gpus", "8"], "only for sia traces"),
    (["--format", "sia", "--max-gpus", "8", "--nodes", "f.csv"], "not both"),
    (["--format", "sia", "--max-gpus", "0"], "--max-gpus"),
    (["--format", "sia", "--max-gpus", "8"], "num_replicas: 12 is above max_gpus 8"),
])
def test_cli_refusals_write_nothing(tmp_path: Path, args: list[str], error: str) -> None:
    out = tmp_path / "trace.csv"
    result = run_cli(SIA_WORKLOADS[1], "-o", out, *args)
    assert result.exit_code != 0 and error in result.output and not out.exists()


def test_the_simulator_ignores_the_elastic_columns() -> None:
    """The same jobs, rigid and declared elastic, replay to identical results (the simulator reads no bound yet)."""
    from hetplan.allocator.spec import Node
    from hetplan.contracts import PROFILES
    from hetplan.sim.engine import SimConfig, simulate
    from hetplan.sim.truth import TruthCurves

    truth = TruthCurves.from_profiles(PROFILES.validate(pd.DataFrame({
        "model": ["m"] * 2, "gpu_type": "V100", "num_gpus": 1, "cpus_per_gpu": [1.0, 6.0], "mem_gb_per_gpu": 62.5,
        "throughput": [50.0, 200.0], "source": "published:test"}), "<tiny>"))
    rigid = pd.DataFrame({"job_id": [f"j{i}" for i in range(6)], "model": "m", "num_gpus": [1, 2, 4, 2, 1, 3],
                          "arrival_s": [0.0, 10, 20, 30, 40, 50], "duration_s": [600.0, 300, 900, 120, 60, 400]})
    elastic = rigid.assign(min_gpus=1, max_gpus=8, adapt_batch=[0, 1, 0, 1, 0, 1], restart_s=[5.0, 500, 0, 1, 2, 3])
    nodes = [Node(f"n{i}", "V100", 4, 24.0, 250.0) for i in range(2)]
    config = SimConfig("las", 60.0, check_every=1)
    runs = [simulate(prepare_workload(t, truth.models).jobs, nodes, truth, "proportional", None, config).jobs
            for t in (rigid, elastic)]
    assert (runs[0]["status"] == "completed").all() and runs[0]["jct_s"].gt(0).all()
    pd.testing.assert_frame_equal(runs[0], runs[1])


def test_read_trace_bounds_elastic_jobs_by_the_fleet(tmp_path: Path) -> None:
    """`hetplan simulate`'s reading: a Sia file bounded by the fleet's largest type, a trace's bounds checked."""
    from hetplan.cli.common import read_trace

    jobs, report, _ = read_trace(SIA_WORKLOADS[0], "sia", {"T4": 12, "A100": 16})
    assert (jobs["max_gpus"] == 16).all() and report["imported"] == 160
    path = write(tmp_path, "job_id,model,num_gpus,arrival_s,duration_s,min_gpus,max_gpus\na,bert,2,0,10,1,32\n",
                 "t.csv")
    with pytest.raises(ContractError) as exc:
        read_trace(path, "trace", {"T4": 12, "A100": 16})
    assert problems(exc) == [f"{path}:2:max_gpus: 32 is above every GPU type's total (largest: 16 A100)"]


def test_an_error_on_line_100_reads_as_a_line_number(tmp_path: Path) -> None:
    """rich would print `:100:` as an emoji; the CLI's error line keeps it as the row."""
    good = "".join(f"j{i},{i},cifar10,2,256\n" for i in range(98))
    path = write(tmp_path, HEADER + good + "bad,5,cifar10,0,256\n")
    result = run_cli("--format", "sia", path, "-o", tmp_path / "t.csv")
    assert result.exit_code == 1 and f"error: {path}:100:num_replicas: must be at least 1, got 0" in result.output


def test_hetplan_names_of_sias_networks_cost_what_sias_names_cost():
    from hetplan.contracts.trace import RESTART_S
    from hetplan.traces.sia import MODELS

    assert all(RESTART_S[ours] == RESTART_S[sia] for sia, ours in MODELS.items())
