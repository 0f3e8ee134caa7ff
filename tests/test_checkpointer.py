"""SQLite's WAL copied into the store from a thread while a long write runs (store/checkpointer.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from conveyor.store import SqlStore, checkpointer, open_store


def _write(store: SqlStore, batches: int) -> None:
    for batch in range(batches):
        with store.db.transaction():
            store.db.executemany("INSERT INTO notes (body) VALUES (?)", [(os.urandom(200).hex(),)] * 500)
        time.sleep(0.02 * (batch % 2))


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "conveyor-checkpoint"]


def test_a_long_write_is_copied_into_the_store_file_before_the_store_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(checkpointer, "CHECKPOINT_EVERY_S", 0.02)
    db = tmp_path / "c.db"
    store = open_store(f"sqlite:///{db}")
    try:
        store.db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        before = db.stat().st_size
        with store.checkpointing():
            assert _threads() == ["conveyor-checkpoint"]
            _write(store, 20)  # ~4 MB in 20 commits: far below SQLite's own checkpoint at 100,000 pages
            deadline = time.monotonic() + 10
            while db.stat().st_size <= before + 2**20 and time.monotonic() < deadline:
                time.sleep(0.02)
        grown = db.stat().st_size - before
        assert _threads() == []
        assert store.db.execute("SELECT COUNT(*) FROM notes")[0][0] == 10_000
    finally:
        store.close()
    assert grown > 2**20  # without the thread the file stays as it was until the close


def test_the_thread_ends_with_a_block_that_fails(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/c.db")
    try:
        with pytest.raises(RuntimeError, match="boom"), store.checkpointing():
            raise RuntimeError("boom")
        assert _threads() == []
    finally:
        store.close()


def test_nothing_runs_beside_a_store_that_has_no_wal_to_copy(store: SqlStore) -> None:
    with store.checkpointing():  # PostgreSQL: the server's own work
        expected = ["conveyor-checkpoint"] if store.backend == "sqlite" else []
        assert _threads() == expected
    assert _threads() == []
