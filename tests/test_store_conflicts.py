"""A transaction the database rolls back for another's sake (a deadlock) is recognised as safe to make again:
the worker's store calls make it again (runtime/worker.py ``_call``) instead of dying."""

from __future__ import annotations

import threading

from conveyor.store import SqlStore, open_store


def test_a_real_deadlock_is_a_conflict_on_postgres_and_other_errors_are_not(store_url: str) -> None:
    first, second = open_store(store_url), open_store(store_url)
    try:
        if first.db.name != "postgres":
            assert not first.conflicted(RuntimeError("database is locked"))
            return
        first.db.execute("CREATE TABLE conflict_probe (id INTEGER PRIMARY KEY, v INTEGER)")
        first.db.execute("INSERT INTO conflict_probe VALUES (1, 0), (2, 0)")
        both = threading.Barrier(2, timeout=30)
        caught: list[BaseException] = []

        def cross(store: SqlStore, mine: int, theirs: int) -> None:
            try:
                with store.transaction():
                    store.db.execute("UPDATE conflict_probe SET v = v + 1 WHERE id = ?", (mine,))
                    both.wait()
                    store.db.execute("UPDATE conflict_probe SET v = v + 1 WHERE id = ?", (theirs,))
            except Exception as exc:
                caught.append(exc)

        threads = [threading.Thread(target=cross, args=(first, 1, 2)),
                   threading.Thread(target=cross, args=(second, 2, 1))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(caught) == 1, caught  # the database chose one victim; the other committed
        assert first.conflicted(caught[0])
        assert not first.conflicted(RuntimeError("something else"))
        assert first.db.execute("SELECT SUM(v) FROM conflict_probe")[0][0] == 2  # the victim changed nothing
    finally:
        first.close()
        second.close()
