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

# The README's and CI's command: the linter, then every test (slow end-to-end ones included).
test: $(STAMP) lint
	$(BIN)/python -m pytest

# The inner loop: every test but those that train for minutes (marked `slow`) and those that
# run whole experiments through the command (marked `e2e`); see the README's test section.
# On this 2-core machine: about 19 min for its 867 tests (their share of a full `make test`,
# 38 min for 953 tests, while other work ran beside it).
test-fast: $(STAMP) lint
	$(BIN)/python -m pytest -m "not slow and not e2e" -q

lint: $(STAMP)
	$(BIN)/ruff check compiler tasks runtime tests bench

clean:
	rm -rf runexp_output .pytest_cache
