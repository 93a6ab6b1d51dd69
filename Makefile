# The two front-door commands: `make main` (set up, run the main job) and `make test` (set up, run the tests).
# Both create the virtualenv on first use and reinstall only when requirements.txt or pyproject.toml change.
PYTHON ?= python3
VENV ?= .venv
WORKSPACE ?= $(CURDIR)/.hetplan
BUDGET ?= 200
# More of the nightly DAG's params, as JSON members, e.g. NIGHTLY_CONF='"trace": "allocator:http://127.0.0.1:8080"'
NIGHTLY_CONF ?=
BIN = $(VENV)/bin
export MLFLOW_TRACKING_URI ?= sqlite:///$(WORKSPACE)/mlflow.db
# Airflow on embedded defaults: SQLite metadata in the workspace, this repo's DAGs and plugins, loopback only
# (`airflow dags list` and the other `airflow` commands need the first three of these in your shell too: `make main`
# prints them).
export AIRFLOW_HOME ?= $(WORKSPACE)/airflow
export AIRFLOW__CORE__LOAD_EXAMPLES = False
export AIRFLOW__CORE__DAGS_FOLDER = $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER = $(CURDIR)/plugins
export AIRFLOW__CORE__PARALLELISM = 4
export AIRFLOW__API__HOST = 127.0.0.1
# Not the in-process execution API's three INFO lines per task instance (state updates, rendered fields): with the
# mapped replays they were a sixth of `make main`'s log. Its warnings and errors still show.
export AIRFLOW__LOGGING__NAMESPACE_LEVELS = airflow.api_fastapi.execution_api=WARNING
# The allocator as `make main` prints it: the published hints, and the plan's nodes (owned and added, one per
# node, named <shape>-<i>) so that the first allocate places a job (tests/test_first_hour.py runs this line).
ALLOCATOR = $(abspath $(BIN))/hetplan serve --store $(WORKSPACE)/hints --db $(WORKSPACE)/allocator.db \
	--from-plan $(WORKSPACE)/current/plan/plan.json --host 127.0.0.1 --port 8080

comma := ,

.PHONY: setup main pipeline test test-fast deploy-env

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt -e .
	touch $@

# The main job: the nightly Airflow DAG run for real on the workspace (your fleet and trace after `hetplan init
# --fleet F --trace T`, else the embedded defaults: profile this host for real, derived profiles for the GPU types
# not present, fit with MLflow on SQLite, plan the workspace's workload on its owned fleet plus what BUDGET rents,
# publish), then the Kueue export DAG it triggers, then the decision in words and how to look further. Every
# command printed runs as printed (tests/test_as_printed.py runs them).
main: setup
	$(BIN)/airflow db migrate
	$(BIN)/airflow dags test hetplan_nightly -c '{"workspace": "$(WORKSPACE)", "budget": $(BUDGET)$(if $(NIGHTLY_CONF),$(comma) $(NIGHTLY_CONF))}'
	$(BIN)/airflow dags test hetplan_publish -c '{"workspace": "$(WORKSPACE)"}'
	$(BIN)/hetplan hints show --store $(WORKSPACE)/hints --ranks 1
	@echo
	@echo "Decision:        $$(sed -n 1p $(WORKSPACE)/report/decision.txt)"
	@echo "                 $$(sed -n 2p $(WORKSPACE)/report/decision.txt)"
	@echo "                 $$(sed -n 3p $(WORKSPACE)/report/decision.txt)"
	@echo "Report:          $(WORKSPACE)/report/report.html (the decision, node mix, curves and knees, predicted JCT, what needs profiling)"
	@echo "Plan detail:     $$(cat $(WORKSPACE)/current/plan/summary.txt)"
	@echo "Latest run:      $(WORKSPACE)/current/ (curves.parquet, plan/: plan.json, hints.parquet, kueue.yaml, baselines.csv)"
	@echo "Published:       $$(cat $(WORKSPACE)/hints/LATEST) in $(WORKSPACE)/hints"
	@echo "Curves:          $(abspath $(BIN))/hetplan curves show --curves $(WORKSPACE)/current/curves.parquet"
	@echo "MLflow UI:       $(abspath $(BIN))/mlflow ui --backend-store-uri $(MLFLOW_TRACKING_URI) --host 127.0.0.1 --port 5000"
	@echo "Allocator:       $(ALLOCATOR)"
	@echo "  then allocate: curl -s -X POST 127.0.0.1:8080/v1/allocate -H 'Content-Type: application/json' -d '{\"job_id\": \"j1\", \"model\": \"res50\", \"num_gpus\": 1}'"
	@echo "  its jobs:      $(abspath $(BIN))/hetplan trace export --url http://127.0.0.1:8080 --curves $(WORKSPACE)/current/curves.parquet --out $(WORKSPACE)/ran.csv"
	@echo "Plan again:      $(abspath $(BIN))/hetplan plan --budget $(BUDGET) --workload $(WORKSPACE)/trace.csv --owned $(WORKSPACE)/fleet.csv \\"
	@echo "                   --catalog $(WORKSPACE)/catalog.csv --curves $(WORKSPACE)/current/curves.parquet --out-dir $(WORKSPACE)/plan"
	@echo "Evaluate:        $(abspath $(BIN))/hetplan evaluate --trace $(WORKSPACE)/trace.csv --budget $(BUDGET) --rho 0.5,1.3 \\"
	@echo "                   --owned $(WORKSPACE)/fleet.csv --catalog $(WORKSPACE)/catalog.csv --truth $(WORKSPACE)/profiles.csv \\"
	@echo "                   --curves $(WORKSPACE)/current/curves.parquet --out-dir $(WORKSPACE)/evaluation"
	@echo "Airflow:         AIRFLOW_HOME=$(AIRFLOW_HOME) AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags AIRFLOW__CORE__PLUGINS_FOLDER=$(CURDIR)/plugins \\"
	@echo "                   $(abspath $(BIN))/airflow dags list"
	@echo "Nightly:         created paused: switch it on with the same three variables and $(abspath $(BIN))/airflow dags unpause hetplan_nightly"
	@echo "                   (a running scheduler, e.g. airflow standalone, then runs it daily)"

# The same offline steps through the CLI, with plots and a budget sweep (no Airflow), then the four-way
# evaluation of the plan on the workspace's trace in the simulator. An existing workspace is kept as it is
# (`hetplan init` refuses to overwrite it; `hetplan init --force` re-seeds it).
pipeline: setup
	test -f $(WORKSPACE)/catalog.csv || $(BIN)/hetplan init --workspace $(WORKSPACE)
	$(BIN)/hetplan fit --profiles $(WORKSPACE)/profiles.csv --out $(WORKSPACE)/curves.parquet
	$(BIN)/hetplan plan --budget $(BUDGET) --curves $(WORKSPACE)/curves.parquet --catalog $(WORKSPACE)/catalog.csv \
		--owned $(WORKSPACE)/fleet.csv --workload $(WORKSPACE)/trace.csv --out-dir $(WORKSPACE)/plan --sweep 100
	$(BIN)/hetplan publish --plan $(WORKSPACE)/plan/plan.json --hints $(WORKSPACE)/plan/hints.parquet \
		--store $(WORKSPACE)/hints
	$(BIN)/hetplan hints show --store $(WORKSPACE)/hints
	$(BIN)/hetplan report --plan-dir $(WORKSPACE)/plan --curves $(WORKSPACE)/curves.parquet \
		--workload $(WORKSPACE)/trace.csv --out-dir $(WORKSPACE)/plan/report
	$(BIN)/hetplan evaluate --trace $(WORKSPACE)/trace.csv --budget $(BUDGET) --rho 0.5,1.3 \
		--owned $(WORKSPACE)/fleet.csv --catalog $(WORKSPACE)/catalog.csv \
		--curves $(WORKSPACE)/curves.parquet --truth $(WORKSPACE)/profiles.csv --out-dir $(WORKSPACE)/evaluation

test: setup
	$(BIN)/python -m pytest

# For iteration: everything but the tests marked slow (real Airflow DAG runs, MLflow registries, subprocesses).
test-fast: setup
	$(BIN)/python -m pytest -m "not slow"

# docker-compose.yaml's settings for this host: AIRFLOW_UID and freshly generated secrets (compose refuses to start
# without them). Written once to .env (mode 600, ignored by git and by the image); never overwritten.
deploy-env:
	@test ! -e .env || { echo ".env exists; delete it to generate new secrets" >&2; exit 1; }
	@umask 077 && $(PYTHON) -c 'import base64, os, secrets; print("AIRFLOW_UID=%d" % os.getuid()); \
	print("AIRFLOW_JWT_SECRET=" + secrets.token_urlsafe(48)); \
	print("AIRFLOW_FERNET_KEY=" + base64.urlsafe_b64encode(os.urandom(32)).decode()); \
	print("HETPLAN_ADMIN_TOKEN=" + secrets.token_urlsafe(32)); \
	print("HETPLAN_WRITE_TOKEN=" + secrets.token_urlsafe(32)); \
	print("MLFLOW_ADMIN_PASSWORD=" + secrets.token_urlsafe(24)); \
	print("MLFLOW_SECRET_KEY=" + secrets.token_urlsafe(32))' > .env.tmp && mv .env.tmp .env
	@echo "wrote .env (AIRFLOW_UID, AIRFLOW_JWT_SECRET, AIRFLOW_FERNET_KEY, HETPLAN_ADMIN_TOKEN, HETPLAN_WRITE_TOKEN, MLFLOW_ADMIN_PASSWORD, MLFLOW_SECRET_KEY)"
