"""What joins and gathers wait on, read in the transaction that decides whether they are ready.

A join runs once every parent succeeded for its item; a gather once every child of its item settled. Two
commits that settle the last two of them at once (two workers, PostgreSQL's READ COMMITTED) would each see the
other's task still open and neither would make the join: so the deciding transaction first locks the item's row
(``lock_items``), and the later of the two, once the lock is its, sees the other's commit. On SQLite one writer
at a time makes the lock needless.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.records import CHILD_MARK
from conveyor.store.tasks import chunks

# The columns the readiness reads below find rows by: their statistics are what the planner needs of a fresh or
# fast-growing store (the others' cost an ANALYZE four fifths of its time).
BARRIER_COLUMNS = {"tasks": ("run_id", "root_key", "item_key", "stage", "status"),
                   "items": ("run_id", "item_key", "root_key", "parent_key")}


class StageState(NamedTuple):
    """A task's state as a join or gather sees it."""

    status: str
    task_key: str
    output_kind: str | None
    output_digest: str | None
    error_class: str | None
    siblings: int = 0  # a fan-out child's task: how many children its parent's fan-out made (0: not known)


class BarrierQueries:
    db: Dialect

    def refresh_barrier_statistics(self) -> None:
        """ANALYZE tasks and items when their statistics are stale (PostgreSQL; see Dialect.refresh_statistics).
        The reads below find a run's roots through (run, root key); a fresh store's tables, never analyzed yet,
        made the planner take a run for a few rows and read all of its tasks for every commit (120 ms a statement
        at 5,000 items, and a gather cost 3.8 transitions an item). Outside any transaction: ANALYZE takes a lock
        that two writing transactions holding row locks could wait on in turn."""
        self.db.refresh_statistics(("tasks", "items"), BARRIER_COLUMNS)

    def lock_items(self, items: Sequence[tuple[str, str]]) -> None:
        """Hold these items' rows (run id, item key) until the transaction ends, taken in one order."""
        if not self.db.row_lock:
            return
        by_run: dict[str, list[str]] = {}
        for run_id, key in sorted(set(items)):
            by_run.setdefault(run_id, []).append(key)
        for run_id, keys in sorted(by_run.items()):
            for part in chunks(keys, self.db.in_chunk):
                where, params = self.db.one_of("item_key", part, "text")
                self.db.execute(f"SELECT item_key FROM items WHERE run_id = ? AND {where} ORDER BY item_key"
                                f"{self.db.row_lock}", [run_id, *params])

    def stage_states(self, run_id: str, wanted: Sequence[tuple[str, str, str]]
                     ) -> dict[tuple[str, str], StageState]:
        """(item key, stage) -> its task's state, for ``wanted`` (root key, item key, stage) of a run."""
        roots = sorted({root for root, _, _ in wanted})
        stages = sorted({stage for _, _, stage in wanted})
        items = {item for _, item, _ in wanted}
        found: dict[tuple[str, str], StageState] = {}
        marks = ",".join("?" * len(stages))
        for part in chunks(roots, self.db.in_chunk):
            where, params = self.db.one_of("root_key", part, "text")
            for item, stage, *state in self.db.execute(
                    "SELECT item_key, stage, status, task_key, output_kind, output_digest, error_class FROM tasks "
                    f"WHERE run_id = ? AND {where} AND stage IN ({marks})", [run_id, *params, *stages]):
                if item in items:
                    found[item, stage] = StageState(*state)
        return found

    def children_states(self, run_id: str, parents: Sequence[tuple[str, str]], stages: Sequence[str]
                        ) -> dict[tuple[str, str], StageState]:
        """For ``parents`` (root key, item key) of a run: (child key, stage) -> state of their fan-out children's
        tasks at ``stages`` (a child's key is ``parent¶index``), one statement per few hundred roots."""
        wanted = {item for _, item in parents}
        marks = ",".join("?" * len(stages))
        found: dict[tuple[str, str], StageState] = {}
        for part in chunks(sorted({root for root, _ in parents}), self.db.in_chunk):
            where, params = self.db.one_of("root_key", part, "text")
            for item, stage, *state in self.db.execute(
                    "SELECT item_key, stage, status, task_key, output_kind, output_digest, error_class, siblings "
                    f"FROM tasks WHERE run_id = ? AND {where} AND stage IN ({marks})", [run_id, *params, *stages]):
                parent, mark, index = str(item).rpartition(CHILD_MARK)
                if mark and parent in wanted and index.isdigit():  # a child of a waiting parent, not a grandchild
                    found[item, stage] = StageState(*state)
        return found
