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


class ProgressQueries(RunTotalsQueries):
    db: Dialect

    def timeline_rows(self, run_id: str, bucket_s: float) -> Sequence[TimelineRow]:
        """Per time bucket (a whole number of minutes), stage and outcome: the attempts that ended then, and
        the tokens and cost of each bucket (on its first row), from the run's running totals."""
        minutes = max(1, round(bucket_s / MINUTE))
        usage: dict[tuple[int, str], float] = defaultdict(float)
        for minute, field, _, value in self.run_totals(run_id, "timeline_usage"):
            usage[int(minute) // minutes, field] += value
        counts: dict[tuple[int, str, str], int] = defaultdict(int)
        for minute, stage, outcome, value in self.run_totals(run_id, "timeline"):
            counts[int(minute) // minutes, stage, outcome] += int(value)
        for bucket, _ in usage:
            counts.setdefault((bucket, "", ""), 0)  # usage in a bucket without a counted attempt
        rows, seen = [], set()
        for bucket, stage, outcome in sorted(counts):
            first = bucket not in seen
            seen.add(bucket)
            rows.append(TimelineRow(float(bucket * minutes * MINUTE), stage, outcome, counts[bucket, stage, outcome],
                                    int(usage.get((bucket, "tokens"), 0)) if first else 0,
                                    usage.get((bucket, "cost"), 0.0) if first else 0.0))
        return rows
