# Two commands: `make up` runs the product, `make test` runs the tests.
# Both create .venv and install what they need on a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test test-slow reliability bench bench-analyze bench-commits venv clean

$(STAMP): pyproject.toml setup.py collector/_speedups.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,test]'
	touch $(STAMP)

venv: $(STAMP)

up: $(STAMP)
	$(BIN)/shapewatch up

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q

# Slow suites (SIGKILL crash test and friends): their own script, not the default run.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# The reliability suite (issue 7): every scenario of reliability/, the long ones included;
# writes reliability/REPORT.md with the figures each one measured.
reliability: $(STAMP)
	SHAPEWATCH_RELIABILITY_REPORT=reliability/REPORT.md $(BIN)/python -m pytest -q \
		-m 'reliability or not reliability' reliability

bench: $(STAMP)
	$(BIN)/python bench/ingest.py

bench-analyze: $(STAMP)
	$(BIN)/python bench/analyze.py

bench-commits: $(STAMP)
	$(BIN)/python bench/commits.py

clean:
	rm -rf $(VENV) var .pytest_cache
