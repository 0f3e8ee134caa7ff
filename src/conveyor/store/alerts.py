"""Alerts on rates: what they are computed from (bounded reads) and their state rows (one per pipeline and alert).

A transition (ok -> firing, firing -> ok) is made under the alert row's lock, in one transaction with its events,
so that any number of workers and servers evaluating at once raise each episode once and resolve it once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from conveyor.store.dialect import Dialect

COLUMNS = "pipeline, alert, state, value, threshold, since, evaluated_at, firings"


class AlertRow(NamedTuple):
    """One declared alert's state: ``state`` 'ok' or 'firing' since ``since``; ``firings``: episodes so far."""

    pipeline: str
    alert: str
    state: str
    value: float
    threshold: float
    since: float
    evaluated_at: float
    firings: int


class AlertEvent(NamedTuple):
    """An outbox row for an alert: ``subject`` (alert:PIPELINE:NAME) in place of a job; ``webhook_url`` None
    when it goes nowhere (the row still records it); ``tenant`` the one whose secret signs it."""

    subject: str
    type: str
    data: str  # JSON
    created_at: float
    webhook_url: str | None
    tenant: str


class AlertQueries:
    db: Dialect

    def claim_alert_evaluation(self, pipeline: str, thresholds: dict[str, float], now: float, every: float) -> bool:
        """Make the pipeline's alert rows (state ok) if new, and drop those of alerts it no longer declares;
        True unless another process evaluated them within ``every`` seconds (then this one skips its turn).
        A claim writes ``evaluated_at``."""
        marks = ",".join("?" * len(thresholds))
        with self.db.transaction():
            self.db.execute(f"DELETE FROM alerts WHERE pipeline = ? AND alert NOT IN ({marks})",
                            (pipeline, *sorted(thresholds)))
            self.db.executemany(
                f"INSERT INTO alerts ({COLUMNS}) VALUES (?, ?, 'ok', 0, ?, ?, ?, 0) ON CONFLICT (pipeline, alert) "
                "DO NOTHING", [(pipeline, name, threshold, now, now - every - 1) for name, threshold in
                               sorted(thresholds.items())])
            return self.db.execute_rowcount(
                f"UPDATE alerts SET evaluated_at = ? WHERE pipeline = ? AND alert IN ({marks}) AND evaluated_at <= ?",
                (now, pipeline, *sorted(thresholds), now - every)) > 0

    def dead_letters_of_pipeline(self, pipeline: str, since: float, cap: int) -> int:
        """The pipeline's dead letters created since ``since``, counted up to ``cap``: an index range of
        ``dead_letters_created`` (the window's dead letters of every pipeline), each checked against its run.
        CROSS JOIN makes SQLite read dead_letters first: otherwise it starts from the pipeline's runs and reads
        every dead letter they ever had (PostgreSQL plans it by its statistics either way)."""
        rows = self.db.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM dead_letters d CROSS JOIN runs r WHERE r.run_id = d.run_id "
            "AND d.created_at >= ? AND r.pipeline = ? LIMIT ?) found", (since, pipeline, cap))
        return int(rows[0][0])

    def overdue_reviews(self, pipeline: str, now: float, cap: int) -> int:
        """The pipeline's review entries undecided past their deadline, counted up to ``cap``: an index range
        of ``reviews_open`` (pipeline, deadline_at)."""
        rows = self.db.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM reviews WHERE pipeline = ? AND decided_at IS NULL AND deadline_at < ? "
            "LIMIT ?) found", (pipeline, now, cap))
        return int(rows[0][0])

    def move_alert(self, pipeline: str, alert: str, firing: bool, value: float, threshold: float,
                   now: float) -> AlertRow | None:
        """In the caller's transaction: record the alert's latest value, and move it to ``firing`` (or to ok);
        the row as it was before when its state changed here, None when it was in that state already (or
        another process moved it first: its row is locked until its transaction ends)."""
        rows = self.db.execute(f"SELECT {COLUMNS} FROM alerts WHERE pipeline = ? AND alert = ?{self.db.row_lock}",
                               (pipeline, alert))
        if not rows:
            return None
        before = _row(rows[0])
        state = "firing" if firing else "ok"
        if before.state == state:
            self.db.execute("UPDATE alerts SET value = ?, threshold = ? WHERE pipeline = ? AND alert = ?",
                            (value, threshold, pipeline, alert))
            return None
        self.db.execute("UPDATE alerts SET state = ?, value = ?, threshold = ?, since = ?, firings = firings + ? "
                        "WHERE pipeline = ? AND alert = ?",
                        (state, value, threshold, now, int(firing), pipeline, alert))
        return before

    def insert_alert_events(self, events: Sequence[AlertEvent]) -> None:
        """Alert events into the outbox: pending delivery (due now) when they have a webhook URL."""
        self.db.executemany(
            "INSERT INTO events (job_id, type, data, created_at, delivery, next_delivery_at, webhook_url, tenant) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(e.subject, e.type, e.data, e.created_at, None if e.webhook_url is None else "pending",
              None if e.webhook_url is None else e.created_at, e.webhook_url, e.tenant) for e in events])

    def alert_rows(self, pipeline: str | None = None) -> list[AlertRow]:
        """Every alert's state (of ``pipeline``), by pipeline and name: a row per declared alert."""
        where, params = ("WHERE pipeline = ?", (pipeline,)) if pipeline else ("", ())
        rows = self.db.execute(f"SELECT {COLUMNS} FROM alerts {where} ORDER BY pipeline, alert", params)
        return [_row(r) for r in rows]


def _row(r: Sequence[Any]) -> AlertRow:
    return AlertRow(str(r[0]), str(r[1]), str(r[2]), float(r[3]), float(r[4]), float(r[5]), float(r[6]), int(r[7]))
