"""The call journal: the answers of the model calls each task's attempts made, by the call's request.

An attempt that fails, is paused by its run's budget or loses its lease after a call was answered keeps that
answer here; the next attempt of the same task makes the same request and is answered from this row instead of
paying again (runtime/journal.py). The rows of a task go when it ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect

CHUNK = 500


class CallAnswer(NamedTuple):
    task_id: int
    call_key: str
    answer: str
    created_at: float


class JournalQueries:
    db: Dialect

    def call_answers(self, task_ids: Sequence[int]) -> dict[int, dict[str, str]]:
        """The answers journaled for each task, by call key."""
        found: dict[int, dict[str, str]] = {}
        for i in range(0, len(task_ids), CHUNK):
            condition, params = self.db.one_of("task_id", list(task_ids[i:i + CHUNK]), "bigint")
            for task_id, key, answer in self.db.execute(
                    f"SELECT task_id, call_key, answer FROM call_answers WHERE {condition}", params):
                found.setdefault(int(task_id), {})[str(key)] = str(answer)
        return found

    def keep_call_answers(self, rows: Sequence[CallAnswer]) -> None:
        """Journal answers (a call already journaled keeps its first answer)."""
        if rows:
            self.db.executemany("INSERT INTO call_answers (task_id, call_key, answer, created_at) VALUES (?, ?, ?, ?) "
                                "ON CONFLICT (task_id, call_key) DO NOTHING", rows)

    def forget_call_answers(self, task_ids: Sequence[int]) -> None:
        """The journal of tasks that ended: their answers are in their output (or their end) now."""
        for i in range(0, len(task_ids), CHUNK):
            condition, params = self.db.one_of("task_id", list(task_ids[i:i + CHUNK]), "bigint")
            self.db.execute(f"DELETE FROM call_answers WHERE {condition}", params)
