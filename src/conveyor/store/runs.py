"""Runs: creation, the submission's heartbeat and hand-over, status, and what a run tells its user.

A submission holds its run: the submitter writes a heartbeat every few seconds
(the store's clock). Which submissions have stopped is decided above the store
(runtime/heartbeat.py); a stopped one is marked ``abandoned`` — workers stop
waiting for it, and a new submitter may take it over (``take_submission``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.store.dialect import Dialect
from conveyor.store.groups import GroupQueries
from conveyor.store.records import UNFINISHED_RUNS, RunRecord
from conveyor.store.tasks import chunks

RUN_COLUMNS = (
    "run_id, pipeline, target, input, status, expected, has_publish, stages, created_at, submitted_at, finished_at, "
    "lane, submitter, heartbeat_at, note, budget_usd, spent_usd, reserved_usd, paused, params"
)


class RunQueries(GroupQueries):
    db: Dialect

    def create_run(self, run: RunRecord) -> None:
        with self.db.transaction():
            self.db.execute(
                f"INSERT INTO runs ({RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run.run_id, run.pipeline, run.target, run.input, run.status, run.expected,
                 int(run.has_publish), run.stages, run.created_at, run.submitted_at, run.finished_at, run.lane,
                 run.submitter, run.heartbeat_at, run.note, run.budget_usd, run.spent_usd, run.reserved_usd,
                 run.paused, run.params),
            )
            if '"group"' in run.stages or '"reduce"' in run.stages:  # its group stages' waits (store/groups.py)
                self.open_group_waits(run.run_id, run.pipeline, run.stages)

    def set_run_status(self, run_id: str, status: str, now: float, expected: int | None = None,
                       note: str | None = None) -> None:
        column = "submitted_at" if status == "submitted" else "finished_at"
        with self.db.transaction():
            self.db.execute(
                f"UPDATE runs SET status = ?, {column} = ?, expected = COALESCE(?, expected), note = ? "
                "WHERE run_id = ?", (status, now, expected, note, run_id))

    def discard_run(self, run_id: str) -> None:
        """Remove a run whose submission failed before any of its work could be seen by a worker."""
        with self.db.transaction():
            for table in ("attempts", "dead_letters", "tasks", "items", "run_notices", "runs"):
                self.db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))

    def get_run(self, run_id: str) -> RunRecord | None:
        rows = self.db.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
        return _run(rows[0]) if rows else None

    def list_runs(self, limit: int = 20, before: float | None = None, pipeline: str | None = None) -> list[RunRecord]:
        """The newest runs (created before ``before``, when given: the next page; of ``pipeline``, when given),
        newest first."""
        clauses = [c for c, v in (("created_at < ?", before), ("pipeline = ?", pipeline)) if v is not None]
        params = [v for v in (before, pipeline) if v is not None]
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        rows = self.db.execute(f"SELECT {RUN_COLUMNS} FROM runs {where}ORDER BY created_at DESC LIMIT ?",
                               (*params, limit))
        return [_run(r) for r in rows]

    # --- the submission's heartbeat -------------------------------------------

    def heartbeat(self, run_id: str, submitter: str, now: float) -> bool:
        """Renew the submitter's hold on its run; False when it has lost it (abandoned, taken over)."""
        with self.db.transaction():
            return self.db.execute_rowcount(
                "UPDATE runs SET heartbeat_at = ? WHERE run_id = ? AND submitter = ? AND status = 'submitting'",
                (now, run_id, submitter)) == 1

    def live_submissions(self, pipeline: str, run_id: str | None) -> list[tuple[str, str | None, float]]:
        """(run id, submitter, heartbeat at) of the runs of ``pipeline`` (or just ``run_id``) being submitted."""
        run_filter, params = ("AND run_id = ?", (run_id,)) if run_id else ("", ())
        rows = self.db.execute(f"SELECT run_id, submitter, heartbeat_at FROM runs WHERE status = 'submitting' "
                               f"AND pipeline = ? {run_filter}", (pipeline, *params))
        return [(str(r[0]), r[1], float(r[2] or 0.0)) for r in rows]

    def abandon_runs(self, run_ids: Sequence[str], note: str) -> None:
        """Mark submissions that stopped ``abandoned`` (still only those being submitted)."""
        with self.db.transaction():
            self.db.executemany("UPDATE runs SET status = 'abandoned', note = ? WHERE run_id = ? "
                                "AND status = 'submitting'", [(note, run_id) for run_id in run_ids])

    def take_submission(self, run_id: str, submitter: str, now: float, abandon_after: float) -> bool:
        """Hand an unfinished submission to ``submitter``: only when it was abandoned, or its submitter
        stopped beating ``abandon_after`` seconds ago (0: the caller knows it is gone). True when it is
        now ours."""
        with self.db.transaction():
            return self.db.execute_rowcount(
                "UPDATE runs SET status = 'submitting', submitter = ?, heartbeat_at = ?, note = NULL "
                "WHERE run_id = ? AND (status = 'abandoned' OR (status = 'submitting' AND heartbeat_at < ?))",
                (submitter, now, run_id, now - abandon_after)) == 1

    def unfinished_run(self, pipeline: str, stages: str, input_path: str) -> RunRecord | None:
        """The latest run of this pipeline and graph over this input whose submission did not finish."""
        marks = ",".join("?" * len(UNFINISHED_RUNS))
        rows = self.db.execute(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE pipeline = ? AND stages = ? AND input = ? AND status IN ({marks})"
            " ORDER BY created_at DESC LIMIT 1", (pipeline, stages, input_path, *UNFINISHED_RUNS))
        return _run(rows[0]) if rows else None

    def existing_roots(self, run_id: str, keys: Sequence[str]) -> set[str]:
        """Of ``keys``, the root items the run already has (a resumed submission skips them)."""
        found: set[str] = set()
        for part in chunks(list(keys), 900):
            marks = ",".join("?" * len(part))
            found.update(str(r[0]) for r in self.db.execute(
                f"SELECT item_key FROM items WHERE run_id = ? AND item_key IN ({marks})", [run_id, *part]))
        return found

    # --- inputs ---------------------------------------------------------------

    def input_checked(self, path: str, signature: str) -> bool:
        """Whether this manifest, as ``signature`` identifies it, passed the check already."""
        return bool(self.db.execute("SELECT 1 FROM checked_inputs WHERE path = ? AND signature = ?",
                                    (path, signature)))

    def record_input_check(self, path: str, signature: str, now: float) -> None:
        with self.db.transaction():
            self.db.execute("INSERT INTO checked_inputs (path, signature, checked_at) VALUES (?, ?, ?) "
                            "ON CONFLICT (path, signature) DO NOTHING", (path, signature, now))

    # --- code changes ---------------------------------------------------------

    def accept_code(self, rows: Sequence[tuple[str, str, str, str, str, float]]) -> None:
        """rows: (pipeline, stage, version, code, run id, now): outputs made by other code under this stage
        version are accepted for this code (``--accept-code-change``)."""
        with self.db.transaction():
            self.db.executemany(
                "INSERT INTO code_acceptances (pipeline, stage, version, code, run_id, accepted_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (pipeline, stage, version, code) DO NOTHING", rows)

    def stale_code(self, run_id: str) -> list[tuple[str, str, int]]:
        """(stage, version, tasks) answered in this run from outputs that other code made under the same
        stage version, and not accepted for the code the run declared."""
        rows = self.db.execute(
            """SELECT n.stage, n.version, n.count FROM run_notices n JOIN runs r ON r.run_id = n.run_id
            WHERE n.run_id = ? AND n.kind = 'stale_code' AND NOT EXISTS (
                SELECT 1 FROM code_acceptances a WHERE a.pipeline = r.pipeline AND a.stage = n.stage
                AND a.version = n.version AND a.code = n.code)
            ORDER BY n.created_at, n.stage""", (run_id,))
        return [(str(stage), str(version), int(count)) for stage, version, count in rows]

    def copy_notices(self, base: str, run_id: str) -> None:
        """A run that copies settled items from ``base`` inherits what ``base`` had to say about them."""
        self.db.execute(
            "INSERT INTO run_notices (run_id, kind, stage, version, code, count, created_at) "
            "SELECT ?, kind, stage, version, code, count, created_at FROM run_notices WHERE run_id = ? "
            "ON CONFLICT (run_id, kind, stage) DO NOTHING", (run_id, base))


def _run(row: tuple[Any, ...]) -> RunRecord:
    values = list(row)
    values[6] = bool(values[6])
    return RunRecord(*values)
