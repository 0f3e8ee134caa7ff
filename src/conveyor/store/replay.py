"""Replaying settled items of an earlier run: a cached re-run copied row for row inside the database.

An item whose every task succeeded in an earlier run of the same pipeline graph
(same stages, versions and config hashes), from the same source bytes, would be
answered task by task from the memo with exactly the rows that run already holds:
its task keys follow from the source digest and the graph, and each output is the
memo's (a commit that loses a memo race takes the winner's output). So instead of
one memo lookup and one row built in Python per task, its rows are copied with one
``INSERT ... SELECT`` per batch of items, each marked ``cached`` as a memo answer is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from conveyor.store.dialect import Dialect
from conveyor.store.records import CHILD_MARK, CHILD_RANGE_END
from conveyor.store.reopen import RUNS_LIKE, names_run, naming_run
from conveyor.store.runtotals import RunTally, RunTotalsQueries
from conveyor.store.tasks import chunks

ANALYZE_FROM = 5_000  # items in the base run from which the planner's statistics are refreshed first

_TASK_COPY_COLUMNS = """run_id, pipeline, stage, item_key, root_key, task_key, stage_version, config_hash,
    input_digest, input_kind, input_size, output_digest, output_kind, max_attempts, lane_rank, available_at,
    created_at, finished_at, status, cached, siblings"""


class ReplayQueries(RunTotalsQueries):
    db: Dialect

    def replay_base(self, pipeline: str, stages: str, run_id: str) -> str | None:
        """The latest other run of ``pipeline`` with exactly this graph (``stages``, as runs.stages holds it)."""
        rows = self.db.execute(
            "SELECT run_id, expected FROM runs WHERE pipeline = ? AND stages = ? AND run_id <> ?"
            " AND status <> 'submitting' ORDER BY created_at DESC LIMIT 1", (pipeline, stages, run_id))
        if not rows:
            return None
        if rows[0][1] >= ANALYZE_FROM:
            # With statistics from before a bulk load, PostgreSQL read a whole run to find 900 roots
            # (80 ms instead of 3 ms a batch, measured).
            self.db.refresh_statistics(("tasks", "items"))
        return str(rows[0][0])

    def settled_roots(self, base: str, roots: Sequence[tuple[str, str | None]]) -> list[str]:
        """Of ``roots`` (item key, source digest), the keys whose root item in ``base`` came from the same
        source and whose every task there succeeded. A task's successors are created in the same transaction
        as its success, so "every task succeeded" also means the item's whole graph is there."""
        digests = dict(roots)
        settled: list[str] = []
        every_task_succeeded = self.every_task_succeeded(base)
        for part in chunks(list(digests), self.db.in_chunk):
            where, params = self.db.one_of("item_key", part, "text")
            same = {key for key, digest in self.db.execute(
                f"SELECT item_key, source_digest FROM items WHERE run_id = ? AND {where}"
                " AND parent_key IS NULL", [base, *params]) if digest is not None and digest == digests[key]}
            if every_task_succeeded or not same:
                settled += [key for key in part if key in same]
                continue
            where, params = self.db.one_of("root_key", part, "text")
            open_or_failed = {row[0] for row in self.db.execute(
                f"SELECT DISTINCT root_key FROM tasks WHERE run_id = ? AND {where}"
                " AND status <> 'succeeded'", [base, *params])}
            settled += [key for key in part if key in same and key not in open_or_failed]
        return settled

    def copy_settled(self, base: str, run_id: str, roots: Sequence[str], now: float, lane_rank: int,
                     children: bool, totals: RunTally) -> int:
        """Copy the tasks (and, with ``children``, the fan-out child items) of ``roots`` from ``base`` into
        ``run_id`` as cached successes, counted in ``totals`` (the caller writes them); returns the tasks
        copied. Runs inside the caller's transaction."""
        copied = 0
        with self.db.transaction():
            for part in chunks(list(roots), self.db.in_chunk):
                where, params = self.db.one_of("root_key", part, "text")
                stages = Counter(stage for (stage,) in self.db.execute(
                    f"""INSERT INTO tasks ({_TASK_COPY_COLUMNS})
                    SELECT ?, pipeline, stage, item_key, root_key, task_key, stage_version, config_hash, input_digest,
                        input_kind, input_size, output_digest, output_kind, max_attempts, ?, ?, ?, ?, 'succeeded', 1,
                        siblings
                    FROM tasks WHERE run_id = ? AND {where}
                    ON CONFLICT (run_id, root_key, item_key, stage) DO NOTHING RETURNING stage""",
                        [run_id, lane_rank, now, now, now, base, *params]))
                for stage, count in stages.items():
                    totals.task(run_id, str(stage), "succeeded", 1, count)
                    copied += count
            if children:
                # A root's descendants are one range of item keys (records.CHILD_MARK); root_key = ? is a guard.
                self.db.executemany(
                    """INSERT INTO items (run_id, item_key, parent_key, root_key, source_digest, source_size,
                        created_at)
                    SELECT ?, item_key, parent_key, root_key, source_digest, source_size, ? FROM items
                    WHERE run_id = ? AND item_key > ? AND item_key < ? AND root_key = ?
                    ON CONFLICT (run_id, item_key) DO NOTHING""",
                    [(run_id, now, base, root + CHILD_MARK, root + CHILD_RANGE_END, root) for root in roots])
        return copied

    def every_task_succeeded(self, base: str) -> bool:
        """Whether every task of ``base`` has succeeded, read from its running totals (a few rows) rather than
        from its task rows: then no root needs its tasks read. A replay's superseded rows are counted in no
        total, so a run a replay touched is never taken on its totals."""
        if any(state != "succeeded" and value for _, state, _, value in self.run_totals(base, "tasks")):
            return False
        return not any(names_run(str(r[0]), base) for r in self.db.execute(
            f"SELECT runs FROM replays WHERE {RUNS_LIKE}", (naming_run(base),)))
