# The two commands of the README: `make demo` and `make test`. Both create .venv and install
# the project with everything it needs (torch pinned and installed first: the CPU build where pip finds one, see README).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-test
BENCH_STAMP := $(VENV)/.installed-bench
TORCH  := torch==2.13.0
# Ray after the test extra: RecBole 1.2.1 pins ray<=2.6.3 (pip warns about the pin and installs); the Ray adapter's
# tests need Ray Data >= 2.44 (docs/install.md)
RAY    := ray[data]>=2.44

.PHONY: install demo test bench docs docs-build clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Bytecode: the environment may set PYTHONDONTWRITEBYTECODE, and then every process the suite starts (xdist workers,
# Ray actors, DDP ranks, subprocesses) would compile torch & co. from source again: every recipe here writes it.
unexport PYTHONDONTWRITEBYTECODE

# pip writes the bytecode of every file it installs, one at a time (~70 s on 2 cores; compileall on every core: ~50 s
# for 20,000 files); the suite imports about a quarter of them. So pip installs without it and imports of what the
# suite uses write theirs; what else a test imports is written at its first import. pip installs on one core: torch's
# own stack (~15 s) is imported on the other while pip installs the test extra (torch and numpy first, so that it
# never reads a package pip is writing; a failure there only leaves bytecode unwritten, and the imports after pip
# import torch again), then the frameworks and the rest side by side. An import that fails after pip fails the
# install (the test extra is broken).
WARM_TORCH := torch, torch._dynamo, torch._inductor.compile_fx
WARM_FRAMEWORKS := torchmetrics, lightning.pytorch, pytorch_lightning
WARM_REST  := numpy, scipy.stats, scipy.optimize, scipy.sparse, pandas, ray.data, matplotlib.pyplot, mlflow, \
              mkdocs.commands.build, hypothesis, yaml, mypy.main, recometrics, recbole.quick_start, reco_sampled_plugin
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --no-compile $(TORCH) numpy
	$(BIN)/python -c 'import $(WARM_TORCH)' >/dev/null 2>&1 & torch_pid=$$!; \
	$(BIN)/pip install --quiet --no-compile -e '.[test]' && \
	$(BIN)/pip install --quiet --no-compile --upgrade '$(RAY)'; pip_rc=$$?; wait $$torch_pid; test $$pip_rc -eq 0
	$(BIN)/python -c 'import $(WARM_FRAMEWORKS)' & frameworks_pid=$$!; \
	$(BIN)/python -c 'import $(WARM_REST)'; rest_rc=$$?; wait $$frameworks_pid && test $$rest_rc -eq 0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/reco-sampled reproduce --out reports/reproduce

# the type check (pyproject's [tool.mypy]: the whole package, every function annotated) beside the suite on every
# core (pytest-xdist; an idle worker takes over queued tests from the busy one): mypy runs in the background while
# pytest collects and runs, its report printed after pytest's; the target fails if either fails
# The package's bytecode is written first, so that the processes the suite starts at once do not each compile it (a
# source that does not compile fails in pytest and mypy, which report it)
test: $(STAMP)
	@$(BIN)/python -m compileall -qq reco_sampled_plugin >/dev/null 2>&1 || true
	@log=$$(mktemp); $(BIN)/python -m mypy >$$log 2>&1 & mypy_pid=$$!; \
	$(BIN)/python -m pytest -q -n auto --dist worksteal; pytest_rc=$$?; \
	wait $$mypy_pid; mypy_rc=$$?; echo "mypy (exit $$mypy_rc):"; cat $$log; rm -f $$log; \
	test $$pytest_rc -eq 0 -a $$mypy_rc -eq 0

# the documentation site (mkdocs.yml): `make docs` serves it at http://127.0.0.1:8000 and rebuilds on edits;
# `make docs-build` writes site/ in strict mode (what tests/test_docs_site.py checks). The test extra has the docs extra.
docs: $(STAMP)
	$(BIN)/python -m mkdocs serve

docs-build: $(STAMP)
	$(BIN)/python -m mkdocs build --strict --site-dir site

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/bench_exact_metrics.py

clean:
	rm -rf $(VENV) build site .mypy_cache *.egg-info
