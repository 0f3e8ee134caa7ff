"""The memo's 64-bit index key, and the migration that moved an existing memo onto it (both backends)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.store import NewOutput, open_store
from conveyor.store import sql_store as sql_store_module
from conveyor.store.memokey import key64
from conveyor.store.schema import MIGRATIONS
from tests.conftest import _admin, _pg_url_for, drop_later, fresh_pg_url


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_key64_reads_the_first_64_bits_as_a_signed_integer() -> None:
    assert key64("0" * 64) == 0
    assert key64("7fffffffffffffff" + "0" * 48) == 2**63 - 1
    assert key64("8000000000000000" + "0" * 48) == -(2**63)
    assert key64("ffffffffffffffff" + "a" * 48) == -1


@pytest.fixture(params=["sqlite", "postgres"])
def empty_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of a store with no schema at all."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/old.db"
        return
    drop_later(fresh_pg_url())  # fails under CI=true, skips elsewhere, when PostgreSQL is unreachable
    name = f"conveyor_m_{uuid.uuid4().hex[:12]}"
    with _admin() as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = _pg_url_for(name)
    yield url
    drop_later(url)


def test_a_store_of_schema_3_moves_its_memo_onto_the_integer_key(
    empty_store_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sql_store_module, "MIGRATIONS", [m for m in MIGRATIONS if m[0] <= 3])
    old = open_store(empty_store_url)
    assert old.schema_version() == 3
    # Keys whose first hex digit is 8-f are negative as signed 64-bit integers: both backends must agree.
    keys = [_key(f"task {i}") for i in range(40)]
    assert any(k[0] in "89abcdef" for k in keys) and any(k[0] in "01234567" for k in keys)
    old.db.executemany(
        "INSERT INTO outputs (task_key, stage, kind, digest, inline, size, run_id, created_at)"
        " VALUES (?, 'a', 'json', ?, ?, 2, 'r1', ?)",
        [(k, _key(k), b"{}", float(i)) for i, k in enumerate(keys)])
    old.close()
    monkeypatch.undo()

    store = open_store(empty_store_url)
    try:
        assert store.schema_version() == max(m[0] for m in MIGRATIONS)
        stored = dict(store.db.execute("SELECT task_key, key64 FROM outputs"))
        assert stored == {k: key64(k) for k in keys}, "the database computed the same key64 as Python"
        found = store.lookup_outputs([*keys, _key("never stored")])
        assert set(found) == set(keys)
        assert all(found[k].digest == _key(k) for k in keys)
        # Insert-or-ignore still holds: the first write of a key wins.
        store.insert_outputs([NewOutput(keys[0], "a", "json", "other", b"[]", 2, "r2", 99.0),
                              NewOutput(_key("new"), "a", "json", "d", b"[]", 2, "r2", 99.0)])
        assert store.lookup_outputs([keys[0]])[keys[0]].digest == _key(keys[0])
        assert store.lookup_outputs([_key("new")])[_key("new")].digest == "d"
    finally:
        store.close()


def test_a_lookup_checks_the_full_key_when_64_bits_collide(store_url: str) -> None:
    store = open_store(store_url)
    try:
        first, twin = "abcdef0123456789" + "1" * 48, "abcdef0123456789" + "2" * 48
        assert key64(first) == key64(twin)
        store.insert_outputs([NewOutput(first, "a", "json", "d1", b"1", 1, "r", 1.0)])
        assert set(store.lookup_outputs([first, twin])) == {first}, "the twin is a miss, not the first's output"
        store.insert_outputs([NewOutput(twin, "a", "json", "d2", b"2", 1, "r", 2.0)])
        assert set(store.lookup_outputs([first, twin])) == {first}, "the twin is not memoised, and that is all"
    finally:
        store.close()
