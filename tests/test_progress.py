"""Progress of long steps: INFO lines off a terminal (throttled, with percent and ETA, a heartbeat), a bar on one."""

from __future__ import annotations

import io
import logging
import threading

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from hetplan.cli import app
from hetplan.progress import Reporter, clock_text, eta_seconds, nested, running
from hetplan.reference import build_reference
from hetplan.sensitivity import curves, fit_profiles

LOGGER = "hetplan.progress"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lines(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)

    def messages() -> list[str]:
        out = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        caplog.clear()
        return out

    return messages


@pytest.fixture
def clock():
    return FakeClock()


def test_eta_and_clock_text():
    assert eta_seconds(10.0, 1, 4) == 30.0
    assert eta_seconds(10.0, 0, 4) is None and eta_seconds(10.0, 1, 0) is None
    assert [clock_text(s) for s in (None, 0, 59.6, 61, 3725)] == ["?", "0:00", "1:00", "1:01", "1:02:05"]


def test_lines_say_percent_done_and_eta(lines, clock):
    with Reporter("fit", interval=10, clock=clock, ticking=False) as progress:
        progress(0, 4, "fitting a")
        clock.now += 10
        progress(1, 4, "fitting b")
        clock.now += 10
        progress(2, 4, "fitting c")
    assert lines() == [
        "fit: fitting a, 0/4 (0%), 0:00 elapsed, ETA ?",
        "fit: fitting b, 1/4 (25%), 0:10 elapsed, ETA 0:30",
        "fit: fitting c, 2/4 (50%), 0:20 elapsed, ETA 0:20",
        "fit: 4/4 (100%) in 0:20, last fitting c",
    ]


def test_at_most_one_line_per_interval_but_always_the_first_and_last(lines, clock):
    with Reporter("plan", interval=10, clock=clock, ticking=False) as progress:
        for done in range(100):  # a step every second for 100 s
            progress(done, 100, f"step {done}")
            clock.now += 1
        progress(100, 100, "done")
        said = lines()
    assert said[0] == "plan: step 0, 0/100 (0%), 0:00 elapsed, ETA ?"
    assert said[-1] == "plan: 100/100 (100%) in 1:40, last done"
    steps = [int(s.split("step ")[1].split(",")[0]) for s in said[1:-1]]
    assert steps == list(range(10, 100, 10))  # one line per 10 s in between, no more
    assert lines() == []  # the phase ended with its last line: nothing more at exit


def test_heartbeat_names_what_still_runs_and_for_how_long(lines, clock):
    with Reporter("evaluate", interval=10, clock=clock, ticking=False) as progress:
        clock.now += 9
        progress.tick()
        assert lines() == []
        clock.now += 2
        progress.tick()
        assert lines() == ["evaluate: still running, 0:11 elapsed"]  # before any step is known
        progress(2, 8, "replaying status quo")
        lines()
        clock.now += 5
        progress.tick()
        assert lines() == []
        clock.now += 6
        progress.tick()
        progress.tick()
        assert lines() == ["evaluate: still replaying status quo, 2/8 (25%), 0:11 elapsed, ETA 0:33"]
        clock.now += 10
        progress.tick()
        assert lines() == ["evaluate: still replaying status quo, 2/8 (25%), 0:21 elapsed, ETA 1:03"]


def test_one_long_step_beats_every_interval(lines, clock):
    with running("simulate", "simulating 3,000 jobs", interval=10, clock=clock, ticking=False) as step:
        for _ in range(7):
            clock.now += 5
            step.tick()
    assert lines() == ["simulate: simulating 3,000 jobs, 0:00 elapsed",
                       "simulate: still simulating 3,000 jobs, 0:10 elapsed",
                       "simulate: still simulating 3,000 jobs, 0:20 elapsed",
                       "simulate: still simulating 3,000 jobs, 0:30 elapsed",
                       "simulate: simulating 3,000 jobs in 0:35"]


def test_the_heartbeat_thread_ticks_on_its_own(lines):
    seen = threading.Event()

    class Spy(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "still" in record.getMessage():
                seen.set()

    spy = Spy()
    logging.getLogger(LOGGER).addHandler(spy)
    try:
        with running("simulate", "one long step", interval=0.05):
            assert seen.wait(10), "no heartbeat line from the ticking thread"
    finally:
        logging.getLogger(LOGGER).removeHandler(spy)


def test_phases_and_nested_steps_read_in_order(lines, clock):
    with Reporter("evaluate", interval=10, clock=clock, ticking=False) as progress:
        progress(0, 2, "planning for rho 0.8")
        plan = nested(progress, "planning for rho 0.8")
        clock.now += 3
        plan(0, 3, "proposing status quo")  # a phase ...
        clock.now += 3
        plan(3, 3, "proposed")
        plan(0, 2, "replaying status quo")  # ... then the next
        clock.now += 4
        progress(1, 2, "status quo | las | rho 0.8")  # the step moves on: its sub-steps are over
        clock.now += 20
    assert lines() == [
        "evaluate: planning for rho 0.8, 0/2 (0%), 0:00 elapsed, ETA ?",
        "evaluate > planning for rho 0.8: proposing status quo, 0/3 (0%), 0:00 elapsed, ETA ?",
        "evaluate > planning for rho 0.8: 3/3 (100%) in 0:03, last proposed",
        "evaluate > planning for rho 0.8: replaying status quo, 0/2 (0%), 0:00 elapsed, ETA ?",
        "evaluate > planning for rho 0.8: 2/2 (100%) in 0:04, last replaying status quo",
        "evaluate: 2/2 (100%) in 0:30, last status quo | las | rho 0.8",
    ]


def test_a_failed_step_says_where_it_stopped(lines, clock):
    with pytest.raises(ValueError), Reporter("plan", clock=clock, ticking=False) as progress:
        progress(3, 17, "proposing only A100")
        clock.now += 65
        raise ValueError("solver gave up")
    assert lines()[-1] == "plan: stopped at 3/17 (proposing only A100) after 1:05"


def test_nested_prefixes_labels_for_any_other_callback():
    heard = []
    sub = nested(lambda done, total, label: heard.append((done, total, label)), "planning")
    assert sub is not None
    sub(1, 5, "replaying status quo")
    assert heard == [(1, 5, "planning: replaying status quo")]
    assert nested(None, "planning") is None


def test_a_terminal_gets_a_bar_with_eta(lines, clock):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    with Reporter("fit", console, clock=clock) as progress:
        assert "fit" in out.getvalue()  # a row with its clock before the first step is known
        progress(0, 4, "fitting a")
        clock.now += 10
        progress(1, 4, "fitting b")
        drawn = out.getvalue()
    assert "fitting b" in drawn and "1/4 (25%) ETA 0:30" in drawn and "0:00:10" in drawn
    assert "fit: 4/4 (100%) in 0:10" in out.getvalue()  # the phase's summary stays above the (transient) bar
    assert lines() == []  # no log lines on a terminal


def test_fit_profiles_reports_every_pair(published_pairs):
    heard = []
    fit_profiles(published_pairs, progress=lambda done, total, label: heard.append((done, total, label)),
                 workers=1)
    pairs = published_pairs.groupby(["model", "gpu_type"]).ngroups
    assert heard[0] == (0, pairs, f"fitting {pairs} (model, GPU type) pairs")
    assert [h[0] for h in heard] == list(range(pairs + 1))
    assert {h[2] for h in heard[1:]} == {f"{m} on {g}" for m, g in
                                         published_pairs.groupby(["model", "gpu_type"]).groups}


@pytest.mark.slow
def test_fitting_in_processes_reports_every_pair_and_fits_the_same(published_pairs, monkeypatch):
    monkeypatch.setattr(curves, "PARALLEL_MIN_PAIRS", 1)
    heard = []
    parallel = fit_profiles(published_pairs, gpu_types=["T4"], workers=2,
                            progress=lambda done, total, label: heard.append(done))
    serial = fit_profiles(published_pairs, gpu_types=["T4"], workers=1)
    pd.testing.assert_frame_equal(parallel.curves, serial.curves)
    assert [(f.model, f.gpu_type) for f in parallel.fits] == [(f.model, f.gpu_type) for f in serial.fits]
    assert heard == list(range(published_pairs.groupby(["model", "gpu_type"]).ngroups + 1))


def test_cli_fit_logs_progress_per_pair_off_a_terminal(tmp_path, published_pairs, lines):
    profiles = tmp_path / "profiles.csv"
    published_pairs.to_csv(profiles, index=False)
    result = CliRunner().invoke(app, ["fit", "--profiles", str(profiles), "--out", str(tmp_path / "c.parquet"),
                                      "--no-mlflow"])
    assert result.exit_code == 0, result.output
    said = lines()
    pairs = published_pairs.groupby(["model", "gpu_type"]).ngroups
    assert said[0] == f"fit: fitting {pairs} (model, GPU type) pairs, 0/{pairs} (0%), 0:00 elapsed, ETA ?"
    assert said[-1].startswith(f"fit: {pairs}/{pairs} (100%) in ")
    assert all("%" in s for s in said)
    assert "\x1b[" not in result.output  # no bar drawn into a pipe


@pytest.fixture(scope="module")
def published_pairs() -> pd.DataFrame:
    """Three models of the published V100 profiles: small enough to fit in a second or two."""
    published = build_reference().published
    return published[published["model"].isin(sorted(published["model"].unique())[:3])].reset_index(drop=True)
