"""A run's progress over time: what finished in each time bucket (the read side of the dashboard's plots)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.runtotals import MINUTE, RunTotalsQueries


class TimelineRow(NamedTuple):
    """Attempts of one stage that ended in one bucket (``bucket``: its start, epoch seconds); ``tokens`` and
    ``cost`` are the whole bucket's, on its first row (0 on the others)."""

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


class ProgressQueries(RunTotalsQueries):
    db: Dialect

    def timeline_rows(self, run_id: str, bucket_s: float) -> Sequence[TimelineRow]:
        """Per time bucket (a whole number of minutes, or of seconds under a minute), stage and outcome: the
        attempts that ended then, and the tokens and cost of each bucket (on its first row). Whole minutes come
        from the run's running totals; buckets under a minute from its attempts, one grouped read of them all
        (so for runs with few: the caller's to choose)."""
        fine = bucket_s < MINUTE
        unit = 1 if fine else MINUTE
        per = max(1, round(bucket_s / unit))
        usage: dict[tuple[int, str], float] = defaultdict(float)
        for at, field, _, value in self._attempt_usage(run_id) if fine else self.run_totals(run_id, "timeline_usage"):
            usage[int(at) // per, field] += value
        counts: dict[tuple[int, str, str], int] = defaultdict(int)
        for at, stage, outcome, value in self._attempt_ends(run_id) if fine else self.run_totals(run_id, "timeline"):
            counts[int(at) // per, stage, outcome] += int(value)
        return _timeline(counts, usage, per * unit)

    def _attempt_ends(self, run_id: str) -> list[tuple[str, str, str, float]]:
        """(second, stage, outcome, attempts): the run's attempts by the second they ended, counted as the
        running totals' ``timeline`` counts them by the minute."""
        rows = self.db.execute(
            "SELECT a.at, t.stage, a.outcome, COUNT(*) FROM (SELECT task_id, outcome, "
            f"{self.db.types['attempt_second']} AS at FROM attempts WHERE run_id = ? AND started_at IS NOT NULL "
            "AND outcome NOT IN ('replayed', 'superseded')) a JOIN tasks t ON t.id = a.task_id "
            "GROUP BY a.at, t.stage, a.outcome", (run_id,))
        return [(str(at), str(stage), str(outcome), float(n)) for at, stage, outcome, n in rows]

    def _attempt_usage(self, run_id: str) -> list[tuple[str, str, str, float]]:
        """(second, "tokens" or "cost", "", value): the run's model usage by the second its attempts ended."""
        rows = self.db.execute(
            f"SELECT at, SUM(tokens), SUM(cost) FROM (SELECT {self.db.types['attempt_second']} AS at, "
            "prompt_tokens + completion_tokens AS tokens, cost FROM attempts WHERE run_id = ? "
            "AND started_at IS NOT NULL) a GROUP BY at", (run_id,))
        return [(str(at), field, "", float(value)) for at, tokens, cost in rows
                for field, value in (("tokens", tokens), ("cost", cost)) if value]

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


def _timeline(counts: dict[tuple[int, str, str], int], usage: dict[tuple[int, str], float],
              size: float) -> list[TimelineRow]:
    """The rows of ``timeline_rows`` from counts and usage by bucket number (``size`` seconds each)."""
    for bucket, _ in usage:
        counts.setdefault((bucket, "", ""), 0)  # usage in a bucket without a counted attempt
    rows, seen = [], set()
    for bucket, stage, outcome in sorted(counts):
        first = bucket not in seen
        seen.add(bucket)
        rows.append(TimelineRow(float(bucket * size), stage, outcome, counts[bucket, stage, outcome],
                                int(usage.get((bucket, "tokens"), 0)) if first else 0,
                                usage.get((bucket, "cost"), 0.0) if first else 0.0))
    return rows
