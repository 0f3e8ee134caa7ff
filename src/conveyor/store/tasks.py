"""The hot path: insert, claim, fence, complete and lease tasks, in batches.

Each method runs inside the caller's transaction when there is one
(``with store.transaction():``) and in a transaction of its own otherwise.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any, NamedTuple, TypeVar

from conveyor.store import claimfloors
from conveyor.store.claimfloors import LANES, SLOW_CLAIM_S, ClaimFloors, ReclaimFloors
from conveyor.store.dialect import Dialect
from conveyor.store.errortext import index_new_errors, newest_task
from conveyor.store.memokey import key64
from conveyor.store.queuecounts import OpenTally, QueueCountQueries
from conveyor.store.records import (
    LEASED,
    AttemptRecord,
    ClaimedTask,
    Crashed,
    Ended,
    ExpiredLease,
    Lease,
    NewDeadLetter,
    NewItem,
    NewOutput,
    NewTasks,
    Notice,
    PlainAttempt,
    Retried,
    StoredOutput,
    Succeeded,
    declared_filter,
)
from conveyor.store.runtotals import RunTally, RunTotalsQueries

log = logging.getLogger("conveyor.store")
T = TypeVar("T")
MemoRow = tuple[str, str, str, bytes | None, int, str | None, str | None]

CLAIM_COLUMNS = (
    "id, run_id, stage, item_key, root_key, task_key, input_digest, input_kind, input_inline, "
    "input_size, attempts, max_attempts, lease_token, lane_rank, tier, available_at, siblings"
)

_NEW_TASK_HEAD = """INSERT INTO tasks (run_id, pipeline, stage, item_key, root_key, task_key, stage_version,
    config_hash, input_digest, input_kind"""
_NEW_TASK_TAIL = "ON CONFLICT (run_id, root_key, item_key, stage) DO NOTHING"
RUN_PIPELINE = itemgetter(0, 1)  # a new task row's (run_id, pipeline)
RUN_STAGE_AT = itemgetter(1, 2, 15)  # a ClaimedTask's (run_id, stage, available_at)
TASK_KEY = (0, 4, 3, 2)  # a new task row's (run_id, root_key, item_key, stage): its conflict key (insert_many)
ITEM_KEY = (0, 1)  # a new item row's (run_id, item_key)
OUTPUT_KEY = (0,)  # an output row's key64


def _revives(sets: str) -> str:
    """A new task whose (run, item, stage) is taken by a superseded row (store/reopen.py) takes that row: the
    successor of a task a replay re-opened, made again from its new input. Any other row is left as it is."""
    return (f"""ON CONFLICT (run_id, root_key, item_key, stage) DO UPDATE SET task_key = excluded.task_key,
    stage_version = excluded.stage_version, config_hash = excluded.config_hash, input_digest = excluded.input_digest,
    input_kind = excluded.input_kind, input_size = excluded.input_size, max_attempts = excluded.max_attempts,
    lane_rank = excluded.lane_rank, available_at = excluded.available_at, status = excluded.status,
    cached = excluded.cached, siblings = excluded.siblings, crashes = 0, tier = 0, {sets}
    WHERE tasks.status = 'superseded'""")


_FRESH = ("attempts = 0, input_inline = excluded.input_inline, output_digest = NULL, output_kind = NULL, "
          "error_class = NULL, last_error = NULL, finished_at = NULL, started_at = NULL, lease_owner = NULL, "
          "lease_expires_at = NULL")
# One statement per shape of NewTasks (see there); NULL columns are written by the statement, not bound.
INSERT_QUEUED = f"""{_NEW_TASK_HEAD}, input_inline, input_size, max_attempts, lane_rank, available_at, created_at,
    siblings, status, cached) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued', 0)
    {_revives(_FRESH)}"""
QUEUED_AT = 14  # the position of available_at in an INSERT_QUEUED (and INSERT_RUNNING) row
SIBLINGS_AT = 16  # ... and of siblings (store/records.py NewTasks)
INSERT_RUNNING = f"""{_NEW_TASK_HEAD}, input_inline, input_size, max_attempts, lane_rank, available_at, created_at,
    siblings, lease_owner, lease_expires_at, started_at, status, cached, attempts, lease_token)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', 0, 1, 1) {_revives(
    "attempts = 1, lease_token = tasks.lease_token + 1, input_inline = excluded.input_inline, output_digest = NULL, "
    "output_kind = NULL, error_class = NULL, last_error = NULL, finished_at = NULL, "
    "started_at = excluded.started_at, lease_owner = excluded.lease_owner, "
    "lease_expires_at = excluded.lease_expires_at")}"""
INSERT_CACHED = f"""{_NEW_TASK_HEAD}, input_size, output_digest, output_kind, max_attempts, lane_rank, available_at,
    created_at, finished_at, siblings, status, cached) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,
    ?, 'succeeded', 1) {_revives(
    "attempts = 0, input_inline = NULL, output_digest = excluded.output_digest, output_kind = excluded.output_kind, "
    "error_class = NULL, last_error = NULL, finished_at = excluded.finished_at, lease_owner = NULL, "
    "lease_expires_at = NULL")}"""
INSERT_FAILED = f"""{_NEW_TASK_HEAD}, input_inline, input_size, error_class, last_error, max_attempts, lane_rank,
    available_at, created_at, finished_at, siblings, status, cached) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,
    ?, ?, ?, ?, ?, ?, 'failed', 1) {_revives(
    "attempts = 0, input_inline = excluded.input_inline, output_digest = NULL, output_kind = NULL, "
    "error_class = excluded.error_class, last_error = excluded.last_error, finished_at = excluded.finished_at, "
    "lease_owner = NULL, lease_expires_at = NULL")}"""

INSERT_BAD = f"""{_NEW_TASK_HEAD}, input_size, error_class, last_error, max_attempts, lane_rank, available_at,
    created_at, finished_at, status, cached) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'failed', 0)
    {_NEW_TASK_TAIL}"""

# A task's provenance, one row per (name, value) (store/provenance.py); a row already there is kept.
INSERT_PROVENANCE = """
INSERT INTO provenance (run_id, root_key, item_key, stage, name, value, sort_key) VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, root_key, item_key, stage, name, value) DO NOTHING
"""

INSERT_ITEM = """
INSERT INTO items (run_id, item_key, parent_key, root_key, source_digest, source_size, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, item_key) DO NOTHING
"""
INSERT_ROOT_ITEM = """
INSERT INTO items (run_id, item_key, root_key, source_digest, source_size, created_at, parent_key)
VALUES (?, ?, ?, ?, ?, ?, NULL) ON CONFLICT (run_id, item_key) DO NOTHING
"""

# Insert-or-ignore: the first output of a task key wins. A memoised refusal is the one row that may be
# replaced (by the same key's output or a newer refusal): it is consulted only while its guard still holds
# (a refusal under max_input_bytes=N is not an answer once the limit is raised), and requeue forgets it.
_INSERT_OUTPUT = """
INSERT INTO outputs (key64, task_key, stage, kind, digest, inline, size, run_id, created_at, code, provenance)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {provenance}) ON CONFLICT (key64) DO UPDATE SET kind = excluded.kind,
    digest = excluded.digest, inline = excluded.inline, size = excluded.size, run_id = excluded.run_id,
    created_at = excluded.created_at, code = excluded.code, provenance = excluded.provenance
WHERE outputs.kind = 'failed' AND outputs.task_key = excluded.task_key
"""
INSERT_OUTPUT = _INSERT_OUTPUT.format(provenance="?")
# The same for outputs without a provenance document (nearly all), whose NULL the statement writes: sqlite3 binds
# None through its slow adaptation path (see NewTasks), about 0.7 us a row more than a value.
INSERT_PLAIN_OUTPUT = _INSERT_OUTPUT.format(provenance="NULL")

ATTEMPT_COLUMNS = (
    "task_id", "run_id", "attempt", "outcome", "invoked", "error_class", "message", "worker", "lease_token",
    "stage_version", "code_version", "started_at", "duration", "provider_calls", "prompt_tokens",
    "completion_tokens", "cost", "model", "prompt_version", "unpriced_calls", "tier", "repaired", "confidence",
    "config_hash", "provenance", "logs", "logs_dropped", "unrepaired")
# The common case, an attempt that succeeded without a provider call: no NULL bound (see NewTasks).
PLAIN_ATTEMPT_COLUMNS = ("task_id", "run_id", "attempt", "outcome", "invoked", "worker", "lease_token",
                         "stage_version", "code_version", "started_at", "duration", "config_hash")

# Every transition of a leased task is fenced: it applies only while the caller's
# lease token still holds, so a worker that lost its lease changes nothing.
FENCE = "WHERE id = ? AND lease_token = ? AND status = 'running'"

MARK_SUCCEEDED = f"""
UPDATE tasks SET status = 'succeeded', output_digest = ?, output_kind = ?, cached = ?, finished_at = ?,
    input_inline = NULL, lease_owner = NULL, lease_expires_at = NULL, error_class = NULL, last_error = NULL
{FENCE}
"""
# SQLite: MARK_SUCCEEDED for the tasks without an error to clear, which sets no column the error-text trigger
# watches (store/errortext.py): a trigger compiled into the statement cost 1.3 us a task. A batch where it changed
# fewer rows than given (a task that succeeds after a retry, or a lost lease) goes through MARK_SUCCEEDED after it:
# the rows done already no longer match its fence, those with an error do. Each row ends as MARK_SUCCEEDED alone
# leaves it, and the two counts add up to its count.
MARK_SUCCEEDED_CLEAN = f"""
UPDATE tasks SET status = 'succeeded', output_digest = ?, output_kind = ?, cached = ?, finished_at = ?,
    input_inline = NULL, lease_owner = NULL, lease_expires_at = NULL
{FENCE} AND error_class IS NULL AND last_error IS NULL
"""

MARK_RETRY = f"""
UPDATE tasks SET status = 'queued', available_at = ?, error_class = ?, last_error = ?,
    lease_owner = NULL, lease_expires_at = NULL
{FENCE}
"""

MARK_ENDED = f"""
UPDATE tasks SET status = ?, error_class = ?, last_error = ?, finished_at = ?, cached = ?,
    lease_owner = NULL, lease_expires_at = NULL
{FENCE}
"""

RELEASE = f"""
UPDATE tasks SET status = 'queued', attempts = attempts - 1, lease_owner = NULL, lease_expires_at = NULL
{FENCE}
"""

REQUEUE_CRASHED = f"""
UPDATE tasks SET status = 'queued', available_at = ?, error_class = 'lease_expired', last_error = ?,
    crashes = crashes + ?, lease_owner = NULL, lease_expires_at = NULL
{FENCE}
"""

INSERT_DEAD_LETTER = """
INSERT INTO dead_letters (task_id, run_id, item_key, stage, error_class, error, attempts, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
"""


# What a claim sets on the rows it leases (parameters: owner, lease expiry, now): every claim statement's SET.
LEASE = """status = 'running', attempts = attempts + 1, lease_token = lease_token + 1, lease_owner = ?,
    lease_expires_at = ?, started_at = ?"""


def _queued_at_stage(declared: bool) -> str:
    """The condition a claim picks a stage's runnable tasks by (parameters: pipeline, stage, and with ``declared``
    the stage's version and config hash: tasks made under one declaration of it)."""
    declaration = "AND stage_version = ? AND config_hash = ?" if declared else ""
    return f"status = 'queued' AND crashes = 0 AND pipeline = ? AND stage = ? {declaration}"


def _claim_sql(run_filter: str, skip_locked: str, lane: str, declared: bool) -> str:
    """Lease up to ? queued tasks of a stage (made under one declaration of it: ``declared``), in lane then age
    order (``lane``: one lane, from its floor)."""
    return f"""UPDATE tasks SET {LEASE}
    WHERE id IN (SELECT id FROM tasks WHERE {_queued_at_stage(declared)} {lane} AND available_at <= ? {run_filter}
        ORDER BY lane_rank, available_at LIMIT ? {skip_locked})
    RETURNING {CLAIM_COLUMNS}"""


class OutputRows(NamedTuple):
    """A batch of outputs as the memo's rows (``TaskQueries.output_rows``): those without a provenance document
    (``INSERT_PLAIN_OUTPUT``) and those with one (``INSERT_OUTPUT``)."""

    plain: list[tuple[Any, ...]]
    made: list[tuple[Any, ...]]


def _sharing(stages: Sequence[str], shares: Sequence[Collection[str]]) -> dict[str, int]:
    """Stage -> how many of ``stages`` from it on (itself included) are in its share group (1: it shares with
    none), so that each takes its part of the room the stages before it left (see ``claim``'s ``shares``)."""
    sharing = {stage: 1 for stage in stages}
    for group in shares:
        members = [stage for stage in stages if stage in group]
        for index, stage in enumerate(members):
            sharing[stage] = len(members) - index
    return sharing


def _not_paused(paused: Sequence[str]) -> str:
    """A claim's condition that leaves paused runs' tasks alone (none in the common case: no condition)."""
    return f" AND run_id NOT IN ({','.join('?' * len(paused))})" if paused else ""


def _by_run_stage(rows: Sequence[T], run: int, stage: int) -> dict[tuple[str, str], Sequence[T]]:
    """Rows grouped by their (run, stage) values at these positions (the common case, one group, not copied)."""
    first = rows[0]
    key = (first[run], first[stage])  # type: ignore[index]
    if all((r[run], r[stage]) == key for r in rows):  # type: ignore[index]
        return {key: rows}
    groups: dict[tuple[str, str], list[T]] = {}
    for r in rows:
        groups.setdefault((r[run], r[stage]), []).append(r)  # type: ignore[index]
    return dict(groups)


def set_item_values(db: Dialect, column: str, run_id: str, values: Mapping[str, str]) -> None:
    """Set one text column (``meta``, ``traceparent``) of root items, by item key."""
    db.executemany(f"UPDATE items SET {ITEM_COLUMNS[column]} = ? WHERE run_id = ? AND item_key = ?",
                   [(value, run_id, key) for key, value in values.items()])


def item_values(db: Dialect, column: str, roots: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """One text column of root items, by (run, key); items where it is NULL are left out."""
    name = ITEM_COLUMNS[column]
    found: dict[tuple[str, str], str] = {}
    by_run: dict[str, list[str]] = {}
    for run_id, key in set(roots):
        by_run.setdefault(run_id, []).append(key)
    for run_id, keys in by_run.items():
        for part in chunks(keys, 900):
            marks = ",".join("?" * len(part))
            for key, value in db.execute(f"SELECT item_key, {name} FROM items WHERE run_id = ? AND item_key IN "
                                         f"({marks}) AND {name} IS NOT NULL", (run_id, *part)):
                found[run_id, str(key)] = str(value)
    return found


ITEM_COLUMNS = {"meta": "meta", "traceparent": "traceparent"}  # the item columns those two may name


def chunks(rows: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


class TaskQueries(RunTotalsQueries, QueueCountQueries):
    """Batched task operations over one dialect's connection."""

    db: Dialect
    claim_floors: ClaimFloors
    reclaim_floors: ReclaimFloors

    def insert_items(self, items: Sequence[NewItem]) -> None:
        roots = [i[:2] + i[3:] for i in items if i.parent_key is None]  # NewItem without parent_key
        with self.db.transaction():
            self.db.insert_many(INSERT_ROOT_ITEM, roots, ITEM_KEY)
            if len(roots) < len(items):
                self.db.insert_many(INSERT_ITEM, [i for i in items if i.parent_key is not None], ITEM_KEY)

    def set_item_meta(self, run_id: str, metas: Mapping[str, str]) -> None:
        """Record root items' manifest ``meta`` (JSON text, by item key), after they are inserted."""
        set_item_values(self.db, "meta", run_id, metas)

    def item_metas(self, roots: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """The ``meta`` JSON of root items, by (run, key); items without one are left out."""
        return item_values(self.db, "meta", roots)

    def insert_tasks(self, tasks: NewTasks, totals: RunTally | None = None,
                     opened: OpenTally | None = None) -> list[ClaimedTask]:
        """Insert new task rows; return the ones claimed as they were created (``tasks.running``). The run's
        task totals and the queue's counts grow by the rows each group really inserted (a row already there is
        kept): added to ``totals`` and ``opened`` when given (the caller writes them with the rest of its
        transaction's, once: two writes of running totals in one transaction could deadlock with another
        process's), else written here."""
        writes = totals is None
        totals = RunTally() if totals is None else totals
        opened = OpenTally() if opened is None else opened
        with self.db.transaction():
            self._insert_queued(tasks.queued, totals, opened)
            self._insert_counted(INSERT_CACHED, tasks.cached, totals, "succeeded", 1)
            newest = newest_task(self.db) if tasks.failed or tasks.bad else None  # rows with an error to index
            self._insert_counted(INSERT_FAILED, tasks.failed, totals, "failed", 1)
            rejected = [(r[0], r[4], r[3], r[2]) for r in tasks.failed if r[12] == "rejected"]
            if rejected:  # a memoised rejection (by a reviewer or a review deadline) ends its task rejected
                for (run_id, stage), rows in _by_run_stage(rejected, 0, 3).items():
                    moved = self.db.executemany_count(
                        "UPDATE tasks SET status = 'rejected' WHERE run_id = ? AND root_key = ? AND item_key = ? "
                        "AND stage = ? AND status = 'failed'", rows)
                    totals.move(run_id, stage, ("failed", 1), ("rejected", 1), moved)
            self._insert_counted(INSERT_BAD, tasks.bad, totals, "failed", 0)
            if newest is not None:
                index_new_errors(self.db, newest)  # the rows with an error this insert made (store/errortext.py)
            if tasks.provenance:
                self.db.executemany(INSERT_PROVENANCE, tasks.provenance)
            claimed = self._insert_running(tasks.running) if tasks.running else []
            pipelines = dict(map(RUN_PIPELINE, tasks.running))
            # counted per (run, stage, second of available_at): a commit's hundreds of new leased tasks share a few
            # values of available_at, counted at C speed (the task's claim columns are its row's: _insert_running)
            seconds: Counter[tuple[str, str, int]] = Counter()
            for (run_id, stage, at), count in Counter(map(RUN_STAGE_AT, claimed)).items():
                seconds[run_id, stage, math.floor(at)] += count
            for (run_id, stage, second), count in seconds.items():
                totals.task(run_id, stage, "running", 0, count)
                opened.add(pipelines[run_id], stage, second, count)
            if writes:
                self.add_run_totals(totals)
                self.add_open_tasks(opened)
            if tasks.queued:
                self.db.notify()
        return claimed

    def _insert_counted(self, sql: str, rows: Sequence[tuple[Any, ...]], totals: RunTally, status: str,
                        cached: int) -> None:
        """One executemany per (run, stage) of ``rows``, whose row count is then exact for that group."""
        if not rows:
            return
        groups = _by_run_stage(rows, 0, 2)
        for (run_id, stage), part in groups.items():
            totals.task(run_id, stage, status, cached, self.db.insert_many(sql, part, TASK_KEY))

    def _insert_queued(self, rows: Sequence[tuple[Any, ...]], totals: RunTally, opened: OpenTally) -> None:
        """Queued rows: one executemany per (run, stage, second of ``available_at``), so that each group's row
        count is exact for the queue's counts too (a commit's new tasks share a second, or two)."""
        if not rows:
            return
        for (run_id, stage), part in _by_run_stage(rows, 0, 2).items():
            seconds: dict[int, list[tuple[Any, ...]]] = {}
            for row in part:
                seconds.setdefault(math.floor(row[QUEUED_AT]), []).append(row)
            for second, same in seconds.items():
                inserted = self.db.insert_many(INSERT_QUEUED, same, TASK_KEY)
                totals.task(run_id, stage, "queued", 0, inserted)
                opened.add(same[0][1], stage, second, inserted)

    def _insert_running(self, rows: Sequence[tuple[Any, ...]]) -> list[ClaimedTask]:
        """New tasks leased as they are inserted: written as new rows whose ids come back without a RETURNING
        (Dialect.insert_numbered), their claim columns being the ones given; else (a replay's row revived or kept
        by the conflict clause) the statement with RETURNING."""
        ids = self.db.insert_numbered(INSERT_RUNNING, rows, "tasks") if len(rows) > 1 else None
        if ids is not None:
            return [ClaimedTask(task_id, r[0], r[2], r[3], r[4], r[5], r[8], r[9], r[10], r[11], 1, r[12], 1, r[13], 0,
                                r[QUEUED_AT], r[SIBLINGS_AT]) for task_id, r in zip(ids, rows, strict=True)]
        returned = self.db.insert_many_returning(f"{INSERT_RUNNING} RETURNING {CLAIM_COLUMNS}", rows, TASK_KEY)
        return list(map(ClaimedTask._make, returned))

    def lookup_outputs(self, task_keys: Iterable[str]) -> dict[str, StoredOutput]:
        """The memo: one indexed lookup per key, batched (by 64-bit key; the full key is checked)."""
        return {key: StoredOutput(key, *row) for key, row in self.memo_rows(task_keys).items()}

    def memo_rows(self, task_keys: Iterable[str]) -> dict[str, MemoRow]:
        """lookup_outputs as plain tuples (stage, kind, digest, inline, size, code, provenance), for the
        planner's hot loop."""
        wanted = set(task_keys)
        found: dict[str, MemoRow] = {}
        for part in chunks([key64(k) for k in wanted], self.db.in_chunk):
            where, params = self.db.one_of("key64", part, "bigint")
            for key, *row in self.db.execute(
                f"SELECT task_key, stage, kind, digest, inline, size, code, provenance FROM outputs WHERE {where}",
                params,
            ):
                if key in wanted:
                    found[key] = row  # type: ignore[assignment]
        return found

    @staticmethod
    def output_rows(outputs: Sequence[NewOutput]) -> OutputRows:
        """``outputs`` as the memo's rows, for ``insert_outputs``: made before a commit's transaction, which on
        SQLite holds the store's one writer lock (0.7 us an output)."""
        plain = [(key64(o[0]), *o[:-1]) for o in outputs if o[-1] is None]
        made = [(key64(o[0]), *o) for o in outputs if o[-1] is not None] if len(plain) < len(outputs) else []
        return OutputRows(plain, made)

    def insert_outputs(self, outputs: Sequence[NewOutput] | OutputRows) -> int:
        """Insert-or-ignore: when two workers race on one key, the first write wins. Returns the rows
        written, so a caller can tell that it lost a race (see Transitions.commit_and_claim)."""
        rows = outputs if isinstance(outputs, OutputRows) else self.output_rows(outputs)
        with self.db.transaction():
            # A batch holds one output per key (transitions: _first_per_key), so the counts are exact.
            return ((self.db.insert_many(INSERT_PLAIN_OUTPUT, rows.plain, OUTPUT_KEY) if rows.plain else 0)
                    + (self.db.insert_many(INSERT_OUTPUT, rows.made, OUTPUT_KEY) if rows.made else 0))

    def claim(
        self, pipeline: str, stages: Sequence[str], limit: int, owner: str, now: float,
        lease_seconds: float, run_id: str | None = None, caps: Mapping[str, int] | None = None,
        paused: Sequence[str] = (), paused_stages: Collection[str] | None = None,
        declared: Mapping[str, tuple[str, str]] | None = None, shares: Sequence[Collection[str]] = (),
    ) -> list[ClaimedTask]:
        """Lease up to ``limit`` runnable tasks (at most ``caps[stage]`` of a stage), later stages
        first, none of a ``paused`` run at ``paused_stages`` (None: any stage); count the attempt now.
        ``declared``: each stage's (version, config hash) in the claimer's declaration, the only tasks it may
        take (runtime/transitions always passes it; None, any declaration, is for tests of the queue alone).
        ``shares``: groups of stages that split the room left when their turn comes in equal parts (a join's
        parents, runtime/expand.py ``Expander.join_shares``): a stage of a group takes at most the room
        left over the number of its group's stages from it on."""
        claimed: list[ClaimedTask] = []
        wanted = [(stage, want) for stage in stages
                  if (want := min(limit, caps.get(stage, limit) if caps else limit)) > 0]
        sharing = _sharing([stage for stage, _ in wanted], shares)
        with self.db.transaction():
            if len(wanted) > 1 and self.db.name == "postgres" and all(
                    self.claim_floors.lanes(pipeline, stage) is None for stage, _ in wanted) and (
                    not self.claim_floors.one_by_one(pipeline)):
                return self._claim_stages(pipeline, wanted, limit, owner, now, lease_seconds, run_id, paused,
                                          paused_stages, declared, sharing)
            for stage, cap in wanted:
                if len(claimed) >= limit:
                    break
                room = limit - len(claimed)
                want = min(room, cap, math.ceil(room / sharing[stage]))
                held = paused if paused_stages is None or stage in paused_stages else ()
                run_filter = ("AND run_id = ?" if run_id else "") + _not_paused(held)
                head: list[Any] = [owner, now + lease_seconds, now, pipeline, stage,
                                   *(declared[stage] if declared is not None else ())]
                tail: list[Any] = [now, *([run_id] if run_id else []), *held]
                claimed += self._claim_stage(pipeline, stage, want, run_filter, head, tail, now, declared is not None)
        return claimed

    def _claim_stages(self, pipeline: str, wanted: Sequence[tuple[str, int]], limit: int, owner: str, now: float,
                      lease_seconds: float, run_id: str | None, paused: Sequence[str],
                      paused_stages: Collection[str] | None,
                      declared: Mapping[str, tuple[str, str]] | None, sharing: Mapping[str, int]
                      ) -> list[ClaimedTask]:
        """A claim of several stages as one PostgreSQL statement (one round trip instead of one per stage): each
        stage's pick, in the order given, is a materialized ``WITH`` query whose ``LIMIT`` is its cap and what the
        picks before it left of the claim's limit (divided by ``sharing[stage]``, the stages from it on that share
        the room with it): the stages get what the statement-per-stage loop gives them, and a pick locks only the
        rows it takes. Slow (an old snapshot is held, or a busy host), it sends the next claim stage by stage,
        where a slow stage engages its floors (store/claimfloors.py)."""
        picks: list[str] = []
        params: list[Any] = []
        for n, (stage, cap) in enumerate(wanted):
            held = paused if paused_stages is None or stage in paused_stages else ()
            taken = " + ".join(f"(SELECT COUNT(*) FROM s{k})" for k in range(n)) or "0"
            picks.append(
                f"s{n} AS MATERIALIZED (SELECT id FROM tasks WHERE {_queued_at_stage(declared is not None)} "
                f"AND available_at <= ? "
                f"{'AND run_id = ?' if run_id else ''}{_not_paused(held)} ORDER BY lane_rank, available_at "
                f"LIMIT GREATEST(0, LEAST(CAST(? AS bigint), CEIL((CAST(? AS bigint) - ({taken})) / "
                f"CAST(? AS numeric)))) {self.db.skip_locked})")
            params += [pipeline, stage, *(declared[stage] if declared is not None else ()), now,
                       *([run_id] if run_id else []), *held, cap, limit, sharing[stage]]
        union = " UNION ALL ".join(f"SELECT id FROM s{n}" for n in range(len(wanted)))
        started = time.perf_counter()
        rows = self.db.execute(
            f"""WITH {', '.join(picks)}
            UPDATE tasks SET {LEASE}
            WHERE id IN ({union})
            RETURNING {CLAIM_COLUMNS}""", [*params, owner, now + lease_seconds, now])
        by_stage: dict[str, list[ClaimedTask]] = {stage: [] for stage, _ in wanted}
        for task in map(ClaimedTask._make, rows):
            by_stage[task.stage].append(task)
        if time.perf_counter() - started > SLOW_CLAIM_S:
            self.claim_floors.split(pipeline)
        return [task for stage, _ in wanted for task in by_stage[stage]]

    def _claim_stage(self, pipeline: str, stage: str, want: int, run_filter: str, head: list[Any],
                     tail: list[Any], now: float, declared: bool) -> list[ClaimedTask]:
        """One stage's part of a claim: the usual statement, or one per lane from its floor while an old snapshot
        is held (PostgreSQL, store/claimfloors.py). ``head`` and ``tail`` are its parameters before and after the
        lane's."""
        postgres = self.db.name == "postgres"
        if not postgres:
            return self._claim_picked(run_filter, head, tail, want, declared)
        floors = self.claim_floors.lanes(pipeline, stage)
        if floors is None:
            started = time.perf_counter()
            got = list(map(ClaimedTask._make, self.db.execute(_claim_sql(run_filter, self.db.skip_locked, "", declared),
                                                              [*head, *tail, want])))
            if postgres and (took := time.perf_counter() - started) > SLOW_CLAIM_S:
                log.info("claims of %s take %.0f ms: claiming from floors for %.0f s (store/claimfloors.py; "
                         "an old snapshot is held?)", stage, took * 1000, claimfloors.FLOOR_RESCAN_S,
                         extra={"event": "claim_floors", "stage": stage})
                self.claim_floors.engage(pipeline, stage, [(t.lane_rank, t.available_at) for t in got],
                                         len(got) == want, now)
            return got
        claimed: list[ClaimedTask] = []
        for lane in LANES:
            if len(claimed) >= want:
                break
            floor = floors.get(lane)
            where = "AND lane_rank = ? AND available_at >= ?" if floor is not None else "AND lane_rank = ?"
            asked = want - len(claimed)
            got = list(map(ClaimedTask._make, self.db.execute(
                _claim_sql(run_filter, self.db.skip_locked, where, declared),
                [*head, lane, *([floor] if floor is not None else []), *tail, asked])))
            self.claim_floors.advance(pipeline, stage, lane, [t.available_at for t in got], len(got) == asked, now)
            claimed += got
        return claimed

    def _claim_picked(self, run_filter: str, head: list[Any], tail: list[Any], want: int,
                      declared: bool) -> list[ClaimedTask]:
        """SQLite: ``_claim_sql``'s pick read first, then its rows leased by id. The one statement does the same
        in more time (0.3 us a task: its RETURNING rows are gathered apart before they are handed over); the
        caller's write transaction holds the store's one writer lock, so no row changes between the two. A task's
        claim columns are its row's, its attempts and lease token one more."""
        picked = self.db.execute(
            f"""SELECT {CLAIM_COLUMNS} FROM tasks WHERE {_queued_at_stage(declared)} AND available_at <= ?
            {run_filter} ORDER BY lane_rank, available_at LIMIT ?""", [*head[3:], *tail, want])
        for part in chunks([row[0] for row in picked], self.db.max_params - 3):
            self.db.execute(f"UPDATE tasks SET {LEASE} WHERE id IN ({','.join('?' * len(part))})",
                            [*head[:3], *part])
        return [ClaimedTask._make((*r[:10], r[10] + 1, r[11], r[12] + 1, *r[13:])) for r in picked]

    def claim_suspect(
        self, pipeline: str, owner: str, now: float, lease_seconds: float, run_id: str | None = None,
        paused: Sequence[str] = (), declared: Mapping[str, tuple[str, str]] | None = None,
    ) -> list[ClaimedTask]:
        """Lease one task that was in flight when a worker died (none of a ``paused`` run; made under
        ``declared``, as claim() takes them); the caller runs it alone."""
        only, among = declared_filter(declared)
        run_filter = ("AND run_id = ?" if run_id else "") + _not_paused(paused) + " " + only
        params: list[Any] = [owner, now + lease_seconds, now, pipeline, now, *([run_id] if run_id else []), *paused,
                             *among]
        with self.db.transaction():
            rows = self.db.execute(
                f"""UPDATE tasks SET {LEASE}
                WHERE id IN (SELECT id FROM tasks WHERE status = 'queued' AND crashes > 0 AND pipeline = ?
                    AND available_at <= ? {run_filter} ORDER BY available_at LIMIT 1 {self.db.skip_locked})
                RETURNING {CLAIM_COLUMNS}""",
                params,
            )
        return list(map(ClaimedTask._make, rows))

    def held_leases(self, tokens: Sequence[Lease]) -> set[int]:
        """The ids among (id, token) whose lease this worker still holds."""
        held: set[int] = set()
        wanted = dict(tokens)
        for part in chunks(list(wanted), self.db.in_chunk):
            where, params = self.db.one_of("id", part, "bigint")
            for task_id, token in self.db.execute(
                f"SELECT id, lease_token FROM tasks WHERE status = 'running' AND {where} {self.db.skip_locked}",
                params,
            ):
                if wanted.get(task_id) == token:
                    held.add(task_id)
        return held

    def mark_succeeded(self, rows: Sequence[Succeeded]) -> int:
        """Returns the rows changed (fewer than given: a lease was lost)."""
        if self.db.name != "sqlite":
            return self.db.update_many(MARK_SUCCEEDED, rows)
        changed = self.db.update_many(MARK_SUCCEEDED_CLEAN, rows)
        return changed if changed == len(rows) else changed + self.db.update_many(MARK_SUCCEEDED, rows)

    def mark_retry(self, rows: Sequence[Retried]) -> int:
        """Returns the rows changed."""
        return self.db.update_many(MARK_RETRY, rows)

    def mark_ended(self, rows: Sequence[Ended]) -> int:
        """Returns the rows changed."""
        return self.db.update_many(MARK_ENDED, rows)

    def insert_attempts(self, attempts: Sequence[AttemptRecord], plain: Sequence[PlainAttempt] = ()) -> None:
        """``plain``: successes without provider calls (no NULL column to bind)."""
        self.db.append("attempts", ATTEMPT_COLUMNS, attempts)
        self.db.append("attempts", PLAIN_ATTEMPT_COLUMNS, plain)

    def insert_dead_letters(self, rows: Sequence[NewDeadLetter]) -> None:
        self.db.executemany(INSERT_DEAD_LETTER, rows)

    def renew_leases(self, tokens: Sequence[Lease], expires_at: float) -> int:
        """Extend the leases still held, in one batch; returns how many were."""
        with self.db.transaction():
            return self.db.update_many(
                f"UPDATE tasks SET lease_expires_at = ? {FENCE}",
                [(expires_at, task_id, token) for task_id, token in tokens],
            )

    def release(self, tokens: Sequence[Lease]) -> None:
        """Give leased tasks back untouched (a clean shutdown); the attempt is not counted."""
        with self.db.transaction():
            self.db.update_many(RELEASE, list(tokens))
            self.db.notify()

    def release_leases(self, tokens: Sequence[Lease]) -> int:
        """``release`` inside the caller's transaction (a commit): returns the rows changed."""
        return self.db.update_many(RELEASE, list(tokens))

    def requeue_crashed(self, rows: Sequence[Crashed]) -> int:
        """The tasks are queued again (the suspects among them to run alone); returns the rows changed."""
        return self.db.executemany_count(REQUEUE_CRASHED, rows)

    def note_lost_workers(self, owners: Sequence[str], now: float) -> dict[str, int]:
        """For each owner whose leases expired: how many tasks it held when that was first noticed
        (recorded once, so a worker's death is judged the same way in every later scan)."""
        if not owners:
            return {}
        marks = ",".join("?" * len(owners))
        with self.db.transaction():
            held = self.db.execute(f"SELECT lease_owner, COUNT(*) FROM tasks WHERE {LEASED} AND "
                                   f"lease_owner IN ({marks}) GROUP BY lease_owner", list(owners))
            self.db.executemany("INSERT INTO lost_workers (owner, in_flight, noticed_at) VALUES (?, ?, ?) "
                                "ON CONFLICT (owner) DO NOTHING", [(owner, count, now) for owner, count in held])
            self.db.execute("DELETE FROM lost_workers WHERE noticed_at < ?", (now - 7 * 86400,))  # a week is plenty
            return {str(owner): int(count) for owner, count in self.db.execute(
                f"SELECT owner, in_flight FROM lost_workers WHERE owner IN ({marks})", list(owners))}

    def add_notices(self, rows: Sequence[Notice]) -> None:
        """Counts add up per (run, kind, stage)."""
        self.db.executemany(
            "INSERT INTO run_notices (run_id, kind, stage, version, code, count, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, kind, stage) "
            "DO UPDATE SET count = run_notices.count + excluded.count", rows)

    def expired_leases(self, pipeline: str, now: float, limit: int = 1000) -> list[ExpiredLease]:
        """Up to ``limit`` leases of ``pipeline`` expired before ``now``, the oldest first; on PostgreSQL from the
        pipeline's reclaim floor while an old snapshot is held (store/claimfloors.py)."""
        postgres = self.db.name == "postgres"
        floor = self.reclaim_floors.floor(pipeline) if postgres else None
        started = time.perf_counter()
        rows = self.db.execute(
            f"""SELECT id, run_id, item_key, stage, attempts, max_attempts, lease_token, lease_owner, crashes,
                root_key, started_at, available_at, error_class, lease_expires_at
            FROM tasks WHERE {LEASED} AND pipeline = ? AND lease_expires_at < ?
            {"AND lease_expires_at >= ?" if floor is not None else ""}
            ORDER BY lease_expires_at LIMIT ? {self.db.skip_locked}""",
            (pipeline, now, *([floor] if floor is not None else []), limit),
        )
        if postgres:
            self.reclaim_floors.scanned(pipeline, [float(r[-1]) for r in rows], limit, now,
                                        time.perf_counter() - started > SLOW_CLAIM_S)
        return [ExpiredLease(*r[:-1]) for r in rows]
