# kvroute: `make demo` runs the product on embedded defaults, `make test` runs the suite.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvroute-installed
# Postgres used for the second pass of the control-plane tests when reachable.
TEST_POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/test

.PHONY: demo test test-fast test-vllm lint bench venv clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m controlplane.demo

test: $(STAMP)
	@bash scripts/test.sh

test-fast: $(STAMP)
	$(VENV)/bin/pytest tests/routing/core -q

test-vllm: $(STAMP)
	@bash scripts/test_vllm.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy routing/core workers/sim

bench: $(STAMP)
	$(PY) bench/core_bench.py

clean:
	rm -rf $(VENV) var/*.sqlite3 build *.egg-info
