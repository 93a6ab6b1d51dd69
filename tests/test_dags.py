"""The Airflow DAGs: they import cleanly, have the expected shape, and a tiny nightly run publishes hints.

Airflow and MLflow run for real: a session fixture points AIRFLOW_HOME and MLFLOW_TRACKING_URI at temporary
directories before airflow is imported, then creates the metadata DB.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = {  # 2 models x 3 GPU types, 2 profiled types at 1 and 2 cores with sub-second windows, a small budget
    "gpu_types": ["T4", "L4"],
    "workload": "token-batch",
    "workloads": {"L4": "hetplan_no_such_module:run"},  # forces L4's profiling to fail -> stale
    "cpus": "1,2",
    "warmup_s": 0.5,
    "measure_s": 0.5,
    "repeats": 1,
    "models": ["res18", "transformer"],
    "keep_gpu_types": ["T4", "L4", "V100"],
    "budget": 20.0,
    "time_limit": 20.0,
}


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow")
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    if str(REPO / "plugins") not in sys.path:  # Airflow adds it at start-up; also when airflow was imported earlier
        sys.path.append(str(REPO / "plugins"))
    from airflow.utils import db

    db.initdb()
    yield home
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def dagbag(airflow_home):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_dags_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == {"hetplan_nightly", "hetplan_publish"}


def test_nightly_task_graph(dagbag):
    dag = dagbag.get_dag("hetplan_nightly")
    tasks = {t.task_id: t for t in dag.tasks}
    assert set(tasks) == {"resolve", "profile", "fit", "plan", "publish"}
    assert tasks["resolve"].downstream_task_ids == {"profile", "fit"}
    assert tasks["profile"].downstream_task_ids == {"fit"}
    assert tasks["fit"].downstream_task_ids == {"plan"}
    assert tasks["plan"].downstream_task_ids == {"publish"}
    assert tasks["fit"].trigger_rule == "all_done"
    assert [a.name for a in tasks["publish"].outlets] == ["hetplan_hints"]
    assert all(t.retries >= 1 for t in dag.tasks)
    assert dag.params["budget"] == 200.0 and dag.params["workspace"] == ".hetplan"


def test_publish_dag_is_scheduled_on_the_hints_asset(dagbag):
    dag = dagbag.get_dag("hetplan_publish")
    assert {t.task_id for t in dag.tasks} == {"export", "reload"}
    assert "hetplan_hints" in str(dag.timetable.asset_condition)
    assert "hetplan_curves" not in str(dag.timetable.asset_condition)


def test_nightly_run_publishes_hints_and_marks_failed_profiling_stale(dagbag, airflow_home, tmp_path):
    from mlflow.tracking import MlflowClient

    from hetplan.hints import HintStore

    workspace = tmp_path / "ws"
    run = dagbag.get_dag("hetplan_nightly").test(run_conf={**TINY, "workspace": str(workspace)})
    assert run.state == "success"

    published = HintStore(workspace / "hints").load()  # LATEST exists and loads
    assert len(published.hints) > 0
    assert published.plan.model_extra["stale_gpu_types"] == ["L4"]
    assert published.plan.cost_per_hour <= TINY["budget"] + 1e-6
    assert (workspace / "profiles" / "last_good" / "T4.csv").is_file()
    assert not (workspace / "profiles" / "last_good" / "L4.csv").exists()
    assert (workspace / "runs").is_dir()
    assert len(list((workspace / "runs").glob("*/plan/kueue.yaml"))) == 1

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    names = [m.name for m in client.search_registered_models()]
    assert any(n.startswith("hetplan.res18.") for n in names)
    assert client.get_model_version_by_alias(names[0], "champion") is not None

    export = dagbag.get_dag("hetplan_publish").test(run_conf={"workspace": str(workspace)})
    assert export.state == "success"
    assert (workspace / "exports" / published.version / "kueue.yaml").is_file()


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (Debian 1.29) not installed")
def test_docker_compose_file_validates():
    done = subprocess.run(["docker-compose", "-f", str(REPO / "docker-compose.yaml"), "config", "-q"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
