"""A platform team's own data: `hetplan init --fleet --trace` and the nightly DAG's `resolve` (`pipeline.prepare`)
seed a workspace from their files, validated, never overwrite a file they placed, and read the workload from its
source (a file, a URL, the allocator) every night."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from hetplan.cli import app
from hetplan.contracts import FLEET, TRACE, ContractError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "my-cluster"


def _errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def test_init_seeds_your_fleet_and_trace_and_running_it_again_changes_nothing(tmp_path):
    ws = tmp_path / "ws"
    argv = ["init", "--workspace", str(ws), "--fleet", str(EXAMPLE / "fleet.csv"), "--trace",
            str(EXAMPLE / "trace.csv")]
    first = CliRunner().invoke(app, argv)
    assert first.exit_code == 0, first.output
    assert FLEET.load(ws / "fleet.csv")[["name", "count"]].values.tolist() == [["dgx-a100", 2], ["t4x4", 6],
                                                                               ["v100x8", 3]]
    assert len(TRACE.load(ws / "trace.csv")) == 200 and (ws / "catalog.csv").is_file()
    demand = pd.read_csv(ws / "demand.csv")
    assert set(demand["model"]) == set(TRACE.load(EXAMPLE / "trace.csv")["model"])  # the mix of your jobs
    files = {p: p.read_bytes() for p in ws.iterdir()}
    again = CliRunner().invoke(app, argv)
    assert again.exit_code == 0 and "nothing to write" in again.output
    assert {p: p.read_bytes() for p in ws.iterdir()} == files


def test_files_you_copied_in_are_kept_by_init_and_by_the_nightly_resolve(tmp_path):
    from hetplan.pipeline import prepare

    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("fleet.csv", "trace.csv"):
        shutil.copy(EXAMPLE / name, ws / name)
    result = CliRunner().invoke(app, ["init", "--workspace", str(ws)])
    assert result.exit_code == 0, result.output
    prepare(ws)  # what the DAG's `resolve` does with a workspace that has its files
    for name in ("fleet.csv", "trace.csv"):
        assert (ws / name).read_bytes() == (EXAMPLE / name).read_bytes()
    other = tmp_path / "other-fleet.csv"
    other.write_text("name,gpu_type,gpus,vcpus,mem_gb,count\nh100x8,H100,8,208,1800,1\n")
    refused = CliRunner().invoke(app, ["init", "--workspace", str(ws), "--fleet", str(other)])
    assert refused.exit_code == 1
    (line,) = _errors(refused.output)
    assert str(ws / "fleet.csv") in line and "your own file" in line and "--force" in line
    assert (ws / "fleet.csv").read_bytes() == (EXAMPLE / "fleet.csv").read_bytes()


@pytest.mark.parametrize(("text", "where"), [
    ("name,gpu_type,gpus,vcpus,mem_gb,count\ndgx,A100,8,many,1024,2\n", "fleet.csv:2:vcpus"),
    ("name,gpu_type,gpus,vcpus,mem_gb\ndgx,A100,8,256,1024\n", "fleet.csv:1:count"),
])
def test_a_bad_file_is_one_line_naming_file_row_and_column_and_nothing_is_written(tmp_path, text, where):
    bad = tmp_path / "fleet.csv"
    bad.write_text(text)
    ws = tmp_path / "ws"
    result = CliRunner().invoke(app, ["init", "--workspace", str(ws), "--fleet", str(bad), "--trace",
                                      str(EXAMPLE / "trace.csv")])
    assert result.exit_code == 1
    (line,) = _errors(result.output)
    assert where in line, line
    assert not ws.exists()


def test_the_nightly_source_refreshes_a_trace_it_wrote_but_never_one_you_edited(tmp_path):
    from hetplan.pipeline import prepare

    ws = tmp_path / "ws"
    trace = TRACE.load(EXAMPLE / "trace.csv")
    night1, night2 = tmp_path / "night1.csv", tmp_path / "night2.csv"
    TRACE.write(trace.iloc[:120], night1)
    TRACE.write(trace.iloc[:150], night2)
    prepare(ws, trace=str(night1))
    assert len(TRACE.load(ws / "trace.csv")) == 120
    prepare(ws, trace=str(night2))  # hetplan wrote trace.csv from the source: the next night refreshes it
    assert len(TRACE.load(ws / "trace.csv")) == 150
    assert pd.read_csv(ws / "demand.csv")["share"].sum() == pytest.approx(1.0)
    TRACE.write(trace.iloc[:10], ws / "trace.csv")  # a person edits it
    with pytest.raises(ContractError, match="your own file"):
        prepare(ws, trace=str(night1))
    assert len(TRACE.load(ws / "trace.csv")) == 10


def test_a_url_source_is_read_and_a_bad_row_is_named_by_its_url(tmp_path):
    from hetplan.traces.sources import read_source

    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(EXAMPLE / "trace.csv", served / "trace.csv")
    (served / "bad.csv").write_text("job_id,model,num_gpus,arrival_s,duration_s\nj1,res50,two,0,10\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert len(read_source(url + "/trace.csv").trace) == 200
        with pytest.raises(ContractError) as caught:
            read_source(url + "/bad.csv")
        assert str(caught.value).startswith(f"{url}/bad.csv:2:num_gpus")
        with pytest.raises(ContractError, match="HTTP 404"):
            read_source(url + "/missing.csv")
    finally:
        server.shutdown()
        thread.join(timeout=10)


def test_an_allocator_that_ran_nothing_yet_leaves_the_workspace_trace(tmp_path, caplog):
    from hetplan.allocator.durable import SqliteJournal
    from hetplan.pipeline import prepare
    from hetplan.traces.sources import EmptyHistory, read_source

    db = tmp_path / "allocator.db"
    SqliteJournal(db).close()  # a new allocator: its database, no job yet
    with pytest.raises(EmptyHistory):
        read_source(f"allocator:{db}")
    ws = tmp_path / "ws"
    prepare(ws, trace=f"allocator:{db}")
    assert len(TRACE.load(ws / "trace.csv")) == 1181  # the embedded trace, until the cluster has run jobs
    assert "no done job" in caplog.text
    result = CliRunner().invoke(app, ["trace", "export", "--db", str(db), "--out", str(tmp_path / "t.csv")])
    assert result.exit_code == 1 and len(_errors(result.output)) == 1 and not (tmp_path / "t.csv").exists()


@pytest.mark.parametrize("yours", [False, True])
def test_a_workspace_made_before_workspace_json_never_fails_the_nightly_source(tmp_path, caplog, yours):
    from hetplan.pipeline import prepare

    ws = tmp_path / "ws"
    prepare(ws)  # every file from the embedded defaults
    if yours:
        shutil.copy(EXAMPLE / "trace.csv", ws / "trace.csv")
    (ws / "workspace.json").unlink()  # as an older hetplan left it
    night = tmp_path / "night.csv"
    TRACE.write(TRACE.load(EXAMPLE / "trace.csv").iloc[:120], night)
    for _ in range(2):  # the night it gets its workspace.json, and the next
        prepare(ws, trace=str(night))
        assert len(TRACE.load(ws / "trace.csv")) == (200 if yours else 120)
    assert (ws / "workspace.json").is_file()
    kept = [r.message for r in caplog.records if "is not used" in r.message]
    assert len(kept) == (2 if yours else 0) and all(str(ws / "trace.csv") in m for m in kept)


def test_your_own_demand_mix_is_kept_when_the_trace_changes(tmp_path, caplog):
    from hetplan.pipeline import prepare

    ws = tmp_path / "ws"
    trace = TRACE.load(EXAMPLE / "trace.csv")
    night1, night2 = tmp_path / "night1.csv", tmp_path / "night2.csv"
    TRACE.write(trace.iloc[:120], night1)
    TRACE.write(trace[trace["num_gpus"] == 1], night2)
    prepare(ws, trace=str(night1))
    mine = "model,num_gpus,share\nres50,1,1.0\n"
    (ws / "demand.csv").write_text(mine)
    prepare(ws, trace=str(night2))
    assert len(TRACE.load(ws / "trace.csv")) == len(trace[trace["num_gpus"] == 1])
    assert (ws / "demand.csv").read_text() == mine
    assert "no longer matches" in caplog.text
