"""The hint store: atomic, versioned publishing; LATEST never names a half-written or failed version."""

import os
import signal
import subprocess
import sys
import threading
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from hetplan.cli import app
from hetplan.contracts import ContractError, Plan, write_plan
from hetplan.hints import (
    LATEST, STORE_ENV, HintSet, HintStore, PublishedHints, VersionExistsError, default_store_root, validate_hints,
)

HINTS_CSV = """model,num_gpus,gpu_type,rank,cpus_per_gpu,mem_gb_per_gpu,expected_throughput,normalized_throughput,throughput_per_dollar,plan_id
res18,1,V100,1,9,62.5,1200,1.0,390,{pid}
res18,1,Tesla-T4,2,6,30,400,0.33,760,{pid}
transformer,2,A100,1,1,20,9000,1.0,270,{pid}
"""


def make_plan(pid: str) -> Plan:
    return Plan(plan_id=pid, created_at=datetime(2025, 1, 2, tzinfo=timezone.utc), budget_per_hour=100.0,
                cost_per_hour=97.5, node_counts={"aws:p3.16xlarge": 2, "aws:g4dn.12xlarge": 3}, objective=10.0,
                lp_bound=10.5, gap=0.047, solver="highs", solve_seconds=1.5)


def hints_frame(pid: str) -> pd.DataFrame:
    from io import StringIO

    return pd.read_csv(StringIO(HINTS_CSV.format(pid=pid)), dtype=str)


def publish(store: HintStore, pid: str, **kwargs) -> PublishedHints:
    return store.publish(make_plan(pid), hints_frame(pid), **kwargs)


def test_publish_then_load_round_trips(tmp_path):
    store = HintStore(tmp_path / "store")
    assert store.latest_version() is None and store.versions() == []
    published = publish(store, "plan-a", artifacts={"solve.log": b"optimal\n"})
    assert published.version == "plan-a" and published.path == tmp_path / "store" / "plan-a"
    assert (tmp_path / "store" / LATEST).read_text() == "plan-a\n"
    assert sorted(p.name for p in published.path.iterdir()) == ["hints.parquet", "plan.json", "published.json",
                                                                 "solve.log"]
    loaded = store.load()
    assert loaded.version == "plan-a" and loaded.plan == make_plan("plan-a")
    assert list(loaded.hints["gpu_type"]) == ["V100", "T4", "A100"]  # normalised on the way in
    pd.testing.assert_frame_equal(loaded.hints, published.hints)
    assert store.load("plan-a").version == "plan-a"


def test_latest_is_readable_like_the_versions_it_names(tmp_path):
    """LATEST gets the mode a plain write would give it, not mkstemp's 0600: other users' allocators read it."""
    old = os.umask(0o022)
    try:
        store = HintStore(tmp_path / "store")
        published = publish(store, "plan-a")
    finally:
        os.umask(old)
    assert (store.latest_path.stat().st_mode & 0o777) == 0o644
    assert (store.latest_path.stat().st_mode & 0o777) == ((published.path / "plan.json").stat().st_mode & 0o777)


def test_latest_follows_the_newest_and_versions_are_in_publish_order(tmp_path):
    store = HintStore(tmp_path, keep=10)
    for pid in ["zz", "aa", "mm"]:  # publish order, not name order
        publish(store, pid)
    assert store.versions() == ["zz", "aa", "mm"]
    assert store.latest_version() == "mm"


def test_prune_keeps_the_newest_n(tmp_path):
    store = HintStore(tmp_path, keep=2)
    for i in range(5):
        publish(store, f"p{i}")
    assert store.versions() == ["p3", "p4"]
    assert not any(p.name.startswith(".staging-") or p.name.startswith(".trash-") for p in tmp_path.iterdir())


def test_prune_never_removes_the_version_latest_names(tmp_path):
    store = HintStore(tmp_path, keep=5)
    for pid in ["p1", "p2", "p3"]:
        publish(store, pid)
    store._switch_latest("p1")  # an operator rolled LATEST back by hand
    store.keep = 1
    store._prune()
    assert store.versions() == ["p1", "p3"]
    assert store.load().version == "p1"


def test_republishing_a_version_is_an_error_and_changes_nothing(tmp_path):
    store = HintStore(tmp_path)
    publish(store, "p1")
    publish(store, "p2")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(VersionExistsError, match="already published"):
        publish(store, "p1")
    assert store.latest_version() == "p2" and sorted(os.listdir(tmp_path)) == before


def test_invalid_hints_are_refused_before_the_store_is_touched(tmp_path):
    root = tmp_path / "store"
    store = HintStore(root)
    bad = hints_frame("p1")
    bad.loc[1, "cpus_per_gpu"] = "-2"
    bad.loc[2, "gpu_type"] = "bad name!"
    with pytest.raises(ContractError) as exc:
        store.publish(make_plan("p1"), bad)
    lines = [str(p) for p in exc.value.problems]
    assert "<hints>:2:cpus_per_gpu: must be greater than 0, got -2" in lines
    assert any(line.startswith("<hints>:3:gpu_type: 'bad name!' is not a GPU type name") for line in lines)
    assert not root.exists()


def test_plan_id_mismatch_is_refused_row_by_row(tmp_path):
    store = HintStore(tmp_path)
    publish(store, "p1")
    frame = hints_frame("p2")
    frame.loc[2, "plan_id"] = "other"
    with pytest.raises(ContractError) as exc:
        store.publish(make_plan("p2"), hints_frame("p1"))
    assert [str(p) for p in exc.value.problems][:1] == [
        "<hints>:1:plan_id: plan_id 'p1' does not match the plan's plan_id 'p2'"]
    with pytest.raises(ContractError) as exc:
        store.publish(make_plan("p2"), frame)
    assert "<hints>:3:plan_id: plan_id 'other' does not match the plan's plan_id 'p2'" in str(exc.value)
    assert store.latest_version() == "p1" and store.versions() == ["p1"]


@pytest.mark.parametrize("pid", ["../evil", "LATEST", ".hidden", "a/b", "x" * 201])
def test_plan_ids_that_cannot_name_a_directory_are_refused(tmp_path, pid):
    with pytest.raises(ContractError, match="cannot name a store version"):
        publish(HintStore(tmp_path / "s"), pid)
    assert not (tmp_path / "s").exists()


def test_reserved_artifact_names_are_refused(tmp_path):
    with pytest.raises(ContractError, match="not allowed"):
        publish(HintStore(tmp_path), "p1", artifacts={"plan.json": b"{}"})
    assert HintStore(tmp_path).latest_version() is None


def test_a_failed_latest_switch_leaves_latest_on_the_previous_version(tmp_path, monkeypatch):
    store = HintStore(tmp_path)
    publish(store, "good")
    real_replace = os.replace

    def failing_replace(src, dst, *args, **kwargs):
        if Path(dst).name == LATEST:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space"):
        publish(store, "next")
    monkeypatch.setattr(os, "replace", real_replace)
    assert store.latest_version() == "good"
    assert store.load().version == "good"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".LATEST.")]  # no temp file left behind
    assert publish(store, "after").version == "after" and store.latest_version() == "after"


CRASH_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_hints import make_plan, hints_frame
    from hetplan.hints import HintStore, LATEST

    store = HintStore({root!r})
    real_replace = os.replace

    def crash(src, dst, *a, **k):
        if Path(dst).name == LATEST:
            os.kill(os.getpid(), signal.SIGKILL)  # die between "version written" and "LATEST switched"
        return real_replace(src, dst, *a, **k)

    os.replace = crash
    store.publish(make_plan("crashed"), hints_frame("crashed"))
""")


def test_a_publisher_killed_between_the_two_steps_leaves_latest_on_the_previous_version(tmp_path):
    root = tmp_path / "store"
    store = HintStore(root)
    publish(store, "good")
    script = CRASH_SCRIPT.format(tests=str(Path(__file__).parent), root=str(root))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (root / "crashed" / "published.json").exists()  # the version was complete ...
    assert [p for p in root.iterdir() if p.name.startswith(".LATEST.")]  # ... the switch was under way
    assert store.latest_version() == "good"  # ... and LATEST never moved
    assert store.load().version == "good"
    publish(store, "next")  # the next publisher cleans up the crash's leftovers
    assert store.latest_version() == "next"
    assert not [p for p in root.iterdir() if p.name.startswith(".") and p.name != ".lock"]


def test_loading_missing_or_corrupt_versions_is_a_contract_error(tmp_path):
    store = HintStore(tmp_path)
    with pytest.raises(ContractError, match="no published hints"):
        store.load()
    publish(store, "p1")
    with pytest.raises(ContractError, match="no such published version"):
        store.load("p0")
    (tmp_path / "p1" / "hints.parquet").write_bytes(b"PAR1garbage")
    with pytest.raises(ContractError, match="not a readable Parquet file"):
        store.load()
    (tmp_path / LATEST).write_text("../../etc\n")
    with pytest.raises(ContractError, match="does not name a version"):
        store.latest_version()


def test_concurrent_publishers_each_publish_once(tmp_path):
    store = HintStore(tmp_path, keep=20)
    errors: list[BaseException] = []

    def run(pid: str) -> None:
        try:
            HintStore(tmp_path, keep=20).publish(make_plan(pid), hints_frame(pid))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"c{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(store.versions()) == [f"c{i}" for i in range(6)]
    assert store.latest_version() == store.versions()[-1]


def test_default_store_root_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(STORE_ENV, raising=False)
    assert default_store_root() == Path(".hetplan/hints")
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "elsewhere"))
    assert default_store_root() == tmp_path / "elsewhere"


def test_hint_set_indexes_classes_by_rank_case_insensitively():
    hints = HintSet.from_frame(hints_frame("p1"))
    assert hints.version == "p1" and len(hints) == 3
    assert [e.gpu_type for e in hints.lookup("RES18", 1)] == ["V100", "T4"]
    assert hints.lookup("res18", 2) == () and hints.lookup("vgg", 1) == ()
    assert validate_hints(make_plan("p1"), hints_frame("p1"))["num_gpus"].tolist() == [1, 1, 2]


# --- CLI ------------------------------------------------------------------------------------------------------

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def _files(tmp_path: Path, pid: str, hints_pid: str | None = None) -> tuple[Path, Path]:
    plan = write_plan(make_plan(pid), tmp_path / f"{pid}.json")
    hints = tmp_path / f"{pid}-hints.csv"
    hints.write_text(HINTS_CSV.format(pid=hints_pid or pid))
    return plan, hints


def test_cli_publish_and_show(tmp_path):
    plan, hints = _files(tmp_path, "plan-7")
    store = tmp_path / "store"
    result = runner.invoke(app, ["publish", "--plan", str(plan), "--hints", str(hints), "--store", str(store)])
    assert result.exit_code == 0, result.output
    assert "published plan-7" in result.stdout and HintStore(store).latest_version() == "plan-7"
    result = runner.invoke(app, ["hints", "show", "--store", str(store)], env=WIDE)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "hints plan-7 (LATEST)" in out and "solver highs" in out and "cost $97.50/h" in out
    assert out.index("res18") < out.index("transformer") and out.index("V100") < out.index("T4")
    first = runner.invoke(app, ["hints", "show", "--store", str(store), "--ranks", "1"], env=WIDE)
    assert first.exit_code == 0, first.output
    assert "rank <= 1 of 3 rows" in first.stdout and "V100" in first.stdout and "T4" not in first.stdout


def test_cli_publish_parquet_and_store_from_environment(tmp_path):
    plan, hints_csv = _files(tmp_path, "pq")
    hints = tmp_path / "h.parquet"
    hints_frame("pq").to_parquet(hints)
    store = tmp_path / "envstore"
    result = runner.invoke(app, ["publish", "--plan", str(plan), "--hints", str(hints)], env={STORE_ENV: str(store)})
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["hints", "show", "--version", "pq"], env={STORE_ENV: str(store), **WIDE})
    assert result.exit_code == 0 and "hints pq (LATEST)" in result.stdout


def test_cli_publish_bad_input_names_file_row_column_and_publishes_nothing(tmp_path):
    store = tmp_path / "store"
    plan, hints = _files(tmp_path, "ok")
    args = ["publish", "--plan", str(plan), "--hints", str(hints), "--store", str(store)]
    assert runner.invoke(app, args).exit_code == 0
    plan2, hints2 = _files(tmp_path, "next", hints_pid="ok")
    text = hints2.read_text().replace("res18,1,Tesla-T4,2,6,", "res18,1,Tesla-T4,2,zero,")
    hints2.write_text(text)
    result = runner.invoke(app, ["publish", "--plan", str(plan2), "--hints", str(hints2), "--store", str(store)])
    assert result.exit_code == 1
    assert f"{hints2}:3:cpus_per_gpu: not a number: 'zero'" in result.stderr
    assert f"{hints2}:2:plan_id: plan_id 'ok' does not match the plan's plan_id 'next'" in result.stderr
    assert HintStore(store).latest_version() == "ok" and HintStore(store).versions() == ["ok"]


def test_cli_show_without_a_store_is_an_error(tmp_path):
    result = runner.invoke(app, ["hints", "show", "--store", str(tmp_path / "none")])
    assert result.exit_code == 1 and "no published hints" in result.stderr
