"""The deployment as written: the package installs alone, the compose file comes up as it says, the image holds
what every service runs.

- `pip install <wheel>` in a clean virtualenv: every module imports, `hetplan serve --from-plan` places a job;
- `docker-compose config` (Debian's 1.29, no engine): secrets required, every hetplan service as ${AIRFLOW_UID}:0
  on volumes airflow-init prepares, health checks behind every dependency, GPU workers behind a profile,
  nothing installed at start-up;
- the image's Python environment (docker/image-requirements.txt + `.[airflow]`, pinned by requirements.txt, as
  the Dockerfile installs it) rebuilt in a virtualenv: every service's command and health check runs there.
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
import tomllib
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
import yaml
from servers import free_port
from venvs import REPO, build_wheel, clean_env, download_pip, make_venv

SECRETS = {"AIRFLOW_JWT_SECRET": "jwt-test", "AIRFLOW_FERNET_KEY": "fernet-test", "HETPLAN_ADMIN_TOKEN": "token-test",
           "HETPLAN_WRITE_TOKEN": "write-test", "MLFLOW_ADMIN_PASSWORD": "mlflow-test-password",
           "MLFLOW_SECRET_KEY": "mlflow-secret-test"}
UID = "4242"
HETPLAN_IMAGE = "hetplan:0.1.0"
INIT = "airflow-init"
TEST_ONLY = {"pytest", "hypothesis", "schemathesis", "gurobipy", "torch"}
IMAGE_TOOLS = {"curl", "pg_isready", "redis-cli", "bash"}  # not Python: in the base images, not in the virtualenv
OPTIONAL_MODULES = {"hetplan.profiling.workloads.resnet": "torch"}  # module -> the extra's package it imports

compose = pytest.mark.skipif(shutil.which("docker-compose") is None,
                             reason="docker-compose (Debian 1.29) not installed")


def _compose(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`docker-compose config ...` on the repository's file with exactly `env` (an empty env file: no .env)."""
    empty = tmp_path / "empty.env"
    empty.write_text("")
    base = {k: v for k, v in os.environ.items() if k not in SECRETS and k != "AIRFLOW_UID"}
    return subprocess.run(["docker-compose", "--env-file", str(empty), "-f", str(REPO / "docker-compose.yaml"),
                           "config", *args], capture_output=True, text=True, cwd=tmp_path, env={**base, **env})


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> dict:
    done = _compose(tmp_path_factory.mktemp("compose"), {**SECRETS, "AIRFLOW_UID": UID})
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def _hetplan_services(config: dict) -> dict[str, dict]:
    return {name: s for name, s in config["services"].items() if s.get("image") == HETPLAN_IMAGE}


@compose
@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_compose_refuses_to_start_without_each_secret(tmp_path, missing):
    env = {k: v for k, v in SECRETS.items() if k != missing}
    done = _compose(tmp_path, env, "-q")
    assert done.returncode != 0
    assert missing in done.stderr and "make deploy-env" in done.stderr, done.stderr
    assert "change-me" not in (REPO / "docker-compose.yaml").read_text()


@compose
def test_hetplan_services_run_as_airflow_uid_on_volumes_init_prepares(config):
    services = _hetplan_services(config)
    assert {"allocator", "airflow-apiserver", "airflow-scheduler", "airflow-worker", INIT} <= set(services)
    init = services.pop(INIT)
    assert init["user"] == "0:0"
    script = " ".join(init["command"]) if isinstance(init["command"], list) else init["command"]
    prepared = _named_mounts(init, config)
    for path in prepared:  # init gives every volume it mounts to ${AIRFLOW_UID}:0
        assert re.search(rf"chown -R \"?{UID}:0\"? [^\n]*{re.escape(path)}", script), path
    for name, service in services.items():
        assert service["user"] == f"{UID}:0", name
        assert service["depends_on"][INIT]["condition"] == "service_completed_successfully", name
        mounts = _named_mounts(service, config)
        assert mounts and mounts <= prepared, (name, mounts - prepared)


def _named_mounts(service: dict, config: dict) -> set[str]:
    """Where a service mounts the file's named volumes (long or short syntax, as docker-compose prints them)."""
    out = set()
    for mount in service.get("volumes", []):
        source, target = (mount.get("source"), mount.get("target")) if isinstance(mount, dict) else \
            mount.split(":")[:2]
        if source in config.get("volumes", {}):
            out.add(target)
    return out


@compose
def test_every_dependency_waits_for_health_and_every_service_has_a_health_check(config):
    services = config["services"]
    for name, service in services.items():
        if name != INIT:
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        for dependency, how in service.get("depends_on", {}).items():
            assert how["condition"] in ("service_healthy", "service_completed_successfully"), (name, dependency)
            if how["condition"] == "service_healthy":
                assert services[dependency].get("healthcheck"), (name, dependency)
    assert services["allocator"]["healthcheck"]["test"][-1].endswith("/healthz")


@compose
def test_mlflow_and_the_airflow_ui_need_a_login_and_are_published_on_loopback(config):
    """MLflow runs its basic-auth app (admin from the secrets, users on their own volume); the clients log in; the
    SimpleAuthManager UI (development and testing, Airflow says) and MLflow listen on the host's loopback only."""
    services = config["services"]
    mlflow = services["mlflow"]
    assert mlflow["command"][:4] == ["mlflow", "server", "--app-name", "basic-auth"]
    env = mlflow["environment"]
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"] == SECRETS["MLFLOW_ADMIN_PASSWORD"]
    assert env["MLFLOW_FLASK_SERVER_SECRET_KEY"] == SECRETS["MLFLOW_SECRET_KEY"]
    assert env["MLFLOW_AUTH_CONFIG_PATH"] == "/etc/mlflow/basic_auth.ini"
    dockerfile = (REPO / "docker" / "mlflow.Dockerfile").read_text()
    assert "COPY mlflow_basic_auth.ini /etc/mlflow/basic_auth.ini" in dockerfile
    assert "/mlflow-auth" in _named_mounts(mlflow, config)
    for name in ("airflow-scheduler", "airflow-worker", "airflow-apiserver"):
        client = services[name]["environment"]
        assert (client["MLFLOW_TRACKING_USERNAME"], client["MLFLOW_TRACKING_PASSWORD"]) == (
            env["MLFLOW_AUTH_ADMIN_USERNAME"], SECRETS["MLFLOW_ADMIN_PASSWORD"]), name
    for name in ("mlflow", "airflow-apiserver"):
        (port,) = services[name]["ports"]
        host_ip = port["host_ip"] if isinstance(port, dict) else port.split(":")[0]
        assert host_ip == "127.0.0.1", name


@pytest.mark.slow
def test_mlflow_basic_auth_refuses_strangers_and_hetplan_logs_in(tmp_path, monkeypatch):
    """The basic-auth settings compose ships, with a SQLite user store here: a request without a login gets 401;
    hetplan, given the admin's login as the Airflow workers are, creates its experiment (tagged model training)."""
    from hetplan.tracking import EXPERIMENT_KIND, experiment_id

    ini = (REPO / "docker" / "mlflow_basic_auth.ini").read_text()
    (tmp_path / "auth.ini").write_text(ini.replace("sqlite:////mlflow-auth/basic_auth.db",
                                                   f"sqlite:///{tmp_path}/basic_auth.db"))
    port = free_port()
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "auth.ini"), "MLFLOW_AUTH_ADMIN_USERNAME": "admin",
           "MLFLOW_AUTH_ADMIN_PASSWORD": SECRETS["MLFLOW_ADMIN_PASSWORD"],
           "MLFLOW_FLASK_SERVER_SECRET_KEY": SECRETS["MLFLOW_SECRET_KEY"],
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    mlflow = str(Path(sys.executable).parent / "mlflow")  # this virtualenv's
    log = open(tmp_path / "mlflow.log", "wb")
    proc = subprocess.Popen([mlflow, "server", "--app-name", "basic-auth", "--backend-store-uri",
                             f"sqlite:///{tmp_path}/mlflow.db", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "mlflow.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "mlflow.log").read_text()[-3000:]
            time.sleep(0.5)
        search = url + "/api/2.0/mlflow/experiments/search?max_results=10"
        assert httpx.get(search, timeout=10).status_code == 401
        assert httpx.get(search, auth=("admin", "wrong"), timeout=10).status_code == 401
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRETS["MLFLOW_ADMIN_PASSWORD"])
        from mlflow.tracking import MlflowClient

        created = experiment_id(url, "hetplan-planning")
        assert MlflowClient(url).get_experiment(created).tags[EXPERIMENT_KIND[0]] == EXPERIMENT_KIND[1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@compose
def test_gpu_workers_only_with_the_gpu_profile(config):
    gpu = [name for name, s in config["services"].items()
           if s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")]
    assert gpu == ["airflow-worker-gpu-t4"]
    for name, service in config["services"].items():
        assert (service.get("profiles") == ["gpu"]) == (name in gpu), name
    # no queue waits for a worker that the default profile does not start
    assert config["services"]["airflow-scheduler"]["environment"]["HETPLAN_PROFILE_QUEUES"] == ""


@compose
def test_nothing_is_installed_when_a_container_starts(config):
    for name, service in config["services"].items():
        words = json.dumps([service.get("entrypoint"), service.get("command")])
        assert "pip" not in words and "install" not in words, name
    mlflow = config["services"]["mlflow"]
    dockerfile = (REPO / "docker" / "mlflow.Dockerfile").read_text()
    assert mlflow["build"]["dockerfile"] == "mlflow.Dockerfile"
    assert Path(mlflow["build"]["context"]).resolve() == (REPO / "docker").resolve()
    pins = _pins(REPO / "requirements.txt")
    image_pins = _pins(REPO / "docker" / "image-requirements.txt")
    assert f"FROM ghcr.io/mlflow/mlflow:v{pins['mlflow']}\n" in dockerfile  # the server the clients were tested with
    assert f'"psycopg2-binary=={image_pins["psycopg2-binary"]}"' in dockerfile


def test_the_image_installs_runtime_dependencies_only():
    dockerfile = (REPO / "Dockerfile").read_text()
    args = _image_pip_args(dockerfile)
    assert "-r" in args and args[args.index("-r") + 1] == "/opt/hetplan/src/docker/image-requirements.txt"
    assert args[args.index("-c") + 1] == "/opt/hetplan/src/requirements.txt"  # pins only
    assert "/opt/hetplan/src[airflow]" in args
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    shipped = [*project["dependencies"], *project["optional-dependencies"]["airflow"],
               *_pins(REPO / "docker" / "image-requirements.txt")]
    names = {re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower() for req in shipped}
    assert not names & TEST_ONLY
    extras = project["optional-dependencies"]
    assert {"pytest", "hypothesis", "schemathesis"} <= {re.split(r"[<>=]", r)[0] for r in extras["test"]}
    assert extras["gurobi"][0].startswith("gurobipy") and extras["torch"][0].startswith("torch")
    assert {"prometheus-client", "kubernetes"} <= {re.split(r"[<>=]", r)[0] for r in project["dependencies"]}


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip().lower()] = version.strip()
    return out


def _image_pip_args(dockerfile: str) -> list[str]:
    """The arguments of the Dockerfile's one `pip install` (continuation lines joined)."""
    text = dockerfile.replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("RUN ") and "pip install" in ln]
    words = shlex.split(line.split("pip install", 1)[1])
    return [w for w in words if w != "--no-cache-dir"]


# ------------------------------------------------------------------ slow: real virtualenvs


@pytest.fixture(scope="module")
def pip(tmp_path_factory) -> Path:
    """The pip every virtualenv here is given (a wheel of it)."""
    return download_pip(tmp_path_factory.mktemp("pip"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, pip) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"), pip)


@pytest.mark.slow
def test_the_wheel_alone_imports_every_module_and_serves_a_plan(pip, wheel, tmp_path):
    """`pip install <wheel>` in a clean virtualenv: every module imports, `hetplan serve --from-plan` places a job."""
    bin_dir = make_venv(tmp_path / "venv", str(wheel), pip=pip)
    code = ("import importlib, json, pkgutil, hetplan\nfailed = {}\n"
            "for m in ['hetplan_estimators', *(i.name for i in pkgutil.walk_packages(hetplan.__path__, 'hetplan.'))]:\n"
            "    try:\n        importlib.import_module(m)\n"
            "    except ImportError as exc:\n        failed[m] = exc.name or str(exc)\n"
            "print(json.dumps({'file': hetplan.__file__, 'failed': failed}))\n")
    done = subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=clean_env())
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["file"].startswith(str(tmp_path / "venv"))  # the installed wheel, not this checkout
    assert report["failed"] == OPTIONAL_MODULES  # only what an extra provides (torch: `pip install hetplan[torch]`)
    listed = subprocess.run([str(bin_dir / "python"), "-m", "pip", "list", "--format", "json"], capture_output=True,
                            text=True, timeout=120, env=clean_env())
    assert not {p["name"].lower() for p in json.loads(listed.stdout)} & TEST_ONLY

    helped = subprocess.run([str(bin_dir / "hetplan"), "serve", "--help"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env=clean_env())
    assert helped.returncode == 0 and "--from-plan" in helped.stdout, helped.stderr
    plan = _plan_file(tmp_path)
    answer = _serve_and_allocate(bin_dir / "hetplan", tmp_path, plan, tmp_path / "hints")
    assert answer["status"] == "allocated", answer
    assert answer["allocation"]["node"].startswith("aws:g5.12xlarge-")


def _plan_file(tmp_path: Path) -> Path:
    """A small plan: two 4x A10G nodes added, one owned 8-GPU node."""
    from hetplan.contracts.plan import Plan

    plan = Plan(plan_id="p-deploy", created_at=datetime(2026, 12, 1, tzinfo=timezone.utc), budget_per_hour=50.0,
                cost_per_hour=11.34, node_counts={"aws:g5.12xlarge": 2}, owned_nodes={"pai:misc": 1}, objective=1.0,
                lp_bound=1.0, gap=0.0, solver="highs", solve_seconds=0.1,
                shapes={"aws:g5.12xlarge": {"gpu_type": "A10G", "gpus": 4, "vcpus": 48, "mem_gb": 192,
                                            "price_per_hour": 5.67},
                        "pai:misc": {"gpu_type": "MISC", "gpus": 8, "vcpus": 96, "mem_gb": 512,
                                     "price_per_hour": 0.0}})
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    return path


def _serve_and_allocate(hetplan: Path, tmp_path: Path, plan: Path, store: Path, argv: list[str] | None = None,
                        env: dict | None = None) -> dict:
    """Start `hetplan serve --from-plan` (or `argv`) on a free port, allocate one 4-GPU job, stop it."""
    port = free_port()
    argv = argv or [str(hetplan), "serve", "--from-plan", str(plan), "--store", str(store),
                    "--db", str(tmp_path / "allocator.db"), "--host", "127.0.0.1", "--port", str(port)]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=env or clean_env())
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        return httpx.post(url + "/v1/allocate", json={"job_id": "first", "model": "res18", "num_gpus": 4},
                          timeout=30).json()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@compose
@pytest.mark.slow
def test_every_service_command_runs_in_the_images_python_environment(config, pip, wheel, tmp_path):
    """The image's environment rebuilt from its requirement set (the Dockerfile's own `pip install` arguments):
    each service's command, and each health check's, answers `--help` there; no test tool is installed."""
    args = [a.replace("/opt/hetplan/src[airflow]", f"{wheel}[airflow]").replace("/opt/hetplan/src/", f"{REPO}/")
            for a in _image_pip_args((REPO / "Dockerfile").read_text())]
    bin_dir = make_venv(tmp_path / "image", *args, pip=pip, pinned=False)  # the Dockerfile's own -c requirements.txt
    listed = subprocess.run([str(bin_dir / "python"), "-m", "pip", "list", "--format", "json"], capture_output=True,
                            text=True, timeout=120, env=clean_env())
    assert not {p["name"].lower() for p in json.loads(listed.stdout)} & TEST_ONLY

    commands = []  # (service, argv, env): what each service runs and its health check, as `--help` / compile
    for name, service in config["services"].items():
        if service.get("image") != HETPLAN_IMAGE and name != "mlflow":
            continue
        env = clean_env(**{k: str(v) for k, v in (service.get("environment") or {}).items()},
                        AIRFLOW_HOME=str(tmp_path / "airflow-home"),
                        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
                        AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"))
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
        service_argvs = [_service_argv(service)]
        test = service.get("healthcheck", {}).get("test") or []
        if test and test[0] in ("CMD", "CMD-SHELL"):
            service_argvs.append(test[1:] if test[0] == "CMD" else shlex.split(test[1].replace("$${", "${")))
        for argv in service_argvs:
            if argv[0] in IMAGE_TOOLS:
                continue
            assert (bin_dir / argv[0]).is_file(), f"{name}: {argv[0]} is not in the image's environment"
            if argv[0] == "python":  # a health check's one-liner: it must at least compile
                argv = [argv[0], "-c", f"compile({argv[2]!r}, 'healthcheck', 'exec')"]
            else:
                argv = [*argv, "--help"]
            commands.append((name, argv, env))

    def check(command: tuple[str, list[str], dict[str, str]]) -> tuple[str, str, str]:
        name, argv, env = command
        done = subprocess.run([str(bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path, env=env)
        assert done.returncode == 0, f"{name}: {' '.join(argv)}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        return name, argv[0], argv[1] if len(argv) > 1 else ""

    # The first command alone (it writes AIRFLOW_HOME's config and the bytecode the others import), then the
    # rest two at a time: each is a separate process, as each service is a separate container.
    checked = [check(commands[0])]
    with ThreadPoolExecutor(max_workers=2) as pool:
        checked += pool.map(check, commands[1:])
    assert {c[0] for c in checked} >= {"allocator", "airflow-apiserver", "airflow-scheduler", "airflow-worker",
                                      "airflow-dag-processor", "airflow-triggerer", INIT, "mlflow"}
    imports = subprocess.run([str(bin_dir / "python"), "-c", "import psycopg2, hetplan.allocator.metrics"],
                             capture_output=True, text=True, timeout=120, env=clean_env())
    assert imports.returncode == 0, imports.stderr


def _service_argv(service: dict) -> list[str]:
    """What a service runs: Airflow's image entrypoint runs `airflow <command>`; init's script runs
    `/entrypoint airflow version`; an explicit entrypoint is used as is."""
    command = service.get("command") or []
    command = shlex.split(command) if isinstance(command, str) else list(command)
    entrypoint = service.get("entrypoint")
    entrypoint = shlex.split(entrypoint) if isinstance(entrypoint, str) else list(entrypoint or [])
    if entrypoint and entrypoint[0].endswith("bash"):
        (line,) = [ln for ln in command[-1].splitlines() if "/entrypoint " in ln]
        return shlex.split(line.split("/entrypoint ", 1)[1])
    if entrypoint:
        return [*entrypoint, *command]
    return command if command and command[0] == "mlflow" else ["airflow", *command]
