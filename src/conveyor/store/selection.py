"""Selecting tasks by run, stage, status, error class, item, provenance and time: what `conveyor select` reads
and `conveyor replay` re-opens.

A selection is walked in task-id order a page at a time (keyset pagination), so it streams whatever its size.
Failures are found through the partial index of the tasks that did not succeed (``tasks_unsettled``), and a
provenance comparison through the provenance rows' index: selecting the 1,000 failures of a run of a million
items reads about a thousand rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from conveyor.store.dialect import Dialect

# Tasks in these statuses always carry an error class, which the partial index tasks_unsettled covers (schema
# migration 9): a selection of only these says so in the words of the index's predicate, which is how SQLite's
# planner knows it may use the index.
UNSETTLED = ("failed", "dead_lettered", "rejected", "awaiting_review")
_UNSETTLED_TERM = "t.error_class IS NOT NULL"

SELECTED_COLUMNS = """t.id, t.run_id, t.root_key, t.item_key, t.stage, t.status, t.error_class, t.last_error,
    t.attempts, t.stage_version, t.config_hash, t.task_key, t.input_kind, t.input_digest, t.input_inline,
    t.input_size, t.output_kind, t.output_digest, t.cached, t.tier, t.finished_at, t.created_at, t.replay_id"""

OPS = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


class ProvenanceTerm(NamedTuple):
    """``name op value`` over a task's provenance rows, ``sort_key`` the value's (store/provenance.py).
    ``!=`` holds when the task has the name with another value, or not at all."""

    name: str
    op: str
    sort_key: str


class TaskFilter(NamedTuple):
    """What a selection asks of a task, every field optional (empty: no condition)."""

    runs: tuple[str, ...] = ()
    stages: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    error_classes: tuple[str, ...] = ()
    item_glob: str | None = None
    columns: tuple[tuple[str, str], ...] = ()  # (column, value): equality on a task column (stage_version, ...)
    provenance: tuple[ProvenanceTerm, ...] = ()
    models: tuple[str, ...] = ()  # asked for any of these models (the provenance rows named "model")
    since: float | None = None
    until: float | None = None


class SelectedTask(NamedTuple):
    id: int
    run_id: str
    root_key: str
    item_key: str
    stage: str
    status: str
    error_class: str | None
    last_error: str | None
    attempts: int
    stage_version: str
    config_hash: str
    task_key: str
    input_kind: str
    input_digest: str
    input_inline: bytes | None
    input_size: int
    output_kind: str | None
    output_digest: str | None
    cached: int
    tier: int
    finished_at: float | None
    created_at: float
    replay_id: int | None


COLUMN_NAMES = frozenset({"stage_version", "config_hash"})


def _where(db: Dialect, f: TaskFilter) -> tuple[list[str], list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []

    def among(column: str, values: Sequence[str]) -> None:
        if values:
            clauses.append(f"{column} IN ({','.join('?' * len(values))})")
            params.extend(values)

    # With provenance conditions, the id list they make drives the query: `|| ''` keeps SQLite's planner from
    # walking every task of the run through the run's index instead (2 s instead of 50 ms at a million tasks).
    driven = bool(f.provenance or f.models)
    among("(t.run_id || '')" if driven else "t.run_id", f.runs)
    among("t.stage", f.stages)
    among("t.status", f.statuses)
    if f.statuses and set(f.statuses) <= set(UNSETTLED):
        clauses.append(_UNSETTLED_TERM)
    among("t.error_class", f.error_classes)
    if f.item_glob is not None:
        op, pattern = db.glob(f.item_glob)
        clauses.append(f"t.item_key {op} ?")
        params.append(pattern)
    for column, value in f.columns:
        if column not in COLUMN_NAMES:
            raise ValueError(f"not a selectable column: {column}")
        clauses.append(f"t.{column} = ?")
        params.append(value)
    # Provenance conditions name the tasks through the provenance rows' index (run, name, sort key): an id list
    # made once, not a probe per task (SQLite would otherwise scan the index range for every task row).
    scope = f"p.run_id IN ({','.join('?' * len(f.runs))}) AND " if f.runs else ""
    ids = ("t.id {negate}IN (SELECT t2.id FROM provenance p JOIN tasks t2 ON t2.run_id = p.run_id AND "
           "t2.root_key = p.root_key AND t2.item_key = p.item_key AND t2.stage = p.stage WHERE " + scope +
           "p.name = ? AND {condition})")
    if f.models:
        clauses.append(ids.format(negate="", condition=f"p.value IN ({','.join('?' * len(f.models))})"))
        params += [*f.runs, "model", *f.models]
    for term in f.provenance:
        if term.op == "!=":
            clauses.append(ids.format(negate="NOT ", condition="p.sort_key = ?"))
        else:
            clauses.append(ids.format(negate="", condition=f"p.sort_key {OPS[term.op]} ?"))
        params += [*f.runs, term.name, term.sort_key]
    if f.since is not None:
        clauses.append("COALESCE(t.finished_at, t.created_at) >= ?")
        params.append(f.since)
    if f.until is not None:
        clauses.append("COALESCE(t.finished_at, t.created_at) < ?")
        params.append(f.until)
    return clauses, params


class SelectionQueries:
    db: Dialect

    def select_tasks(self, f: TaskFilter, after_id: int = 0, limit: int = 1000,
                     roots: Sequence[str] = ()) -> list[SelectedTask]:
        """The next ``limit`` tasks matching ``f`` after task id ``after_id``, in id order; ``roots`` (at most
        a few hundred, given by the caller a part at a time) narrows to those root items' tasks."""
        clauses, params = _where(self.db, f)
        if roots:
            clauses.append(f"t.root_key IN ({','.join('?' * len(roots))})")
            params.extend(roots)
        clauses.append("t.id > ?")
        params.append(after_id)
        rows = self.db.execute(f"SELECT {SELECTED_COLUMNS} FROM tasks t WHERE {' AND '.join(clauses)} "
                               "ORDER BY t.id LIMIT ?", [*params, limit])
        return [SelectedTask(*r) for r in rows]

    def count_tasks(self, f: TaskFilter, roots: Sequence[str] = ()) -> dict[str, int]:
        """Tasks matching ``f`` (narrowed as ``select_tasks`` narrows), by stage."""
        clauses, params = _where(self.db, f)
        if roots:
            clauses.append(f"t.root_key IN ({','.join('?' * len(roots))})")
            params.extend(roots)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self.db.execute(f"SELECT t.stage, COUNT(*) FROM tasks t {where} GROUP BY t.stage", params)
        return {str(stage): int(count) for stage, count in rows}

    def source_digests(self, run_id: str, roots: Sequence[str]) -> dict[str, str | None]:
        """Root item key -> the digest of the source it was read from (None: it had no readable source)."""
        found: dict[str, str | None] = {}
        for start in range(0, len(roots), 900):
            part = list(roots[start:start + 900])
            found.update((str(k), None if d is None else str(d)) for k, d in self.db.execute(
                f"SELECT item_key, source_digest FROM items WHERE run_id = ? AND item_key IN "
                f"({','.join('?' * len(part))})", [run_id, *part]))
        return found

    def run_ids(self) -> list[str]:
        return [str(r[0]) for r in self.db.execute("SELECT run_id FROM runs ORDER BY created_at")]
