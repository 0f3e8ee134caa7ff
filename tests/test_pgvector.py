"""Search by meaning on PostgreSQL with pgvector: a real server with the extension (the PostgreSQL 16 and pgvector
binaries of the ``pgserver`` wheel, started here with initdb/pg_ctl), the same rankings as the exact scan, the
table kept in step by publications and rollbacks, a publication under way when the table is made, the pipeline,
the command line, and ``CONVEYOR_PGVECTOR=0``."""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conveyor.store import NewPublication, SqlStore, open_store
from conveyor.store.vectors import ExactScan, PgVector, vector_index
from tests.helpers import cli_json
from tests.pgvector_server import binaries, running_pgvector
from tests.test_semantic_search import GUIDES, Collection, keys

COLLECTION = "docs"


@pytest.fixture(scope="module")
def pgvector_server() -> Iterator[str]:
    """A private PostgreSQL server that has pgvector; its admin URL."""
    if binaries() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("pgserver (PostgreSQL with pgvector, in the dev extra) is not installed under CI=true")
        pytest.skip("pgserver (PostgreSQL with pgvector) is not installed")
    with running_pgvector() as url:
        yield url


@pytest.fixture
def pgvector_url(pgvector_server: str) -> Iterator[str]:
    """A fresh database on that server with the extension created, migrated."""
    name = f"conveyor_v_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pgvector_server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    url = pgvector_server.rpartition("/")[0] + f"/{name}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")
    open_store(url).close()
    yield url
    with psycopg.connect(pgvector_server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def unit(rng: random.Random, dim: int) -> list[float]:
    raw = [rng.gauss(0, 1) for _ in range(dim)]
    norm = sum(x * x for x in raw) ** 0.5
    return [x / norm for x in raw]


def publish(store: SqlStore, docs: dict[str, list[list[float]]], tag: str = "", collection: str = COLLECTION) -> None:
    rows = [NewPublication(collection, key, "bench", "run", 0, f"{key}{tag}", "{}", f"{key} {tag}", vectors,
                           time.time(), "model") for key, vectors in docs.items()]
    with store.db.transaction():
        store.publish(rows)


def both(store: SqlStore, query: list[float], limit: int = 10, prefix: str | None = None) -> tuple[Any, Any]:
    return (PgVector().nearest(store.db, COLLECTION, query, limit, prefix),
            ExactScan().nearest(store.db, COLLECTION, query, limit, prefix))


def same(found: list[tuple[int, float]], exact: list[tuple[int, float]]) -> None:
    assert [pid for pid, _ in found] == [pid for pid, _ in exact]
    assert [score for _, score in found] == pytest.approx([score for _, score in exact], abs=1e-5)


def test_pgvector_ranks_as_the_exact_scan_does_and_follows_what_is_live(pgvector_url: str) -> None:
    rng = random.Random(7)
    store = open_store(pgvector_url)
    try:
        assert vector_index(store.db).name == "pgvector"
        # Several chunks per document (a version scores by its best), another collection beside it.
        publish(store, {f"d{i:03d}": [unit(rng, 16) for _ in range(1 + i % 3)] for i in range(300)})
        publish(store, {f"d{i:03d}": [unit(rng, 16)] for i in range(50)}, collection="other")
        query = unit(rng, 16)
        found, exact = both(store, query)
        same(found, exact)
        assert store.db.execute("SELECT COUNT(*) FROM publication_pgvec_16")[0][0] == sum(
            1 + i % 3 for i in range(300)) + 50
        # New versions of a third of the documents, near the query: the table follows in the same transaction.
        publish(store, {f"d{i:03d}": [[q + 0.01 * rng.gauss(0, 1) for q in query]] for i in range(0, 300, 3)}, "v2")
        found, exact = both(store, query)
        same(found, exact)
        assert found[0][1] > 0.99
        # A rollback brings back the old vectors; a prefix keeps to its keys.
        store.rollback_item(COLLECTION, "d000", "me", None, time.time())
        store.rollback_item(COLLECTION, "d003", "me", None, time.time())
        found, exact = both(store, query, limit=25)
        same(found, exact)
        same(*both(store, query, prefix="d1"))
        assert store.db.execute(
            "SELECT COUNT(*) FROM publication_pgvec_16 v JOIN publications p ON p.id = v.publication_id "
            "WHERE p.live = 0")[0][0] == 0
    finally:
        store.close()


def test_a_publication_under_way_when_the_table_is_made_is_in_it(pgvector_url: str) -> None:
    rng = random.Random(3)
    store, other = open_store(pgvector_url), open_store(pgvector_url)
    try:
        publish(store, {f"d{i}": [unit(rng, 8)] for i in range(20)})
        late = unit(rng, 8)
        made: list[Any] = []
        with other.db.transaction():  # a publication, not yet committed, when the first search starts
            other.publish([NewPublication(COLLECTION, "late", "bench", "run", 0, "late", "{}", "late", [late],
                                          time.time(), "model")])
            search = threading.Thread(target=lambda: made.append(PgVector().nearest(store.db, COLLECTION, late, 3,
                                                                                    None)))
            search.start()
            time.sleep(0.5)
            assert search.is_alive()  # waiting for the publication to end
        search.join(30)
        assert made and made[0][0][1] == pytest.approx(1.0, abs=1e-5)
        late_id = other.db.execute("SELECT id FROM publications WHERE item_key = 'late' AND live = 1")[0][0]
        assert made[0][0][0] == late_id
    finally:
        store.close()
        other.close()


def test_the_pipeline_and_the_command_line_search_with_pgvector(tmp_path: Path, pgvector_url: str) -> None:
    guides = Collection(tmp_path, pgvector_url)
    guides.publish(GUIDES)
    found = guides.search("car")
    assert found["index"] == "pgvector" and keys(found)[0] == "oil"
    target = f"{tmp_path}/meaning1.py:pipe"
    args = ["search", "car", "--semantic", "--collection", "guides", "--pipeline", target, "--db", pgvector_url]
    scanned = cli_json(*args, cwd=tmp_path, env={"CONVEYOR_PGVECTOR": "0"})
    assert scanned["index"] == "exact-scan"
    assert [h["similarity"] for h in scanned["results"]] == pytest.approx([h["similarity"] for h in found["results"]])
    assert cli_json(*args, cwd=tmp_path)["index"] == "pgvector"
