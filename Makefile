# qwen3-trn-repro: every target bootstraps .venv from the lock when it is missing or stale.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.lock-installed
# bash: the rehearsal nights keep their exit code through a pipe (set -o pipefail).
SHELL  := /bin/bash

.PHONY: venv repro test test-fast lint neuron-venv test-neuron rehearse-trn2 rehearse-default rehearse-flipped rehearse-device-random bench lock fixtures goldens bump bisect clean

venv: $(STAMP)

$(STAMP): requirements-lock.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --require-hashes --no-deps -r requirements-lock.txt
	cp requirements-lock.txt $(STAMP)

# The main job: every recipe on the cpu tier, with the published-vs-measured table.
repro: venv
	$(PY) -m harness run all --tier cpu

# The cpu test tier, in parallel on every core.
test: venv
	$(PY) -m pytest -m cpu -n auto --dist loadgroup $(PYTEST_ARGS)

# The everyday lane: every cpu test not marked slow (tiny sizes; every recipe's config, refusals, report
# paths, one real launch of the main job). What it leaves to `make test`: README "Tests".
test-fast: venv lint
	$(PY) -m pytest -m "cpu and not slow" -n auto --dist loadgroup $(PYTEST_ARGS)

# The stage contracts (pyproject.toml [tool.importlinter]) and the one format (ruff, [tool.ruff]).
lint: venv
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Figures, not tests: harness overhead, per-recipe step time/tokens/s/memory, suite wall time
# (report/bench/*.json; several minutes). E.g. BENCH_ARGS="overhead --reps 6" or "recipes --tier trn2".
bench: venv
	$(PY) -m benchmarks $(or $(BENCH_ARGS),all)

# The trn2 tier (Neuron SDK 2.33) in $(NEURON_VENV_DIR): requirements-neuron.txt + TorchTitan Neuron
# from git. The 2.33 standalone wheels are Ubuntu 26.04 only; on the TorchNeuron DLAMI (24.04/26.04) reuse its venv:
#   NEURON_VENV=/opt/aws_neuronx_venv_torch_neuronx_2_14_0 make neuron-venv
# `scripts/neuron_venv.sh --check` prints the plan without changing anything.
NEURON_VENV_DIR ?= .venv-neuron

neuron-venv:
	VENV=$(NEURON_VENV_DIR) scripts/neuron_venv.sh

# On a trn2.48xlarge: every neuron test, serially (a 64-rank job takes the whole instance).
# QWEN3_REQUIRE_TRN2=1 turns a missing device, package, weights or dataset into a failure.
test-neuron: neuron-venv
	$(NEURON_VENV_DIR)/bin/python -m pytest -m neuron -p no:xdist $(PYTEST_ARGS)

# The trn2 night rehearsed on cpu: .github/workflows/nightly-trn2.yml's own steps, in order, in a scratch
# dir, on stand-in Neuron packages (rehearsal/night.py), built first into STANDINS (offline, ~6 s).
# REHEARSAL_ARGS="--night later" expects a later night's exit codes. Never a trn2 result.
# The third night is short: random ops on the stand-in device draw from the CPU generator (DEVICE_RANDOM=0), so the
# night's preflight (python -m harness.night.device_random) must stop it with one line and no launch.
STANDINS ?= $(CURDIR)/.rehearsal-standins
# Each behaviour of the real packages no cited source confirms is a stand-in switch (rehearsal/settings.py
# SWITCHES): the night runs with every switch at its default, then with these flipped. DEVICE_RANDOM=0 (the
# public copy's CPU-generator fallback) is not flipped here: under it DTensor's trunc_normal_ never returns (the third night).
REHEARSAL_FLIPPED ?= --switch QWEN3_STANDIN_AUTOLOAD=0 --switch QWEN3_STANDIN_LOCAL_RANK_CORES=0 \
	--switch QWEN3_STANDIN_WRAP_NKI_CONTIGUOUS=1 --switch QWEN3_STANDIN_WRAP_NKI_RETURNS_ARGUMENT=0

# The three nights run side by side (REHEARSAL_JOBS=1: one after another): each has its own scratch dir, fake
# devices, core locks and ports, and one night alone leaves a third of 2 cores idle (a rank waits on its peer, pip
# on the disk). Each line is prefixed with its night; each night's exit code is its own.
REHEARSAL_JOBS ?= 3
REHEARSAL_NIGHTS := rehearse-default rehearse-flipped rehearse-device-random

rehearse-trn2: venv
	$(PY) -m rehearsal.standins build --out $(STANDINS)
	$(MAKE) --no-print-directory -j$(REHEARSAL_JOBS) $(REHEARSAL_NIGHTS)

# One night each: $(call night,LABEL,ARGS); `set -o pipefail` keeps its exit code through the prefixing sed.
night = set -o pipefail; $(PY) -m rehearsal.night --standins $(STANDINS) $(2) 2>&1 | sed -u 's/^/[$(1)] /'

rehearse-default:
	$(call night,default,$(REHEARSAL_ARGS))
rehearse-flipped:
	$(call night,flipped,$(REHEARSAL_FLIPPED) $(REHEARSAL_ARGS))
rehearse-device-random:
	$(call night,device-random,--night device-random --switch QWEN3_STANDIN_DEVICE_RANDOM=0)

# Regenerate the lock (pip-tools, exact pins with hashes) from requirements.in.
lock: venv
	$(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	  --no-emit-index-url --no-emit-find-links -o requirements-lock.txt requirements.in

# List every exact-lane cpu golden a real run would change (old → new); ACCEPT=1 writes them.
# Published and proxy values (the tutorial's claims) are never touched.
goldens: venv
	$(PY) -m pytest -m cpu -n auto --dist loadgroup --update-goldens $(if $(ACCEPT),--accept-goldens)

# Rehearse a version bump: PKGS="transformers==5.23.0 [torch==2.15.0 ...]" in a separate .venv-bump-<hash>,
# cpu tier there and on the lock; report/bump/<name>.md + .json; exit 1 if a published-number check breaks.
# BUMP_ARGS="--dry-run" prints the plan only (harness/bump/).
bump: venv
	$(PY) -m harness.bump $(PKGS) $(BUMP_ARGS)

# Which package of PKGS="name==version ..." (make bump's candidate set), and which release of it, moves
# TEST="tests/cpu/test_x.py::test_y ..." (each point installed over .venv in .venv-bisect-<hash>, its tests run
# twice: differing outcomes are reported flaky); report/bisect/<name>.md + .json. BISECT_ARGS="--find-links DIR" offline.
bisect: venv
	$(PY) -m harness.bump --bisect $(PKGS) $(foreach t,$(TEST),--test $(t)) $(BISECT_ARGS)

# Rebuild the tiny tokenizer, corpus and checkpoints in fixtures/ (deterministic).
fixtures: venv
	$(PY) -m fixtures.build_fixtures

clean:
	rm -rf report .pytest_cache
