# Two commands on a fresh machine:
#   make run    install into .venv if needed, then run the quickstart experiment end to end
#   make test   install into .venv if needed, then run the test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.runexp-installed

.PHONY: install run dry_run test test-fast lint clean

$(STAMP): setup.cfg pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/runexp --gin_file=quickstart.gin

dry_run: $(STAMP)
	$(BIN)/runexp --gin_file=quickstart.gin --dry_run || test $$? -eq 2

# Test processes (pytest-xdist): one a core on this 2-core machine; `make test TEST_WORKERS=1`
# runs in one process, `TEST_WORKERS=4` on a bigger one (each worker holds TensorFlow: ~1 GB).
TEST_WORKERS ?= 2
# A worker takes whole files, so a file's module fixtures (a trained tiny model) are built once;
# in collection order (tests/conftest.py puts the long files first), not xdist's by test count,
# which left one-test files like the soak test for the end.
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The README's and CI's command: the linter, then every test (slow end-to-end ones included).
test: $(STAMP) lint
	$(BIN)/python -m pytest $(XDIST)

# The inner loop: every test but those that train for minutes (marked `slow`) and those that
# run whole experiments through the command (marked `e2e`); see the README's test section.
# On this 2-core machine its 867 tests take about 19 min in one process (their share of a
# one-process run of all 953: 35 min); two workers ran all 953 in 39.5 min with two CPU hogs
# beside them (bench/cpu_load.py). With two workers on a quiet machine, test-fast's 867 tests
# took 10.8 min (10 min 54 s wall, `make` included).
test-fast: $(STAMP) lint
	$(BIN)/python -m pytest $(XDIST) -m "not slow and not e2e" -q

lint: $(STAMP)
	$(BIN)/ruff check compiler tasks runtime tests bench

clean:
	rm -rf runexp_output .pytest_cache
