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


class ItemAges(NamedTuple):
    """A run's ended root items per age bucket, the items not ended yet, and when its first task was created
    and its last task finished (None: no task has)."""

    counts: tuple[int, ...]
    open_items: int
    first_at: float | None
    last_at: float | None


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

    def item_ages(self, run_id: str, bounds: Sequence[float]) -> ItemAges:
        """How long the run's root items took, from their first task's creation (their submission) to their
        last task's end, as counts per bucket (``bounds``: ascending upper limits in seconds, one bucket more
        for the rest); items with a task still open (queued, running, awaiting review) are counted apart.
        One pass over the run's tasks in (root, item) index order, whatever the run's size."""
        cases = " ".join(f"WHEN age < ? THEN {index}" for index in range(len(bounds)))
        rows = self.db.execute(
            f"SELECT CASE WHEN age IS NULL THEN -1 {cases} ELSE {len(bounds)} END, COUNT(*), MIN(first_at), "
            "MAX(last_at) FROM (SELECT CASE WHEN SUM(CASE WHEN status IN ('queued', 'running', 'awaiting_review') "
            "THEN 1 ELSE 0 END) > 0 OR COUNT(finished_at) < COUNT(*) THEN NULL "
            "ELSE MAX(finished_at) - MIN(created_at) END AS age, MIN(created_at) AS first_at, "
            "MAX(finished_at) AS last_at FROM tasks WHERE run_id = ? AND status <> 'superseded' GROUP BY root_key"
            ") per_item GROUP BY 1",
            (*bounds, run_id))
        counts = [0] * (len(bounds) + 1)
        open_items, firsts, lasts = 0, [], []
        for bucket, count, first, last in rows:
            if int(bucket) < 0:
                open_items = int(count)
            else:
                counts[int(bucket)] = int(count)
            firsts += [float(first)] if first is not None else []
            lasts += [float(last)] if last is not None else []
        return ItemAges(tuple(counts), open_items, min(firsts, default=None), max(lasts, default=None))
