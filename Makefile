# Two commands: `make up` runs the product, `make test` runs the tests.
# Both create .venv and install what they need on a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test test-slow sanitize reliability bench bench-analyze bench-commits venv clean test-cluster bench-scaleout

$(STAMP): pyproject.toml setup.py $(wildcard collector/_speedups_src/*.c collector/_speedups_src/*.h)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,test]'
	touch $(STAMP)

venv: $(STAMP)

up: $(STAMP)
	$(BIN)/shapewatch up

# The suites that use the accelerator run a second time on its pure-Python twin
# (collector/_pyspeedups.py, what runs where the C cannot be built): both must pass them. Left out
# of that run: the store's memory-limit test (a minute of writes, about DuckDB) and the import CLI's
# tests other than those reading whole files through scan_lines.
# Both runs spread their tests over TEST_WORKERS processes (pytest-xdist): on the 2-core machine
# (2026-12-03) the default run took 14 minutes in one process and under 8 in two (many tests wait
# on a server or a subprocess). TEST_WORKERS=0 runs them in this process (a debugger, -x, print
# output); TEST_WORKERS=auto takes one per core.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)
	SHAPEWATCH_ACCEL=python $(BIN)/python -m pytest -q -n $(TEST_WORKERS) \
		tests/collector/test_accel.py tests/collector/test_envelope.py tests/collector/test_envelope_fast_path.py \
		tests/collector/test_scanner.py tests/collector/test_flatten.py tests/collector/test_rollup.py \
		tests/collector/test_number_rollups.py tests/collector/test_store.py tests/collector/test_tiers.py \
		tests/collector/test_privacy.py \
		--deselect tests/collector/test_store.py::test_the_memory_limit_grows_with_the_key_index_so_writes_never_run_out \
		tests/collector/test_ingest_cli.py::test_ingest_stores_every_line_and_a_rerun_adds_nothing \
		tests/collector/test_ingest_cli.py::test_rejected_lines_go_to_a_quarantine_that_a_rerun_rewrites \
		tests/collector/test_ingest_cli.py::test_lines_read_in_blocks_are_the_lines_of_the_file

# Slow suites (SIGKILL crash test and friends): their own script, not the default run.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# The scale-out cluster on loopback (docs/scale-out.md): 3 NATS JetStream nodes, PostgreSQL, 2
# collectors, 2 workers, kills during ingest, the tally printed. It installs what it needs:
# PostgreSQL 15 through .ci/install-tools, NATS and the DuckLake extensions through the scaleout
# extra. CLUSTER_EVENTS sets the number of events.
CLUSTER_EVENTS ?= 200000
test-cluster: $(STAMP)
	.ci/install-tools
	$(BIN)/python -m pip install --quiet -e '.[all,test,scaleout]'
	SHAPEWATCH_CLUSTER_REQUIRED=1 SHAPEWATCH_CLUSTER_EVENTS=$(CLUSTER_EVENTS) $(BIN)/python -m pytest -q -s -m cluster tests/cluster

bench-scaleout: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[all,test,scaleout]'
	$(BIN)/python bench/scaleout.py

# The reliability suite (issue 7): every scenario of reliability/, the long ones included;
# writes reliability/REPORT.md with the figures each one measured.
reliability: $(STAMP)
	SHAPEWATCH_RELIABILITY_REPORT=reliability/REPORT.md $(BIN)/python -m pytest -q \
		-m 'reliability or not reliability' reliability

# The C accelerator built with ASan and UBSan into a temporary copy of the tree, and the
# scanner, envelope and fuzz tests run against it (.ci/sanitize; .venv is left as it is).
sanitize: $(STAMP)
	PY=$(abspath $(BIN))/python .ci/sanitize

bench: $(STAMP)
	$(BIN)/python bench/ingest.py

bench-analyze: $(STAMP)
	$(BIN)/python bench/analyze.py

bench-commits: $(STAMP)
	$(BIN)/python bench/commits.py

clean:
	rm -rf $(VENV) var .pytest_cache
