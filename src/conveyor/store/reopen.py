"""Re-opening ended tasks (a replay): queued again under their stage's current version and config, and
what was downstream of them superseded until the new input reaches it.

A superseded task is no part of its item's outcome; when its upstream task commits again, the successor that
commit creates takes the superseded row (the insert's ``ON CONFLICT ... WHERE status = 'superseded'``), so an
item never has two tasks at one stage.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.memokey import key64
from conveyor.store.queuecounts import OPEN_STATUSES, OpenTally, QueueCountQueries
from conveyor.store.records import CHILD_MARK, CHILD_RANGE_END
from conveyor.store.runtotals import RunTally, RunTotalsQueries
from conveyor.store.tasks import chunks

ENDED = ("succeeded", "failed", "dead_lettered", "rejected", "awaiting_review")
_ENDED_SQL = ", ".join(f"'{s}'" for s in ENDED)

REOPEN = f"""
UPDATE tasks SET status = 'queued', task_key = ?, stage_version = ?, config_hash = ?, input_digest = ?,
    input_kind = ?, input_inline = ?, input_size = ?, max_attempts = ?, available_at = ?, replay_id = ?,
    attempts = 0, crashes = 0, cached = 0, tier = 0, finished_at = NULL, output_digest = NULL, output_kind = NULL,
    error_class = NULL, last_error = NULL, lease_owner = NULL, lease_expires_at = NULL
WHERE id = ? AND status IN ({_ENDED_SQL})
"""

# A task downstream of a re-opened one: ended, or re-opened by this same replay (it will be made again anyway).
SUPERSEDE = f"""
UPDATE tasks SET status = 'superseded', replay_id = ?, lease_owner = NULL, lease_expires_at = NULL
WHERE run_id = ? AND root_key = ? AND (status IN ({_ENDED_SQL}) OR (status = 'queued' AND replay_id = ?))
    AND ((item_key = ? AND stage IN ({{stages}})) OR (item_key > ? AND item_key < ? AND ? = 1))
RETURNING id, stage
"""

# What SUPERSEDE will change, read first (with its rows locked) for the run's task totals.
SUPERSEDED_BEFORE = f"""
SELECT id, status, cached, pipeline, stage, available_at FROM tasks
WHERE run_id = ? AND root_key = ? AND (status IN ({_ENDED_SQL}) OR (status = 'queued' AND replay_id = ?))
    AND ((item_key = ? AND stage IN ({{stages}})) OR (item_key > ? AND item_key < ? AND ? = 1))"""


# Replays whose ``runs`` may name a run (with ``naming_run``'s pattern): a backslash escapes ``%`` and ``_``.
RUNS_LIKE = "runs LIKE ? ESCAPE '\\'"


def naming_run(run_id: str) -> str:
    """A LIKE pattern (for ``RUNS_LIKE``) for the replays whose ``runs`` (a JSON list of run ids) names
    ``run_id``: the id as JSON writes it, its ``%``, ``_`` and backslashes taken as themselves. SQLite's LIKE
    ignores ASCII case, so a match is checked with ``names_run`` too."""
    quoted = json.dumps(run_id)
    return "%" + quoted.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def names_run(runs: str, run_id: str) -> bool:
    """Whether a replay's ``runs`` (a JSON list of run ids) names ``run_id`` exactly."""
    return run_id in json.loads(runs)


class Reopened(NamedTuple):
    """An ended task queued again (bound in REOPEN's order)."""

    task_key: str
    stage_version: str
    config_hash: str
    input_digest: str
    input_kind: str
    input_inline: bytes | None
    input_size: int
    max_attempts: int
    available_at: float
    replay_id: int
    task_id: int


class Downstream(NamedTuple):
    """What lies after a re-opened task on its item: its item's tasks at ``stages``, and with ``children``
    every task of the item's fan-out descendants."""

    run_id: str
    root_key: str
    item_key: str
    stages: tuple[str, ...]
    children: bool


class ReopenQueries(RunTotalsQueries, QueueCountQueries):
    db: Dialect

    def start_replay(self, reason: str, note: str | None, selection: str, downstream: bool, runs: str, now: float,
                     by: str) -> int:
        rows = self.db.execute(
            "INSERT INTO replays (reason, note, selection, downstream, reopened, superseded, runs, created_at, "
            "created_by) VALUES (?, ?, ?, ?, 0, 0, ?, ?, ?) RETURNING id",
            (reason, note, selection, int(downstream), runs, now, by))
        return int(rows[0][0])

    def finish_replay(self, replay_id: int) -> tuple[int, int]:
        """Record (and return) how many tasks the replay left queued and superseded."""
        counts = dict(self.db.execute("SELECT status, COUNT(*) FROM tasks WHERE replay_id = ? GROUP BY status",
                                      (replay_id,)))
        reopened = sum(int(v) for k, v in counts.items() if k != "superseded")
        superseded = int(counts.get("superseded", 0))
        self.db.execute("UPDATE replays SET reopened = ?, superseded = ? WHERE id = ?",
                        (reopened, superseded, replay_id))
        return reopened, superseded

    def replays_of(self, run_id: str) -> list[tuple[int, str, str | None, float, str, int, int]]:
        """(id, reason, note, created_at, created_by, reopened, superseded) of the replays that touched a run."""
        rows = self.db.execute("SELECT id, reason, note, created_at, created_by, reopened, superseded, runs FROM "
                               f"replays WHERE {RUNS_LIKE} ORDER BY id", (naming_run(run_id),))
        return [(int(r[0]), str(r[1]), r[2], float(r[3]), str(r[4]), int(r[5]), int(r[6])) for r in rows
                if names_run(str(r[7]), run_id)]

    def replay_entries(self, ids: Sequence[int]) -> dict[int, tuple[str, str | None, float, str]]:
        """id -> (reason, note, created_at, created_by)."""
        found: dict[int, tuple[str, str | None, float, str]] = {}
        for part in chunks(sorted(set(ids)), 500):
            for row in self.db.execute("SELECT id, reason, note, created_at, created_by FROM replays WHERE id IN "
                                       f"({','.join('?' * len(part))})", list(part)):
                found[int(row[0])] = (str(row[1]), row[2], float(row[3]), str(row[4]))
        return found

    def reopen(self, rows: Sequence[Reopened], forget: Sequence[str], message: str, worker: str, now: float,
               run_of: dict[int, str]) -> list[int]:
        """Queue ended tasks again; forget the memoised refusals of ``forget`` (task keys: a refusal the replay
        asks to run again must not answer it); close their open review entries and dead letters; record
        ``message`` as an attempt of each. Returns the ids re-opened (a task no longer ended is left as it is).
        Runs in the caller's transaction."""
        self.forget_refusals(forget)
        totals, opened, changed = RunTally(), OpenTally(), []
        for row in rows:
            before = self.db.execute("SELECT run_id, stage, status, cached, pipeline FROM tasks WHERE id = ?"
                                     f"{self.db.row_lock}", (row.task_id,))
            if before and self.db.execute_rowcount(REOPEN, row):
                run_id, stage, status, cached, pipeline = before[0]
                totals.move(str(run_id), str(stage), (str(status), int(cached)), ("queued", 0))
                opened.add(str(pipeline), str(stage), row.available_at)  # it was ended: not open before
                changed.append(row.task_id)
        self.add_run_totals(totals)
        self.add_open_tasks(opened)
        self._closed(changed, message, worker, now, run_of, "replayed")
        return changed

    def supersede(self, parts: Sequence[Downstream], replay_id: int, message: str, worker: str, now: float,
                  ) -> dict[str, int]:
        """Supersede what lies downstream of re-opened tasks (see Downstream); returns the count by stage."""
        by_stage: dict[str, int] = {}
        touched: list[int] = []
        run_of: dict[int, str] = {}
        totals, opened = RunTally(), OpenTally()
        for d in parts:
            marks = ",".join("?" * len(d.stages)) if d.stages else "NULL"
            params = (replay_id, d.run_id, d.root_key, replay_id, d.item_key, *d.stages,
                      d.item_key + CHILD_MARK, d.item_key + CHILD_RANGE_END, int(d.children))
            before = {int(r[0]): r[1:] for r in self.db.execute(
                SUPERSEDED_BEFORE.replace("{stages}", marks) + self.db.row_lock, params[1:])}
            for task_id, stage in self.db.execute(SUPERSEDE.replace("{stages}", marks), params):
                by_stage[str(stage)] = by_stage.get(str(stage), 0) + 1
                touched.append(int(task_id))
                run_of[int(task_id)] = d.run_id
                status, cached, pipeline, _, available_at = before[int(task_id)]
                totals.task(d.run_id, str(stage), str(status), int(cached), value=-1)  # superseded: counted nowhere
                if status in OPEN_STATUSES:  # queued again by this replay, now superseded
                    opened.add(str(pipeline), str(stage), float(available_at), -1)
        self.add_run_totals(totals)
        self.add_open_tasks(opened)
        self._closed(touched, message, worker, now, run_of, "superseded")
        return by_stage

    def downstream_counts(self, parts: Sequence[Downstream]) -> dict[str, int]:
        """What ``supersede`` would supersede, by stage (a dry run)."""
        by_stage: dict[str, int] = {}
        for d in parts:
            marks = ",".join("?" * len(d.stages)) if d.stages else "NULL"
            rows = self.db.execute(
                f"SELECT stage, COUNT(*) FROM tasks WHERE run_id = ? AND root_key = ? AND status IN ({_ENDED_SQL}) "
                f"AND ((item_key = ? AND stage IN ({marks})) OR (item_key > ? AND item_key < ? AND ? = 1)) "
                "GROUP BY stage", (d.run_id, d.root_key, d.item_key, *d.stages, d.item_key + CHILD_MARK,
                                   d.item_key + CHILD_RANGE_END, int(d.children)))
            for stage, count in rows:
                by_stage[str(stage)] = by_stage.get(str(stage), 0) + int(count)
        return by_stage

    def _closed(self, task_ids: Sequence[int], message: str, worker: str, now: float, run_of: dict[int, str],
                outcome: str) -> None:
        """The bookkeeping of tasks a replay touched: review entries and dead letters closed, provenance rows
        dropped (the task gets new ones when it ends again), an attempt that says why."""
        for part in chunks(list(task_ids), 500):
            marks = ",".join("?" * len(part))
            self.db.execute(f"UPDATE reviews SET decided_at = ?, decision = 'superseded', decided_by = ?, why = ? "
                            f"WHERE task_id IN ({marks}) AND decided_at IS NULL", [now, worker, message, *part])
            self.db.execute(f"UPDATE dead_letters SET replayed_at = ?, replay_reason = ? WHERE task_id IN ({marks}) "
                            "AND replayed_at IS NULL", [now, message, *part])
            self.db.execute(
                "DELETE FROM provenance WHERE EXISTS (SELECT 1 FROM tasks t WHERE t.id IN "
                f"({marks}) AND t.run_id = provenance.run_id AND t.root_key = provenance.root_key "
                "AND t.item_key = provenance.item_key AND t.stage = provenance.stage)", list(part))
        self.db.executemany(
            "INSERT INTO attempts (task_id, run_id, attempt, outcome, invoked, message, worker, started_at) "
            "VALUES (?, ?, 0, ?, 0, ?, ?, ?)", [(t, run_of[t], outcome, message, worker, now) for t in task_ids])
        totals = RunTally()  # bookkeeping attempts: counted by outcome, not in the timeline
        for t in task_ids:
            totals.add(run_of[t], "attempts", outcome)
        self.add_run_totals(totals)

    def forget_refusals(self, task_keys: Sequence[str]) -> None:
        """Drop memoised refusals (never outputs) of these task keys."""
        for part in chunks(sorted(set(task_keys)), 450):
            marks = ",".join("?" * len(part))
            self.db.execute(f"DELETE FROM outputs WHERE kind = 'failed' AND key64 IN ({marks}) AND task_key IN "
                            f"({marks})", [*map(key64, part), *part])

    def correct_sources(self, run_id: str, sources: Sequence[tuple[str, str, int]]) -> None:
        """Root items read again from corrected sources: (key, digest, size)."""
        self.db.executemany("UPDATE items SET source_digest = ?, source_size = ? WHERE run_id = ? AND item_key = ?",
                            [(digest, size, run_id, key) for key, digest, size in sources])

    def task_outputs(self, run_id: str, tasks: Sequence[tuple[str, str, str]]
                     ) -> dict[tuple[str, str], tuple[str, str | None, str | None, str]]:
        """(item key, stage) -> (task key, output kind, output digest, status) of these tasks (root, item,
        stage) of a run: where a re-opened task's input came from."""
        found: dict[tuple[str, str], tuple[str, str | None, str | None, str]] = {}
        for root, item, stage in set(tasks):
            for row in self.db.execute("SELECT task_key, output_kind, output_digest, status FROM tasks WHERE "
                                       "run_id = ? AND root_key = ? AND item_key = ? AND stage = ?",
                                       (run_id, root, item, stage)):
                found[item, stage] = (str(row[0]), row[1], row[2], str(row[3]))
        return found

    def open_downstream(self, run_id: str, root_key: str) -> list[tuple[str, str]]:
        """(item key, stage) of a root item's tasks that are queued or running."""
        return [(str(r[0]), str(r[1])) for r in self.db.execute(
            "SELECT item_key, stage FROM tasks WHERE run_id = ? AND root_key = ? AND status IN ('queued', 'running')",
            (run_id, root_key))]
