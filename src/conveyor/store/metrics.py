"""What a Prometheus scrape reads: bounded queries only.

Gauges of the hot queue come from its partial indexes (finished task rows are never read); counters come from
``metric_totals``, a few rows per (metric, label values) that commits increment, never from the attempts table.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect

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


class QueueRow(NamedTuple):
    """Runnable tasks of one stage: how many, the earliest ``available_at``, and how many are at most
    each AGE_BUCKETS bound old (cumulative), with the sum of their ``available_at``."""

    pipeline: str
    stage: str
    tasks: int
    oldest_at: float
    sum_at: float
    within: tuple[int, ...]


class StageCount(NamedTuple):
    pipeline: str
    stage: str
    tasks: int
    oldest_at: float | None = None


def _age_columns() -> str:
    return ", ".join("SUM(CASE WHEN available_at >= ? THEN 1 ELSE 0 END)" for _ in AGE_BUCKETS)


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

    def queue_rows(self, now: float) -> list[QueueRow]:
        """Runnable tasks per stage with their ages, in one pass over the hot queue's partial index
        (``tasks_runnable`` covers pipeline, stage and available_at: no task row is read)."""
        rows = self.db.execute(
            f"SELECT pipeline, stage, COUNT(*), MIN(available_at), SUM(available_at), {_age_columns()} "
            "FROM tasks WHERE status = 'queued' AND crashes = 0 GROUP BY pipeline, stage",
            [now - bound for bound in AGE_BUCKETS])
        return [QueueRow(str(r[0]), str(r[1]), int(r[2]), float(r[3]), float(r[4]), tuple(int(c) for c in r[5:]))
                for r in rows]

    def suspect_counts(self) -> list[StageCount]:
        """Queued tasks whose worker died (they run one at a time), through ``tasks_suspect``."""
        return self._stage_counts("status = 'queued' AND crashes > 0", "MIN(available_at)")

    def running_counts(self) -> list[StageCount]:
        """Leased tasks (bounded by the fleet's batches), through ``tasks_leased``."""
        return self._stage_counts("status = 'running'", "NULL")

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
