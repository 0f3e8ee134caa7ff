# The two commands of the README's Quick start: `make demo` and `make test`.
# Both set up everything they need (virtualenv, packages, a PostgreSQL server).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: setup test demo check bench soak clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[dev]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

setup: $(STAMP)

test: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" $(BIN)/python -m pytest -q -p no:cacheprovider

demo: setup
	$(BIN)/python examples/manpages/demo.py

check: setup
	$(BIN)/ruff check src tests examples bench
	$(BIN)/mypy

bench: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" $(BIN)/python bench/engine.py

soak: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" $(BIN)/python -m pytest -q -m soak

clean:
	rm -rf .conveyor .pytest_cache
