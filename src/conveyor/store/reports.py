"""Status counts, reconciliation and the dead-letter list: the read side (runs: store/runs.py)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

from conveyor.store.claimfloors import LANES, ClaimFloors
from conveyor.store.dialect import Dialect
from conveyor.store.queuecounts import OpenTally, QueueCountQueries
from conveyor.store.records import DeadLetter, open_probes
from conveyor.store.runtotals import OPEN as OPEN_STATE
from conveyor.store.runtotals import USAGE_FIELDS, RunTally, RunTotalsQueries
from conveyor.store.tasks import chunks

DLQ_COLUMNS = (
    "id, task_id, run_id, item_key, stage, error_class, error, attempts, created_at, replayed_at, replay_reason"
)


OPEN = "t.status IN ('queued', 'running')"

# An ending that makes its item's outcome: any of the item's tasks, except a fan-out child's on the path of a gather
# with on_child_failure="skip" that succeeded for the item (the gather went on without it: reconcile counts it lost).
ENDED = ("(SUM(CASE WHEN t.status = '{status}' AND NOT ({{skipped}}) THEN 1 ELSE 0 END) > 0 OR "
         "(SUM(CASE WHEN t.status = '{status}' AND ({{skipped}}) THEN 1 ELSE 0 END) > 0 AND "
         "SUM(CASE WHEN t.status = 'succeeded' AND ({{skip_gathers}}) THEN 1 ELSE 0 END) = 0))")

# One outcome per expected (root) item, from all of its tasks and its children's, in this order:
# 'missing' when it has no task (unaccounted); superseded when a replay superseded every task it has and nothing
# took their place (a group item whose members all moved to other groups: the group is no more); in_progress
# (open, not past its acceptance stage), accepted (open only after it), awaiting_review, dead_lettered, failed,
# rejected, published, completed.
ITEM_OUTCOMES = f"""
SELECT i.item_key,
  CASE
    WHEN COUNT(t.id) = 0 THEN 'missing'
    WHEN SUM(CASE WHEN t.status <> 'superseded' THEN 1 ELSE 0 END) = 0 THEN 'superseded'
    WHEN SUM(CASE WHEN {OPEN} THEN 1 ELSE 0 END) > 0 THEN
      CASE WHEN SUM(CASE WHEN {OPEN} AND NOT ({{past}}) THEN 1 ELSE 0 END) = 0
             AND SUM(CASE WHEN {{accept}} AND t.status <> 'succeeded' THEN 1 ELSE 0 END) = 0
        THEN 'accepted' ELSE 'in_progress' END
    WHEN SUM(CASE WHEN t.status = 'awaiting_review' THEN 1 ELSE 0 END) > 0 THEN 'awaiting_review'
    WHEN {ENDED.format(status="dead_lettered")} THEN 'dead_lettered'
    WHEN {ENDED.format(status="failed")} THEN 'failed'
    WHEN {ENDED.format(status="rejected")} THEN 'rejected'
    WHEN SUM(CASE WHEN t.status = 'succeeded' AND {{publish}} THEN 1 ELSE 0 END) > 0 THEN 'published'
    ELSE 'completed'
  END AS outcome
FROM items i LEFT JOIN tasks t ON t.run_id = i.run_id AND t.root_key = i.item_key
WHERE i.run_id = ? AND i.parent_key IS NULL {{items}}
GROUP BY i.item_key
"""

# The root items of a run with a task that carries an error class (one that failed, was dead-lettered or rejected,
# or waits for review): read through the partial index tasks_unsettled, whose predicate this repeats word for word
# (how SQLite's planner knows it may use it).
TROUBLED_ROOTS = "SELECT root_key FROM tasks WHERE run_id = ? AND error_class IS NOT NULL"
TROUBLED_TASKS = "SELECT root_key, status FROM tasks WHERE run_id = ? AND error_class IS NOT NULL"

# The statuses that end an item with that outcome, in ITEM_OUTCOMES' order (the first one found wins).
ENDINGS = ("awaiting_review", "dead_lettered", "failed", "rejected")
ENDING_ORDER = {status: rank for rank, status in enumerate(ENDINGS)}

# Task statuses that keep an item from being done (reconcile's not_done).
NOT_DONE = ('failed', 'dead_lettered', 'rejected', 'awaiting_review', 'queued', 'running')


def settled_outcome(stages: Sequence[str], publish_stages: Collection[str]) -> str:
    """The outcome ITEM_OUTCOMES gives a root item of a run whose every task succeeded (``settled_outcomes``
    counts them so), from the stages of its tasks and its children's: ``missing`` with none, ``published``
    with one at a publish stage, else ``completed``."""
    if not stages:
        return "missing"
    for stage in stages:
        if stage in publish_stages:
            return "published"
    return "completed"


class OutcomeStages(NamedTuple):
    """The stages of a run's graph an item's outcome depends on: publish stages, stages with an acceptance
    boundary, and the stages after one (an item open only there is accepted, not yet published)."""

    publish: tuple[str, ...] = ()
    accept: tuple[str, ...] = ()
    past_accept: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # stages on the path of a gather that skips children that did not succeed
    skip_gathers: tuple[str, ...] = ()  # those gathers


def outcome_query(stages: OutcomeStages, items: str = "") -> tuple[str, list[Any]]:
    """ITEM_OUTCOMES for ``stages``, with ``items`` (a condition on ``i.item_key``, its parameters bound
    after the run id) narrowing the items; returns the SQL and the parameters that precede the run id."""
    past, accept = _among("t.stage", stages.past_accept), _among("t.stage", stages.accept)
    publish = _among("t.stage", stages.publish)
    skipped, gathers = _among("t.stage", stages.skipped), _among("t.stage", stages.skip_gathers)
    sql = ITEM_OUTCOMES.format(past=past[0], accept=accept[0], publish=publish[0], items=items,
                               skipped=skipped[0], skip_gathers=gathers[0])
    ended = [*skipped[1], *skipped[1], *gathers[1]]  # each ENDED binds them in this order, three times
    return sql, [*past[1], *accept[1], *ended, *ended, *ended, *publish[1]]


def _among(column: str, names: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """``column IN (...)``; an empty list is false (``IN ()`` is not SQL, ``IN (NULL)`` is not false)."""
    if not names:
        return "1 = 0", ()
    return f"{column} IN ({','.join('?' * len(names))})", tuple(names)


class ReportQueries(RunTotalsQueries, QueueCountQueries):
    db: Dialect
    claim_floors: ClaimFloors

    # --- progress -----------------------------------------------------------

    def task_counts(self, run_id: str) -> list[tuple[str, str, int, int]]:
        """(stage, status, cached, count) of the run's tasks (superseded ones left out), from its running totals:
        a few rows whatever its size; the open ones split into running (through the lease index) and queued."""
        counts: list[tuple[str, str, int, int]] = []
        running: dict[str, int] | None = None
        for stage, state, cached, value in self.run_totals(run_id, "tasks"):
            if state != OPEN_STATE:
                counts.append((stage, state, int(cached), int(value)))
                continue
            if running is None:
                running = self.running_by_stage(self._pipeline_of(run_id), run_id)
            leased = min(running.get(stage, 0), int(value))
            counts += [(stage, status, 0, n) for status, n in (("running", leased), ("queued", int(value) - leased))
                       if n]
        return counts

    def _pipeline_of(self, run_id: str) -> str:
        rows = self.db.execute("SELECT pipeline FROM runs WHERE run_id = ?", (run_id,))
        return str(rows[0][0]) if rows else ""

    def stage_progress(self, pipeline: str, run_id: str) -> dict[str, tuple[int, int]]:
        """stage -> (tasks, open tasks) of a run, from its running totals (cheap enough to ask every second)."""
        progress: dict[str, tuple[int, int]] = {}
        for stage, state, _, value in self.run_totals(run_id, "tasks"):
            total, open_ = progress.get(stage, (0, 0))
            progress[stage] = (total + int(value), open_ + (int(value) if state == OPEN_STATE else 0))
        return progress

    def stage_calls(self, run_id: str) -> dict[str, int]:
        """stage -> stage functions invoked for the run's tasks."""
        return {stage: int(value) for stage, _, _, value in self.run_totals(run_id, "calls")}

    def oldest_queued(self, pipeline: str, run_id: str, stages: Sequence[str], lane_ranks: Sequence[int],
                      now: float) -> dict[str, float]:
        """stage -> when its oldest task ready to run became so (retry waits not due yet left out). Bounded work:
        per stage and lane, the runnable index is walked in ``available_at`` order to the run's first task; the
        suspects (few) are grouped whole. Finished task rows are never read."""
        oldest: dict[str, float] = {}
        for stage in stages:
            for rank in lane_ranks:
                rows = self.db.execute(
                    "SELECT available_at FROM tasks WHERE status = 'queued' AND crashes = 0 AND pipeline = ? "
                    "AND stage = ? AND lane_rank = ? AND run_id = ? AND available_at <= ? ORDER BY available_at "
                    "LIMIT 1", (pipeline, stage, rank, run_id, now))
                if rows:
                    oldest[stage] = min(float(rows[0][0]), oldest.get(stage, float(rows[0][0])))
        for stage, at in self.db.execute(
                "SELECT stage, MIN(available_at) FROM tasks WHERE status = 'queued' AND crashes > 0 AND pipeline = ? "
                "AND run_id = ? AND available_at <= ? GROUP BY stage", (pipeline, run_id, now)):
            oldest[str(stage)] = min(float(at), oldest.get(str(stage), float(at)))
        return oldest

    def any_open_tasks(self, pipeline: str, run_id: str | None = None,
                       declared: Mapping[str, tuple[str, str]] | None = None) -> bool:
        """Whether any task (made under ``declared``: see records.open_probes) is still queued or running (retry
        waits included): one probe per partial index of the hot queue, each stopping at its first entry (a count
        walked every queued task: at a million queued tasks an idle worker spent most of its time counting
        them)."""
        where, params = _scope(run_id, None)
        return any(self.db.execute(f"SELECT 1 FROM tasks WHERE {state} AND pipeline = ? {where} {only} LIMIT 1",
                                   (pipeline, *params, *among)) for state, only, among in open_probes(declared))

    def queued_depths(self, pipeline: str, stages: Sequence[str], cap: int,
                      run_id: str | None = None) -> dict[str, int]:
        """Runnable tasks per stage, counted up to ``cap`` (a bounded walk of the hot index); a stage claimed from
        floors (an old snapshot is held: store/claimfloors.py) is counted lane by lane from them."""
        where, params = _scope(run_id, None)
        depths = {}
        for stage in stages:
            floors = self.claim_floors.lanes(pipeline, stage) if self.db.name == "postgres" else None
            parts = [("", ())] if floors is None else [
                ("AND lane_rank = ?" + (" AND available_at >= ?" if lane in floors else ""),
                 (lane, *([floors[lane]] if lane in floors else []))) for lane in LANES]
            depths[stage] = 0
            for lane_where, lane_params in parts:
                if depths[stage] >= cap:
                    break
                rows = self.db.execute(
                    f"SELECT COUNT(*) FROM (SELECT 1 FROM tasks WHERE status = 'queued' AND crashes = 0 "
                    f"AND pipeline = ? AND stage = ? {lane_where} {where} LIMIT ?) AS q",
                    (pipeline, stage, *lane_params, *params, cap - depths[stage]))
                depths[stage] += int(rows[0][0])
        return depths

    def next_due(self, pipeline: str, stages: Sequence[str], after: float,
                 run_id: str | None = None) -> float | None:
        """The earliest ``available_at`` later than ``after`` of a queued task (a retry's backoff, a delayed task):
        when an idle worker looks again. One ordered probe per (stage, lane) of ``tasks_runnable`` and one of
        ``tasks_suspect``, each entered at ``after``: a task due already is not its answer (it waits on something
        else: a cap, backpressure, a paused run), and the entries of tasks claimed since an old snapshot (all due
        before now) are never walked."""
        where, params = _scope(run_id, None)
        probes = [("crashes = 0 AND pipeline = ? AND stage = ? AND lane_rank = ?", (pipeline, stage, lane))
                  for stage in stages for lane in LANES] + [("crashes > 0 AND pipeline = ?", (pipeline,))]
        sql = " UNION ALL ".join(
            f"SELECT (SELECT available_at FROM tasks WHERE status = 'queued' AND {cond} AND available_at > ? "
            f"{where} ORDER BY available_at LIMIT 1) AS due" for cond, _ in probes)
        rows = self.db.execute(f"SELECT MIN(due) FROM ({sql}) AS probes",
                               [p for _, values in probes for p in (*values, after, *params)])
        return None if rows[0][0] is None else float(rows[0][0])

    def attempt_counts(self, run_id: str) -> dict[str, Any]:
        """Attempts of this run by outcome, ``stage_calls`` (stage functions actually invoked) and the
        model usage of every attempt, retries and failures included (``unpriced_calls``: calls to a
        model without a price, which ``cost`` leaves out; ``seconds``: the attempts' total duration)."""
        out: dict[str, Any] = {outcome: int(value) for outcome, _, _, value in self.run_totals(run_id, "attempts")}
        out["stage_calls"] = sum(self.stage_calls(run_id).values())
        usage = {field: value for field, _, _, value in self.run_totals(run_id, "usage")}
        for field in USAGE_FIELDS:
            out[field] = usage.get(field, 0.0) if field == "cost" else int(usage.get(field, 0))
        out["seconds"] = usage.get("seconds", 0.0)
        return out

    def attempt_errors(self, run_id: str) -> dict[str, int]:
        """Attempts of this run that did not succeed, by error class (``rate_limited`` counts the 429s)."""
        return {error: int(value) for error, _, _, value in sorted(self.run_totals(run_id, "errors"))}

    # --- reconciliation ---------------------------------------------------

    def item_outcomes(self, run_id: str, stages: OutcomeStages) -> dict[str, int]:
        """Root items by outcome (``missing``: no task yet)."""
        sql, params = outcome_query(stages)
        rows = self.db.execute(f"SELECT outcome, COUNT(*) FROM ({sql}) per_item GROUP BY outcome", (*params, run_id))
        return {str(r[0]): int(r[1]) for r in rows}

    def outcomes_of(self, run_id: str, stages: OutcomeStages, keys: Sequence[str]) -> dict[str, str]:
        """The outcome of each of these root items (a few: a sample)."""
        found: dict[str, str] = {}
        for part in chunks(list(keys), 500):
            sql, params = outcome_query(stages, f"AND i.item_key IN ({','.join('?' * len(part))})")
            found.update((str(k), str(o)) for k, o in self.db.execute(sql, (*params, run_id, *part)))
        return found

    def ended_outcomes(self, run_id: str, stages: OutcomeStages, entry_stage: str, roots: int) -> dict[str, int]:
        """``item_outcomes`` of a run that holds no open and no superseded task and one task per (root item,
        stage) (no fan-out nor group stage), at most one publish stage and ``entry_stage`` every root item
        starts at (the caller checked), with ``roots`` root items, in bounded work. Only the tasks with an error
        class are read (``tasks_unsettled``: every task that failed, was dead-lettered or rejected, or waits for
        review): their item's outcome is the first of those statuses in ITEM_OUTCOMES' order among them (nothing
        else can come before it in a run so ended). The other items (every task succeeded) are counted from the
        run's totals. At a million items of which 20,000 failed: a tenth of a second, not several seconds."""
        first: dict[str, int] = {}
        other: set[str] = set()  # an error class on a task that succeeded: the item is read whole
        for root, status in self.db.execute(TROUBLED_TASKS, (run_id,)):
            rank = ENDING_ORDER.get(str(status))
            if rank is None:
                other.add(str(root))
            elif rank < first.get(str(root), len(ENDING_ORDER)):
                first[str(root)] = rank
        counts: dict[str, int] = {}
        for rank in first.values():
            counts[ENDINGS[rank]] = counts.get(ENDINGS[rank], 0) + 1
        for outcome in self.outcomes_of(run_id, stages, sorted(other - first.keys())).values():
            counts[outcome] = counts.get(outcome, 0) + 1
        troubled = len(first.keys() | other)
        tasks: dict[tuple[str, str], int] = {}
        for stage, state, _, value in self.run_totals(run_id, "tasks"):  # cached and not: both rows counted
            tasks[stage, state] = tasks.get((stage, state), 0) + int(value)
        started = sum(v for (stage, _), v in tasks.items() if stage == entry_stage)  # root items with a task
        published = 0
        if stages.publish:
            (publish,) = stages.publish
            troubled_published = int(self.db.execute(
                "SELECT COUNT(*) FROM tasks t WHERE t.run_id = ? AND t.stage = ? AND t.status = 'succeeded' AND "
                f"t.root_key IN ({TROUBLED_ROOTS})", (run_id, publish, run_id))[0][0])
            published = tasks.get((publish, "succeeded"), 0) - troubled_published
        more = {"published": published, "completed": started - troubled - published, "missing": roots - started}
        for outcome, n in more.items():
            if n:
                counts[outcome] = counts.get(outcome, 0) + n
        return counts

    def settled_outcomes(self, run_id: str, publish_stages: Sequence[str]) -> dict[str, int]:
        """``item_outcomes`` for a run whose every task succeeded (the caller checked), from two
        walks of the (run, root, item, stage) index instead of a join over every task row."""
        roots = int(self.db.execute("SELECT COUNT(*) FROM items WHERE run_id = ? AND parent_key IS NULL",
                                    (run_id,))[0][0])
        with_tasks = int(self.db.execute("SELECT COUNT(DISTINCT root_key) FROM tasks WHERE run_id = ?",
                                         (run_id,))[0][0])
        published = 0
        if publish_stages:
            marks = ",".join("?" * len(publish_stages))
            published = int(self.db.execute(
                f"SELECT COUNT(DISTINCT root_key) FROM tasks WHERE run_id = ? AND stage IN ({marks})",
                (run_id, *publish_stages))[0][0])
        vanished = self.vanished_groups(run_id, publish_stages)
        gone_published = sum(1 for had_publish in vanished.values() if had_publish)
        counts = {"published": published - gone_published,
                  "completed": with_tasks - published - (len(vanished) - gone_published),
                  "superseded": len(vanished), "missing": roots - with_tasks}
        return {k: v for k, v in counts.items() if v}

    def vanished_groups(self, run_id: str, publish_stages: Sequence[str] = ()) -> dict[str, bool]:
        """The run's group items whose every task a replay superseded, none made again (their members moved to
        other groups): item key -> whether one of those tasks was at a publish stage. Only a group item can be
        so (a replay re-opens a root item's own task), so only the group items' key range is read."""
        rows = self.db.execute(
            "SELECT t.root_key, t.stage, t.status FROM items i JOIN tasks t ON t.run_id = i.run_id AND "
            "t.root_key = i.item_key WHERE i.run_id = ? AND i.item_key >= 'group:' AND i.item_key < 'group;' "
            "AND i.parent_key IS NULL", (run_id,))
        found: dict[str, bool] = {}
        live: set[str] = set()
        for root, stage, status in rows:
            if status != "superseded":
                live.add(str(root))
            found[str(root)] = found.get(str(root), False) or stage in publish_stages
        return {root: published for root, published in found.items() if root not in live}

    def group_item_count(self, run_id: str) -> int:
        """The run's group items (``group:KEY``, made by its group stages)."""
        rows = self.db.execute("SELECT COUNT(*) FROM items WHERE run_id = ? AND item_key >= 'group:' "
                               "AND item_key < 'group;' AND parent_key IS NULL", (run_id,))
        return int(rows[0][0])

    def item_count(self, run_id: str) -> int:
        rows = self.db.execute(
            "SELECT COUNT(*) FROM items WHERE run_id = ? AND parent_key IS NULL", (run_id,)
        )
        return int(rows[0][0])

    def missing_items(self, run_id: str, limit: int) -> list[str]:
        """Root items without a task (a submission that stopped between the two): unaccounted."""
        rows = self.db.execute(
            "SELECT i.item_key FROM items i WHERE i.run_id = ? AND i.parent_key IS NULL AND NOT EXISTS "
            "(SELECT 1 FROM tasks t WHERE t.run_id = i.run_id AND t.root_key = i.item_key) ORDER BY i.item_key LIMIT ?",
            (run_id, limit))
        return [str(r[0]) for r in rows]

    def unfinished_tasks(self, run_id: str, limit: int) -> list[dict[str, Any]]:
        """Tasks that keep their item from being done, with why."""
        rows = self.db.execute(
            f"""SELECT root_key, item_key, stage, status, attempts, error_class, last_error FROM tasks
            WHERE run_id = ? AND status IN {NOT_DONE}
            ORDER BY root_key, item_key, stage LIMIT ?""",
            (run_id, limit),
        )
        keys = ("item_key", "child_key", "stage", "status", "attempts", "error_class", "error")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    # --- dead letters -----------------------------------------------------

    def dead_letters(
        self, run_id: str | None, stage: str | None, error_class: str | None,
        include_replayed: bool = False, limit: int = 1000, after: int | None = None,
    ) -> list[DeadLetter]:
        """Dead letters by id (those after id ``after``, when given: the next page)."""
        clauses: list[str] = []
        params: list[str | int] = []
        for column, value in (("run_id", run_id), ("stage", stage), ("error_class", error_class)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if after is not None:
            clauses.append("id > ?")
            params.append(after)
        if not include_replayed:
            clauses.append("replayed_at IS NULL")
        where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
        rows = self.db.execute(
            f"SELECT {DLQ_COLUMNS} FROM dead_letters {where} ORDER BY id LIMIT ?", (*params, limit)
        )
        return [DeadLetter(*r) for r in rows]

    def dead_letter_classes(self, run_id: str) -> dict[str, int]:
        """The run's dead letters not replayed yet, by error class (the (run_id, replayed_at) index)."""
        rows = self.db.execute(
            "SELECT error_class, COUNT(*) FROM dead_letters WHERE run_id = ? AND replayed_at IS NULL "
            "GROUP BY error_class ORDER BY error_class", (run_id,))
        return {str(r[0]): int(r[1]) for r in rows}

    def dead_letter(self, dead_letter_id: int) -> DeadLetter | None:
        rows = self.db.execute(f"SELECT {DLQ_COLUMNS} FROM dead_letters WHERE id = ?", (dead_letter_id,))
        return DeadLetter(*rows[0]) if rows else None

    def task_attempts(self, task_id: int, run_id: str | None = None) -> list[dict[str, Any]]:
        """A task's attempts, oldest first; give its ``run_id`` to read them through the (run_id, task_id)
        index (without it, every attempt row is read)."""
        scope, params = ("run_id = ? AND ", (run_id, task_id)) if run_id is not None else ("", (task_id,))
        rows = self.db.execute(
            f"""SELECT attempt, outcome, invoked, error_class, message, worker, lease_token, stage_version,
            code_version, started_at, duration FROM attempts WHERE {scope}task_id = ? ORDER BY id""",
            params,
        )
        keys = ("attempt", "outcome", "invoked", "error_class", "message", "worker", "lease_token",
                "stage_version", "code_version", "started_at", "duration")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def replay_dead_letters(self, ids: Sequence[int], reason: str, now: float) -> list[int]:
        """Queue dead-lettered tasks again with a fresh attempt budget; record why. Returns the ids of the dead
        letters replayed: one replayed before, or whose task is no longer dead-lettered, is left as it is."""
        replayed: list[int] = []
        totals, opened = RunTally(), OpenTally()
        with self.db.transaction():
            for dead_letter_id in ids:
                queued = self.db.execute(
                    """UPDATE tasks SET status = 'queued', attempts = 0, available_at = ?, finished_at = NULL
                    WHERE id = (SELECT task_id FROM dead_letters WHERE id = ? AND replayed_at IS NULL)
                    AND status = 'dead_lettered' RETURNING run_id, stage, cached, pipeline""",
                    (now, dead_letter_id),
                )
                for run_id, stage, cached, pipeline in queued:
                    self.db.execute("UPDATE dead_letters SET replayed_at = ?, replay_reason = ? WHERE id = ?",
                                    (now, reason, dead_letter_id))
                    totals.move(str(run_id), str(stage), ("dead_lettered", int(cached)), ("queued", int(cached)))
                    opened.add(str(pipeline), str(stage), now)
                    replayed.append(dead_letter_id)
            self.add_run_totals(totals)
            self.add_open_tasks(opened)
            self.db.notify()
        return replayed

    def dead_letter_fates(self, ids: Sequence[int]) -> dict[int, tuple[float, float | None, int | None, float | None]]:
        """id -> (created_at, replayed_at, its task's last replay id, when that replay was made) of these dead
        letters: what became of them, for a replay that found them no longer dead-lettered."""
        found: dict[int, tuple[float, float | None, int | None, float | None]] = {}
        for part in chunks(sorted(set(ids)), 500):
            for row in self.db.execute(
                    "SELECT d.id, d.created_at, d.replayed_at, t.replay_id, r.created_at FROM dead_letters d "
                    "JOIN tasks t ON t.id = d.task_id LEFT JOIN replays r ON r.id = t.replay_id "
                    f"WHERE d.id IN ({','.join('?' * len(part))})", list(part)):
                found[int(row[0])] = (float(row[1]), row[2], row[3], row[4])
        return found

    # --- re-running a selection -------------------------------------------


def _scope(run_id: str | None, pipeline: str | None) -> tuple[str, tuple[Any, ...]]:
    clauses, params = [], []
    if run_id:
        clauses.append("AND run_id = ?")
        params.append(run_id)
    if pipeline:
        clauses.append("AND pipeline = ?")
        params.append(pipeline)
    return " ".join(clauses), tuple(params)
