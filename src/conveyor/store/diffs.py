"""Items and their records in key order, a chunk at a time: what `conveyor diff` compares and what a
reconciliation samples (the outcome SQL itself: store/reports.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.reports import OutcomeStages, outcome_query
from conveyor.store.tasks import chunks

# A root item's own task at one stage, succeeded: its output is the item's record.
RECORD_TASK = """
JOIN tasks t ON t.run_id = i.run_id AND t.root_key = i.item_key AND t.item_key = i.item_key AND t.stage = ?
    AND t.status = 'succeeded'
"""


class RecordRef(NamedTuple):
    """Where an item's record is: the task key its output is memoised under, and the output's kind and digest
    (the bytes are inline in the memo, or in the blob store by digest)."""

    task_key: str
    kind: str
    digest: str


class GroupTask(NamedTuple):
    """A group item's task at a group stage, as `conveyor diff` compares it: its input is the group's members."""

    item_key: str
    stage: str
    status: str
    task_key: str
    input_kind: str
    input_digest: str
    input_inline: bytes | None
    output_kind: str | None
    output_digest: str | None


class DiffQueries:
    db: Dialect

    def group_tasks(self, run_id: str, keys: Sequence[str], stages: Sequence[str]) -> list[GroupTask]:
        """The tasks of these group items (``group:KEY``) of a run at ``stages`` (superseded ones too)."""
        found: list[GroupTask] = []
        marks = ",".join("?" * len(stages))
        for part in chunks(sorted(set(keys)), 500):
            rows = self.db.execute(
                "SELECT item_key, stage, status, task_key, input_kind, input_digest, input_inline, output_kind, "
                f"output_digest FROM tasks WHERE run_id = ? AND root_key IN ({','.join('?' * len(part))}) "
                f"AND item_key = root_key AND stage IN ({marks})", (run_id, *part, *stages))
            found += [GroupTask(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), str(r[5]),
                                None if r[6] is None else bytes(r[6]), r[7], r[8]) for r in rows]
        return found

    def outcomes_after(self, run_id: str, stages: OutcomeStages, after: str | None,
                       limit: int) -> list[tuple[str, str]]:
        """(root item key, outcome) of the next ``limit`` root items after ``after``, in key order (a
        walk of the items' primary key, one chunk at a time)."""
        sql, params = outcome_query(stages, "AND i.item_key > ?" if after is not None else "")
        rows = self.db.execute(f"{sql} ORDER BY i.item_key LIMIT ?",
                               (*params, run_id, *([after] if after is not None else []), limit))
        return [(str(k), str(o)) for k, o in rows]

    def record_refs_between(self, run_id: str, stage: str, first: str, last: str) -> dict[str, RecordRef]:
        """The records of the root items from ``first`` to ``last`` (in key order) that have one."""
        rows = self.db.execute(
            "SELECT item_key, task_key, output_kind, output_digest FROM tasks WHERE run_id = ? AND root_key >= ? "
            "AND root_key <= ? AND item_key = root_key AND stage = ? AND status = 'succeeded'",
            (run_id, first, last, stage))
        return {str(r[0]): RecordRef(str(r[1]), str(r[2]), str(r[3])) for r in rows if r[3] is not None}

    def record_refs_of(self, run_id: str, stage: str, keys: Sequence[str]) -> dict[str, RecordRef]:
        """The records of these root items (a sample)."""
        found: dict[str, RecordRef] = {}
        for part in chunks(list(keys), 500):
            rows = self.db.execute(
                "SELECT item_key, task_key, output_kind, output_digest FROM tasks WHERE run_id = ? AND stage = ? "
                f"AND status = 'succeeded' AND item_key = root_key AND root_key IN ({','.join('?' * len(part))})",
                (run_id, stage, *part))
            found.update((str(r[0]), RecordRef(str(r[1]), str(r[2]), str(r[3]))) for r in rows if r[3] is not None)
        return found

    def recorded_items_after(self, run_id: str, stage: str, after: str | None,
                             limit: int) -> list[tuple[str, str | None]]:
        """(key, manifest meta JSON) of the next ``limit`` root items after ``after`` whose task at
        ``stage`` succeeded (the items with a record), in key order."""
        rows = self.db.execute(
            f"SELECT i.item_key, i.meta FROM items i {RECORD_TASK} WHERE i.run_id = ? AND i.parent_key IS NULL "
            f"{'AND i.item_key > ?' if after is not None else ''} ORDER BY i.item_key LIMIT ?",
            (stage, run_id, *([after] if after is not None else []), limit))
        return [(str(k), None if m is None else str(m)) for k, m in rows]
