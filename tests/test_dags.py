"""The Airflow DAGs: they import cleanly, have the expected shape, and a tiny nightly run publishes hints.

Airflow and MLflow run for real: a session fixture points AIRFLOW_HOME and MLFLOW_TRACKING_URI at temporary
directories before airflow is imported, then creates the metadata DB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from servers import TOKEN, Server

REPO = Path(__file__).resolve().parents[1]
TINY = {  # 2 models x 3 GPU types; this host's CPU and L4 profiled at 1 and 2 cores, sub-second windows, a small budget
    "gpu_types": ["CPU", "L4"],
    "workload": "token-batch",
    "workloads": {"L4": "hetplan_no_such_module:run"},  # L4: skipped without a GPU, else fails -> stale
    "cpus": "1,2",
    "warmup_s": 0.5,
    "measure_s": 0.5,
    "repeats": 1,
    "models": ["res18", "transformer"],
    "keep_gpu_types": ["T4", "L4", "V100"],
    "budget": 20.0,
    "time_limit": 20.0,
}
RUN_KEY = "20260102T000000"
NIGHTLY_JOBS = 150  # the nightly run plans the default trace's first jobs: still 5 replay runs and 30 held-back jobs
TARGET = {"image": "registry.example/hetplan:0.1", "workspace_claim": "hetplan-workspace", "namespace": "gpu",
          "gpu_types": ["L4"]}


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
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    dag = dagbag.get_dag("hetplan_nightly")
    tasks = {t.task_id: t for t in dag.tasks}
    assert set(tasks) == {"resolve", "pod_specs", "profile", "profile_pod", "fit", "shortlist", "replay", "choose",
                          "publish", "report"}
    assert tasks["resolve"].downstream_task_ids == {"profile", "fit"}
    assert tasks["pod_specs"].downstream_task_ids == {"profile_pod", "fit"}
    assert tasks["profile"].downstream_task_ids == {"fit"}
    assert tasks["profile_pod"].downstream_task_ids == {"fit"}
    assert issubclass(tasks["profile_pod"].operator_class, KubernetesPodOperator)
    assert tasks["fit"].downstream_task_ids == {"shortlist", "choose"}
    assert tasks["shortlist"].downstream_task_ids == {"replay"} and tasks["replay"].downstream_task_ids == {"choose"}
    assert tasks["choose"].trigger_rule == "none_failed"  # no workload: zero replay runs skip `replay` only
    assert tasks["choose"].downstream_task_ids == {"publish", "report"}
    assert tasks["publish"].downstream_task_ids == {"report"}
    assert tasks["fit"].trigger_rule == "all_done"
    assert [a.name for a in tasks["publish"].outlets] == ["hetplan_hints"]
    assert all(t.retries >= 1 for t in dag.tasks)
    assert dag.params["budget"] == 200.0 and dag.params["workspace"] == ".hetplan"
    assert dag.params["kubernetes"] == {}  # default: every GPU type is profiled on the workers
    assert dag.params["fleet"] == dag.params["catalog"] == "" and "trace" in dag.params  # empty: the workspace's


def _params(dagbag, **overrides) -> dict:
    """The nightly DAG's default params with `overrides`, as a run sees them."""
    return {**dagbag.get_dag("hetplan_nightly").params.dump(), **TINY, **overrides}


@pytest.mark.parametrize(("gpu_types", "kubernetes", "local", "pods"), [
    (["T4", "nvidia-l4", "T4"], {}, ["T4", "L4"], []),                    # no target: all local, canonical, once
    (["T4", "L4"], {"gpu_types": []}, [], ["T4", "L4"]),                  # a target without gpu_types: all pods
    (["T4", "L4"], {"gpu_types": ["Tesla-T4"]}, ["L4"], ["T4"]),          # node-label spellings are fine
    (["T4", "L4"], {"gpu_types": ["H100"]}, ["T4", "L4"], []),            # not in this run: nothing to do
])
def test_profiling_plan_splits_gpu_types(dagbag, tmp_path, gpu_types, kubernetes, local, pods):
    from hetplan_airflow.pods import profiled_gpu_types, profiling_plan

    target = {**TARGET, **kubernetes} if kubernetes else {}
    plan = profiling_plan(_params(dagbag, gpu_types=gpu_types, workspace=str(tmp_path), kubernetes=target), RUN_KEY)
    assert plan["local"] == local
    assert profiled_gpu_types([], plan["pods"]) == pods
    assert sorted(profiled_gpu_types(plan["local"], plan["pods"])) == sorted(local + pods)
    assert json.loads(json.dumps(plan)) == plan  # XCom carries it


def test_gpu_types_with_workers_of_their_own_are_profiled_on_their_queues(dagbag, tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from hetplan_airflow.config import QUEUES_ENV, profile_queues
    from hetplan_airflow.pods import profiled_gpu_types, profiling_plan

    assert profile_queues("T4, nvidia-a100-sxm4-80gb,T4") == {"T4": "gpu-t4", "A100-80GB": "gpu-a100-80gb"}
    assert profile_queues("") == {}
    monkeypatch.setenv(QUEUES_ENV, "T4,A100-80GB")
    dag = DagBag(dag_folder=str(REPO / "dags" / "hetplan_nightly.py")).get_dag("hetplan_nightly")
    tasks = {t.task_id: t for t in dag.tasks}
    for task_id, queue in (("profile_gpu_t4", "gpu-t4"), ("profile_gpu_a100_80gb", "gpu-a100-80gb")):
        assert tasks[task_id].queue == queue
        assert tasks[task_id].upstream_task_ids == {"resolve"} and tasks[task_id].downstream_task_ids == {"fit"}
    assert tasks["profile"].queue == "default"  # the other types: any worker
    plan = profiling_plan(_params(dagbag, gpu_types=["T4", "L4"], workspace=str(tmp_path)), RUN_KEY,
                          queued=profile_queues())
    assert (plan["local"], plan["queued"]) == (["L4"], ["T4"])  # A100-80GB is not in this run: its task skips
    assert profiled_gpu_types(plan["local"], plan["pods"], plan["queued"]) == ["L4", "T4"]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"gpu_types": ["B300"]}, "unknown GPU type 'B300'"),
    ({"kubernetes": {**TARGET, "gpu_types": ["Z9"]}}, "unknown GPU type 'Z9'"),
    ({"kubernetes": {**TARGET, "products": {"X1": "NVIDIA-X1"}}}, "unknown GPU type 'X1'"),
    ({"kubernetes": {"image": "hetplan:0.1"}}, "workspace_claim required"),
    ({"kubernetes": {**TARGET, "imgae": "typo"}}, "unknown field(s) imgae"),
    ({"kubernetes": {**TARGET, "memory_gb": 0}}, "memory_gb must be a number > 0"),
    ({"kubernetes": {**TARGET, "memory_gb": "16"}}, "memory_gb must be a number > 0, not '16'"),
])
def test_profiling_plan_rejects_bad_targets(dagbag, tmp_path, overrides, message):
    from hetplan_airflow.pods import profiling_plan

    with pytest.raises(ValueError) as caught:
        profiling_plan(_params(dagbag, workspace=str(tmp_path), **overrides), RUN_KEY)
    assert message in str(caught.value)


def test_pod_kwargs_node_label_and_resources(dagbag, tmp_path):
    from hetplan_airflow.pods import PodTarget, node_product, pod_kwargs

    target = PodTarget.from_param({**TARGET, "products": {"h100": "NVIDIA-H100-PCIe"}, "memory_gb": 8})
    grid = {"workload": "token-batch", "cpus": "1,4,2", "mem_gb": None, "warmup_s": 1.0, "measure_s": 1.0,
            "repeats": 1}
    kwargs = pod_kwargs("H100", target, str(tmp_path), RUN_KEY, grid)
    assert kwargs["node_selector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-PCIe"}  # products beat K8S_PRODUCT
    limits = {"cpu": "4", "memory": "9Gi", "nvidia.com/gpu": "1"}  # largest cores point; memory_gb + harness
    assert kwargs["container_resources"] == {"requests": limits, "limits": limits}
    assert kwargs["arguments"][kwargs["arguments"].index("--mem-gb") + 1] == "8"
    sized = pod_kwargs("T4", target, str(tmp_path), RUN_KEY, {**grid, "mem_gb": "4,16"})
    assert sized["node_selector"] == {"nvidia.com/gpu.product": "Tesla-T4"}
    assert sized["container_resources"]["limits"]["memory"] == "17Gi"
    with pytest.raises(ValueError, match="GPU type 'T4'"):
        node_product("T4", {})


def test_pod_task_renders_the_profiling_pod(dagbag, tmp_path):
    from hetplan_airflow.pods import POD_MAP_INDEX_TEMPLATE, profiling_plan
    from jinja2 import Template
    from kubernetes.client import ApiClient

    workspace = tmp_path / "ws"
    plan = profiling_plan(_params(dagbag, workspace=str(workspace), kubernetes=TARGET), RUN_KEY)
    mapped = dagbag.get_dag("hetplan_nightly").get_task("profile_pod")
    task = mapped.unmap(plan["pods"][0])  # what the worker runs for map index 0
    assert mapped.map_index_template == POD_MAP_INDEX_TEMPLATE
    assert Template(POD_MAP_INDEX_TEMPLATE).render(task=task) == "L4"  # the pod task's name in the UI
    pod = ApiClient().sanitize_for_serialization(task.build_pod_request_obj(dry_run=True))  # the API's JSON

    assert pod["metadata"]["namespace"] == "gpu"
    assert pod["metadata"]["name"].startswith("hetplan-profile-l4-")
    assert pod["metadata"]["labels"]["hetplan.io/gpu-type"] == "L4"
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert spec["restartPolicy"] == "Never"
    assert spec["volumes"] == [{"name": "workspace", "persistentVolumeClaim": {"claimName": "hetplan-workspace"}}]
    (container,) = spec["containers"]
    assert container["image"] == TARGET["image"]
    assert container["volumeMounts"] == [{"name": "workspace", "mountPath": str(workspace)}]
    amounts = {"cpu": "2", "memory": "17Gi", "nvidia.com/gpu": "1"}  # cpus "1,2"; 16 GiB point + 1 for the harness
    assert container["resources"] == {"requests": amounts, "limits": amounts}
    assert container["command"] == ["python", "-m", "hetplan.cli.nightly"]
    # GPU nodes' usual taint is tolerated by the pod itself (no reliance on an admission plugin)
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    args = container["args"]
    assert args[:7] == ["profile-gpu", "--workspace", str(workspace), "--run-key", RUN_KEY, "--gpu-type", "L4"]
    assert args[args.index("--workload") + 1] == TINY["workloads"]["L4"]
    assert args[args.index("--cpus") + 1] == "1,2"


@pytest.mark.slow
def test_pod_command_profiles_like_the_local_task_and_reruns_idempotently(dagbag, tmp_path):
    """The pod's command run here (no cluster): a retry rewrites the same files with the same outcome."""
    from hetplan_airflow.pods import profiling_plan

    workspace = tmp_path / "ws"
    params = _params(dagbag, workspace=str(workspace), gpu_types=["T4"], kubernetes={**TARGET, "gpu_types": ["T4"]},
                     cpus="1", mem_gb="1")
    (pod,) = profiling_plan(params, RUN_KEY)["pods"]
    command = [sys.executable, *pod["cmds"][1:], *pod["arguments"]]
    outcomes = []
    for _ in range(2):
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout.strip().splitlines()[-1])
        files = sorted(str(p.relative_to(workspace)) for p in workspace.rglob("*") if p.is_file())
        outcomes.append((status, files))
    assert outcomes[0] == outcomes[1]
    status, files = outcomes[0]
    # never a T4 measured on something else: skipped without a GPU, refused (stale) on another GPU type
    assert status["status"] == ("skipped" if _no_gpu() else "stale") and status["gpu_type"] == "T4"
    assert files == [f"runs/{RUN_KEY}/profiles/T4.json"]


def _no_gpu() -> bool:
    from hetplan.profiling.telemetry import detect_gpu

    return detect_gpu().gpu is None


def test_profiling_without_a_gpu_type_measures_the_cpu_under_its_own_label_and_falls_back_when_it_fails(tmp_path):
    """`CPU` is measured for real and never called a GPU type; a failed run keeps the last good profiles."""
    from hetplan.contracts import PROFILES
    from hetplan.pipeline import STALE, profile_gpu

    grid = {"cpus": "1", "mem_gb": "1", "warmup_s": 0.2, "measure_s": 0.3, "repeats": 1}
    measured = profile_gpu(tmp_path, RUN_KEY, "cpu", "token-batch", **grid)
    assert measured["status"] == "measured" and measured["gpu_type"] == "CPU"
    assert set(PROFILES.load(measured["profiles"])["gpu_type"]) == {"CPU"}
    failed = profile_gpu(tmp_path, "20260103T000000", "CPU", "hetplan_no_such_module:run", **grid)
    assert failed["status"] == STALE and failed["profiles"] == str(tmp_path / "profiles" / "last_good" / "CPU.csv")
    assert "hetplan_no_such_module" in failed["error"]


def test_dags_import_only_the_task_sdk():
    """A naive start_date is read in the server's zone; DAG files author against `airflow.sdk` only."""
    import ast

    for path in sorted((REPO / "dags").glob("*.py")):
        tree = ast.parse(path.read_text())
        modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module] + \
                  [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        airflow = [m for m in modules if m.split(".")[0] == "airflow"]
        assert airflow and all(m == "airflow.sdk" or m.startswith("airflow.sdk.") for m in airflow), (path, airflow)


def test_dag_start_dates_are_timezone_aware(dagbag):
    for dag_id in dagbag.dag_ids:
        start = dagbag.get_dag(dag_id).start_date
        assert start.tzinfo is not None and start.utcoffset().total_seconds() == 0, dag_id


def test_publish_dag_is_scheduled_on_the_hints_asset(dagbag):
    dag = dagbag.get_dag("hetplan_publish")
    assert {t.task_id for t in dag.tasks} == {"export", "reload"}
    assert "hetplan_hints" in str(dag.timetable.asset_condition)
    assert "hetplan_curves" not in str(dag.timetable.asset_condition)


@pytest.mark.slow
def test_nightly_run_publishes_hints_and_marks_failed_profiling_stale(dagbag, airflow_home, tmp_path, monkeypatch):
    """The nightly DAG publishes (one GPU type stale); the publish DAG exports Kueue YAML and makes a real
    allocator on loopback reload the new hints."""
    from hetplan.contracts import TRACE
    from hetplan.workspace import init_workspace

    workspace = tmp_path / "ws"
    init_workspace(workspace)
    recent = tmp_path / "recent.csv"  # the workload's source: `resolve` reads it into the workspace's trace.csv
    TRACE.write(TRACE.load(workspace / "trace.csv").iloc[:NIGHTLY_JOBS], recent)
    (workspace / "hints").mkdir(parents=True)
    # a running allocator on the (still empty) store, polling it too rarely to notice a publish by itself
    allocator = Server(tmp_path, workspace / "hints", extra=("--hint-poll", "3600")).start()
    try:
        _nightly_then_publish(dagbag, workspace, allocator, monkeypatch, recent)
    finally:
        allocator.stop()


def _nightly_then_publish(dagbag, workspace: Path, allocator, monkeypatch, recent: Path) -> None:
    from mlflow.tracking import MlflowClient

    from hetplan.contracts import TRACE
    from hetplan.hints import HintStore

    run = dagbag.get_dag("hetplan_nightly").test(run_conf={**TINY, "workspace": str(workspace),
                                                           "trace": str(recent)})
    assert TRACE.load(workspace / "trace.csv").equals(TRACE.load(recent))  # the night planned its source's jobs
    assert run.state == "success"
    states = _task_states(run.run_id)
    assert states[("profile", 0)] == states[("profile", 1)] == "success"  # L4 skipped or failed: no task fails
    assert states[("profile_pod", -1)] == "skipped"  # no Kubernetes target: zero pods, the mapped task skips
    assert states[("fit", -1)] == states[("publish", -1)] == states[("report", -1)] == "success"
    _mapped_replays_are_the_in_process_plan(workspace, run.run_id, states)
    page = workspace / "report" / "report.html"  # the one-page report, linked to the published run's
    assert page.is_file() and page.resolve().parent == (workspace / "current" / "report").resolve()

    published = HintStore(workspace / "hints").load()  # LATEST exists and loads
    assert len(published.hints) > 0
    assert published.plan.stale_gpu_types == ([] if _no_gpu() else ["L4"])
    assert published.plan.cost_per_hour <= TINY["budget"] + 1e-6
    assert (workspace / "profiles" / "last_good" / "CPU.csv").is_file()
    assert (workspace / "current").resolve() == next((workspace / "runs").iterdir()).resolve()
    assert (workspace / "current" / "curves.parquet").is_file() and (workspace / "current" / "plan" / "plan.json").is_file()
    assert not (workspace / "profiles" / "last_good" / "L4.csv").exists()
    assert (workspace / "runs").is_dir()
    assert len(list((workspace / "runs").glob("*/plan/kueue.yaml"))) == 1

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    names = [m.name for m in client.search_registered_models()]
    assert any(n.startswith("hetplan.res18.") for n in names)
    assert client.get_model_version_by_alias(names[0], "champion") is not None
    planning = client.get_experiment_by_name("hetplan-planning")
    (plan_run,) = client.search_runs([planning.experiment_id], f"tags.plan_id = '{published.plan.plan_id}'")
    assert {"report.html", "node_mix.png", "curves.png", "jct.png"} <= {
        Path(a.path).name for a in client.list_artifacts(plan_run.info.run_id, "report")}

    assert httpx.get(allocator.url + "/v1/hints").json()["version"] is None  # not reloaded yet
    host, port = allocator.url.removeprefix("http://").rsplit(":", 1)  # the allocator as an Airflow Connection
    monkeypatch.setenv("AIRFLOW_CONN_HETPLAN_ALLOCATOR", json.dumps(
        {"conn_type": "http", "host": host, "port": int(port), "schema": "http", "password": TOKEN}))
    export = dagbag.get_dag("hetplan_publish").test(run_conf={"workspace": str(workspace)})
    assert export.state == "success"
    assert _task_states(export.run_id, "hetplan_publish")[("reload", -1)] == "success"
    assert (workspace / "exports" / published.version / "kueue.yaml").is_file()
    hints = httpx.get(allocator.url + "/v1/hints").json()
    assert hints["version"] == published.version and hints["classes"] > 0


def _mapped_replays_are_the_in_process_plan(workspace: Path, run_id: str, states: dict) -> None:
    """One `replay` task instance per replay run of the shortlist, and the plan they choose is the one
    `plan_workload` makes in one process from the same problem and workload."""
    import pickle

    from hetplan.codesign import plan_workload, workload_from_trace
    from hetplan.contracts import TRACE, load_plan

    (run_path,) = (workspace / "runs").iterdir()
    listed = pickle.loads((run_path / "plan" / "stages" / "shortlist.pkl").read_bytes())["shortlist"]
    mapped = sorted(i for (task_id, i), state in states.items() if task_id == "replay" and state == "success")
    assert mapped == list(range(len(listed.pending))) and len(mapped) >= 5  # the status quo and 4, two draws
    assert len(list((run_path / "plan" / "stages" / "replays").glob("*.json"))) == len(mapped)
    planning = load_plan(run_path / "plan" / "plan.json").planning
    here = plan_workload(listed.runs.problem, workload_from_trace(TRACE.load(workspace / "trace.csv")))
    assert planning["winner"] == here.winner
    assert planning["candidates"] == json.loads(here.result.plan.model_dump_json())["planning"]["candidates"]


def _task_states(run_id: str, dag_id: str = "hetplan_nightly") -> dict[tuple[str, int], str]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        query = select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        tis = session.scalars(query).all()
        return {(ti.task_id, ti.map_index): str(ti.state) for ti in tis}


def test_the_plan_stages_make_the_plan_the_one_task_plan_makes(tmp_path):
    """shortlist -> one replay per run -> choose (what the DAG maps) writes the plan `plan_step` writes in one
    task; a replay run the shortlist does not list is refused in one line."""
    from hetplan.contracts import CURVES, TRACE, ContractError, load_plan
    from hetplan.pipeline import choose_step, plan_step, replay_step, run_dir, shortlist_step
    from hetplan.reference import build_reference
    from hetplan.sensitivity import fit_profiles
    from hetplan.workspace import init_workspace

    init_workspace(tmp_path)
    TRACE.write(TRACE.load(tmp_path / "trace.csv").iloc[:60], tmp_path / "trace.csv")
    derived = build_reference().derived
    curves = fit_profiles(derived[derived["model"].isin(TINY["models"])]).curves
    kwargs = {"budget": 60.0, "clouds": ["aws", "gcp"], "time_limit": 20.0}
    for key in ("a", "b"):
        run_dir(tmp_path, key).mkdir(parents=True)
        CURVES.write(curves, run_dir(tmp_path, key) / "curves.parquet")
    runs = shortlist_step(tmp_path, "a", **kwargs)
    assert runs and all(len(run) == 2 for run in runs)
    for run in runs:
        replay_step(tmp_path, "a", run)
    with pytest.raises(ContractError, match=r"run \[999, 0\] is not one of the shortlist's replay runs"):
        replay_step(tmp_path, "a", [999, 0])
    staged = choose_step(tmp_path, "a", mlflow=False, **kwargs)
    whole = plan_step(tmp_path, "b", mlflow=False, **kwargs)
    a, b = (load_plan(Path(out["plan"])) for out in (staged, whole))
    assert a.planning == b.planning and a.node_counts == b.node_counts and staged["summary"] == whole["summary"]
