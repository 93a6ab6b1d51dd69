"""The file contracts: typed loading of CSV and Parquet, every problem located, atomic writes."""

import json
from pathlib import Path

import pandas as pd
import pytest

from hetplan.contracts import (
    CATALOG, DEMAND, HINTS, PROFILES, TRACE, ContractError, Plan, demand_from_trace, fingerprint,
    load_plan, validate_file, write_plan,
)

CATALOG_CSV = """name,gpu_type,gpus,vcpus,mem_gb,price_per_hour,available
aws:p4d.24xlarge,A100,8,96,1152,32.7726,
dc1:v100x8,Tesla V100-SXM2-16GB,8,48,384,0,12
"""


def write(tmp_path: Path, text: str, name: str = "f.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(exc: pytest.ExceptionInfo[ContractError]) -> list[str]:
    return [str(p) for p in exc.value.problems]


def test_catalog_loads_typed_and_normalises_gpu_names(tmp_path):
    frame = CATALOG.load(write(tmp_path, CATALOG_CSV))
    assert list(frame["gpu_type"]) == ["A100", "V100"]
    assert frame["gpus"].tolist() == [8, 8]
    assert frame["price_per_hour"].tolist() == [32.7726, 0.0]
    assert pd.isna(frame.loc[0, "available"]) and frame.loc[1, "available"] == 12
    assert "spot_price_per_hour" in frame.columns  # optional columns are added, empty


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("x,A100,8,96,1152,abc", "f.csv:2:price_per_hour: not a number: 'abc'"),
        ("x,A100,8,96,1152,-1", "f.csv:2:price_per_hour: must be at least 0, got -1"),
        ("x,A100,8,96,1152,NaN", "f.csv:2:price_per_hour: NaN is not a valid value"),
        ("x,A100,8,96,1152,", "f.csv:2:price_per_hour: missing value"),
        ("x,A100,8.5,96,1152,1", "f.csv:2:gpus: not a whole number: '8.5'"),
        ("x,A100,0,96,1152,1", "f.csv:2:gpus: must be at least 1, got 0"),
        ("x,bad/name,1,16,56,1", "f.csv:2:gpu_type: 'bad/name' is not a GPU type name"),
        ("x,A100,8,96,inf,1", "f.csv:2:mem_gb: not a finite number: 'inf'"),
        ("x,A100,8,96,1152", "f.csv:2: has 5 fields, the header has 6"),
    ],
)
def test_bad_cells_are_named_by_file_row_and_column(tmp_path, row, expected):
    path = write(tmp_path, "name,gpu_type,gpus,vcpus,mem_gb,price_per_hour\n" + row + "\n")
    with pytest.raises(ContractError) as exc:
        CATALOG.load(path)
    assert any(line.startswith(f"{tmp_path}/{expected}") for line in problems(exc)), problems(exc)


def test_every_problem_is_reported_not_just_the_first(tmp_path):
    path = write(tmp_path, "name,gpu_type,gpus,vcpus,mem_gb,price_per_hour\n"
                           "a,A100,x,96,1152,1\n"
                           "\n"
                           "b,A100,8,96,1152,-3\n")
    with pytest.raises(ContractError) as exc:
        CATALOG.load(path)
    lines = problems(exc)
    assert f"{path}:2:gpus: not a number: 'x'" in lines
    assert f"{path}:4:price_per_hour: must be at least 0, got -3" in lines  # blank line 3 keeps numbering


def test_missing_columns_are_named_on_the_header_row(tmp_path):
    path = write(tmp_path, "name,gpus\nx,1\n")
    with pytest.raises(ContractError) as exc:
        CATALOG.load(path)
    assert f"{path}:1:gpu_type: missing required column" in problems(exc)
    assert f"{path}:1:price_per_hour: missing required column" in problems(exc)


def test_duplicate_keys_point_at_the_first_occurrence(tmp_path):
    path = write(tmp_path, CATALOG_CSV + "aws:p4d.24xlarge,A100,8,96,1152,30,\n")
    with pytest.raises(ContractError) as exc:
        CATALOG.load(path)
    assert f"{path}:4:name: duplicate key (name=aws:p4d.24xlarge), first on row 2" in problems(exc)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "file is empty"),
        (b"   \n", "file is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00IHDR", "not a CSV or Parquet file (binary content)"),
        (b"just one line of prose\n", "not a CSV file"),
        (b"name,gpu_type,gpus,vcpus,mem_gb,price_per_hour\n", "no data rows"),
    ],
)
def test_unreadable_files_get_one_clear_message(tmp_path, content, message):
    path = tmp_path / "in.csv"
    path.write_bytes(content)
    with pytest.raises(ContractError) as exc:
        CATALOG.load(path)
    assert message in str(exc.value)
    assert str(exc.value).startswith(str(path))


def test_a_corrupt_parquet_file_is_rejected(tmp_path):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ContractError, match="not a readable Parquet file"):
        CATALOG.load(path)


def test_csv_and_parquet_round_trip_to_the_same_frame(tmp_path):
    frame = CATALOG.load(write(tmp_path, CATALOG_CSV))
    csv_path = CATALOG.write(frame, tmp_path / "out.csv")
    pq_path = CATALOG.write(frame, tmp_path / "out.parquet")
    pd.testing.assert_frame_equal(CATALOG.load(csv_path), CATALOG.load(pq_path), check_dtype=False)
    pd.testing.assert_frame_equal(CATALOG.load(csv_path), frame, check_dtype=False)


def test_parquet_problems_count_records_from_one(tmp_path):
    frame = pd.DataFrame({"job_id": ["a", "b"], "model": ["res18", "res50"], "num_gpus": [1, 2],
                          "arrival_s": [0.0, -5.0], "duration_s": [10.0, float("nan")]})
    path = tmp_path / "t.parquet"
    frame.to_parquet(path)
    with pytest.raises(ContractError) as exc:
        TRACE.load(path)
    assert f"{path}:2:arrival_s: must be at least 0, got -5" in problems(exc)
    assert f"{path}:2:duration_s: missing value" in problems(exc)


def test_an_invalid_frame_is_never_written(tmp_path):
    out = tmp_path / "out.csv"
    bad = pd.DataFrame({"model": ["a", "b"], "num_gpus": [1, 1], "share": [0.5, 0.6]})
    with pytest.raises(ContractError, match="shares sum to 1.1000"):
        DEMAND.write(bad, out)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind either


def test_writing_replaces_the_old_file_whole(tmp_path):
    out = tmp_path / "demand.csv"
    DEMAND.write(pd.DataFrame({"model": ["a"], "num_gpus": [1], "share": [1.0]}), out)
    DEMAND.write(pd.DataFrame({"model": ["b", "c"], "num_gpus": [1, 2], "share": [0.25, 0.75]}), out)
    assert DEMAND.load(out)["model"].tolist() == ["b", "c"]


def test_unknown_output_suffix_is_refused(tmp_path):
    with pytest.raises(ContractError, match="must end in .csv or .parquet"):
        DEMAND.write(pd.DataFrame({"model": ["a"], "num_gpus": [1], "share": [1.0]}), tmp_path / "x.txt")


def test_profiles_require_a_labelled_source_and_forbid_silent_zeros(tmp_path):
    header = "model,gpu_type,num_gpus,cpus_per_gpu,mem_gb_per_gpu,throughput,source,status,error\n"
    path = write(tmp_path, header
                 + "res18,V100,1,3,62.5,100,published:synergy,,\n"
                 + "res18,V100,1,4,62.5,,measured:host1,failed,timeout after 60 s\n"
                 + "res18,V100,1,5,62.5,0,measured:host1,ok,\n"
                 + "res18,V100,1,6,62.5,,measured:host1,ok,\n"
                 + "res18,V100,1,9,62.5,5,guessed,ok,\n")
    with pytest.raises(ContractError) as exc:
        PROFILES.load(path)
    lines = problems(exc)
    assert f"{path}:4:throughput: must be greater than 0, got 0" in lines
    assert any(line.startswith(f"{path}:6:source: 'guessed' does not match") for line in lines)
    assert len(lines) == 2  # the failed point (row 3) is valid: failed, with a reason, no throughput


def test_failed_points_are_the_only_rows_without_throughput(tmp_path):
    header = "model,gpu_type,num_gpus,cpus_per_gpu,mem_gb_per_gpu,throughput,status\n"
    path = write(tmp_path, header + "res18,V100,1,6,62.5,,ok\n")
    with pytest.raises(ContractError, match="only a failed point may omit it"):
        PROFILES.load(path)


def test_hints_need_distinct_ranks_and_one_plan(tmp_path):
    header = ("model,num_gpus,gpu_type,rank,cpus_per_gpu,mem_gb_per_gpu,expected_throughput,"
              "normalized_throughput,throughput_per_dollar,plan_id\n")
    good = header + "res18,1,A100,1,12,62.5,900,2.4,300,p1\nres18,1,V100,2,9,62.5,450,2.4,180,p1\n"
    assert HINTS.load(write(tmp_path, good))["rank"].tolist() == [1, 2]
    bad = header + "res18,1,A100,1,12,62.5,900,2.4,300,p1\nres18,1,V100,1,9,62.5,450,2.4,180,p2\n"
    with pytest.raises(ContractError) as exc:
        HINTS.load(write(tmp_path, bad, "bad.csv"))
    text = str(exc.value)
    assert "rank used twice" in text and "a hint table comes from one plan" in text


def test_demand_from_trace_shares_gpu_seconds():
    trace = TRACE.validate(pd.DataFrame({
        "job_id": ["1", "2", "3"], "model": ["res18", "res18", "gnmt"], "num_gpus": [1, 1, 2],
        "arrival_s": [0.0, 1.0, 2.0], "duration_s": [100.0, 100.0, 100.0]}))
    mix = demand_from_trace(trace)
    assert mix.set_index(["model", "num_gpus"])["share"].to_dict() == {("gnmt", 2): 0.5, ("res18", 1): 0.5}


PLAN = {
    "plan_id": "p-20261129", "created_at": "2026-11-29T12:00:00Z", "budget_per_hour": 100.0,
    "cost_per_hour": 98.5, "node_counts": {"aws:p4d.24xlarge": 3}, "objective": 41.0, "lp_bound": 41.5,
    "gap": 0.012, "solver": "highs", "solve_seconds": 0.4, "inputs": {"catalog": "sha256:ab"},
}


def test_plan_round_trips_declared_and_extra_fields(tmp_path):
    plan = Plan.model_validate({**PLAN, "stale_gpu_types": ["T4"], "from_the_future": 1})
    path = write_plan(plan, tmp_path / "plan.json")
    again = load_plan(path)
    assert again == plan and again.stale_gpu_types == ["T4"] and again.model_extra == {"from_the_future": 1}
    validate_file(str(path), "plan")
    assert fingerprint(path).startswith("sha256:") and len(fingerprint(path)) == 71


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cost_per_hour": 120.0}, "exceeds budget_per_hour"),
        ({"lp_bound": 40.0}, "is below the objective"),
        ({"node_counts": {"x": -1}}, "node_counts.x"),
        ({"gap": float("nan")}, "gap"),
        ({"plan_id": ""}, "plan_id"),
    ],
)
def test_bad_plans_name_the_field(tmp_path, change, message):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**PLAN, **change}))
    with pytest.raises(ContractError, match=message.replace(".", r"\.")):
        load_plan(path)


def test_a_plan_that_is_not_json_says_so(tmp_path):
    path = write(tmp_path, "{not json", "plan.json")
    with pytest.raises(ContractError, match="not JSON"):
        load_plan(path)


@pytest.mark.parametrize(("data", "message"), [
    (b'{"plan_id": "\xff"}', "not a plan JSON file: not UTF-8 text (byte 13)"),
    (b"[" * 100_000, "not a plan: JSON nested too deeply")],
                         ids=["not-utf8", "deep"])
def test_a_plan_that_is_no_text_or_too_deep_says_so_in_one_line(tmp_path, data, message):
    """Issue 30: these raised UnicodeDecodeError and RecursionError (a 500 from the hint store's reload)."""
    path = tmp_path / "plan.json"
    path.write_bytes(data)
    with pytest.raises(ContractError) as info:
        load_plan(path)
    assert str(info.value) == f"{path}: {message}"
