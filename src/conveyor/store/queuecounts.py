"""Open tasks counted per (pipeline, stage, second of ``available_at``), so a scrape reads the queue's size and
age histogram from a few rows per stage whatever the backlog.

``open_task_seconds`` rows are (pipeline, stage, second, shard, tasks); a reader sums the shards. A task is
*open* while its status is ``queued`` or ``running``, so a claim (queued to running, ``available_at`` unchanged)
moves no count; the running ones are few (the fleet's leases) and are read through the lease index and taken
off, which leaves the queued ones by age.

The counts are kept by triggers on ``tasks`` (migration 16), so every statement that moves a task (a commit, a
retry, a reclaim, a re-open, a replay, a purge) counts, in its own transaction, with no code at those sites:

- SQLite: row triggers with a ``WHEN`` condition; a row whose open-ness and second did not change (a claim, a
  heartbeat) runs no body. One writer at a time, so one shard (0).
- PostgreSQL: statement triggers over transition tables, one grouped upsert per statement (a claim's rows net to
  nothing and write nothing). Each backend writes its own shard (1 to 16, by process id), so two workers never
  wait on each other's count rows; shard 0 is the keeper's, which folds the others into it
  (``compact_open_task_seconds``) without ever waiting on a worker's row (SKIP LOCKED).

``open_task_mismatches`` checks the counts against the rows (the test suite runs it on every store it closes).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from conveyor.store.dialect import Dialect

OPEN = "status IN ('queued', 'running')"
WRITER_SHARDS = 16

SQLITE_SECOND = "CAST(available_at AS INTEGER)"
POSTGRES_SECOND = "CAST(FLOOR(available_at) AS BIGINT)"


def _sqlite_second(row: str) -> str:
    return f"CAST({row}.available_at AS INTEGER)"


def _sqlite_is_open(row: str) -> str:
    return f"{row}.status IN ('queued', 'running')"


def _sqlite_add(row: str, sign: str) -> str:
    return (f"INSERT INTO open_task_seconds (pipeline, stage, second, shard, tasks) "
            f"SELECT {row}.pipeline, {row}.stage, {_sqlite_second(row)}, 0, {sign}1 WHERE {_sqlite_is_open(row)} "
            f"ON CONFLICT (pipeline, stage, second, shard) DO UPDATE SET tasks = tasks + excluded.tasks")


SQLITE_TRIGGERS = f"""
CREATE TRIGGER tasks_open_insert AFTER INSERT ON tasks WHEN {_sqlite_is_open('NEW')}
BEGIN {_sqlite_add('NEW', '')}; END;
CREATE TRIGGER tasks_open_delete AFTER DELETE ON tasks WHEN {_sqlite_is_open('OLD')}
BEGIN {_sqlite_add('OLD', '-')}; END;
CREATE TRIGGER tasks_open_update AFTER UPDATE OF status, available_at, pipeline, stage ON tasks
WHEN ({_sqlite_is_open('OLD')}) <> ({_sqlite_is_open('NEW')})
    OR ({_sqlite_is_open('NEW')} AND ({_sqlite_second('OLD')} <> {_sqlite_second('NEW')}
        OR OLD.pipeline <> NEW.pipeline OR OLD.stage <> NEW.stage))
BEGIN {_sqlite_add('OLD', '-')}; {_sqlite_add('NEW', '')}; END;
"""


def _pg_side(table: str, sign: str) -> str:
    return (f"SELECT pipeline, stage, CAST(FLOOR(available_at) AS BIGINT) AS second, {sign}1 AS d FROM {table} "
            f"WHERE {OPEN}")


def _pg_function(name: str, sides: str) -> str:
    # ORDER BY: rows are locked in one order by every writer (and the keeper never waits), so no deadlock.
    return f"""CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO open_task_seconds (pipeline, stage, second, shard, tasks)
    SELECT pipeline, stage, second, 1 + pg_backend_pid() % {WRITER_SHARDS}, SUM(d) FROM ({sides}) moved
    GROUP BY pipeline, stage, second HAVING SUM(d) <> 0 ORDER BY pipeline, stage, second
    ON CONFLICT (pipeline, stage, second, shard) DO UPDATE SET tasks = open_task_seconds.tasks + excluded.tasks;
    RETURN NULL;
END $$;
"""


POSTGRES_TRIGGERS = (
    _pg_function("conveyor_tasks_open_insert", _pg_side("new_rows", "+"))
    + _pg_function("conveyor_tasks_open_delete", _pg_side("old_rows", "-"))
    + _pg_function("conveyor_tasks_open_update", f"{_pg_side('old_rows', '-')} UNION ALL {_pg_side('new_rows', '+')}")
    + """
CREATE TRIGGER tasks_open_insert AFTER INSERT ON tasks REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_tasks_open_insert();
CREATE TRIGGER tasks_open_delete AFTER DELETE ON tasks REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_tasks_open_delete();
CREATE TRIGGER tasks_open_update AFTER UPDATE ON tasks REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_tasks_open_update();
""")

# Migration 16: the table, what the store holds now (shard 0), then the triggers.
MIGRATION = """
CREATE TABLE open_task_seconds (
    pipeline TEXT NOT NULL,
    stage TEXT NOT NULL,
    second BIGINT NOT NULL,
    shard INTEGER NOT NULL,
    tasks BIGINT NOT NULL,
    PRIMARY KEY (pipeline, stage, second, shard)
){without_rowid};
INSERT INTO open_task_seconds (pipeline, stage, second, shard, tasks)
SELECT pipeline, stage, {epoch_second}, 0, COUNT(*) FROM tasks WHERE status IN ('queued', 'running')
GROUP BY 1, 2, 3;
{open_task_triggers}
"""


class SecondCount(NamedTuple):
    """Open tasks of one stage whose ``available_at`` falls in ``second`` (epoch seconds, rounded down)."""

    pipeline: str
    stage: str
    second: int
    tasks: int


class QueueCountQueries:
    db: Dialect

    def open_task_seconds(self) -> list[SecondCount]:
        """Open tasks per (pipeline, stage, second), shards summed: rows bounded by the seconds the queue spans,
        not by its size."""
        rows = self.db.execute("SELECT pipeline, stage, second, SUM(tasks) FROM open_task_seconds "
                               "GROUP BY pipeline, stage, second HAVING SUM(tasks) <> 0")
        return [SecondCount(str(p), str(s), int(sec), int(n)) for p, s, sec, n in rows]

    def queued_seconds(self) -> list[SecondCount]:
        """Queued tasks (runnable, waiting out a backoff, or left by a dead worker) per (pipeline, stage, second):
        the open counts less the leased tasks, these read through ``tasks_leased`` (bounded by the fleet's
        batches); one statement, so both sides are one snapshot."""
        second = POSTGRES_SECOND if self.db.name == "postgres" else SQLITE_SECOND
        rows = self.db.execute(
            "SELECT pipeline, stage, second, SUM(tasks) FROM ("
            "SELECT pipeline, stage, second, tasks FROM open_task_seconds UNION ALL "
            f"SELECT pipeline, stage, {second} AS second, -1 AS tasks FROM tasks WHERE status = 'running'"
            ") counted GROUP BY pipeline, stage, second HAVING SUM(tasks) > 0")
        return [SecondCount(str(p), str(s), int(sec), int(n)) for p, s, sec, n in rows]

    def compact_open_task_seconds(self) -> int:
        """Fold the writers' shards into shard 0 and drop the rows that count nothing; returns the rows removed.
        Skips rows a writer holds (they are folded next time) and never waits on one."""
        with self.db.transaction():
            if self.db.name != "postgres":
                return self.db.execute_rowcount("DELETE FROM open_task_seconds WHERE tasks = 0")
            if not self.db.execute("SELECT pg_try_advisory_xact_lock(hashtext('conveyor.open_task_seconds'))")[0][0]:
                return 0  # another keeper is folding
            gone = self.db.execute(
                "DELETE FROM open_task_seconds WHERE (pipeline, stage, second, shard) IN (SELECT pipeline, stage, "
                "second, shard FROM open_task_seconds WHERE shard <> 0 ORDER BY 1, 2, 3, 4 FOR UPDATE SKIP LOCKED) "
                "RETURNING pipeline, stage, second, tasks")
            folded: defaultdict[tuple[str, str, int], int] = defaultdict(int)
            for pipeline, stage, second, tasks in gone:
                folded[str(pipeline), str(stage), int(second)] += int(tasks)
            self.db.executemany(
                "INSERT INTO open_task_seconds (pipeline, stage, second, shard, tasks) VALUES (?, ?, ?, 0, ?) "
                "ON CONFLICT (pipeline, stage, second, shard) DO UPDATE "
                "SET tasks = open_task_seconds.tasks + excluded.tasks",
                [(*key, n) for key, n in sorted(folded.items()) if n])
            dropped = self.db.execute_rowcount("DELETE FROM open_task_seconds WHERE shard = 0 AND tasks = 0")
            return len(gone) + dropped - len([n for n in folded.values() if n])

    def open_task_mismatches(self) -> list[str]:
        """Where the counts disagree with the task rows (empty when they agree)."""
        second = POSTGRES_SECOND if self.db.name == "postgres" else SQLITE_SECOND
        actual = {(str(p), str(s), int(sec)): int(n) for p, s, sec, n in self.db.execute(
            f"SELECT pipeline, stage, {second}, COUNT(*) FROM tasks WHERE {OPEN} GROUP BY 1, 2, 3")}
        counted = {(c.pipeline, c.stage, c.second): c.tasks for c in self.open_task_seconds()}
        return [f"{key}: counted {counted.get(key, 0)}, rows {actual.get(key, 0)}"
                for key in sorted(set(actual) | set(counted)) if counted.get(key, 0) != actual.get(key, 0)]
