"""insert_many: a batch of one-row inserts, on PostgreSQL copied into a temporary table and moved by one statement
(store/bulk.py), means what the row-at-a-time form meant: the same rows, the same counts, the first row of a
key kept, a superseded row revived, and it keeps working across rolled-back transactions and lost connections."""

from __future__ import annotations

import hashlib
import time

import pytest

from conveyor.store import open_store
from conveyor.store.bulk import copied_insert, copied_update, first_per_key
from conveyor.store.dialect import COPY_FROM
from conveyor.store.records import NewOutput
from conveyor.store.tasks import (
    CLAIM_COLUMNS,
    FENCE,
    INSERT_QUEUED,
    INSERT_ROOT_ITEM,
    INSERT_RUNNING,
    MARK_SUCCEEDED,
    REQUEUE_CRASHED,
    TASK_KEY,
)


def _queued(run_id: str, keys: list[str], tag: str = "") -> list[tuple[object, ...]]:
    now = time.time()
    return [(run_id, "p", "a", key, key, f"t-{key}{tag}", "v1", "cfg", f"d-{key}", "text", f"doc {key}".encode(),
             7, 3, 0, now, now, 2) for key in keys]


def _rows(store, run_id: str) -> dict[str, tuple[str, str]]:  # type: ignore[no-untyped-def]
    return {str(k): (str(t), str(s)) for k, t, s in store.db.execute(
        "SELECT item_key, task_key, status FROM tasks WHERE run_id = ?", (run_id,))}


@pytest.mark.parametrize("size", [3, COPY_FROM, 500])
def test_insert_many_counts_keeps_the_first_of_a_key_and_revives_superseded_rows(store_url: str, size: int) -> None:
    store = open_store(store_url)
    try:
        keys = [f"k{i:04d}" for i in range(size)]
        with store.db.transaction():
            assert store.db.insert_many(INSERT_QUEUED, _queued("r1", keys), TASK_KEY) == size
        # Again: every row is there (and not superseded), so nothing changes; a duplicate within the batch too.
        again = _queued("r1", [*keys, keys[0]], tag="-again")
        with store.db.transaction():
            assert store.db.insert_many(INSERT_QUEUED, again, TASK_KEY) == 0
        assert {k: t for k, (t, _) in _rows(store, "r1").items()} == {k: f"t-{k}" for k in keys}
        # A superseded row is taken by the new task; the first of two rows with its key wins.
        store.db.execute("UPDATE tasks SET status = 'superseded' WHERE run_id = 'r1' AND item_key = ?", (keys[0],))
        batch = _queued("r1", [keys[0]], tag="-first") + _queued("r1", [keys[0]], tag="-second")
        batch += _queued("r1", keys[1:], tag="-late") + _queued("r1", ["new"], tag="")
        with store.db.transaction():
            assert store.db.insert_many(INSERT_QUEUED, batch, TASK_KEY) == 2
        rows = _rows(store, "r1")
        assert rows[keys[0]] == (f"t-{keys[0]}-first", "queued") and rows["new"] == ("t-new", "queued")
        assert all(rows[k] == (f"t-{k}", "queued") for k in keys[1:])
        store.recount_open_task_seconds()
    finally:
        store.close()


def test_insert_many_after_a_rolled_back_batch_and_a_lost_connection(store_url: str) -> None:
    store = open_store(store_url)
    try:
        keys = [f"k{i:04d}" for i in range(COPY_FROM * 2)]
        with pytest.raises(RuntimeError), store.db.transaction():
            store.db.insert_many(INSERT_QUEUED, _queued("r1", keys), TASK_KEY)
            raise RuntimeError("the transaction fails after the batch")
        assert _rows(store, "r1") == {}
        with store.db.transaction():  # the temporary table's CREATE was rolled back too: made again
            assert store.db.insert_many(INSERT_QUEUED, _queued("r1", keys), TASK_KEY) == len(keys)
        if store.db.name == "postgres":
            import psycopg

            with psycopg.connect(store_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (store.db.conn.info.backend_pid,))
            with pytest.raises(psycopg.OperationalError):
                store.db.execute("SELECT 1")
        with store.db.transaction():  # a new session: its own temporary table
            assert store.db.insert_many(INSERT_QUEUED, _queued("r2", keys), TASK_KEY) == len(keys)
        assert len(_rows(store, "r2")) == len(keys)
        store.recount_open_task_seconds()
    finally:
        store.close()


def test_a_batch_that_meets_existing_rows_keeps_the_rest_of_its_transaction(store_url: str) -> None:
    """On PostgreSQL a batch is first copied straight into its table; one that meets an existing row is rolled
    back to its savepoint and moved with its conflict clause. Rows written earlier in the same transaction stay,
    and after the pause the direct way is taken again."""
    from conveyor.store.dialect import DIRECT_PAUSE

    store = open_store(store_url)
    try:
        keys = [f"k{i:04d}" for i in range(COPY_FROM * 2)]
        with store.db.transaction():
            assert store.db.insert_many(INSERT_QUEUED, _queued("r1", keys[:COPY_FROM]), TASK_KEY) == COPY_FROM
            assert store.db.insert_many(INSERT_QUEUED, _queued("r1", keys, tag="-x"), TASK_KEY) == COPY_FROM
        rows = _rows(store, "r1")
        assert len(rows) == len(keys) and rows[keys[0]][0] == f"t-{keys[0]}" and rows[keys[-1]][0] == f"t-{keys[-1]}-x"
        for run in range(DIRECT_PAUSE + 2):  # through the pause and back to the direct way
            with store.db.transaction():
                assert store.db.insert_many(INSERT_QUEUED, _queued(f"s{run}", keys), TASK_KEY) == len(keys)
        assert store.db.execute("SELECT COUNT(*) FROM tasks WHERE run_id LIKE 's%'")[0][0] == len(keys) * (
            DIRECT_PAUSE + 2)
        if store.db.name == "postgres":
            assert store.db._direct_paused[INSERT_QUEUED] == 0  # type: ignore[attr-defined]
        store.recount_open_task_seconds()
    finally:
        store.close()


def test_copied_insert_reads_the_statement_shape() -> None:
    plan = copied_insert(INSERT_QUEUED)
    assert plan is not None and plan.bound[:3] == ("run_id", "pipeline", "stage") and "'queued'" in plan.move
    assert "ON CONFLICT (run_id, root_key, item_key, stage) DO UPDATE" in plan.move
    assert plan.direct is not None and plan.direct.endswith("status, cached) FROM STDIN")
    assert plan.constants == ("queued", 0)
    assert copied_insert(INSERT_ROOT_ITEM).constants == (None,)  # type: ignore[union-attr]
    assert copied_insert("INSERT INTO t (a, b) VALUES (?, CURRENT_TIMESTAMP)").direct is None  # type: ignore[union-attr]
    assert copied_insert("UPDATE tasks SET status = ? WHERE id = ?") is None
    assert copied_insert("INSERT INTO t (a, b) VALUES (?, ? + 1)") is None
    assert first_per_key([(1, "a"), (2, "a"), (1, "b")], (1,)) == [(1, "a"), (1, "b")]


@pytest.mark.parametrize("size", [3, COPY_FROM * 4])
def test_running_tasks_return_what_was_inserted_or_revived(store_url: str, size: int) -> None:
    """Successor tasks claimed as they are made (INSERT ... RETURNING): the rows inserted, a superseded row taken
    over, nothing for a row already there or a batch's second row of a key."""
    store = open_store(store_url)
    sql = f"{INSERT_RUNNING} RETURNING {CLAIM_COLUMNS}"
    now = time.time()

    def running(keys: list[str], tag: str) -> list[tuple[object, ...]]:
        return [(*row, "w1", now + 60, now) for row in _queued("r1", keys, tag)]

    try:
        keys = [f"k{i:04d}" for i in range(size)]
        with store.db.transaction():
            first = store.db.insert_many_returning(sql, running(keys, ""), TASK_KEY)
        assert sorted(row[3] for row in first) == keys and {row[5] for row in first} == {f"t-{k}" for k in keys}
        store.db.execute("UPDATE tasks SET status = 'superseded' WHERE run_id = 'r1' AND item_key = ?", (keys[-1],))
        batch = running([keys[-1]], "-new") + running([keys[-1]], "-second") + running(keys[:-1], "-again")
        with store.db.transaction():
            again = store.db.insert_many_returning(sql, batch, TASK_KEY)
        assert [(row[3], row[5], row[10], row[12]) for row in again] == [(keys[-1], f"t-{keys[-1]}-new", 1, 2)]
        store.db.execute("UPDATE tasks SET status = 'succeeded', lease_expires_at = NULL")
        store.recount_open_task_seconds()
    finally:
        store.close()


@pytest.mark.parametrize("size", [3, 500])
def test_tasks_claimed_as_they_are_made_carry_what_the_store_holds(store_url: str, size: int) -> None:
    """insert_tasks' running rows, written without RETURNING (Dialect.insert_numbered: on SQLite numbered from the
    largest id, on PostgreSQL from the table's sequence and copied): each claimed task is the row the store holds;
    a batch that revives a row and meets others goes the statement's own way and returns only the revived one."""
    store = open_store(store_url)
    now = time.time()

    def running(keys: list[str], tag: str) -> list[tuple[object, ...]]:
        return [(*row, "w1", now + 60, now) for row in _queued("r1", keys, tag)]

    def held() -> dict[int, tuple[object, ...]]:
        return {int(row[0]): tuple(row) for row in store.db.execute(
            f"SELECT {CLAIM_COLUMNS} FROM tasks WHERE run_id = 'r1'")}

    try:
        keys = [f"k{i:04d}" for i in range(size)]
        store.db.execute("INSERT INTO tasks (run_id, pipeline, stage, item_key, root_key, status, task_key, "
                         "stage_version, config_hash, input_digest, input_kind, input_size, max_attempts, "
                         "available_at, created_at) VALUES ('r0', 'p', 'a', 'x', 'x', 'succeeded', 't', 'v1', "
                         "'cfg', 'd', 'text', 1, 3, 0, 0)")  # the ids do not start at 1
        with store.db.transaction():
            first = store._insert_running(running(keys, ""))
        assert [tuple(task) for task in first] == [held()[task.id] for task in first]
        assert [task.item_key for task in first] == keys and {task.attempts for task in first} == {1}
        store.db.execute("UPDATE tasks SET status = 'superseded' WHERE run_id = 'r1' AND item_key = ?", (keys[-1],))
        with store.db.transaction():
            again = store._insert_running(running([keys[-1]], "-new") + running(keys[:-1], "-again"))
        assert [(t.item_key, t.task_key, t.attempts, t.lease_token) for t in again] == [
            (keys[-1], f"t-{keys[-1]}-new", 1, 2)]
        assert [tuple(task) for task in again] == [held()[task.id] for task in again]
        assert len(held()) == size
        store.db.execute("UPDATE tasks SET status = 'succeeded', lease_expires_at = NULL")
        store.recount_open_task_seconds()
    finally:
        store.close()


def test_new_leased_rows_are_numbered_or_not_written_at_all(store_url: str) -> None:
    """Dialect.insert_numbered: a batch of new rows comes back as its ids, in order, each the row written; a batch
    one of whose rows meets a row already there writes nothing and says so (None)."""
    store = open_store(store_url)
    now = time.time()

    def running(keys: list[str], tag: str) -> list[tuple[object, ...]]:
        return [(*row, "w1", now + 60, now) for row in _queued("r1", keys, tag)]

    try:
        keys = [f"k{i:04d}" for i in range(COPY_FROM * 2)]
        with store.db.transaction():
            ids = store.db.insert_numbered(INSERT_RUNNING, running(keys[:COPY_FROM], ""), "tasks")
        assert ids is not None and len(set(ids)) == COPY_FROM
        held = dict(store.db.execute("SELECT id, item_key FROM tasks WHERE run_id = 'r1'"))
        assert [held[i] for i in ids] == keys[:COPY_FROM]
        with store.db.transaction():  # the last row's key is taken: none of the batch is written
            assert store.db.insert_numbered(INSERT_RUNNING, running(keys[COPY_FROM:] + keys[:1], "-b"), "tasks") is None
        assert len(_rows(store, "r1")) == COPY_FROM
        # In one transaction, after a batch copied in whole: a batch that meets a row is undone alone (back to its
        # own savepoint, the one before kept), and the next is written.
        with store.db.transaction():
            assert store.db.insert_many(INSERT_QUEUED, _queued("r2", keys), TASK_KEY) == len(keys)
            assert store.db.insert_numbered(INSERT_RUNNING, running(keys[:1] + keys[COPY_FROM:], "-c"), "tasks") is None
            assert store.db.insert_many(INSERT_QUEUED, _queued("r3", keys), TASK_KEY) == len(keys)
        assert len(_rows(store, "r2")) == len(_rows(store, "r3")) == len(keys)
        assert len(_rows(store, "r1")) == COPY_FROM
        store.db.execute("UPDATE tasks SET status = 'succeeded', lease_expires_at = NULL")
        store.recount_open_task_seconds()
    finally:
        store.close()


@pytest.mark.parametrize("size", [3, COPY_FROM * 4])
def test_outputs_are_first_written_wins_and_replace_only_a_refusal(store_url: str, size: int) -> None:
    store = open_store(store_url)
    now = time.time()

    def output(key: str, kind: str = "text", digest: str = "d1") -> NewOutput:
        return NewOutput(key, "a", kind, digest, b"x", 1, "r1", now)

    try:
        keys = [hashlib.sha256(f"t{i}".encode()).hexdigest() for i in range(size)]
        assert store.insert_outputs([output(k) for k in keys[:-1]] + [output(keys[-1], "failed")]) == size
        # Again, with other bytes: the first write stands, save the refusal, which an output replaces.
        assert store.insert_outputs([output(k, digest="d2") for k in keys]) == 1
        memo = store.lookup_outputs(keys)
        assert {(m.kind, m.digest) for k, m in memo.items() if k != keys[-1]} == {("text", "d1")}
        assert (memo[keys[-1]].kind, memo[keys[-1]].digest) == ("text", "d2")
    finally:
        store.close()


@pytest.mark.parametrize("size", [3, COPY_FROM * 4])
def test_update_many_is_fenced_like_one_row_updates(store_url: str, size: int) -> None:
    store = open_store(store_url)
    try:
        keys = [f"k{i:04d}" for i in range(size)]
        with store.db.transaction():
            store.db.insert_many(INSERT_QUEUED, _queued("r1", keys), TASK_KEY)
        store.db.execute("UPDATE tasks SET status = 'running', lease_token = 1, lease_expires_at = 1e12")
        ids = [int(i) for (i,) in store.db.execute("SELECT id FROM tasks ORDER BY id")]
        lost = ids[1]
        store.db.execute("UPDATE tasks SET lease_token = 2 WHERE id = ?", (lost,))  # another worker took it
        # A fenced success for every task: the lost lease changes nothing, the others are counted once each.
        rows = [("digest", "text", 0, 5.0, task_id, 1) for task_id in ids]
        with store.db.transaction():
            assert store.db.update_many(MARK_SUCCEEDED, rows) == size - 1
        states = dict(store.db.execute("SELECT id, status FROM tasks"))
        assert states[lost] == "running" and sum(s == "succeeded" for s in states.values()) == size - 1
        # Renewing the lost one (named twice: one-row statements, each counted) and a finished one: one change.
        renew = f"UPDATE tasks SET lease_expires_at = ? {FENCE}"
        twice = [(9.0, lost, 2)] * COPY_FROM + [(9.0, ids[0], 1)]
        with store.db.transaction():
            assert store.db.update_many(renew, twice) == COPY_FROM
        assert store.db.execute("SELECT lease_expires_at FROM tasks WHERE id = ?", (lost,)) == [(9.0,)]
        store.db.execute("UPDATE tasks SET status = 'succeeded' WHERE id = ?", (lost,))
        store.recount_open_task_seconds()
    finally:
        store.close()


def test_copied_update_reads_the_statement_shape() -> None:
    plan = copied_update(MARK_SUCCEEDED)
    assert plan is not None and plan.bound[-2:] == ("key_id", "key_lease_token")
    assert "tasks.id = v.key_id AND tasks.lease_token = v.key_lease_token AND tasks.status = v.is_status" in plan.move
    assert copied_update(REQUEUE_CRASHED) is None  # attempts = attempts - ?: left to executemany


@pytest.mark.parametrize("shape", ["plain", "named", "not finite"])
def test_update_many_writes_each_value_exactly_whichever_way_its_rows_travel(store_url: str, shape: str) -> None:
    """On PostgreSQL a batch's rows go as one JSON parameter (bulk.json_update), or by COPY when a float has no
    JSON spelling; either way, and on SQLite, every value is stored exactly as given."""
    from conveyor.store.records import Succeeded

    store = open_store(store_url)
    try:
        keys = [f"k{i:04d}" for i in range(COPY_FROM * 2)]
        with store.db.transaction():
            store.db.insert_many(INSERT_QUEUED, _queued("r1", keys), TASK_KEY)
        store.db.execute("UPDATE tasks SET status = 'running', lease_token = 1, lease_expires_at = 1e12")
        ids = [int(i) for (i,) in store.db.execute("SELECT id FROM tasks ORDER BY id")]
        texts = ["plain", "quo'te \"and\" back\\slash", "é ✓ 𝄞", "{a,b}", "", "null", "[1, 2]", "line\nbreak"]
        finished = [time.time() + i / 7 for i in range(len(ids))] + [1e-300, 2**53 + 1.0, 0.1]
        if shape == "not finite":
            finished[3] = float("inf")
        rows = [(texts[n % len(texts)], "json", n % 2, finished[n], task_id, 1) for n, task_id in enumerate(ids)]
        rows[-1] = (rows[-1][0], rows[-1][1], rows[-1][2], finished[-1], rows[-1][4], rows[-1][5])
        given = [Succeeded(*r) for r in rows] if shape == "named" else rows
        with store.db.transaction():
            assert store.db.update_many(MARK_SUCCEEDED, given) == len(ids)
        stored = {int(i): (d, k, int(c), f) for i, d, k, c, f in store.db.execute(
            "SELECT id, output_digest, output_kind, cached, finished_at FROM tasks WHERE status = 'succeeded'")}
        assert stored == {r[4]: (r[0], r[1], r[2], r[3]) for r in rows}
        if store.db.name == "postgres":  # the way they went: a temporary table was made only for the COPY
            plan = copied_update(MARK_SUCCEEDED)
            assert plan is not None
            assert (plan.staging in store.db._staged) == (shape == "not finite")  # type: ignore[attr-defined]
        store.recount_open_task_seconds()
    finally:
        store.close()


def test_json_fed_updates_read_their_rows_through_the_primary_key(pg_url: str) -> None:
    """The JSON-fed move of each fenced update names its ids as one array: the planner reads them through the
    primary key, never the whole table (statistics of 60,000 tasks and none of the JSON rows)."""
    import psycopg

    from conveyor.store.bulk import json_update
    from conveyor.store.tasks import MARK_ENDED, MARK_RETRY, RELEASE

    store = open_store(pg_url)
    try:
        store.db.execute(
            "INSERT INTO tasks (run_id, pipeline, item_key, root_key, stage, status, task_key, stage_version, "
            "config_hash, input_digest, input_kind, input_size, max_attempts, available_at, created_at) "
            "SELECT 'r', 'p', 'k' || g, 'k' || g, 's', 'running', 't' || g, 'v', 'c', 'd', 'inline', 1, 3, g, g "
            "FROM generate_series(1, 60000) AS g")
        store.db.execute("ANALYZE tasks")
        types = store.db._column_types("tasks")  # type: ignore[attr-defined]
        rows = ",".join(f'["d","text",0,1.5,{i},0]' for i in range(1, 1001))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            renew = f"UPDATE tasks SET lease_expires_at = ? {FENCE}"
            for sql in (MARK_SUCCEEDED, MARK_RETRY, MARK_ENDED, RELEASE, renew):
                plan = copied_update(sql)
                assert plan is not None
                fed = json_update(plan, types)
                assert fed is not None, sql
                text = "\n".join(r[0] for r in conn.execute(
                    "EXPLAIN " + fed[0].replace("?", "%s"), (f"[{rows}]" if sql == MARK_SUCCEEDED else None,)))
                assert "Seq Scan on tasks" not in text and "tasks_pkey" in text, f"{sql}\n{text}"
        store.db.execute("UPDATE tasks SET status = 'succeeded'")
        store.recount_open_task_seconds()
    finally:
        store.close()


def test_copies_store_every_value_exactly_in_either_form(store_url: str) -> None:
    """The attempts, outputs and new leased tasks a commit copies (on PostgreSQL in COPY's binary form) are stored
    exactly as given: text of any characters, bytes, floats to the last bit, NULLs, large ids."""
    from conveyor.store.records import PlainAttempt
    from conveyor.store.tasks import ATTEMPT_COLUMNS

    texts = ["plain", "quo'te \"and\" back\\slash\ttab", "é ✓ 𝄞", "line\nbreak\r", "", "\\N", "{a,b}"]
    store = open_store(store_url)
    try:
        plain = [PlainAttempt(2**40 + n, "r1", n % 3 + 1, "succeeded", n % 2, texts[n % len(texts)], 2**31 - 1 - n,
                              "v", "code", 1764945000.123456 + n / 7, 1e-300 if n == 0 else n * 0.1, "cfg")
                 for n in range(COPY_FROM * 2)]
        full = [(*p[:3], "failed", p[4], "error", texts[n % len(texts)], "w", 1, "v", "c", 1.5, 0.25, 3, 10, 20,
                 0.125, "model", None, 0, None, None, None, "cfg", None, '{"x": 1}', 0, None)
                for n, p in enumerate(plain[:COPY_FROM])]
        with store.db.transaction():
            store.db.append("attempts", ATTEMPT_COLUMNS, full)
            store.insert_attempts([], plain)
        columns = ", ".join(ATTEMPT_COLUMNS)
        got = store.db.execute(f"SELECT {columns} FROM attempts WHERE outcome = 'succeeded' ORDER BY id")
        assert [tuple(r[:5]) + tuple(r[7:13]) + (r[23],) for r in got] == [tuple(p) for p in plain]
        got = store.db.execute(f"SELECT {columns} FROM attempts WHERE outcome <> 'succeeded' ORDER BY id")
        assert [tuple(r) for r in got] == full
        now = 1764945000.5
        outputs = [NewOutput(hashlib.sha256(f"o{n}".encode()).hexdigest(), "a", "json", texts[n % len(texts)],
                             bytes(range(n % 256)) if n % 3 else None, n, "r1", now + n, "code")
                   for n in range(COPY_FROM * 2)]
        assert store.insert_outputs(outputs) == len(outputs)
        memo = store.lookup_outputs([o.task_key for o in outputs])
        assert {k: (m.digest, m.inline, m.size) for k, m in memo.items()} == {
            o.task_key: (o.digest, o.inline, o.size) for o in outputs}
    finally:
        store.close()


def test_a_value_the_binary_form_refuses_goes_as_text_and_keeps_the_transaction(pg_url: str) -> None:
    """PostgreSQL: a value of another Python type than its column's (a number for a text column) is refused by
    COPY's binary form before it is sent; the COPY goes back to its savepoint and again as text, storing what the
    text form stores, and what the transaction wrote before it stays. An integer past its column's range is
    refused as the text form refuses it, never cut to its low 32 bits; a column whose type changed since the
    connection read it goes as text."""
    import psycopg

    store = open_store(pg_url)
    try:
        store.db.execute("CREATE TABLE copied (a BIGINT, b TEXT, c DOUBLE PRECISION, d INTEGER, e BYTEA)")
        with store.db.transaction():
            store.db.append("copied", ["a", "b", "c", "d", "e"], [(1, "one", 1.5, 2, b"\x00\xff")])
            store.db.append("copied", ["a", "b", "c", "d", "e"], [(2, 22, 2.5, 3, None), (3, "three", 3, 4, b"")])
            store.db.append("copied", ["a", "b", "c", "d", "e"], [(4, "four", 4.5, 5, b"x")])
        assert store.db._text_copies == {("copied", ("a", "b", "c", "d", "e"))}  # type: ignore[attr-defined]
        assert store.db.execute("SELECT a, b, c, d, e FROM copied ORDER BY a") == [
            (1, "one", 1.5, 2, b"\x00\xff"), (2, "22", 2.5, 3, None), (3, "three", 3.0, 4, b""),
            (4, "four", 4.5, 5, b"x")]
        store.db.execute("CREATE TABLE counted (a BIGINT, d INTEGER)")
        with pytest.raises(psycopg.errors.NumericValueOutOfRange), store.db.transaction():
            store.db.append("counted", ["a", "d"], [(1, 2**31)])
        store.db.append("counted", ["a", "d"], [(1, 2**31 - 1), (2, -(2**31))])
        assert store.db.execute("SELECT a, d FROM counted ORDER BY a") == [(1, 2**31 - 1), (2, -(2**31))]
        assert ("counted", ("a", "d")) not in store.db._text_copies  # type: ignore[attr-defined]
        # A column whose type changed since the connection read it: the server refuses the binary value, the COPY
        # goes as text.
        store.db.execute("CREATE TABLE retyped (a BIGINT, d INTEGER)")
        store.db.append("retyped", ["a", "d"], [(1, 2)])
        store.db.execute("ALTER TABLE retyped ALTER COLUMN d TYPE BIGINT")
        with store.db.transaction():
            store.db.append("retyped", ["a", "d"], [(2, 3)])
        assert store.db.execute("SELECT a, d FROM retyped ORDER BY a") == [(1, 2), (2, 3)]
        assert ("retyped", ("a", "d")) in store.db._text_copies  # type: ignore[attr-defined]
    finally:
        store.close()
