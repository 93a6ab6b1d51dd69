"""`hetplan trace export`: the allocator's journal becomes the next night's workload.

A literal action log gives the spans, jobs and leftovers by hand; then a 200-job trace runs through the simulator on
the example fleet with a durable (SQLite) journal, `hetplan serve` reopens that database on loopback, and the trace
exported over HTTP (and from the database) gives back every finished job's model and GPUs, its run time and its
duration at the reference allocation within 1 %, and `hetplan plan --workload` reads it as is.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pandas as pd
import pytest
from servers import Server
from typer.testing import CliRunner

from hetplan.allocator.history import Histories, job_histories
from hetplan.allocator.journal import LoggedAction
from hetplan.allocator.actions import Action
from hetplan.allocator.spec import Allocation
from hetplan.cli import app

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "my-cluster"


def _a(job: str, node: str, gpus: int, cores: int, model: str = "res50", gpu: str = "V100") -> Allocation:
    return Allocation(job, model, node, gpu, gpus, cores * 1000, gpus * 64 * 1024, None, "hint", "hinted")


def test_the_log_gives_each_jobs_spans_and_leaves_out_what_it_cannot_know():
    log = [
        LoggedAction(1, 0.0, Action("stop", "old", (_a("old", "n1", 1, 3),), ())),  # its start is gone: partial
        LoggedAction(2, 10.0, Action("start", "a", (), (_a("a", "n1", 2, 6),))),
        LoggedAction(3, 70.0, Action("resize", "a", (_a("a", "n1", 2, 6),), (_a("a", "n1", 2, 12),))),
        LoggedAction(4, 100.0, Action("start", "g", (), (_a("g#0", "n1", 8, 24), _a("g#1", "n2", 8, 24)))),
        LoggedAction(5, 130.0, Action("stop", "a", (_a("a", "n1", 2, 12),), ())),
        LoggedAction(6, 200.0, Action("stop", "g", (), ())),
        LoggedAction(7, 250.0, Action("start", "g", (), (_a("g#0", "n3", 16, 48, gpu="A100"),))),  # restarted
        LoggedAction(8, 300.0, Action("stop", "g", (), ())),
        LoggedAction(9, 400.0, Action("start", "r", (), (_a("r", "n2", 1, 3),))),  # still running
    ]
    histories = job_histories(log)
    assert (histories.partial, histories.latest) == (1, 9)
    a, g, r = histories.jobs
    assert (a.job_id, a.model, a.num_gpus, a.done, a.run_s) == ("a", "res50", 2, True, 120.0)
    assert [(s.start, s.end, s.parts[0].cpu_m) for s in a.spans] == [(10.0, 70.0, 6000), (70.0, 130.0, 12000)]
    assert (g.num_gpus, g.done, g.run_s, len(g.spans[0].parts)) == (16, True, 150.0, 2)
    assert (r.done, r.run_s) == (False, 0.0)
    assert Histories.from_dict(histories.to_dict()) == histories  # what GET /v1/jobs carries



def test_a_job_first_seen_at_a_restart_is_partial_not_guessed(tmp_path):
    import sqlite3

    from hetplan.allocator.core import Allocator
    from hetplan.allocator.durable import SqliteJournal, read_actions
    from hetplan.allocator.spec import Job, Node

    db = tmp_path / "allocator.db"
    allocator = Allocator([Node("n1", "V100", 4, 32, 256)], "proportional", journal=SqliteJournal(db, "NORMAL"),
                          retain=1)  # the log keeps only the newest action
    first = allocator.allocate(Job("p", "res50", 1))
    allocator.apply_actions([Action("stop", "p", (first,), ())])  # preempted: it may come back
    assert allocator.restore(first)  # its restart: the first start and the stop have fallen out of the log
    for logged in (allocator.log.entries(), read_actions(db)):
        assert [(x.action.kind, x.restart) for x in logged] == [("start", True)]
        histories = job_histories(logged)
        assert (histories.jobs, histories.partial) == ([], 1)
    allocator.journal.close()
    with sqlite3.connect(db) as raw:  # a journal from before restarts were marked: still read, as a start
        raw.execute("UPDATE actions SET kind = 'start'")
    assert [(x.action.kind, x.restart) for x in read_actions(db)] == [("start", False)]


@pytest.mark.parametrize("how", ["option", "env"])
def test_serve_sets_how_many_actions_the_log_keeps(tmp_path, monkeypatch, how):
    import uvicorn

    from hetplan.allocator import service

    seen = []
    monkeypatch.setattr(service, "create_app", seen.append)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    args, env = (["--action-log", "50000"], {}) if how == "option" else ([], {"HETPLAN_ALLOCATOR_ACTION_LOG": "50000"})
    result = CliRunner().invoke(app, ["serve", "--db", str(tmp_path / "a.db"), *args], env=env)
    assert result.exit_code == 0, result.output
    assert [s.action_log for s in seen] == [50_000]


def test_export_asks_for_no_token_as_get_v1_jobs_takes_none():
    result = CliRunner().invoke(app, ["trace", "export", "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "--out" in result.output
    assert "--token" not in result.output and "HETPLAN_ALLOCATOR_TOKEN" not in result.output

def test_durations_are_run_times_times_the_speed_of_each_span():
    from hetplan.traces.history import RUN_TIME, trace_from_history

    class Speeds:  # V100 at the reference: 1; every core above 3 per GPU: +10 %; no curve on T4
        def speed(self, model, gpu_type, gpus, cpu_m, mem_mib):
            if gpu_type != "V100":
                raise KeyError(gpu_type)
            return 1.0 + 0.1 * (cpu_m / 1000 / gpus - 3)

    log = [LoggedAction(1, 0.0, Action("start", "a", (), (_a("a", "n1", 2, 6),))),
           LoggedAction(2, 100.0, Action("resize", "a", (_a("a", "n1", 2, 6),), (_a("a", "n1", 2, 12),))),
           LoggedAction(3, 200.0, Action("stop", "a", (), ())),
           LoggedAction(4, 50.0, Action("start", "t", (), (_a("t", "n9", 1, 4, gpu="T4"),))),
           LoggedAction(5, 80.0, Action("stop", "t", (), ()))]
    result = trace_from_history(job_histories(log), Speeds())
    rows = result.trace.set_index("job_id")
    assert rows.loc["a", "duration_s"] == pytest.approx(100 * 1.0 + 100 * 1.3)
    assert rows.loc["a", "run_s"] == 200.0 and rows.loc["t", "arrival_s"] == 50.0
    assert rows.loc["t", "duration_s"] == 30.0 and rows.loc["t", "duration_from"].startswith(RUN_TIME)
    assert any("no curve for res50 on T4" in w for w in result.warnings)


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict:
    """The example's 200 jobs simulated on the example fleet, every change journaled in SQLite as the service does."""
    from hetplan.allocator.core import Allocator
    from hetplan.allocator.durable import SqliteJournal
    from hetplan.contracts import PROFILES, TRACE
    from hetplan.planner.entry import read_fleet
    from hetplan.reference import build_reference
    from hetplan.sim.engine import SimConfig, Simulator
    from hetplan.sim.setups import nodes_from_counts, truth_hints
    from hetplan.sim.truth import TruthCurves
    from hetplan.sim.workload import prepare_workload

    root = tmp_path_factory.mktemp("export")
    profiles = PROFILES.write(build_reference().derived, root / "profiles.csv")
    truth = TruthCurves.from_profiles(PROFILES.load(profiles))
    trace = TRACE.load(EXAMPLE / "trace.csv")
    fleet = read_fleet(EXAMPLE / "fleet.csv")
    nodes = nodes_from_counts(fleet, dict(zip(fleet["name"], fleet["count"])))
    db = root / "allocator.db"
    jobs = prepare_workload(trace, truth.models, load=6.0).jobs  # busy: jobs queue, are preempted and move
    hints = truth_hints(truth, jobs.drop_duplicates(["model", "num_gpus"]), ["A100", "T4", "V100"])
    allocator = Allocator(nodes, "hint", hints, journal=SqliteJournal(db, "NORMAL"), retain=100_000)
    result = Simulator(jobs, allocator, truth, SimConfig(migration_s=0.0, resize_s=0.0)).run()
    allocator.journal.close()
    return {"root": root, "db": db, "profiles": profiles, "trace": trace, "sim": result.jobs,
            "actions": allocator.log.latest}


def _compare(exported: pd.DataFrame, ran: dict) -> None:
    sim = ran["sim"].set_index("job_id")
    done = sim[sim["status"] == "completed"]
    got = exported.set_index("job_id").astype({"run_s": float})  # an extra column: loaded as text
    assert len(done) >= 150 and set(got.index) == set(done.index)
    original = ran["sim"].set_index("job_id").loc[got.index]
    assert (got["model"] == original["model"]).all() and (got["num_gpus"] == original["num_gpus"]).all()
    assert ((got["run_s"] - done.loc[got.index, "run_s"]).abs() <= 0.01 * done.loc[got.index, "run_s"]).all()
    error = (got["duration_s"] / original["duration_s"] - 1).abs()
    assert error.max() <= 0.01, error.sort_values().tail()
    assert (got["arrival_s"] == done.loc[got.index, "start_s"] - done["start_s"].min()).all()


@pytest.mark.slow
def test_a_running_allocator_exports_the_jobs_it_ran_within_one_percent(ran, tmp_path):
    from hetplan.contracts import TRACE

    assert ran["actions"] > 500  # 200 starts and stops, and the co-adaptive rounds' preemptions and moves
    (tmp_path / "hints").mkdir()
    server = Server(ran["root"], tmp_path / "hints").start()  # reopens the simulation's database
    try:
        body = httpx.get(server.url + "/v1/jobs", timeout=30).json()
        out = tmp_path / "from-http.csv"
        result = CliRunner().invoke(app, ["trace", "export", "--url", server.url, "--out", str(out),
                                          "--curves", str(tmp_path / "none.parquet"), "--profiles",
                                          str(ran["profiles"])])
    finally:
        server.stop()
    assert body["partial"] == 0 and len(body["jobs"]) == len(ran["sim"])
    assert result.exit_code == 0, result.output
    assert f"exported {len(TRACE.load(out))} jobs" in result.output and "from the profiles" in result.output
    _compare(TRACE.load(out), ran)


def test_the_database_exports_the_same_trace_and_plan_reads_it(ran, tmp_path):
    from hetplan.contracts import PROFILES
    from hetplan.traces.history import workspace_speeds
    from hetplan.traces.sources import read_source

    speeds, how = workspace_speeds(None, PROFILES.load(ran["profiles"]))
    sourced = read_source(f"allocator:{ran['db']}", speeds=speeds)
    assert "profiles" in how
    _compare(sourced.trace, ran)


# --- an answer or a database that is no job history (issue 30) ------------------------------------------------------

NOT_HISTORIES = {"not-utf8": (b'{"jobs": "\xff"}', "not a JSON answer"), "deep": (b"[" * 100_000, "not a JSON answer"),
                 "a-list": (b"[]", "not the allocator's job history (TypeError"),
                 "no-jobs": (b"{}", "not the allocator's job history (KeyError: 'jobs')"),
                 "bad-span": (b'{"jobs": [{"job_id": "a", "model": "m", "spans": [{"start": "x"}]}], "partial": 0, '
                              b'"latest": 1}', "not the allocator's job history (ValueError"),
                 "nan": (b'{"jobs": [], "partial": NaN, "latest": 1}', "not the allocator's job history (ValueError")}


@pytest.fixture(scope="module")
def answering():
    """A server on loopback that answers every GET with the body `answering.body` (some other service's URL)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Answer(BaseHTTPRequestHandler):
        body = b""

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(Answer.body)))
            self.end_headers()
            self.wfile.write(Answer.body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Answer, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.mark.parametrize("case", NOT_HISTORIES)
def test_an_answer_that_is_no_job_history_is_refused_in_one_line_naming_the_url(answering, case):
    """Issue 30: these raised RecursionError, TypeError, KeyError or ValueError from `hetplan trace export --url`."""
    from hetplan.contracts import ContractError
    from hetplan.traces.sources import from_allocator

    handler, url = answering
    handler.body, expected = NOT_HISTORIES[case]
    with pytest.raises(ContractError) as info:
        from_allocator(url)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{url}/v1/jobs: {expected}"), message


@pytest.mark.parametrize("parts", [b"\xff\xfe", "not json", '[[], [{"x": 1}]]', "[1, 2, 3]"])
def test_a_database_with_an_unreadable_action_is_refused_naming_it_and_the_action(tmp_path, parts):
    """Issue 30: an action row whose parts are not UTF-8, not JSON or no allocations raised a bare ValueError or
    TypeError from `hetplan trace export --db` and from the allocator's start."""
    import sqlite3

    from hetplan.allocator import DurableAllocator, StateError
    from hetplan.allocator.spec import Job, Node
    from hetplan.contracts import ContractError
    from hetplan.traces.sources import from_allocator

    db = tmp_path / "allocator.db"
    with DurableAllocator(db, "proportional") as allocator:
        allocator.upsert_node(Node("v1", "V100", 8, 64, 488))
        allocator.allocate(Job("j", "res50", 1))
        allocator.release("j")
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE actions SET parts = ? WHERE seq = 2", (parts,))
    with pytest.raises(ContractError) as info:
        from_allocator(str(db))
    assert str(info.value).startswith(f"{db}: action 2 is unreadable (") and "\n" not in str(info.value)
    with pytest.raises(StateError, match=f"^{db}: action 2 is unreadable"):
        DurableAllocator(db, "proportional")
