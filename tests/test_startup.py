"""Start-up races: many processes opening a fresh store at once all succeed; a SQLite store reached through a
symlink queues its writers on the same lock as through its real path."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from conveyor.store import open_store
from conveyor.store.dialect import WriterLock
from conveyor.store.schema import MIGRATIONS
from tests.conftest import _admin, _pg_url_for, drop_later, fresh_pg_url
from tests.helpers import SRC

OPEN = "import sys; from conveyor.store import open_store; open_store(sys.argv[1]).close()"


def _open_at_once(url: str, processes: int = 8) -> list[subprocess.CompletedProcess[str]]:
    env = {**os.environ, "PYTHONPATH": SRC}
    procs = [subprocess.Popen([sys.executable, "-c", OPEN, url], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(processes)]
    return [subprocess.CompletedProcess(p.args, p.wait(60), *p.communicate()) for p in procs]


def test_many_processes_open_a_fresh_postgres_database_at_once() -> None:
    drop_later(fresh_pg_url())  # fails under CI=true, skips elsewhere, when PostgreSQL is unreachable
    for _ in range(3):  # the race is a matter of timing: try it a few times
        name = f"conveyor_s_{uuid.uuid4().hex[:12]}"
        with _admin() as conn:
            conn.execute(f"CREATE DATABASE {name}")
        url = _pg_url_for(name)
        try:
            results = _open_at_once(url)
            assert [r.returncode for r in results] == [0] * len(results), [r.stderr[-400:] for r in results]
            store = open_store(url)
            assert store.schema_version() == max(m[0] for m in MIGRATIONS)
            store.close()
        finally:
            drop_later(url)


def test_many_processes_open_a_fresh_sqlite_store_at_once(tmp_path: Path) -> None:
    results = _open_at_once(f"sqlite:///{tmp_path}/fresh/conveyor.db")
    assert [r.returncode for r in results] == [0] * len(results), [r.stderr[-400:] for r in results]


def test_a_symlinked_sqlite_path_shares_the_writer_lock_of_its_target(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    through_link = open_store(f"sqlite:///{tmp_path}/link/conveyor.db")
    direct = open_store(f"sqlite:///{real}/conveyor.db")
    try:
        locks = {store.db._writers.path for store in (through_link, direct)}  # type: ignore[attr-defined]
        assert locks == {os.path.realpath(real / "conveyor.db") + ".lock"}
        assert not (tmp_path / "link" / "conveyor.db.lock").is_symlink()
        # Two lock objects for one file: while one holds it, the other waits.
        first, second = WriterLock(str(tmp_path / "link" / "conveyor.db")), WriterLock(str(real / "conveyor.db"))
        order: list[str] = []
        with first.held():
            waiter = threading.Thread(target=lambda: second.held().__enter__() or order.append("second"))
            waiter.start()
            waiter.join(0.3)
            order.append("first released")
        waiter.join(5)
        assert order == ["first released", "second"]
        first.close()
        second.close()
    finally:
        through_link.close()
        direct.close()
