"""A run's progress over time: what finished in each time bucket (the read side of the dashboard's plots)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect


class TimelineRow(NamedTuple):
    """Attempts of one stage that ended in one bucket (``bucket``: its start, epoch seconds)."""

    bucket: float
    stage: str
    outcome: str
    attempts: int
    tokens: int
    cost: float


class ProgressQueries:
    db: Dialect

    def timeline_rows(self, run_id: str, bucket_s: float) -> Sequence[TimelineRow]:
        """Per time bucket, stage and outcome: the attempts that ended then, their tokens and cost."""
        rows = self.db.execute(
            "SELECT FLOOR((a.started_at + COALESCE(a.duration, 0)) / ?) * ?, t.stage, a.outcome, COUNT(*), "
            "SUM(a.prompt_tokens + a.completion_tokens), SUM(a.cost) FROM attempts a JOIN tasks t ON t.id = a.task_id "
            "WHERE a.run_id = ? AND a.started_at IS NOT NULL GROUP BY 1, 2, 3 ORDER BY 1",
            (bucket_s, bucket_s, run_id))
        return [TimelineRow(float(b), str(s), str(o), int(n), int(tok or 0), float(c or 0.0))
                for b, s, o, n, tok, c in rows]
