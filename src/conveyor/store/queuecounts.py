"""Open tasks counted per (pipeline, stage, second of ``available_at``), so a scrape reads the queue's size and
age histogram from a few rows per stage whatever the backlog.

``open_task_seconds`` rows are (pipeline, stage, second, shard, tasks); a reader sums the shards. A task is
*open* while its status is ``queued`` or ``running``, so a claim (queued to running, ``available_at`` unchanged)
moves no count; the running ones are few (the fleet's leases) and are read through the lease index and taken
off, which leaves the queued ones by age.

The transactions that move a task in or out of the open states, or give an open task a new ``available_at``,
add their moves (an ``OpenTally``) in the same transaction through ``add_open_tasks``, one grouped upsert: a
commit (tasks ending, retried, escalated, sent to review; new tasks made), a lease reclaim, a review decision or
deadline, a re-open, a dead-letter replay. They are the writers of run_totals too (store/runtotals.py), and
they know their rows: fenced updates whose count was checked, inserts counted per group, or rows read first.
(Triggers on ``tasks`` would need no code at those sites, but on PostgreSQL each of the hot path's one-row
statements then runs one: measured, half again the server's time per commit.)

Each process writes its own shard (1 to 16, by process id), so two PostgreSQL workers never wait on each other's
count rows; shard 0 is the keeper's, which folds the others into it (``compact_open_task_seconds``) without
waiting on a writer's row (SKIP LOCKED). ``open_task_mismatches`` checks the counts against the rows (the test
suite runs it on every store it closes).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from typing import TYPE_CHECKING, NamedTuple

from conveyor.store.records import LEASED

if TYPE_CHECKING:
    from conveyor.store.dialect import Dialect

OPEN = "status IN ('queued', 'running')"
OPEN_STATUSES = frozenset(("queued", "running"))
WRITER_SHARDS = 16

# A task's second: the dialect's ``epoch_second`` (available_at rounded down), in SQL and in the migration.

# Migration 16: the table, and what the store holds now (shard 0).
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
"""


class OpenTally:
    """Open tasks gained (positive) and lost (negative) by one transaction, per (pipeline, stage, second)."""

    __slots__ = ("sums",)

    def __init__(self) -> None:
        self.sums: defaultdict[tuple[str, str, int], int] = defaultdict(int)

    def __bool__(self) -> bool:
        return any(self.sums.values())

    def add(self, pipeline: str, stage: str, available_at: float, count: int = 1) -> None:
        if count:
            self.sums[pipeline, stage, math.floor(available_at)] += count

    def move(self, pipeline: str, stage: str, old_at: float, new_at: float, count: int = 1) -> None:
        """``count`` open tasks became runnable again at ``new_at`` (a retry, an escalation)."""
        if math.floor(old_at) != math.floor(new_at):
            self.add(pipeline, stage, old_at, -count)
            self.add(pipeline, stage, new_at, count)

    def rows(self) -> list[tuple[str, str, int, int]]:
        return [(*key, n) for key, n in sorted(self.sums.items()) if n]


class SecondCount(NamedTuple):
    """Open tasks of one stage whose ``available_at`` falls in ``second`` (epoch seconds, rounded down)."""

    pipeline: str
    stage: str
    second: int
    tasks: int


class QueueCountQueries:
    db: Dialect

    def add_open_tasks(self, tally: OpenTally) -> None:
        """Add a transaction's moves to the counts, in key order (concurrent commits lock rows alike)."""
        rows = tally.rows()
        if rows:
            shard = 1 + os.getpid() % WRITER_SHARDS
            self.db.executemany(
                "INSERT INTO open_task_seconds (pipeline, stage, second, shard, tasks) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (pipeline, stage, second, shard) DO UPDATE "
                "SET tasks = open_task_seconds.tasks + excluded.tasks",
                [(pipeline, stage, second, shard, n) for pipeline, stage, second, n in rows])

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
        second = self.db.types["epoch_second"]
        rows = self.db.execute(
            "SELECT pipeline, stage, second, SUM(tasks) FROM ("
            "SELECT pipeline, stage, second, tasks FROM open_task_seconds UNION ALL "
            f"SELECT pipeline, stage, {second} AS second, -1 AS tasks FROM tasks WHERE {LEASED}"
            ") counted GROUP BY pipeline, stage, second HAVING SUM(tasks) > 0")
        return [SecondCount(str(p), str(s), int(sec), int(n)) for p, s, sec, n in rows]

    def compact_open_task_seconds(self) -> int:
        """Fold the writers' shards into shard 0 and drop the rows that count nothing; returns the rows removed.
        On PostgreSQL it skips rows a writer holds (they are folded next time) and never waits on one."""
        with self.db.transaction():
            if self.db.name == "postgres" and not self.db.execute(
                    "SELECT pg_try_advisory_xact_lock(hashtext('conveyor.open_task_seconds'))")[0][0]:
                return 0  # another keeper is folding
            gone = self.db.execute(
                "DELETE FROM open_task_seconds WHERE (pipeline, stage, second, shard) IN (SELECT pipeline, stage, "
                f"second, shard FROM open_task_seconds WHERE shard <> 0 ORDER BY 1, 2, 3, 4 {self.db.skip_locked}) "
                "RETURNING pipeline, stage, second, tasks")
            folded: defaultdict[tuple[str, str, int], int] = defaultdict(int)
            for pipeline, stage, second, tasks in gone:
                folded[str(pipeline), str(stage), int(second)] += int(tasks)
            kept = [(*key, n) for key, n in sorted(folded.items()) if n]
            self.db.executemany(
                "INSERT INTO open_task_seconds (pipeline, stage, second, shard, tasks) VALUES (?, ?, ?, 0, ?) "
                "ON CONFLICT (pipeline, stage, second, shard) DO UPDATE "
                "SET tasks = open_task_seconds.tasks + excluded.tasks", kept)
            dropped = self.db.execute_rowcount("DELETE FROM open_task_seconds WHERE shard = 0 AND tasks = 0")
            return len(gone) - len(kept) + dropped

    def recount_open_task_seconds(self) -> None:
        """Count the open tasks again from the rows (after rows were written around the engine, as a benchmark
        or a test does), in one transaction."""
        second = self.db.types["epoch_second"]
        with self.db.transaction():
            self.db.execute("DELETE FROM open_task_seconds")
            self.db.execute("INSERT INTO open_task_seconds (pipeline, stage, second, shard, tasks) "
                            f"SELECT pipeline, stage, {second}, 0, COUNT(*) FROM tasks WHERE {OPEN} GROUP BY 1, 2, 3")

    def open_task_mismatches(self) -> list[str]:
        """Where the counts disagree with the task rows (empty when they agree)."""
        second = self.db.types["epoch_second"]
        actual = {(str(p), str(s), int(sec)): int(n) for p, s, sec, n in self.db.execute(
            f"SELECT pipeline, stage, {second}, COUNT(*) FROM tasks WHERE {OPEN} GROUP BY 1, 2, 3")}
        counted = {(c.pipeline, c.stage, c.second): c.tasks for c in self.open_task_seconds()}
        return [f"{key}: counted {counted.get(key, 0)}, rows {actual.get(key, 0)}"
                for key in sorted(set(actual) | set(counted)) if counted.get(key, 0) != actual.get(key, 0)]
