"""The queue's one-task statements are served from the primary key whatever the planner's statistics say.

On PostgreSQL an ANALYZE that samples no running task records ``tasks_leased`` as empty; with the index's old
predicate (``status = 'running'``) the planner then served every fenced update from it, walking all leased
tasks per row (bench/RESULTS.md, "Bloat, first attempt"). The test makes exactly those statistics.
"""

from __future__ import annotations

import pytest

from conveyor.store import open_store
from conveyor.store.bulk import copied_update
from conveyor.store.provider_batch import PARK
from conveyor.store.records import LEASED
from conveyor.store.tasks import FENCE, MARK_ENDED, MARK_RETRY, MARK_SUCCEEDED, RELEASE, REQUEUE_CRASHED

FENCED = {
    "renew": f"UPDATE tasks SET lease_expires_at = 1 {FENCE}",
    "succeeded": MARK_SUCCEEDED, "retry": MARK_RETRY, "ended": MARK_ENDED, "release": RELEASE,
    "crashed": REQUEUE_CRASHED, "park": PARK,
}
HELD = "SELECT id, lease_token FROM tasks WHERE status = 'running' AND id IN (1000, 2000, 3000)"


def _explain(conn, sql: str) -> str:  # type: ignore[no-untyped-def]
    """The generic plan of ``sql`` (its ? bound to NULL, as a prepared statement's generic plan sees them)."""
    marks = sql.count("?")
    conn.execute(f"PREPARE probe AS {sql.replace('?', '${}').format(*range(1, marks + 1))}"
                 if marks else f"PREPARE probe AS {sql}")
    try:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        return "\n".join(row[0] for row in conn.execute(
            f"EXPLAIN EXECUTE probe{'(' + ', '.join(['NULL'] * marks) + ')' if marks else ''}").fetchall())
    finally:
        conn.execute("DEALLOCATE probe")


def test_fenced_statements_use_the_primary_key_when_statistics_saw_no_running_task(pg_url: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO tasks (run_id, pipeline, item_key, root_key, stage, status, task_key, stage_version, "
            "config_hash, input_digest, input_kind, input_size, max_attempts, available_at, created_at, "
            "lane_rank, tier) SELECT 'r', 'p', 'k' || g, 'k' || g, 's', 'succeeded', 't' || g, 'v', 'c', "
            "'d' || g, 'inline', 1, 3, g, g, 0, 0 FROM generate_series(1, 60000) AS g")
        # A third of the tasks ran (the index holds their dead entries), then statistics were taken while no
        # task was leased: the index is recorded as empty.
        conn.execute("UPDATE tasks SET status = 'running', lease_expires_at = 1 WHERE id % 3 = 0")
        conn.execute("UPDATE tasks SET status = 'succeeded', lease_expires_at = NULL WHERE status = 'running'")
        conn.execute("VACUUM ANALYZE tasks")
        conn.execute("UPDATE tasks SET status = 'running', lease_expires_at = 1e12, lease_token = 1 "
                     "WHERE id % 1000 = 0")
        (tuples,) = conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'tasks_leased'").fetchone()
        assert tuples == 0  # the statistics this test is about
        for name, sql in [*FENCED.items(), ("held", HELD)]:
            plan = _explain(conn, sql)
            assert "tasks_pkey" in plan and "tasks_leased" not in plan, f"{name}:\n{plan}"
        # The same updates for a batch (store/bulk.py): one join, each task found through the primary key.
        for name, sql in FENCED.items():
            plan = copied_update(sql)
            if plan is None:
                continue
            conn.execute(plan.create)
            conn.execute(f"INSERT INTO {plan.staging} SELECT {', '.join(['NULL'] * len(plan.bound))} "
                         "FROM generate_series(1, 1000)")
            text = _explain(conn, plan.move)
            # The fence's constant comes through the staged rows, so no statistic about it can make the
            # planner believe the table nearly empty and scan it whole per batch; and the staged ids, named as
            # one array, are read through the primary key (a hash join over all 60,000 rows was the planner's
            # choice for the join alone: 44 against 25 ms a batch of 500 in a fleet's run).
            assert "Filter: (status = 'running'" not in text, f"{name} (batch):\n{text}"
            assert "Seq Scan on tasks" not in text and "tasks_pkey" in text, f"{name} (batch):\n{text}"
        # ... while the statements that scan the leased tasks still read the index.
        plan = _explain(conn, f"SELECT COUNT(*) FROM tasks WHERE {LEASED} AND pipeline = 'p'")
        assert "tasks_leased" in plan, plan


@pytest.mark.parametrize("name", sorted(FENCED))
def test_fenced_statements_use_the_rowid_on_sqlite(tmp_path, name: str) -> None:  # type: ignore[no-untyped-def]
    store = open_store(f"sqlite:///{tmp_path}/conveyor.db")
    try:
        plan = " ".join(str(row[-1]) for row in store.db.execute(f"EXPLAIN QUERY PLAN {FENCED[name]}",
                                                                 [None] * FENCED[name].count("?")))
    finally:
        store.close()
    assert "INTEGER PRIMARY KEY" in plan, plan


def test_batch_moves_are_planned_at_every_call(pg_url: str) -> None:
    """A batch's move (store/bulk.py) is never a prepared statement: a plan made while ``tasks`` was small (a hash
    join over the whole table) would be kept as the table grew, and each batch of a worker would then read all of
    it (one worker through 60,000 items: mark_succeeded took 11.5 of 20.8 s; planned per call, 2.2 s)."""
    from conveyor.store.dialect import COPY_FROM
    from conveyor.store.tasks import INSERT_QUEUED, TASK_KEY

    store = open_store(pg_url)
    try:
        for batch in range(8):  # more than psycopg's prepare threshold (5)
            rows = [("r", "p", "a", f"k{batch}-{i}", f"k{batch}-{i}", f"t{batch}-{i}", "v", "c", "d", "text", b"x",
                     1, 3, 0, 1.0, 1.0, 0) for i in range(COPY_FROM)]
            with store.db.transaction():
                store.db.insert_many(INSERT_QUEUED, rows, TASK_KEY)
            with store.db.transaction():  # claimed, then succeeded: a batch through update_many
                ids = store.db.execute(f"UPDATE tasks SET status = 'running', lease_token = 1 WHERE item_key LIKE "
                                       f"'k{batch}-%' RETURNING id")
                store.db.update_many(MARK_SUCCEEDED, [("o", "bytes", 0, 2.0, i, 1) for (i,) in ids])
        prepared = [s for (s,) in store.db.execute("SELECT statement FROM pg_prepared_statements")]
        assert not [s for s in prepared if "WITH v AS" in s], prepared
        assert store.db.execute("SELECT COUNT(*) FROM tasks WHERE status = 'succeeded'")[0][0] == 8 * COPY_FROM
        store.recount_open_task_seconds()
    finally:
        store.close()


def test_no_task_index_serves_the_items_page_stage_alone(pg_url: str) -> None:
    """Migration 31: every task write of the queue made an entry in the items page's stage index; the page walks
    the unique index instead, and a stage filter still pages in key order."""
    from conveyor.store.selection import TaskFilter

    store = open_store(pg_url)
    try:
        names = {str(n) for (n,) in store.db.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'tasks'")}
        assert "tasks_run_stage_key" not in names, names
        store.db.execute(
            "INSERT INTO tasks (run_id, pipeline, item_key, root_key, stage, status, task_key, stage_version, "
            "config_hash, input_digest, input_kind, input_size, max_attempts, available_at, created_at) "
            "SELECT 'r', 'p', 'k' || lpad(g::text, 4, '0'), 'k' || lpad(g::text, 4, '0'), s, 'succeeded', "
            "'t' || g || s, 'v', 'c', 'd', 'inline', 1, 3, g, g FROM generate_series(1, 300) AS g, "
            "(VALUES ('a'), ('b')) AS st(s)")
        f = TaskFilter(runs=("r",), stages=("b",))
        first = store.task_page(f, None, 100)
        after = (first[-1].root_key, first[-1].item_key, first[-1].stage)
        second = store.task_page(f, after, 100)
        keys = [t.item_key for t in (*first, *second)]
        assert {t.stage for t in (*first, *second)} == {"b"} and keys == sorted(keys) and len(set(keys)) == 200
        assert "tasks_run_id_root_key_item_key_stage_key" in "\n".join(store.task_page_plan(f, None, 100))
        store.recount_open_task_seconds()
    finally:
        store.close()
