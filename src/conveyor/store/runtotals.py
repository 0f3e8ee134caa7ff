"""A run's running totals: its task counts by stage and state, its attempts, usage and timeline, kept as a few
rows per run that the transactions changing them increment, so status, progress and the dashboard read a
handful of rows at any run size instead of grouping millions of task and attempt rows.

Rows are (run_id, name, k1, k2, k3, shard, value); a reader sums the shards. The names:

- ``tasks`` (stage, state, cached): tasks now in that state; ``state`` is the task's status, with ``queued``
  and ``running`` counted together as ``open`` (claims and retries then change no total; the running ones are
  counted through the lease index when read). Superseded rows (store/reopen.py) are not counted.
- ``attempts`` (outcome), ``calls`` (stage: stage functions invoked), ``errors`` (error class),
  ``usage`` (field: provider_calls, prompt_tokens, completion_tokens, cost, unpriced_calls, seconds).
- ``timeline`` (minute, stage, outcome): attempts that ended in that minute (epoch seconds // 60);
  ``timeline_usage`` (minute, field): tokens and cost of those attempts.

Task totals change by moves (state to state) that the writer knows exactly: fenced updates whose row count
was checked, single-row decisions, inserts counted per (run, stage) group, and the rare bulk changes
(re-opens, operator retries, replays) which read the rows they change first. ``run_total_mismatches`` checks
the totals against the rows themselves (the test suite runs it on every store it closes).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.records import LEASED, AttemptRecord, PlainAttempt

SHARDS = 16
MINUTE = 60
OPEN = "open"
USAGE_FIELDS = ("provider_calls", "prompt_tokens", "completion_tokens", "cost", "unpriced_calls")

# The totals recounted from the rows (``{only}``/``{only_a}``: a condition on the run, or nothing for every run;
# ``{attempt_minute}``: the dialect's minute of an attempt's end). Migration 13 counts what a store held before.
RECOUNT = """
INSERT INTO run_totals (run_id, name, k1, k2, k3, shard, value)
SELECT run_id, 'tasks', stage, CASE WHEN status IN ('queued', 'running') THEN 'open' ELSE status END,
    CASE WHEN cached <> 0 AND status NOT IN ('queued', 'running') THEN '1' ELSE '0' END, 0, COUNT(*)
FROM tasks WHERE status <> 'superseded'{only} GROUP BY 1, 2, 3, 4, 5;
INSERT INTO run_totals (run_id, name, k1, k2, k3, shard, value)
SELECT run_id, 'attempts', outcome, '', '', 0, COUNT(*) FROM attempts WHERE 1 = 1{only} GROUP BY run_id, outcome;
INSERT INTO run_totals (run_id, name, k1, k2, k3, shard, value)
SELECT a.run_id, 'calls', t.stage, '', '', 0, SUM(a.invoked) FROM attempts a JOIN tasks t ON t.id = a.task_id
WHERE 1 = 1{only_a} GROUP BY a.run_id, t.stage HAVING SUM(a.invoked) > 0;
INSERT INTO run_totals (run_id, name, k1, k2, k3, shard, value)
SELECT run_id, 'errors', error_class, '', '', 0, COUNT(*) FROM attempts WHERE error_class IS NOT NULL{only}
GROUP BY run_id, error_class;
""" + "".join(f"""INSERT INTO run_totals (run_id, name, k1, k2, k3, shard, value)
SELECT run_id, 'usage', '{field}', '', '', 0, SUM({column})
FROM attempts WHERE 1 = 1{{only}} GROUP BY run_id HAVING SUM({column}) <> 0;
""" for field, column in (*((f, f) for f in USAGE_FIELDS), ("seconds", "COALESCE(duration, 0)"))) + """
INSERT INTO run_totals (run_id, name, k1, k2, k3, shard, value)
SELECT a.run_id, 'timeline', a.minute, t.stage, a.outcome, 0, COUNT(*)
FROM (SELECT run_id, task_id, outcome, {attempt_minute} AS minute FROM attempts WHERE started_at IS NOT NULL
      AND outcome NOT IN ('replayed', 'superseded'){only}) a
JOIN tasks t ON t.id = a.task_id GROUP BY a.run_id, a.minute, t.stage, a.outcome;
INSERT INTO run_totals (run_id, name, k1, k2, k3, shard, value)
SELECT run_id, 'timeline_usage', minute, 'tokens', '', 0, SUM(tokens)
FROM (SELECT run_id, prompt_tokens + completion_tokens AS tokens, {attempt_minute} AS minute FROM attempts
      WHERE started_at IS NOT NULL{only}) a GROUP BY run_id, minute HAVING SUM(tokens) <> 0;
INSERT INTO run_totals (run_id, name, k1, k2, k3, shard, value)
SELECT run_id, 'timeline_usage', minute, 'cost', '', 0, SUM(cost)
FROM (SELECT run_id, cost, {attempt_minute} AS minute FROM attempts WHERE started_at IS NOT NULL{only}) a
GROUP BY run_id, minute HAVING SUM(cost) <> 0;
"""


class RunIncrement(NamedTuple):
    run_id: str
    name: str
    k1: str
    k2: str
    k3: str
    value: float


def state_of(status: str) -> str:
    return OPEN if status in ("queued", "running") else status


class RunTally:
    """Increments gathered by one transaction, summed by key before they are written."""

    __slots__ = ("sums",)

    def __init__(self) -> None:
        self.sums: defaultdict[tuple[str, str, str, str, str], float] = defaultdict(float)

    def __bool__(self) -> bool:
        return bool(self.sums)

    def add(self, run_id: str, name: str, k1: str, k2: str = "", k3: str = "", value: float = 1.0) -> None:
        self.sums[run_id, name, k1, k2, k3] += value

    def task(self, run_id: str, stage: str, status: str, cached: int, value: float = 1.0) -> None:
        """``value`` tasks (negative: fewer) now in ``status``."""
        if status != "superseded":
            state = state_of(status)
            self.sums[run_id, "tasks", stage, state, "0" if state == OPEN else str(int(bool(cached)))] += value

    def move(self, run_id: str, stage: str, src: tuple[str, int], dst: tuple[str, int], count: int = 1) -> None:
        """``count`` tasks went from (status, cached) ``src`` to ``dst`` (an open task's cached flag is not
        counted: it is set when the task ends)."""
        if count:
            self.task(run_id, stage, *src, value=-count)
            self.task(run_id, stage, *dst, value=count)

    def attempts(self, stages: Mapping[int, str], full: Iterable[AttemptRecord] = (),
                 plain: Iterable[PlainAttempt] = ()) -> None:
        """What recorded attempts add: by outcome, stage calls, errors, usage and the timeline."""
        add = self.add
        # The plain rows (a commit's hundreds of successes) grouped first, one dict entry per (run, stage,
        # outcome, minute): [attempts, stage calls, seconds].
        groups: dict[tuple[str, str, str, int], list[float]] = {}
        for p in plain:
            key = (p.run_id, stages[p.task_id], p.outcome, int((p.started_at + p.duration) // MINUTE))
            group = groups.get(key)
            if group is None:
                groups[key] = [1, p.invoked, p.duration]
            else:
                group[0] += 1
                group[1] += p.invoked
                group[2] += p.duration
        for (run_id, stage, outcome, minute), (count, invoked, seconds) in groups.items():
            add(run_id, "attempts", outcome, value=count)
            if invoked:
                add(run_id, "calls", stage, value=invoked)
            add(run_id, "usage", "seconds", value=seconds)
            add(run_id, "timeline", str(minute), stage, outcome, value=count)
        for a in full:
            self._full(a, stages[a.task_id])

    def _full(self, a: AttemptRecord, stage: str) -> None:
        add, run = self.add, a.run_id
        add(run, "attempts", a.outcome)
        if a.invoked:
            add(run, "calls", stage, value=a.invoked)
        if a.error_class is not None:
            add(run, "errors", a.error_class)
        for field in USAGE_FIELDS:
            value = getattr(a, field)
            if value:
                add(run, "usage", field, value=value)
        if a.duration:
            add(run, "usage", "seconds", value=a.duration)
        if a.started_at is not None:
            minute = str(int((a.started_at + (a.duration or 0.0)) // MINUTE))
            add(run, "timeline", minute, stage, a.outcome)
            tokens = a.prompt_tokens + a.completion_tokens
            if tokens:
                add(run, "timeline_usage", minute, "tokens", value=tokens)
            if a.cost:
                add(run, "timeline_usage", minute, "cost", value=a.cost)

    def rows(self) -> list[RunIncrement]:
        return [RunIncrement(*key, value) for key, value in sorted(self.sums.items()) if value]


class RunTotalsQueries:
    db: Dialect

    def add_run_totals(self, tally: RunTally | Sequence[RunIncrement]) -> None:
        """Add to the running totals, in key order (concurrent PostgreSQL commits lock rows alike)."""
        rows = tally.rows() if isinstance(tally, RunTally) else sorted(tally)
        if not rows:
            return
        shard = os.getpid() % SHARDS
        self.db.executemany(
            "INSERT INTO run_totals (run_id, name, k1, k2, k3, shard, value) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (run_id, name, k1, k2, k3, shard) DO UPDATE SET value = run_totals.value + excluded.value",
            [(*r[:5], shard, r.value) for r in rows])

    def recount_run_totals(self, run_id: str) -> None:
        """Count a run's totals again from its rows (a run whose rows were written around the engine, such as
        a benchmark's): its old totals are replaced, in one transaction."""
        text = RECOUNT.replace("{only}", " AND run_id = ?").replace("{only_a}", " AND a.run_id = ?")
        with self.db.transaction():
            self.db.execute("DELETE FROM run_totals WHERE run_id = ?", (run_id,))
            for statement in text.format(**self.db.types).split(";"):
                if statement.strip():
                    self.db.execute(statement, (run_id,))

    def run_totals(self, run_id: str, name: str) -> list[tuple[str, str, str, float]]:
        """(k1, k2, k3, value) of one kind of total of a run, shards summed (zeros left out)."""
        rows = self.db.execute("SELECT k1, k2, k3, SUM(value) FROM run_totals WHERE run_id = ? AND name = ? "
                               "GROUP BY k1, k2, k3", (run_id, name))
        return [(str(a), str(b), str(c), float(v)) for a, b, c, v in rows if v]

    def running_by_stage(self, pipeline: str, run_id: str) -> dict[str, int]:
        """Leased tasks of a run per stage, through ``tasks_leased`` (bounded by the fleet's leases)."""
        rows = self.db.execute(f"SELECT stage, COUNT(*) FROM tasks WHERE {LEASED} AND pipeline = ? "
                               "AND run_id = ? GROUP BY stage", (pipeline, run_id))
        return {str(s): int(n) for s, n in rows}

    def run_total_mismatches(self, run_id: str) -> list[str]:
        """Where the run's task and attempt totals differ from its rows (empty when they agree): a check for
        tests, read in one statement so that both sides come from one snapshot."""
        rows = self.db.execute(
            "SELECT 'totals', name, k1, k2, k3, SUM(value) FROM run_totals WHERE run_id = ? "
            "AND name IN ('tasks', 'attempts') GROUP BY name, k1, k2, k3 "
            "UNION ALL SELECT 'rows', 'tasks', stage, CASE WHEN status IN ('queued', 'running') THEN 'open' "
            "ELSE status END, CASE WHEN cached <> 0 AND status NOT IN ('queued', 'running') THEN '1' ELSE '0' END, "
            "COUNT(*) FROM tasks WHERE run_id = ? AND status <> 'superseded' GROUP BY 3, 4, 5 "
            "UNION ALL SELECT 'rows', 'attempts', outcome, '', '', COUNT(*) FROM attempts WHERE run_id = ? "
            "GROUP BY outcome", (run_id, run_id, run_id))
        sides: dict[str, dict[tuple[str, str, str, str], int]] = {"totals": {}, "rows": {}}
        for side, name, k1, k2, k3, value in rows:
            if value:
                sides[str(side)][str(name), str(k1), str(k2), str(k3)] = int(value)
        totals, actual = sides["totals"], sides["rows"]
        return [f"{run_id} {k[0]} {'/'.join(x for x in k[1:] if x)}: totals {totals.get(k, 0)}, rows "
                f"{actual.get(k, 0)}" for k in sorted(set(totals) | set(actual))
                if totals.get(k, 0) != actual.get(k, 0)]
