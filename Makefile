# qwen3-trn-repro: every target bootstraps .venv from the lock when it is missing or stale.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.lock-installed

.PHONY: venv repro test test-neuron bench lock fixtures goldens clean

venv: $(STAMP)

$(STAMP): requirements-lock.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --require-hashes --no-deps -r requirements-lock.txt
	cp requirements-lock.txt $(STAMP)

# The main job: every recipe on the cpu tier, with the published-vs-measured table.
repro: venv
	$(PY) -m recipes run all --tier cpu

# The cpu test tier, in parallel on every core.
test: venv
	$(PY) -m pytest -m cpu -n auto $(PYTEST_ARGS)

# Figures, not tests: harness overhead, per-recipe step time/tokens/s/memory, suite wall time
# (report/bench/*.json; several minutes). E.g. BENCH_ARGS="overhead --reps 6" or "recipes --tier trn2".
bench: venv
	$(PY) -m benchmarks $(or $(BENCH_ARGS),all)

# On a trn2.48xlarge with requirements-neuron.txt installed.
test-neuron:
	python -m pytest -m neuron

# Regenerate the lock (pip-tools, exact pins with hashes) from requirements.in.
lock: venv
	$(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	  --no-emit-index-url --no-emit-find-links -o requirements-lock.txt requirements.in

# Rewrite the exact-lane cpu goldens from a real run (published values are never touched).
goldens: venv
	$(PY) -m pytest -m cpu -n auto --update-goldens

# Rebuild the tiny tokenizer, corpus and checkpoints in fixtures/ (deterministic).
fixtures: venv
	$(PY) -m fixtures.build_fixtures

clean:
	rm -rf report .pytest_cache
