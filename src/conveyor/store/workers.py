"""The fleet: each worker's row, written at its start, at every lease-keeping beat and at a clean exit.

Whether a worker is live, lost or stopped is decided above the store (service/workers.py), from its last
beat and how often it beats.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect

COLUMNS = ("worker, host, pid, pipeline, run_id, beat_s, started_at, heartbeat_at, tasks_held, tasks_done, stopped_at, "
           "serves")
PRUNE_BATCH = 1000  # rows deleted at one worker's start, at most: pruning stays bounded work


class WorkerRow(NamedTuple):
    """One worker process, its columns in the table's order."""

    worker: str
    host: str
    pid: int
    pipeline: str
    run_id: str | None
    beat_s: float
    started_at: float
    heartbeat_at: float
    tasks_held: int = 0
    tasks_done: int = 0
    stopped_at: float | None = None
    serves: str | None = None  # {stage: [version, config hash]} as JSON: the declarations whose tasks it claims


class Declaration(NamedTuple):
    """One declaration of a stage: what a task's stage_version and config_hash columns name, with the config
    (canonical JSON) that made the hash."""

    pipeline: str
    stage: str
    version: str
    config_hash: str
    config: str


class WorkerQueries:
    db: Dialect

    def register_worker(self, row: WorkerRow, forget_before: float) -> None:
        """Add a starting worker; forget (a bounded batch of) workers silent since ``forget_before``."""
        with self.db.transaction():
            self.db.execute(
                "DELETE FROM workers WHERE worker IN (SELECT worker FROM workers WHERE heartbeat_at < ? LIMIT ?)",
                (forget_before, PRUNE_BATCH))
            self.db.execute(f"INSERT INTO workers ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def beat_worker(self, worker: str, now: float, held: int, done: int) -> None:
        """A beat: in the caller's transaction (the lease keeper's), so it takes no lock of its own."""
        self.db.execute("UPDATE workers SET heartbeat_at = ?, tasks_held = ?, tasks_done = ? WHERE worker = ?",
                        (now, held, done, worker))

    def stop_worker(self, worker: str, now: float, done: int) -> None:
        with self.db.transaction():
            self.db.execute("UPDATE workers SET stopped_at = ?, heartbeat_at = ?, tasks_held = 0, tasks_done = ? "
                            "WHERE worker = ?", (now, now, done, worker))

    def list_workers(self, since: float, stopped: bool, limit: int) -> list[WorkerRow]:
        """Workers that beat since ``since`` (the stopped ones too, with ``stopped``), oldest start first."""
        also = "" if stopped else "AND stopped_at IS NULL"
        rows = self.db.execute(
            f"SELECT {COLUMNS} FROM workers WHERE heartbeat_at >= ? {also} ORDER BY started_at, worker LIMIT ?",
            (since, limit))
        return [WorkerRow(*r) for r in rows]

    def note_declarations(self, declarations: Sequence[tuple[str, str, str, str, str]], now: float) -> None:
        """Remember these stage declarations (rows as Declaration holds them; a submission's, a worker's), so a
        difference can be named later."""
        with self.db.transaction():
            self.db.executemany(
                "INSERT INTO stage_declarations (pipeline, stage, version, config_hash, config, seen_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (pipeline, stage, version, config_hash) DO UPDATE "
                "SET seen_at = excluded.seen_at", [(*d, now) for d in declarations])

    def declarations(self, pipeline: str, stage: str) -> list[Declaration]:
        """Every declaration of ``pipeline``'s ``stage`` seen, the latest first."""
        rows = self.db.execute("SELECT pipeline, stage, version, config_hash, config FROM stage_declarations "
                               "WHERE pipeline = ? AND stage = ? ORDER BY seen_at DESC", (pipeline, stage))
        return [Declaration(*r) for r in rows]

    def open_task_declarations(self, run_id: str) -> list[tuple[str, str, str, int]]:
        """(stage, version, config hash, tasks) of the run's open tasks (queued or running): the declarations a
        process must have to finish the run (a replay may have made some under another than its submission's)."""
        rows = self.db.execute(
            "SELECT stage, stage_version, config_hash, COUNT(*) FROM tasks WHERE run_id = ? "
            "AND status IN ('queued', 'running') GROUP BY stage, stage_version, config_hash ORDER BY stage",
            (run_id,))
        return [(str(a), str(b), str(c), int(n)) for a, b, c, n in rows]
