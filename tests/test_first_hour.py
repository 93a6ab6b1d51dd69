"""The first hour after `make main`: the printed allocator command places a job, the report opens with its four
panels, a missing file names the command that makes it, and a plot tells 20 GPU types apart."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from servers import free_port
from typer.testing import CliRunner

from hetplan.cli import app

REPO = Path(__file__).resolve().parents[1]
RUN_KEY = "20260102T000000"
CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A workspace as `make main` leaves it (its steps, small: 3 models, the demand mix, no MLflow)."""
    from hetplan.pipeline import fit_step, plan_step, prepare, publish_step, report_step

    ws = tmp_path_factory.mktemp("first-hour") / "ws"
    prepare(ws)
    fit_step(ws, RUN_KEY, [], models=["res18", "res50", "transformer"], mlflow=False)
    plan_step(ws, RUN_KEY, budget=20.0, objective="throughput", time_limit=20.0, mlflow=False)
    publish_step(ws, RUN_KEY)
    report_step(ws, RUN_KEY, mlflow=False)
    return ws


def _printed_allocator(ws: Path) -> list[str]:
    """The `Allocator:` line `make main` prints for this workspace, as argv."""
    done = subprocess.run(["make", "-n", "main", f"WORKSPACE={ws}", f"VENV={sys.prefix}", "-o",
                           f"{sys.prefix}/.installed"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if "Allocator:" in ln]
    return shlex.split(re.sub(r'^echo "Allocator:\s*|"$', "", line.strip()))


@pytest.mark.slow
def test_the_printed_allocator_places_the_first_job_on_the_plans_nodes(workspace, tmp_path):
    from hetplan.contracts import load_plan

    argv = _printed_allocator(workspace)
    assert argv[1] == "serve" and argv[argv.index("--from-plan") + 1] == str(workspace / "current/plan/plan.json")
    port = free_port()
    argv[argv.index("--port") + 1] = str(port)
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's hetplan, whatever the virtualenv's
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                health = httpx.get(url + "/healthz", timeout=1)
                if health.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        plan = load_plan(workspace / "current" / "plan" / "plan.json")
        assert health.json()["nodes"] == sum(plan.node_counts.values()) + sum(plan.owned_nodes.values())
        answer = httpx.post(url + "/v1/allocate", json={"job_id": "j1", "model": "res50", "num_gpus": 1},
                            timeout=30).json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert answer["status"] == "allocated", answer
    assert answer["allocation"]["node"].rsplit("-", 1)[0] in plan.shapes
    assert answer["hint_version"] == (workspace / "hints" / "LATEST").read_text().strip()


@pytest.mark.slow
def test_the_report_has_four_panels_and_every_picture_it_references(workspace):
    page = workspace / "report" / "report.html"
    text = page.read_text()
    for panel in ("node-mix", "curves", "jct", "needs-profiling"):
        assert '<section class="panel' in text and f'id="{panel}"' in text, panel
    pictures = re.findall(r'<img src="([^"]+)"', text)
    assert sorted(pictures) == ["curves.png", "jct.png", "node_mix.png"]
    for picture in pictures:
        data = (page.parent / picture).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000, picture
    assert "res18" in text and "derived" in text  # the top models; derived data labelled as such
    assert "a3c" in text or "needs profiling" in text.lower()
    # the decision in words comes first, the technical detail last; decision.txt says the same for `make main`
    decision = (page.parent / "decision.txt").read_text().splitlines()
    assert text.index('id="decision"') < text.index('id="node-mix"') < text.index('id="detail"')
    assert decision[0].startswith(("Rent ", "Add no node", "Keep what you have")) and "owned nodes" in decision[0]
    assert decision[2].startswith("The status quo is your owned nodes plus")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (apt-get install chromium-headless-shell)")
def test_the_report_renders_in_a_browser(workspace, tmp_path):
    """A headless Chromium screenshot of the page: the pictures load (their colours fill the page)."""
    from PIL import Image

    shot = tmp_path / "report.png"
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--allow-file-access-from-files", f"--screenshot={shot}", "--window-size=1280,2200",
                           (workspace / "report" / "report.html").resolve().as_uri()],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert shot.is_file(), done.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    hsv = image.convert("HSV")
    saturated = sum(1 for h, s, v in hsv.getdata() if s > 120 and v > 80)
    assert image.size == (1280, 2200)
    assert saturated > 20_000, saturated  # text alone is grey: only the pictures bring colour


def test_a_report_without_a_plan_names_the_command_and_writes_nothing(tmp_path):
    from hetplan.contracts import ContractError
    from hetplan.report import write_report

    (tmp_path / "runs" / RUN_KEY).mkdir(parents=True)
    with pytest.raises(ContractError) as caught:
        write_report(tmp_path, RUN_KEY)
    assert len(str(caught.value).splitlines()) == 1
    assert "plan.json: no such file (made by `hetplan plan" in str(caught.value)
    assert not (tmp_path / "report").exists() and not (tmp_path / "runs" / RUN_KEY / "report").exists()


def test_hetplan_report_writes_the_page_for_a_plan_directory(workspace, tmp_path):
    """`make pipeline`'s report: the same page for `hetplan plan`'s out-dir, outside the nightly run layout."""
    run = workspace / "current"
    out = tmp_path / "page"
    result = CliRunner().invoke(app, ["report", "--plan-dir", str(run / "plan"), "--curves",
                                      str(run / "curves.parquet"), "--workload", str(workspace / "trace.csv"),
                                      "--out-dir", str(out)])
    assert result.exit_code == 0, result.output
    page = (out / "report.html").read_text()
    for picture in ("node_mix.png", "curves.png", "jct.png"):
        assert f'src="{picture}"' in page and (out / picture).stat().st_size > 1000
    assert page == (workspace / "report" / "report.html").read_text()  # the nightly run's page, byte for byte


@pytest.mark.parametrize(("argv", "file", "command"), [
    (["report", "--out-dir", "r"], ".hetplan/plan/plan.json", "hetplan plan"),
    (["simulate", "--nodes", "n.csv", "--trace", ".hetplan/trace.csv", "--truth", ".hetplan/profiles.csv"], "n.csv",
     "hetplan init"),
    (["plan", "--budget", "20", "--no-mlflow", "--out-dir", "p"], ".hetplan/curves.parquet", "hetplan fit"),
    (["plan", "--budget", "20", "--no-mlflow", "--owned", "mine.csv", "--out-dir", "p"], "mine.csv",
     "hetplan init --workspace DIR --fleet"),
    (["evaluate", "--trace", ".hetplan/trace.csv", "--budget", "20", "--owned", "mine.csv", "--no-mlflow"],
     "mine.csv", "hetplan init --workspace DIR --fleet"),
    (["fit", "--profiles", "p.csv", "--out", "c.parquet", "--no-mlflow"], "p.csv", "hetplan profile"),
    (["publish", "--plan", "plan.json", "--hints", "h.parquet", "--store", "s"], "plan.json", "hetplan plan"),
    (["hints", "show", "--store", "s"], "s", "hetplan publish"),
    (["serve", "--from-plan", "plan.json", "--db", "a.db"], "plan.json", "hetplan plan"),
    (["catalog", "show", "shapes.csv"], "shapes.csv", "hetplan catalog import"),
    (["data", "validate", "t.csv", "--kind", "trace"], "t.csv", "hetplan trace import"),
])
def test_a_missing_file_names_the_command_that_makes_it(tmp_path, monkeypatch, argv, file, command):
    """E.g. `hetplan plan` right after `hetplan init`, before `hetplan fit`."""
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, ["init", "--workspace", ".hetplan"]).exit_code == 0
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    result = CliRunner().invoke(app, argv)
    assert result.exit_code != 0
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and file in errors[0] and command in errors[0], result.output
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing written


def test_twenty_gpu_types_get_twenty_distinct_styles():
    import pandas as pd

    from hetplan.plots import distinct_capacity, styles
    from hetplan.sensitivity.plots import plot_model

    gpus = [f"GPU{i:02d}" for i in range(24)]
    palette = styles(gpus)
    assert len({(s.colour, s.linestyle) for s in palette.values()}) == 24 <= distinct_capacity()
    assert styles(reversed(gpus)) == palette  # the same keys, the same styles, in any order
    rows = [{"model": "m", "gpu_type": g, "cpus_per_gpu": c, "mem_gb_per_gpu": 16.0, "throughput": (i + 1) * c,
             "throughput_unit": "samples/s", "method": "fitted", "source": "derived:test", "knee_cpus_at_mem": 2.0}
            for i, g in enumerate(gpus[:20]) for c in (1.0, 2.0, 4.0)]
    fig = plot_model(pd.DataFrame(rows), "m")
    drawn = {(line.get_color(), line.get_linestyle()) for line in fig.axes[0].get_lines()}
    assert len(drawn) == 20
