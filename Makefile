# The two front-door commands: `make main` (set up, run the main job) and `make test` (set up, run the tests).
# Both create the virtualenv on first use and reinstall only when requirements.txt or pyproject.toml change.
PYTHON ?= python3
VENV ?= .venv
WORKSPACE ?= .hetplan
BUDGET ?= 200
BIN = $(VENV)/bin
export MLFLOW_TRACKING_URI ?= sqlite:///$(WORKSPACE)/mlflow.db

.PHONY: setup main test

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt -e .
	touch $@

# The main job on embedded defaults: seed a workspace, fit the sensitivity models (MLflow on SQLite),
# plan under a budget (HiGHS or gurobipy in-process), publish the hint table, show it.
main: setup
	$(BIN)/hetplan init --workspace $(WORKSPACE)
	$(BIN)/hetplan fit --profiles $(WORKSPACE)/profiles.csv --out $(WORKSPACE)/curves.parquet
	$(BIN)/hetplan plan --budget $(BUDGET) --curves $(WORKSPACE)/curves.parquet --catalog $(WORKSPACE)/catalog.csv \
		--demand $(WORKSPACE)/demand.csv --out-dir $(WORKSPACE)/plan --sweep 50,100,200,400
	$(BIN)/hetplan publish --plan $(WORKSPACE)/plan/plan.json --hints $(WORKSPACE)/plan/hints.parquet \
		--store $(WORKSPACE)/hints
	$(BIN)/hetplan hints show --store $(WORKSPACE)/hints
	@echo
	@echo "Published hint table: $$(cat $(WORKSPACE)/hints/LATEST) in $(WORKSPACE)/hints"
	@echo "MLflow UI:       $(BIN)/mlflow ui --backend-store-uri $(MLFLOW_TRACKING_URI) --host 127.0.0.1 --port 5000"
	@echo "Allocator:       $(BIN)/hetplan serve --store $(WORKSPACE)/hints --host 127.0.0.1 --port 8080"

test: setup
	$(BIN)/python -m pytest
