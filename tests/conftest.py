"""Backend fixtures: every store test runs once on SQLite and once on a real PostgreSQL.

PostgreSQL comes from $CONVEYOR_TEST_PG (``make test`` sets it from
scripts/ensure-postgres.sh), else 127.0.0.1:5432. Each test gets a fresh
database cloned from a migrated template. With CI=true a PostgreSQL test that
cannot reach a server fails; it never skips.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.store import SqlStore, open_store

PG_URL = os.environ.get("CONVEYOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
TEMPLATE = "conveyor_test_template"
_template_ready: list[str] = []


def _admin():  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)


def _pg_url_for(dbname: str) -> str:
    base, _, _ = PG_URL.rpartition("/")
    return f"{base}/{dbname}"


def _ensure_template() -> None:
    if _template_ready:
        return
    with _admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    open_store(_pg_url_for(TEMPLATE)).close()
    _template_ready.append(TEMPLATE)


def fresh_pg_url() -> str:
    try:
        _ensure_template()
        name = f"conveyor_t_{uuid.uuid4().hex[:12]}"
        with _admin() as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    except Exception as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL at {PG_URL} is not reachable under CI=true: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {PG_URL}: {exc}")
    return _pg_url_for(name)


def _drop(url: str) -> None:
    name = url.rpartition("/")[2]
    with _admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty, migrated store on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/conveyor.db"
        return
    url = fresh_pg_url()
    yield url
    _drop(url)


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    s = open_store(store_url)
    yield s
    s.close()
