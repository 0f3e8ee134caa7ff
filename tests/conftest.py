"""Backend fixtures: every store test runs once on SQLite and once on a real PostgreSQL.

PostgreSQL comes from $CONVEYOR_TEST_PG (``make test`` sets it from
scripts/ensure-postgres.sh), else 127.0.0.1:5432. Each test gets a fresh
database cloned from a migrated template. With CI=true a PostgreSQL test that
cannot reach a server fails; it never skips.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest

from conveyor.store import SqlStore, open_store
from tests.s3server import S3Server, s3_server

PG_URL = os.environ.get("CONVEYOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
CONVEYOR_SRC = Path(__file__).resolve().parents[1] / "src" / "conveyor"
TEMPLATE = f"conveyor_tpl_{os.getpid()}"  # one per test session, so sessions never share it
_template_ready: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """conveyor's bytecode, written once before any test starts, as `make setup` writes it: where
    PYTHONDONTWRITEBYTECODE is set, each of the suite's conveyor processes (CLI calls, workers, servers)
    would otherwise compile every module it imports that has none (0.1 s of CPU a process). The controller
    writes it, before xdist starts its workers; in a tree it may not write to, processes compile as before."""
    if hasattr(config, "workerinput"):
        return
    import compileall

    compileall.compile_dir(str(CONVEYOR_SRC), quiet=2)


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


def _clone_template(name: str) -> None:
    # CREATE DATABASE ... TEMPLATE fails while anyone else is connected to the
    # template (a parallel test session, an autovacuum worker): try again briefly.
    for attempt in range(20):
        try:
            with _admin() as conn:
                conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
            return
        except Exception as exc:
            if "is being accessed by other users" not in str(exc) or attempt == 19:
                raise
            time.sleep(0.25)


def fresh_pg_url() -> str:
    try:
        _ensure_template()
        name = f"conveyor_t_{uuid.uuid4().hex[:12]}"
        _clone_template(name)
    except Exception as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL at {PG_URL} is not reachable under CI=true: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {PG_URL}: {exc}")
    return _pg_url_for(name)


def _drop(url: str) -> None:
    name = url.rpartition("/")[2]
    with _admin() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# PostgreSQL 15's DROP DATABASE waits for a forced checkpoint: 0.2 to 3 s on a busy host, which each test's
# teardown paid. A test's own database is dropped in the background instead, a few at once (concurrent drops
# share a checkpoint); the session's end waits for every one of them.
_dropping = ThreadPoolExecutor(max_workers=3, thread_name_prefix="conveyor-test-drop")
_drops: list[Future[None]] = []


def drop_later(url: str) -> None:
    """Drop the database of ``url`` (which nothing will use again) in the background."""
    _drops.append(_dropping.submit(_drop, url))


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL of an empty, migrated PostgreSQL store (for the tests that are about PostgreSQL only)."""
    url = fresh_pg_url()
    yield url
    drop_later(url)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty, migrated store on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/conveyor.db"
        if (tmp_path / "conveyor.db").exists():
            _check_run_totals(f"sqlite:///{tmp_path}/conveyor.db")
        return
    url = fresh_pg_url()
    yield url
    try:
        _check_run_totals(url)
    finally:
        drop_later(url)


def _check_run_totals(url: str) -> None:
    """Every run's running totals (store/runtotals.py) and the queue's counts (store/queuecounts.py) equal what
    the rows say, after every backend test."""
    store = open_store(url, migrate=False)
    try:
        version = store.schema_version()
        if version < 13:
            return
        wrong = [line for (run_id,) in store.db.execute("SELECT run_id FROM runs")
                 for line in store.run_total_mismatches(str(run_id))]
        queue = store.open_task_mismatches() if version >= 16 else []
    finally:
        store.close()
    if wrong:
        pytest.fail("run totals disagree with the rows: " + "; ".join(wrong[:10]))
    if queue:
        pytest.fail("open-task counts disagree with the rows: " + "; ".join(queue[:10]))


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A SeaweedFS S3 server for this test process, started at the first test that asks for it.

    Without the `weed` binary, or when it will not start, the S3 tests skip, except under CI=true,
    where they fail.
    """
    running = ExitStack()
    try:
        server = running.enter_context(s3_server(tmp_path_factory.mktemp("seaweedfs")))
    except Exception as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the SeaweedFS S3 server did not start under CI=true: {exc}")
        pytest.skip(f"no S3 server for the S3 tests: {exc}")
    with running:
        yield server


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The S3 server, with this process's environment pointing at it the way a user's would."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    return s3


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    s = open_store(store_url)
    yield s
    s.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _dropping.shutdown(wait=True)
    failed = [str(exc) for exc in (drop.exception() for drop in _drops) if exc is not None]
    if failed:  # cleanup must never fail the run, but a database left behind is said
        print(f"\n{len(failed)} test database(s) not dropped: {failed[0]}", file=sys.stderr)
    if _template_ready:
        try:
            with _admin() as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        except Exception:  # cleanup must never fail the run
            pass
