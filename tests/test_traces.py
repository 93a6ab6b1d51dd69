"""Trace importers: the shipped Synergy and Gavel traces, and Philly / Alibaba files in their real layouts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from hetplan.contracts import DEMAND, TRACE, ContractError
from hetplan.resources import upstream_path
from hetplan.traces import FORMATS, TraceImport, import_trace
from hetplan.traces.synergy import PROXY_MODELS

SYNERGY = upstream_path("traces", "synergy_static_100job.csv")
GAVEL_0E4A51 = upstream_path("traces", "gavel_philly_0e4a51.trace")
GAVEL_2869CE = upstream_path("traces", "gavel_philly_2869ce.trace")

# V100 steps/s copied from reference/gavel_isolated_throughputs_k80_p100_v100.csv (job type, scale factor).
V100_TRANSFORMER_128_X1 = 5.44610521981264
V100_LM_5_X8 = 698.773292956699
V100_A3C_X1 = 7.175767179667988
V100_RESNET50_64_X2 = 7.922054367597505

# Synthetic rows in the real Philly summary layout (timestamp,duration,num_gpus plus ignored extras).
PHILLY_CSV = """\
timestamp,duration,num_gpus,status,user
2017-10-03 14:22:11,3600,1,Pass,u1
2017-10-03T14:20:11,0,2,Killed,u2
2017-10-03 14:25:11,120,0,Pass,u3
2017-10-03 14:30:11,60.5,8,Failed,u1
"""

# Synthetic pods in the real Alibaba 2023 openb_pod_list layout (times in seconds).
ALIBABA_CSV = """\
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
openb-pod-0000,12000,16384,1,1000,V100M16|V100M32,LS,Running,100,2000,110
openb-pod-0001,6000,12288,1,460,,BE,Running,150,1150,0
openb-pod-0002,88000,327680,8,1000,P100,LS,Running,200,5000,
openb-pod-0003,64000,262144,0,0,,LS,Running,50,900,60
openb-pod-0004,8000,30000,2,1000,T4,LS,Running,300,,310
openb-pod-0005,8000,30000,2,1000,T4,LS,Failed,400,400,0
"""


def write(tmp_path: Path, name: str, content: str) -> Path:
    path = tmp_path / name
    path.write_text(content)
    return path


def problems_of(excinfo: pytest.ExceptionInfo[ContractError]) -> list[str]:
    return [str(p) for p in excinfo.value.problems]


def assert_accounted(result: TraceImport) -> None:
    """Every job read is either imported or counted under a named reason, warned about once."""
    assert result.report["imported"] == len(result.trace)
    assert result.report["read"] == result.report["imported"] + result.dropped
    for reason, count in result.report.items():
        if reason not in ("read", "imported") and count:
            assert sum(f"[{reason}]" in w for w in result.warnings) == 1, reason
            assert any(f"{count} job" in w for w in result.warnings if f"[{reason}]" in w)
    TRACE.validate(result.trace)


# --- Synergy ---------------------------------------------------------------------------------------------------


def test_synergy_shipped_trace_imports_all_jobs_with_proxy_models_counted() -> None:
    result = import_trace(SYNERGY, "synergy")
    trace = result.trace.set_index("job_id")
    assert len(trace) == 100
    assert result.report["mapped_model_proxy"] == 34  # 12 mobilenet + 12 shufflenet + 10 lstm
    assert result.dropped == 0
    assert_accounted(result)
    job0 = trace.loc["0"]
    assert (job0["model"], job0["num_gpus"], job0["arrival_s"]) == ("alexnet", 1, 0.0)
    assert job0["duration_s"] == pytest.approx(3349 * 0.6)
    assert trace.loc["1", "arrival_s"] == pytest.approx(0.001 * 3600)  # hours -> seconds
    assert trace.loc["1", "duration_s"] == pytest.approx(26435 * 0.12)  # gnmt
    # Unprofiled models keep their name; their iteration time is the proxy's (lstm -> gnmt, mobilenet -> res18).
    assert trace.loc["98", "model"] == "lstm"
    assert trace.loc["98", "duration_s"] == pytest.approx(193796 * 0.12)
    assert trace.loc["97", "model"] == "mobilenet"
    assert trace.loc["97", "duration_s"] == pytest.approx(19419 * 0.64)
    assert set(trace["model"]) == {"alexnet", "deepspeech", "gnmt", "res18", "res50", "transformer", *PROXY_MODELS}
    assert any("lstm->gnmt" in w for w in result.warnings)


def test_synergy_rejects_unknown_models_and_zero_work_rows(tmp_path: Path) -> None:
    path = write(tmp_path, "s.csv", "0,res50,0.0,100,2\n1,vgg99,0.5,100,1\n2,res18,1.0,0,1\n3,alexnet,1.5,10,0\n")
    result = import_trace(path, "synergy")
    assert list(result.trace["job_id"]) == ["0"]
    assert result.trace.loc[0, "duration_s"] == pytest.approx(100 * 0.78)
    assert result.trace.loc[0, "num_gpus"] == 2
    counts = {k: result.report[k] for k in ("rejected_unknown_model", "rejected_zero_duration", "rejected_no_gpus")}
    assert counts == {"rejected_unknown_model": 1, "rejected_zero_duration": 1, "rejected_no_gpus": 1}
    assert any("vgg99" in w for w in result.warnings)
    assert_accounted(result)


def test_synergy_bad_cells_and_wrong_field_count_name_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "s.csv", "0,res50,zero,100,1\n1,res18,0.1,100,1.5\n")
    with pytest.raises(ContractError) as excinfo:
        import_trace(path, "synergy")
    assert problems_of(excinfo) == [
        f"{path}:1:arrival_h: not a number: 'zero'",
        f"{path}:2:gpu_demand: not a whole number: '1.5'",
    ]
    path = write(tmp_path, "short.csv", "0,res50,0.0,100,1\n1,res18,0.1,100\n")
    with pytest.raises(ContractError) as excinfo:
        import_trace(path, "synergy")
    assert problems_of(excinfo) == [f"{path}:2: has 4 fields but line 1 has 5 (one layout per file: 5)"]


# --- Gavel -----------------------------------------------------------------------------------------------------


def test_gavel_0e4a51_trace_imports_with_v100_durations() -> None:
    result = import_trace(GAVEL_0E4A51, "gavel")
    trace = result.trace.set_index("job_id")
    assert len(trace) == 1181 and result.dropped == 0
    assert result.report["duration_from_scale1"] == 197
    assert_accounted(result)
    first = trace.loc["0"]
    assert (first["model"], first["batch_size"], first["num_gpus"], first["arrival_s"]) == ("transformer", 128, 1, 0.0)
    assert first["duration_s"] == pytest.approx(95121 / V100_TRANSFORMER_128_X1)
    lm = trace.loc["555"]  # LM (batch size 5) at scale 8: the table has that rate
    assert (lm["model"], lm["batch_size"], lm["num_gpus"]) == ("lm", 5, 8)
    assert lm["duration_s"] == pytest.approx(374522 / V100_LM_5_X8)
    a3c = trace.loc["45"]  # A3C at scale 4: only a 1-GPU rate in the table
    assert (a3c["model"], a3c["num_gpus"]) == ("a3c", 4) and pd.isna(a3c["batch_size"])
    assert a3c["duration_s"] == pytest.approx(1934260 / V100_A3C_X1)
    assert set(trace["model"]) == {"res18", "res50", "transformer", "lm", "recommendation", "a3c", "cyclegan"}
    assert trace["arrival_s"].is_monotonic_increasing


def test_gavel_2869ce_trace_falls_back_to_scale1_for_16_and_32_gpus() -> None:
    result = import_trace(GAVEL_2869CE, "gavel")
    assert len(result.trace) == 533 and result.dropped == 0
    assert result.report["duration_from_scale1"] == 179
    assert set(result.trace["num_gpus"]) == {1, 2, 4, 8, 16, 32}
    assert_accounted(result)


def test_gavel_ten_field_layout_and_unknown_job_type(tmp_path: Path) -> None:
    lines = [
        "ResNet-50 (batch size 64)\tpython3 main.py\t/w/imagenet\t--num_steps\t1\t1000\t2\t1.0\t1.2\t30.5",
        "BERT (batch size 8)\tpython3 bert.py\t/w/bert\t--steps\t1\t500\t1\t1.0\t-1\t40",
        "A3C\tpython3 a3c.py\t/w/a3c\t--max-steps\t0\t200\t1\t1.0\t-1\t50",
    ]
    path = write(tmp_path, "new.trace", "\n".join(lines) + "\n")
    result = import_trace(path, "gavel")
    trace = result.trace.set_index("job_id")
    assert list(trace.index) == ["0", "2"]
    row = trace.loc["0"]
    assert (row["model"], row["batch_size"], row["num_gpus"], row["arrival_s"]) == ("res50", 64, 2, 30.5)
    assert row["duration_s"] == pytest.approx(1000 / V100_RESNET50_64_X2)
    assert trace.loc["2", "duration_s"] == pytest.approx(200 / V100_A3C_X1)
    assert result.report["rejected_unknown_job_type"] == 1
    assert any("BERT (batch size 8)" in w for w in result.warnings)
    assert_accounted(result)


def test_gavel_mixed_or_unknown_layouts_and_bad_cells_are_contract_errors(tmp_path: Path) -> None:
    old = "A3C\tcmd\t--max-steps\t0\t200\t0.0\t1"
    new = "A3C\tcmd\t/w\t--max-steps\t0\t200\t1\t1.0\t-1\t50"
    path = write(tmp_path, "mixed.trace", f"{old}\n{new}\n")
    with pytest.raises(ContractError) as excinfo:
        import_trace(path, "gavel")
    assert problems_of(excinfo) == [f"{path}:2: has 10 fields but line 1 has 7 (one layout per file: 7 or 10)"]
    path = write(tmp_path, "five.trace", "A3C\tcmd\t--max-steps\t0\t200\n")
    with pytest.raises(ContractError, match=r"five.trace:1: has 5 fields; a Gavel trace line has 7 or 10"):
        import_trace(path, "gavel")
    path = write(tmp_path, "bad.trace", f"{old}\nA3C\tcmd\t--max-steps\t0\tmany\t6.0\t1\n")
    with pytest.raises(ContractError) as excinfo:
        import_trace(path, "gavel")
    assert problems_of(excinfo) == [f"{path}:2:total_steps: not a number: 'many'"]


# --- Philly ----------------------------------------------------------------------------------------------------


def test_philly_datetimes_rejections_and_model_option(tmp_path: Path) -> None:
    path = write(tmp_path, "philly.csv", PHILLY_CSV)
    result = import_trace(path, "philly", model="res50")
    trace = result.trace
    assert list(trace["job_id"]) == ["0", "3"]  # row index among data rows
    assert set(trace["model"]) == {"res50"}
    # The earliest timestamp (a rejected row, 14:20:11) is time 0.
    assert list(trace["arrival_s"]) == [120.0, 600.0]
    assert list(trace["duration_s"]) == [3600.0, 60.5]
    assert list(trace["num_gpus"]) == [1, 8]
    assert "status" not in trace.columns
    assert (result.report["rejected_zero_duration"], result.report["rejected_no_gpus"]) == (1, 1)
    assert_accounted(result)


def test_philly_seconds_and_job_id_column(tmp_path: Path) -> None:
    path = write(tmp_path, "p.csv", "jobid,timestamp,duration,num_gpus\napp_1,1000,10,1\napp_2,1060.5,20,4\n")
    result = import_trace(path, "philly")
    assert list(result.trace["job_id"]) == ["app_1", "app_2"]
    assert list(result.trace["arrival_s"]) == [0.0, 60.5]
    assert set(result.trace["model"]) == {"unknown"}


def test_philly_bad_input_names_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "p.csv", "timestamp,duration,num_gpus\n0,10,1\n5,ten,1\n9,10,two\n")
    with pytest.raises(ContractError) as excinfo:
        import_trace(path, "philly")
    assert problems_of(excinfo) == [f"{path}:3:duration: not a number: 'ten'", f"{path}:4:num_gpus: not a number: 'two'"]
    path = write(tmp_path, "when.csv", "timestamp,duration,num_gpus\n2017-10-03 14:22:11,10,1\nyesterday,10,1\n")
    with pytest.raises(ContractError, match=r"when.csv:3:timestamp: neither seconds nor a date-time"):
        import_trace(path, "philly")
    with pytest.raises(ContractError, match=r"empty.csv: file is empty"):
        import_trace(write(tmp_path, "empty.csv", ""), "philly")
    with pytest.raises(ContractError, match=r"header.csv: no data rows"):
        import_trace(write(tmp_path, "header.csv", "timestamp,duration,num_gpus\n"), "philly")
    with pytest.raises(ContractError, match=r"nogpu.csv:1:num_gpus: missing required column"):
        import_trace(write(tmp_path, "nogpu.csv", "timestamp,duration\n0,1\n"), "philly")
    with pytest.raises(ContractError, match=r"no such file"):
        import_trace(tmp_path / "absent.csv", "philly")


def test_philly_with_no_importable_job_is_a_contract_error(tmp_path: Path) -> None:
    path = write(tmp_path, "p.csv", "timestamp,duration,num_gpus\n0,0,1\n5,10,0\n")
    with pytest.raises(ContractError) as excinfo:
        import_trace(path, "philly")
    assert problems_of(excinfo) == [
        f"{path}: no job could be imported (read 2: 1 rejected_zero_duration, 1 rejected_no_gpus)"
    ]


def test_philly_80k_rows_import(tmp_path: Path) -> None:
    n = 80_000
    rng = np.random.default_rng(7)
    start = np.sort(rng.integers(1_500_000_000, 1_510_000_000, n))
    duration = rng.integers(1, 200_000, n)
    gpus = rng.choice([1, 2, 4, 8, 16], n)
    duration[::50] = 0
    gpus[1::97] = 0
    frame = pd.DataFrame({"job_id": [f"app_{i}" for i in range(n)], "timestamp": start, "duration": duration,
                          "num_gpus": gpus, "vc": "vc1"})
    path = tmp_path / "philly80k.csv"
    frame.to_csv(path, index=False)
    result = import_trace(path, "philly")
    zero = duration <= 0
    no_gpus = ~zero & (gpus <= 0)
    assert result.report["read"] == n
    assert result.report["rejected_zero_duration"] == int(zero.sum())
    assert result.report["rejected_no_gpus"] == int(no_gpus.sum())
    assert len(result.trace) == n - int(zero.sum()) - int(no_gpus.sum())
    kept = ~zero & ~no_gpus
    assert list(result.trace["job_id"][:3]) == list(frame["job_id"][kept][:3])
    np.testing.assert_allclose(result.trace["arrival_s"], (start - start.min())[kept])
    assert_accounted(result)


# --- Alibaba ---------------------------------------------------------------------------------------------------


def test_alibaba_pods_are_imported_skipped_rounded_or_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "openb_pod_list_test.csv", ALIBABA_CSV)
    result = import_trace(path, "alibaba", model="bert")
    trace = result.trace.set_index("job_id")
    assert list(trace.index) == ["openb-pod-0000", "openb-pod-0001", "openb-pod-0002"]
    assert list(trace["num_gpus"]) == [1, 1, 8]
    assert list(trace["arrival_s"]) == [50.0, 100.0, 150.0]  # from the earliest creation_time (a CPU pod)
    assert list(trace["duration_s"]) == [1890.0, 1000.0, 4800.0]  # from scheduled_time when > 0
    assert list(trace["gpu_spec"]) == ["V100M16|V100M32", "", "P100"]
    assert list(trace["cpu_milli"]) == [12000.0, 6000.0, 88000.0]
    assert list(trace["memory_mib"]) == [16384.0, 12288.0, 327680.0]
    assert set(trace["model"]) == {"bert"}
    assert {k: v for k, v in result.report.items() if k not in ("read", "imported")} == {
        "skipped_cpu_only": 1,
        "rounded_fractional_gpu": 1,
        "rejected_still_running": 1,
        "rejected_zero_duration": 1,
    }
    assert_accounted(result)


def test_alibaba_bad_cells_and_cpu_only_files(tmp_path: Path) -> None:
    bad = ALIBABA_CSV.replace("openb-pod-0002,88000,327680,8,", "openb-pod-0002,88000,327680,eight,")
    path = write(tmp_path, "bad.csv", bad)
    with pytest.raises(ContractError) as excinfo:
        import_trace(path, "alibaba")
    assert problems_of(excinfo) == [f"{path}:4:num_gpu: not a number: 'eight'"]
    header = ALIBABA_CSV.splitlines()[0]
    cpu = write(tmp_path, "cpu.csv", f"{header}\nopenb-pod-9,4000,8000,0,0,,BE,Running,0,100,1\n")
    with pytest.raises(ContractError, match=r"no job could be imported \(read 1: 1 skipped_cpu_only\)"):
        import_trace(cpu, "alibaba")


# --- API -------------------------------------------------------------------------------------------------------


def test_import_trace_api_contract(tmp_path: Path) -> None:
    assert FORMATS == ("synergy", "gavel", "philly", "alibaba", "sia")
    with pytest.raises(ValueError, match="unknown trace format 'csv'"):
        import_trace(SYNERGY, "csv")
    with pytest.raises(TypeError):
        import_trace(SYNERGY, "synergy", model="res50")  # Synergy names its own models
    with pytest.raises(ValueError, match="non-blank"):
        import_trace(write(tmp_path, "p.csv", PHILLY_CSV), "philly", model=" ")
    result = import_trace(SYNERGY, "synergy")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.trace = result.trace.head(1)  # type: ignore[misc]


# --- CLI -------------------------------------------------------------------------------------------------------


def run_cli(*args: str):
    from hetplan.cli import app

    return CliRunner().invoke(app, ["trace", "import", *map(str, args)])


def test_cli_import_writes_trace_and_demand(tmp_path: Path) -> None:
    out, demand = tmp_path / "trace.parquet", tmp_path / "demand.csv"
    result = run_cli("--format", "gavel", GAVEL_0E4A51, "--out", out, "--demand-out", demand)
    assert result.exit_code == 0, result.output
    assert "imported 1181 of 1181 jobs" in result.output
    assert "duration_from_scale1" in result.output
    trace = TRACE.load(out)
    assert len(trace) == 1181 and trace.loc[0, "model"] == "transformer"
    mix = DEMAND.load(demand)
    assert set(mix["model"]) == set(trace["model"])
    assert mix["share"].sum() == pytest.approx(1.0)


def test_cli_failures_exit_non_zero_and_write_nothing(tmp_path: Path) -> None:
    out, demand = tmp_path / "trace.csv", tmp_path / "demand.csv"
    path = write(tmp_path, "p.csv", "timestamp,duration,num_gpus\n0,0,1\n")
    result = run_cli("--format", "philly", path, "--out", out, "--demand-out", demand)
    assert result.exit_code != 0
    assert "no job could be imported" in result.output
    result = run_cli("--format", "philly", write(tmp_path, "ok.csv", PHILLY_CSV), "--out", out,
                     "--demand-out", tmp_path / "demand.txt")
    assert result.exit_code != 0
    result = run_cli("--format", "synergy", SYNERGY, "--out", out, "--model", "res50")
    assert result.exit_code != 0
    assert not out.exists() and not demand.exists() and not (tmp_path / "demand.txt").exists()
