"""SQLite's many-row statements (store/sqlitemany.py) change what executemany changes, and count the same."""

from __future__ import annotations

import random
import sqlite3

import pytest

from conveyor.store.sqlitemany import ManyRows

TABLE = "CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT NOT NULL UNIQUE, v INTEGER, status TEXT, token INTEGER)"
UPSERT = """INSERT INTO t (k, v, status, token) VALUES (?, ?, 'queued', 0)
ON CONFLICT (k) DO UPDATE SET v = excluded.v WHERE t.v < excluded.v"""
FENCED = "UPDATE t SET v = ?, status = 'done', token = NULL WHERE id = ? AND token = ? AND status = 'running'"


def _rows(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
    return conn.execute("SELECT * FROM t ORDER BY id").fetchall()


def _pair() -> tuple[sqlite3.Connection, sqlite3.Connection]:
    pair = []
    for _ in range(2):
        conn = sqlite3.connect(":memory:", isolation_level=None)
        conn.execute(TABLE)
        conn.executemany("INSERT INTO t (k, v, status, token) VALUES (?, ?, ?, ?)",
                         [(f"k{i}", i, "running" if i % 3 else "queued", i % 5) for i in range(300)])
        pair.append(conn)
    return pair[0], pair[1]


@pytest.mark.parametrize("count", [1, 2, 3, 31, 64, 65, 127, 200])
def test_an_upsert_in_many_rows_changes_and_counts_what_row_by_row_does(count: int) -> None:
    rng = random.Random(count)
    # New keys, keys already there (some updated by the conflict clause, some kept) and a key twice in the batch.
    rows = [(f"k{rng.randrange(600)}", rng.randrange(600)) for _ in range(count)]
    one, many = _pair()
    expected = one.executemany(UPSERT, rows).rowcount
    assert ManyRows(many).run(UPSERT, rows) == expected
    assert _rows(many) == _rows(one)


@pytest.mark.parametrize("count", [2, 5, 64, 99, 250])
def test_a_fenced_update_in_many_rows_changes_and_counts_what_row_by_row_does(count: int) -> None:
    rng = random.Random(count)
    ids = rng.sample(range(1, 320), count)  # some past the table, some not running, some with another token
    rows = [(rng.randrange(10**6), task_id, rng.choice([(task_id - 1) % 5, 7])) for task_id in ids]
    one, many = _pair()
    expected = one.executemany(FENCED, rows).rowcount
    assert 0 < expected < count or count < 64
    assert ManyRows(many).run(FENCED, rows) == expected
    assert _rows(many) == _rows(one)


def test_rows_naming_a_row_twice_and_other_shapes_are_left_to_executemany() -> None:
    _, many = _pair()
    before = _rows(many)
    runner = ManyRows(many)
    assert runner.run(FENCED, [(1, 1, 1), (2, 1, 1)]) is None
    assert runner.run("UPDATE t SET v = v + ? WHERE id = ?", [(1, 1), (1, 2)]) is None
    assert runner.run(f"{UPSERT} RETURNING id", [("a", 1), ("b", 2)]) is None
    assert runner.run("INSERT INTO t (k, v) SELECT ?, ? WHERE true", [("a", 1), ("b", 2)]) is None
    assert _rows(many) == before
