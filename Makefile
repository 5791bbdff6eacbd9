# The two commands of the README: `make demo` and `make test`. Both create .venv and install
# the project with everything it needs (torch pinned and installed first: the CPU build where pip finds one, see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-test
BENCH_STAMP := $(VENV)/.installed-bench
TORCH  := torch==2.13.0

.PHONY: install demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/reco-sampled reproduce --out reports/reproduce

test: $(STAMP)
	$(BIN)/python -m pytest -q

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/bench_exact_metrics.py

clean:
	rm -rf $(VENV) build *.egg-info
