"""The front door: `hetplan init` never overwrites a workspace by accident, bad options fail in one line before
anything is written, and the command tree loads without importing the stages it does not run."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from hetplan.cli import app


def test_init_refuses_an_existing_workspace_without_force(tmp_path):
    ws = tmp_path / "ws"
    first = CliRunner().invoke(app, ["init", "--workspace", str(ws)])
    assert first.exit_code == 0, first.output
    catalog = ws / "catalog.csv"
    edited = catalog.read_text()
    catalog.write_text("name,edited\n")  # the platform team's own catalog
    again = CliRunner().invoke(app, ["init", "--workspace", str(ws)])
    assert again.exit_code == 1
    assert "already a workspace" in again.output and "--force" in again.output
    assert len([line for line in again.output.splitlines() if line.startswith("error:")]) == 1
    assert catalog.read_text() == "name,edited\n"  # nothing overwritten
    forced = CliRunner().invoke(app, ["init", "--workspace", str(ws), "--force"])
    assert forced.exit_code == 0 and catalog.read_text() == edited


def test_plan_refuses_a_bad_sweep_before_writing_anything(tmp_path):
    out = tmp_path / "plan"
    result = CliRunner().invoke(app, ["plan", "--budget", "100", "--sweep", "50,abc", "--out-dir", str(out),
                                      "--no-mlflow"])
    assert result.exit_code != 0
    assert "'abc' is not a budget" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_choices_are_checked_by_the_parser(tmp_path):
    result = CliRunner().invoke(app, ["plan", "--budget", "100", "--solver", "cplex", "--out-dir", str(tmp_path / "p")])
    assert result.exit_code == 2 and "cplex" in result.output and not (tmp_path / "p").exists()


@pytest.mark.slow
def test_help_imports_no_stage():
    """`hetplan --help` loads the command tree only: no pandas, MLflow, scikit-learn or solver."""
    code = ("import sys\nfrom hetplan.cli import app\n"
            "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('pandas', 'mlflow', 'sklearn', 'highspy', 'matplotlib', 'fastapi') "
            "if m in sys.modules)\nprint('HEAVY', heavy)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout
    for command in ("init", "profile", "fit", "curves", "plan", "publish", "hints", "serve", "evaluate", "data"):
        assert command in done.stdout
