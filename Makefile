# The two front-door commands: `make main` (set up, run the main job) and `make test` (set up, run the tests).
# Both create the virtualenv on first use and reinstall only when requirements.txt or pyproject.toml change.
PYTHON ?= python3
VENV ?= .venv
WORKSPACE ?= .hetplan
BIN = $(VENV)/bin

.PHONY: setup main test

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt -e .
	touch $@

main: setup
	$(BIN)/hetplan init --workspace $(WORKSPACE)

test: setup
	$(BIN)/python -m pytest
