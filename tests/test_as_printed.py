"""Every command the README shows and every command `make main` prints runs as printed.

The README's commands are read from its ```bash blocks: each `hetplan` line's options must be ones its `--help`
knows, each `make` line must resolve (`make -n`), each `airflow` line must be a command Airflow has, and the three
Airflow variables it exports must be the ones the Makefile sets. Then a fresh copy of the repository goes through the
README's first run with the example's own fleet and 200 jobs (`hetplan init --fleet --trace`, `make main`), and
every command `make main` prints is run: for real where it ends (curves, allocate, trace export, plan again with the
default curves, airflow dags list and unpause), in its `--help` form where it serves forever (MLflow UI) or takes
minutes (evaluate).
"""

from __future__ import annotations

import json
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

from hetplan.cli import COMMANDS, app, load_command

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.prefix) / "bin"
AIRFLOW_VARIABLES = ("AIRFLOW_HOME", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER")
# The example's first run, kept small for CI: the fleet's and a few cloud GPU types, short profiling windows.
SMALL = ('"keep_gpu_types": ["A100", "T4", "V100", "H100", "L4"], "cpus": "1", "repeats": 1, "warmup_s": 0.5, '
         '"measure_s": 0.5, "time_limit": 20')


def readme_commands() -> list[str]:
    """Each command of the README's bash blocks, continuation lines joined, comments dropped."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S):
        for line in block.splitlines():
            text = line.split("  #", 1)[0].split(" # ", 1)[0].rstrip().rstrip("\\").rstrip()
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            if line[:1].isspace() and commands:
                commands[-1] += " " + text.strip()
            else:
                commands.append(text.strip())
    return commands


def _hetplan_path(words: list[str]) -> list[str]:
    """The sub-command words of a `hetplan ...` line (a group's command included)."""
    first = words[0]
    assert first in COMMANDS, f"hetplan has no command {first!r}"
    command = load_command(first)
    return [first, words[1]] if hasattr(command, "commands") else [first]  # a group: its command too


def names_option(help_text: str, option: str) -> bool:
    """Whether `help_text` lists `option` as a whole word (`--curves` is not `--curves-x`)."""
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text) is not None


def test_an_option_is_found_as_a_whole_word_only():
    assert names_option("│ --curves-x  PATH │", "--curves-x") and names_option("--curves/--no-curves", "--curves")
    assert not names_option("│ --curves-x  PATH │", "--curves") and not names_option("--no-curves", "--curves")


def test_every_hetplan_command_in_the_readme_names_options_its_help_knows():
    lines = [c for c in readme_commands() if re.match(r"(\.venv/bin/)?hetplan ", c)]
    assert len(lines) >= 20
    for line in lines:
        words = line.split()[1:]
        path = _hetplan_path(words)
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "250"})
        assert result.exit_code == 0, (line, result.output)
        for option in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line))):
            assert names_option(result.output, option), f"{line!r}: `hetplan {' '.join(path)}` has no {option}"
        for path_word in re.findall(r"examples/\S+", line):
            assert (REPO / path_word).is_file(), path_word


def test_every_make_airflow_and_export_line_in_the_readme_resolves():
    commands = readme_commands()
    makes = [c for c in commands if c.startswith("make ")]
    assert {"make main", "make test", "make setup", "make main BUDGET=50"} <= set(makes)
    for line in makes:
        done = subprocess.run([*shlex.split(line), "-n", "-o", f"{sys.prefix}/.installed", f"VENV={sys.prefix}"],
                              capture_output=True, text=True, cwd=REPO, timeout=60)
        assert done.returncode == 0, (line, done.stderr)
    (export,) = [c for c in commands if c.startswith("export AIRFLOW_HOME")]
    assert tuple(word.split("=")[0] for word in export.split()[1:]) == AIRFLOW_VARIABLES
    makefile = (REPO / "Makefile").read_text()
    assert all(f"export {name}" in makefile for name in AIRFLOW_VARIABLES)
    for line in [c for c in commands if c.startswith(".venv/bin/airflow ")]:
        words = line.split()[1:]
        done = subprocess.run([str(BIN / "airflow"), *words[:2], "--help"], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
        assert done.returncode == 0, (line, done.stderr[-2000:])


def _printed(output: str) -> dict[str, str]:
    """`make main`'s closing block: label -> the command it prints (continuation lines joined)."""
    block = output[output.index("\nDecision:"):]
    commands: dict[str, str] = {}
    label = None
    for line in block.splitlines():
        match = re.match(r"^ {0,2}([A-Za-z][\w ]*):\s+(.*)$", line)
        if match:
            label = match.group(1).strip()
            commands[label] = match.group(2).rstrip(" \\")
        elif label and line.startswith(" " * 10):
            commands[label] += " " + line.strip().rstrip(" \\")
    return commands


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    assert done.returncode == 0 and "Traceback" not in done.stderr, (argv, done.stdout[-3000:], done.stderr[-3000:])
    return done


@pytest.mark.slow
def test_a_fresh_copy_with_your_fleet_and_trace_names_what_to_buy_and_every_printed_command_runs(tmp_path):
    clone = tmp_path / "hetplan"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], capture_output=True, text=True,
                            cwd=REPO, check=True).stdout.split()
    for name in listed:
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    (clone / ".venv").symlink_to(sys.prefix)  # `make setup` done: the virtualenv is this one
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "MLFLOW"))}
    env["PYTHONPATH"] = str(clone)  # the copy's hetplan, DAGs and plugins, whatever the virtualenv points at

    _run([".venv/bin/hetplan", "init", "--fleet", "examples/my-cluster/fleet.csv", "--trace",
          "examples/my-cluster/trace.csv"], clone, env)
    started = time.monotonic()
    main = _run(["make", "main", "BUDGET=50", "-o", ".venv/.installed", f"NIGHTLY_CONF={SMALL}"], clone, env, 600)
    output = main.stdout + main.stderr
    assert "Traceback" not in output and "ERROR" not in output, output[-5000:]
    ws = clone / ".hetplan"
    decision = (ws / "report" / "decision.txt").read_text().splitlines()
    assert re.match(r"(Rent \d+ x \S+ \(\d+ x [\w-]+, \d+ vCPUs, \d+ GiB\)|Keep what you have|Keep your nodes)", decision[0])
    assert "status quo" in decision[0] and "keep your 11 owned nodes" in decision[0]
    assert decision[2].startswith("The status quo is your owned nodes plus")
    assert decision[0] in (ws / "report" / "report.html").read_text().replace("&#x27;", "'")
    printed = _printed(main.stdout)
    assert printed["Decision"].startswith(decision[0])
    seconds = time.monotonic() - started
    print(f"make main on the example: {seconds:.0f} s, {len(output.splitlines())} lines")
    assert len(output.splitlines()) <= 400  # issue 32's budget for make main's log

    run_printed(printed, clone, ws, env, tmp_path)
    # the README's own next steps, as printed: the jobs from the allocator's database, planned for directly
    for line in readme_commands():
        if line.startswith((".venv/bin/hetplan trace export --db", ".venv/bin/hetplan plan --budget 50 --workload")):
            _run(shlex.split(line), clone, env, 600)
    exported = len((ws / "ran.csv").read_text().splitlines()) - 1
    assert json.loads((ws / "plan" / "plan.json").read_text())["planning"]["workload"]["jobs"] == exported == 1


def run_printed(printed: dict[str, str], clone: Path, ws: Path, env: dict[str, str], tmp_path: Path) -> None:
    """Run what `make main` printed for the workspace `ws` of the repository copy `clone` (see the module)."""
    argv = {label: shlex.split(printed[label]) for label in ("Curves", "MLflow UI", "Evaluate", "Plan again",
                                                             "Allocator", "then allocate", "its jobs", "Airflow",
                                                             "Nightly")}
    _run(argv["Curves"], clone, env)
    _run([*argv["MLflow UI"], "--help"], clone, env)  # serves until stopped
    _run([*argv["Evaluate"], "--help"], clone, env)  # minutes: its options, and the files it names exist
    for word in argv["Evaluate"] + argv["Plan again"]:
        if word.startswith(str(ws)) and not word.endswith(("evaluation", "plan")):
            assert Path(word).exists(), word

    serve = argv["Allocator"]
    port = free_port()
    serve[serve.index("--port") + 1] = str(port)
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(serve, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=clone)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        curl = [w.replace("127.0.0.1:8080", f"127.0.0.1:{port}") for w in argv["then allocate"]]
        assert json.loads(_run(curl, clone, env).stdout)["status"] == "allocated"
        time.sleep(1.0)
        assert httpx.post(url + "/v1/release", json={"job_id": "j1"}, timeout=30).json()["released"]
        export = [w.replace("127.0.0.1:8080", f"127.0.0.1:{port}") for w in argv["its jobs"]]
        _run(export, clone, env)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    ran = (ws / "ran.csv").read_text().splitlines()
    assert ran[0].startswith("job_id,model,num_gpus,arrival_s,duration_s") and ran[1].startswith("j1,res50,1,0.0,")

    # the natural next command: plan your workload on your fleet, the workspace's current curves by default
    _run([".venv/bin/hetplan", "plan", "--budget", "50", "--workload", ".hetplan/trace.csv", "--owned",
          ".hetplan/fleet.csv", "--no-mlflow", "--out-dir", str(tmp_path / "again")], clone, env, 600)
    assert (tmp_path / "again" / "plan.json").is_file()

    variables = dict(w.split("=", 1) for w in argv["Airflow"] if "=" in w)
    assert tuple(variables) == AIRFLOW_VARIABLES
    airflow = {**env, **variables}
    listed_dags = _run([w for w in argv["Airflow"] if "=" not in w], clone, airflow).stdout
    assert "hetplan_nightly" in listed_dags and "hetplan_publish" in listed_dags
    drawn = _run([str(BIN / "airflow"), "dags", "show", "hetplan_nightly"], clone, airflow).stdout  # graphviz
    assert "digraph" in drawn and "resolve -> fit" in drawn
    command = next(i for i, w in enumerate(argv["Nightly"]) if w.endswith("/airflow"))
    assert argv["Nightly"][command + 1:command + 4] == ["dags", "unpause", "hetplan_nightly"]
    _run(argv["Nightly"][command:command + 4], clone, airflow)
    paused = _run([str(BIN / "airflow"), "dags", "list", "-o", "json"], clone, airflow).stdout
    rows = {row["dag_id"]: row for row in json.loads(paused[paused.index("["):])}
    assert str(rows["hetplan_nightly"]["is_paused"]).lower() == "false"
