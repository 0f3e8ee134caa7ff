"""What a Prometheus scrape reads: bounded queries only.

The queue's gauges come from the open-task counts (store/queuecounts.py) and the lease index (finished task rows
are never read); counters come from ``metric_totals``, a few rows per (metric, label values) that commits
increment, never from the attempts table.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.records import LEASED

LABEL_SEP = "\x1f"  # joins label values into metric_totals.labels
SHARDS = 16

# Upper bounds (seconds) of the attempt-duration histogram; the last bucket (index len) is +Inf.
ATTEMPT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Upper bounds (seconds) of the queued-age histogram.
AGE_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)


class MetricIncrement(NamedTuple):
    """Add ``value`` to the running total of ``name`` with these label values (LABEL_SEP-joined)."""

    name: str
    labels: str
    value: float


class StageCount(NamedTuple):
    pipeline: str
    stage: str
    tasks: int
    oldest_at: float | None = None


RUNNABLE = "status = 'queued' AND crashes = 0"  # the condition of the tasks_runnable partial index


class MetricsQueries:
    db: Dialect

    def add_metric_totals(self, rows: Sequence[MetricIncrement]) -> None:
        """Add to the running totals, in a fixed order (concurrent PostgreSQL commits lock rows alike)."""
        shard = os.getpid() % SHARDS
        self.db.executemany(
            "INSERT INTO metric_totals (name, labels, shard, value) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (name, labels, shard) DO UPDATE SET value = metric_totals.value + excluded.value",
            [(r.name, r.labels, shard, r.value) for r in sorted(rows)])

    def metric_totals(self) -> list[MetricIncrement]:
        """Every running total, its shards summed: a few rows per label set, whatever the backlog."""
        rows = self.db.execute("SELECT name, labels, SUM(value) FROM metric_totals GROUP BY name, labels")
        return [MetricIncrement(str(n), str(labels), float(v)) for n, labels, v in rows]

    def queue_ages(self, pipeline: str, stage: str, now: float, cap: int) -> list[int]:
        """Runnable tasks of one stage per AGE_BUCKETS bin (the last: older than every bound), each counted up to
        ``cap`` (a bin that holds more reads ``cap``): at most ``cap`` index entries read per bin."""
        cuts = [now - bound for bound in AGE_BUCKETS]
        conds: list[tuple[str, tuple[float, ...]]] = [("available_at >= ?", (cuts[0],))]
        conds += [("available_at >= ? AND available_at < ?", (cuts[i], cuts[i - 1])) for i in range(1, len(cuts))]
        conds.append(("available_at < ?", (cuts[-1],)))
        sql = " UNION ALL ".join(
            f"SELECT {i}, (SELECT COUNT(*) FROM (SELECT 1 FROM tasks WHERE {RUNNABLE} AND pipeline = ? AND stage = ? "
            f"AND {cond} LIMIT {int(cap)}) bin{i})" for i, (cond, _) in enumerate(conds))
        params = [p for _, bound in conds for p in (pipeline, stage, *bound)]
        counts = dict(self.db.execute(sql, params))
        return [int(counts.get(i, 0)) for i in range(len(conds))]

    def running_counts(self) -> list[StageCount]:
        """Leased tasks (bounded by the fleet's batches), through ``tasks_leased``."""
        return self._stage_counts(LEASED, "NULL")

    def _stage_counts(self, where: str, oldest: str) -> list[StageCount]:
        rows = self.db.execute(f"SELECT pipeline, stage, COUNT(*), {oldest} FROM tasks WHERE {where} "
                               "GROUP BY pipeline, stage")
        return [StageCount(str(p), str(s), int(c), None if o is None else float(o)) for p, s, c, o in rows]

    def review_backlog(self) -> list[StageCount]:
        """Undecided review entries per stage and the oldest one's creation, through ``reviews_open``."""
        rows = self.db.execute("SELECT pipeline, stage, COUNT(*), MIN(created_at) FROM reviews "
                               "WHERE decided_at IS NULL GROUP BY pipeline, stage")
        return [StageCount(str(p), str(s), int(c), float(o)) for p, s, c, o in rows]

    def dead_letters_since(self, since: float) -> int:
        """Dead letters created since ``since``, through ``dead_letters_created``."""
        return int(self.db.execute("SELECT COUNT(*) FROM dead_letters WHERE created_at >= ?", (since,))[0][0])
