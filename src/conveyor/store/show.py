"""One item of a run, read whole for `conveyor show`: its row, its tasks and its fan-out descendants', every
attempt of them, and the dead letters of theirs that were replayed. Reads only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.records import CHILD_MARK, CHILD_RANGE_END
from conveyor.store.reviews import REVIEW_COLUMNS, ReviewEntry
from conveyor.store.selection import SELECTED_COLUMNS, SelectedTask
from conveyor.store.tasks import chunks

ATTEMPT_COLUMNS = ("attempt", "outcome", "invoked", "error_class", "message", "worker", "started_at", "duration",
                   "provider_calls", "prompt_tokens", "completion_tokens", "cost", "model", "prompt_version", "tier",
                   "repaired", "confidence", "stage_version", "code_version", "config_hash", "provenance", "logs",
                   "logs_dropped", "unrepaired")


class ItemRow(NamedTuple):
    """An item as submitted (a root) or made by a fan-out (a child): where it sits and what it was read from."""

    item_key: str
    parent_key: str | None
    root_key: str
    source_digest: str | None
    source_size: int | None
    meta: str | None  # the manifest line's meta, as JSON text
    traceparent: str | None = None  # its trace's root context, when it was traced (a root: store/traces.py)


class ReplayedLetter(NamedTuple):
    """A dead letter of a task that `conveyor dlq replay` (or a replay) queued again."""

    id: int
    created_at: float  # when the task was dead-lettered
    replayed_at: float
    reason: str | None


class ShowQueries:
    db: Dialect

    def item_row(self, run_id: str, item_key: str) -> ItemRow | None:
        rows = self.db.execute("SELECT item_key, parent_key, root_key, source_digest, source_size, meta, traceparent "
                               "FROM items WHERE run_id = ? AND item_key = ?", (run_id, item_key))
        if not rows:
            return None
        key, parent, root, digest, size, meta, traceparent = rows[0]
        return ItemRow(str(key), parent, str(root), digest, None if size is None else int(size), meta, traceparent)

    def item_tasks(self, run_id: str, root_key: str, item_key: str, stage: str | None = None) -> list[SelectedTask]:
        """The tasks of ``item_key`` and of its fan-out descendants (one range of the (run, root, item, stage)
        index), optionally at one stage only, in key order."""
        params: list[Any] = [run_id, root_key, item_key, item_key + CHILD_MARK, item_key + CHILD_RANGE_END]
        at_stage = ""
        if stage is not None:
            at_stage = "AND t.stage = ? "
            params.append(stage)
        rows = self.db.execute(
            f"SELECT {SELECTED_COLUMNS} FROM tasks t WHERE t.run_id = ? AND t.root_key = ? AND (t.item_key = ? OR "
            f"(t.item_key > ? AND t.item_key < ?)) {at_stage}ORDER BY t.item_key, t.id", params)
        return [SelectedTask(*r) for r in rows]

    def attempt_history(self, run_id: str, task_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
        """Task id -> its attempt rows, oldest first (replayed, superseded and requeued marks included)."""
        found: dict[int, list[dict[str, Any]]] = {}
        for part in chunks(list(task_ids), 500):
            rows = self.db.execute(
                f"SELECT task_id, {', '.join(ATTEMPT_COLUMNS)} FROM attempts WHERE run_id = ? AND task_id IN "
                f"({','.join('?' * len(part))}) ORDER BY id",
                [run_id, *part])
            for task_id, *values in rows:
                found.setdefault(int(task_id), []).append(dict(zip(ATTEMPT_COLUMNS, values, strict=True)))
        return found

    def task_reviews(self, task_ids: Sequence[int]) -> dict[int, list[ReviewEntry]]:
        """Task id -> its review entries, oldest first (through the reviews_task index)."""
        found: dict[int, list[ReviewEntry]] = {}
        for part in chunks(list(task_ids), 500):
            rows = self.db.execute(f"SELECT {REVIEW_COLUMNS} FROM reviews WHERE task_id IN "
                                   f"({','.join('?' * len(part))}) ORDER BY id", part)
            for row in rows:
                entry = ReviewEntry(*row)
                found.setdefault(entry.task_id, []).append(entry)
        return found

    def replayed_letters(self, run_id: str, task_ids: Sequence[int]) -> dict[int, ReplayedLetter]:
        """Task id -> its latest dead letter that was queued again, for the tasks of the run that have one
        (through the (run, replayed_at) index: dead letters have no index by task)."""
        found: dict[int, ReplayedLetter] = {}
        for part in chunks(list(task_ids), 500):
            rows = self.db.execute(
                "SELECT task_id, id, created_at, replayed_at, replay_reason FROM dead_letters WHERE run_id = ? "
                f"AND replayed_at IS NOT NULL AND task_id IN ({','.join('?' * len(part))}) ORDER BY id",
                [run_id, *part])
            for task_id, letter_id, created_at, replayed_at, reason in rows:
                found[int(task_id)] = ReplayedLetter(int(letter_id), float(created_at), float(replayed_at), reason)
        return found
