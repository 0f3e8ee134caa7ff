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
from conveyor.store.errortext import error_text_clause

# Tasks in these statuses always carry an error class, which the partial index tasks_unsettled covers (schema
# migration 9): a selection of only these says so in the words of the index's predicate, which is how SQLite's
# planner knows it may use the index.
UNSETTLED = ("failed", "dead_lettered", "rejected", "awaiting_review")
_UNSETTLED_TERM = "t.error_class IS NOT NULL"

SELECTED_COLUMNS = """t.id, t.run_id, t.root_key, t.item_key, t.stage, t.status, t.error_class, t.last_error,
    t.attempts, t.stage_version, t.config_hash, t.task_key, t.input_kind, t.input_digest, t.input_inline,
    t.input_size, t.output_kind, t.output_digest, t.cached, t.tier, t.finished_at, t.created_at, t.replay_id"""

# Above every key that starts with a given prefix (keys compare byte by byte: store/schema.py).
PAST_PREFIX = "\U0010ffff"
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
    key_prefix: str | None = None  # root items whose key starts so (a fan-out child goes with its root)
    error_text: str | None = None  # words all found in the task's error message (store/fulltext.py)
    review_states: tuple[str, ...] = ()  # the task has a review entry in one of these states (REVIEW_STATES)


# A review entry's state: open (undecided), else its decision.
REVIEW_STATES = ("open", "approved", "edited", "accepted", "rejected", "escalated")


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


def _where(db: Dialect, f: TaskFilter, walk: bool = False, keyed: bool = False) -> tuple[list[str], list[Any]]:
    """The conditions of ``f`` on task ``t``; with ``walk``, provenance conditions are probes of each task's own
    provenance rows (its primary key) for a walk of the run's tasks in key order, instead of an id list; with
    ``keyed`` (a page in key order), the stage as an expression no index has, so that it is a filter of the walk of
    the run's tasks in key order (migrations 26, 29 and 31: the index by stage is gone)."""
    clauses: list[str] = []
    params: list[Any] = []

    def among(column: str, values: Sequence[str]) -> None:
        if values:
            clauses.append(f"{column} IN ({','.join('?' * len(values))})")
            params.extend(values)

    # With provenance conditions (review states, words of an error on SQLite), the id list they make drives the
    # query: `|| ''` keeps SQLite's planner from walking every task of the run through the run's index instead
    # (2 s instead of 50 ms at a million tasks).
    listed = (f.provenance or f.models) and not walk
    driven = bool(listed or f.review_states or (f.error_text and db.name == "sqlite"))
    among("(t.run_id || '')" if driven else "t.run_id", f.runs)
    among("(t.stage || '')" if keyed else "t.stage", f.stages)
    among("t.status", f.statuses)
    if f.statuses and set(f.statuses) <= set(UNSETTLED):
        clauses.append(_UNSETTLED_TERM)
    among("t.error_class", f.error_classes)
    if f.error_classes and _UNSETTLED_TERM not in clauses:
        clauses.append(_UNSETTLED_TERM)
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
    if walk:  # a probe of the task's own rows (the primary key), never the values' index (SQLite's `+` says so)
        ids = ("{negate}EXISTS (SELECT 1 FROM provenance p WHERE p.run_id = t.run_id AND p.root_key = t.root_key "
               "AND p.item_key = t.item_key AND p.stage = t.stage AND p.name = ? AND {condition})")
        ids = ids.replace("{condition}", "+{condition}") if db.name == "sqlite" else ids
    if f.models:
        clauses.append(ids.format(negate="", condition=f"p.value IN ({','.join('?' * len(f.models))})"))
        params += [*([] if walk else f.runs), "model", *f.models]
    for term in f.provenance:
        if term.op == "!=":
            clauses.append(ids.format(negate="NOT ", condition="p.sort_key = ?"))
        else:
            clauses.append(ids.format(negate="", condition=f"p.sort_key {OPS[term.op]} ?"))
        params += [*([] if walk else f.runs), term.name, term.sort_key]
    if f.key_prefix:
        clauses.append("t.root_key >= ? AND t.root_key < ?")
        params += [f.key_prefix, f.key_prefix + PAST_PREFIX]
    if f.error_text:
        clause, values = error_text_clause(db, f.error_text)
        clauses.append(clause)
        params += values
    if f.review_states:
        for state in f.review_states:
            if state not in REVIEW_STATES:
                raise ValueError(f"not a review state: {state}")
        scope = f"r.run_id IN ({','.join('?' * len(f.runs))}) AND " if f.runs else ""
        clauses.append(f"t.id IN (SELECT r.task_id FROM reviews r WHERE {scope}COALESCE(r.decision, 'open') IN "
                       f"({','.join('?' * len(f.review_states))}))")
        params += [*f.runs, *f.review_states]
    if f.since is not None:
        clauses.append("COALESCE(t.finished_at, t.created_at) >= ?")
        params.append(f.since)
    if f.until is not None:
        clauses.append("COALESCE(t.finished_at, t.created_at) < ?")
        params.append(f.until)
    return clauses, params


def narrow(f: TaskFilter, walk: bool = False) -> bool:
    """Whether ``f`` names its tasks through an index of few rows (the run's failures and waits, its review
    entries, the words of error messages, provenance rows unless ``walk``) rather than walking the run's tasks."""
    unsettled = bool(f.statuses) and set(f.statuses) <= set(UNSETTLED)
    named = (f.provenance or f.models) and not walk
    return bool(unsettled or f.error_classes or f.error_text or f.review_states or named)


# Provenance rows of a run a page of a provenance condition alone reads in key order first (its primary key),
# before it sorts every row the condition matches (``provenance_page``).
WALK = 5_000

# Provenance rows a condition matches from which a walk of the run's tasks finds a page sooner than the list of
# the tasks they name (PostgreSQL plans the walk as a merge join over the run: 0.8 s for 15,000 of a million).
BROAD = 50_000


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

    def task_page(self, f: TaskFilter, after: tuple[str, str, str] | None, limit: int) -> list[SelectedTask]:
        """The next ``limit`` tasks matching ``f`` after the (root key, item key, stage) ``after``, in that order:
        the order of the tasks' unique index, so a page of a broad filter is a walk of an index, never a sort of
        the run. A narrow filter (failures, an error class or words of its message, review entries, provenance) is
        driven by its own index and its few rows sorted; SQLite is told so by an ordering no index gives, or its
        planner may walk the whole run in order."""
        steps = self._provenance_page_sql(f, after, limit) or [self._task_page_sql(f, after, limit)]
        for sql, params in steps[:-1]:  # a first look that may fall short; the last step's answer is the page
            rows = self.db.execute(sql, params)
            if len(rows) >= limit:
                return [SelectedTask(*r) for r in rows]
        sql, params = steps[-1]
        return [SelectedTask(*r) for r in self.db.execute(sql, params)]

    def task_page_plan(self, f: TaskFilter, after: tuple[str, str, str] | None, limit: int) -> list[str]:
        """The database's plan of ``task_page`` (EXPLAIN), one line per step: which index each filter uses."""
        steps = self._provenance_page_sql(f, after, limit) or [self._task_page_sql(f, after, limit)]
        lines = []
        for n, (sql, params) in enumerate(steps):
            lines += [f"(then, when short) {line}" if n else line for line in self._plan(sql, params)]
        return lines

    def _plan(self, sql: str, params: Sequence[Any]) -> list[str]:
        if self.db.name == "postgres":
            return [str(r[0]) for r in self.db.execute(f"EXPLAIN {sql}", params)]
        return [str(r[-1]) for r in self.db.execute(f"EXPLAIN QUERY PLAN {sql}", params)]

    def _provenance_page_sql(self, f: TaskFilter, after: tuple[str, str, str] | None,
                             limit: int) -> list[tuple[str, list[Any]]]:
        """A page of a filter that is one provenance condition of one run and nothing else (``--where parser <
        1.24.10``, or models), read from the provenance rows alone, then only the page's tasks: first the
        next WALK rows of the run in key order (its primary key), the page when as many of them match (a common
        value); then, for a rare one, every row it matches (``provenance_values``), its keys sorted. Each is one
        statement, tried in turn until one fills the page; none (the usual statement) for any other filter.
        At a million items with 15,000 matching, 10 ms or 0.1 s, where the list of the tasks they name (two
        reads of each task) and its sort took 0.3 s on PostgreSQL."""
        if len(f.runs) != 1 or [*f.stages, *f.statuses, *f.error_classes, *f.columns, *f.review_states] or (
                f.item_glob is not None or f.since is not None or f.until is not None or f.key_prefix
                or f.error_text):
            return []
        if f.models and not f.provenance:
            name, condition, values = "model", f"value IN ({','.join('?' * len(f.models))})", list(f.models)
        elif len(f.provenance) == 1 and not f.models and f.provenance[0].op != "!=":
            term = f.provenance[0]
            name, condition, values = term.name, f"sort_key {OPS[term.op]} ?", [term.sort_key]
        else:
            return []
        run = f.runs[0]
        cursor, cursor_params = ("AND (p.root_key, p.item_key, p.stage) > (?, ?, ?) ", [*after]) if after else ("", [])
        keys = "p.root_key, p.item_key, p.stage"
        tasks = (f"SELECT {SELECTED_COLUMNS} FROM (SELECT DISTINCT root_key, item_key, stage FROM {{rows}} "
                 "WHERE {condition} ORDER BY root_key, item_key, stage LIMIT ?) k CROSS JOIN tasks t "
                 "WHERE t.run_id = ? AND t.root_key = k.root_key AND t.item_key = k.item_key AND t.stage = k.stage "
                 "ORDER BY t.root_key, t.item_key, t.stage")
        walked = (f"(SELECT {keys}, p.value, p.sort_key FROM provenance p WHERE p.run_id = ? AND p.name = ? "
                  f"{cursor}ORDER BY {keys} LIMIT {WALK}) w")
        # CROSS JOIN: SQLite reads the page's keys first, then their tasks (not the run's every task, each looked
        # up among the keys). MATERIALIZED: the rows the condition matches are found through its own index,
        # whatever order the page asks for (PostgreSQL would otherwise walk the primary key in that order, as the
        # first statement does, through every row of the run when the matches are few or at its end).
        matched = (f"(SELECT {keys}, p.value, p.sort_key FROM provenance p WHERE p.run_id = ? AND p.name = ? "
                   f"AND p.{condition} {cursor}) m")
        return [
            (tasks.format(rows=walked, condition=condition), [run, name, *cursor_params, *values, limit, run]),
            ("WITH m AS MATERIALIZED " + matched.removesuffix(" m") + " " + tasks.format(rows="m", condition=condition),
             [run, name, *values, *cursor_params, *values, limit, run]),
        ]

    def _task_page_sql(self, f: TaskFilter, after: tuple[str, str, str] | None, limit: int) -> tuple[str, list[Any]]:
        walk = self._broad(f)
        clauses, params = _where(self.db, f, walk, keyed=not narrow(f, walk))
        # A narrow filter's rows are sorted: its cursor may not name the key columns plainly (nor, on SQLite, its
        # order), or the planners walk the run's key index from the cursor instead of the filter's own index (on
        # PostgreSQL, 0.5 s for a second page of failures at a million items). `|| ''` keeps the column's order.
        narrowed = narrow(f, walk)
        first = "t.root_key || ''" if self.db.name == "sqlite" and narrowed else "t.root_key"
        if after is not None and narrowed:
            clauses.append("(t.root_key || '', t.item_key, t.stage) > (?, ?, ?)")
            params += [*after]
        elif after is not None:
            clauses.append("t.root_key >= ? AND (t.root_key, t.item_key, t.stage) > (?, ?, ?)")
            params += [after[0], *after]
        return (f"SELECT {SELECTED_COLUMNS} FROM tasks t WHERE {' AND '.join(clauses)} "
                f"ORDER BY {first}, t.item_key, t.stage LIMIT ?", [*params, limit])

    def _broad(self, f: TaskFilter) -> bool:
        """Whether every provenance condition of ``f`` holds for at least BROAD rows of its run (each counted up
        to that, through the provenance rows' index): then a page is found sooner by walking the run's tasks in
        key order and probing each one's rows than by sorting the list of every task they name. Nothing else in
        ``f`` may be narrower: failures, review entries and words of errors drive the query themselves."""
        if not (f.provenance or f.models) or len(f.runs) != 1 or narrow(f, walk=True):
            return False
        conditions = [("model", f"value IN ({','.join('?' * len(f.models))})", list(f.models))] if f.models else []
        for term in f.provenance:
            if term.op != "!=":  # a negation names the tasks without a value: it cannot drive an id list
                conditions.append((term.name, f"sort_key {OPS[term.op]} ?", [term.sort_key]))
        for name, condition, values in conditions:
            rows = self.db.execute(f"SELECT COUNT(*) FROM (SELECT 1 FROM provenance WHERE run_id = ? AND name = ? "
                                   f"AND {condition} LIMIT {BROAD}) AS found", [f.runs[0], name, *values])
            if int(rows[0][0]) < BROAD:
                return False
        return True

    def task_position(self, run_id: str, task_id: int) -> tuple[str, str, str] | None:
        """(root key, item key, stage) of a task of ``run_id``: where a page of ``task_page`` goes on from."""
        rows = self.db.execute("SELECT root_key, item_key, stage FROM tasks WHERE id = ? AND run_id = ?",
                               (task_id, run_id))
        return (str(rows[0][0]), str(rows[0][1]), str(rows[0][2])) if rows else None

    def reviews_of_tasks(self, task_ids: Sequence[int]) -> dict[int, tuple[int, str]]:
        """Task id -> (review id, state: open or its decision) of each task's newest review entry."""
        found: dict[int, tuple[int, str]] = {}
        for start in range(0, len(task_ids), 500):
            part = list(task_ids[start:start + 500])
            rows = self.db.execute(f"SELECT task_id, id, COALESCE(decision, 'open') FROM reviews WHERE task_id IN "
                                   f"({','.join('?' * len(part))}) ORDER BY id", part)
            found.update((int(t), (int(i), str(state))) for t, i, state in rows)
        return found

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
