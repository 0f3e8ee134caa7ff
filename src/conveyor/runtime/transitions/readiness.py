"""Readiness of joins and gathers that a plan could not decide alone: decided in the writing transaction.

A plan (runtime/expand.py) decides a join or gather when it knows every task it waits on (a cached re-run, a
commit that settles the last of them with the others, a commit that settles every child of a parent: each child's
tasks carry how many children its parent's fan-out made). Otherwise it leaves it pending, and the transaction that
writes the plan decides it here, after its own rows are written: it locks the waiting items (store/barriers.py:
two commits settling the last two parents at once must not both miss the join), reads the states of the tasks
they wait on, and plans the ready ones, which may in turn leave more pending (a cached join whose successor is
another join), until none is left.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

from conveyor.runtime.expand import QUEUED, WAIT, Ended, Pending, Planned, Seed, Verdict
from conveyor.runtime.transitions.base import Base
from conveyor.runtime.values import Ref, parse_fanout
from conveyor.store import CHILD_MARK, NewItem, NewTasks
from conveyor.store.barriers import StageState
from conveyor.store.queuecounts import OpenTally
from conveyor.store.runtotals import RunTally

SUCCEEDED = "succeeded"
STATISTICS_EVERY_S = 30.0  # how often a process asks whether the statistics its readiness reads plan by are stale
SETTLED = Ref("succeeded", "", 0, None)  # a child that succeeded, before its output is read


class Decided:
    """What ``decide_waiting`` wrote: tasks queued, answered from the memo, and the rows to tally."""

    def __init__(self) -> None:
        self.queued = 0
        self.cached = 0
        self.tasks = NewTasks()

    def add(self, tasks: NewTasks, cached: int) -> None:
        self.queued += len(tasks.queued)
        self.cached += cached
        self.tasks.cached.extend(tasks.cached)
        self.tasks.failed.extend(tasks.failed)
ENDINGS = ("failed", "dead_lettered", "rejected")


class Readiness(Base):
    _statistics_at = -STATISTICS_EVERY_S - 1.0  # monotonic time this process last asked (see fresh_statistics)

    def fresh_statistics(self) -> None:
        """Before a commit that decides joins or gathers in the database, outside its transaction: the planner's
        statistics of tasks and items brought up to date when stale (store/barriers.py), asked at most every
        STATISTICS_EVERY_S in a process (one catalog read; an ANALYZE only after a table grew by a fifth)."""
        now = time.monotonic()
        if now - self._statistics_at < STATISTICS_EVERY_S:
            return
        self._statistics_at = now
        self.store.refresh_barrier_statistics()

    def write_planned(self, planned: Sequence[Planned], items: Sequence[NewItem], now: float, totals: RunTally,
                      opened: OpenTally) -> int:
        """Plan ``planned`` and write its rows, then those of the joins and gathers it made ready, inside the
        caller's transaction; returns the tasks queued."""
        tasks, new_items, _ = self.expander.plan(planned, now, items)
        pending = self.expander.take_pending()
        if new_items:
            self.store.insert_items(new_items)
        if tasks:
            self.store.insert_tasks(tasks, totals, opened)
        queued = len(tasks.queued)
        if pending:
            queued += self.decide_waiting(pending, now, totals, opened).queued
        return queued

    def decide_waiting(self, pending: Sequence[Pending], now: float, totals: RunTally, opened: OpenTally) -> Decided:
        """Write the rows of the pending joins and gathers that are ready now (inside the caller's transaction,
        after its other writes), round by round: what a round plans (a cached join, say) is written before the
        next round reads the states its own pending ones wait on."""
        x = self.expander
        decided = Decided()
        seen: set[Pending] = set()
        while pending:
            waiting = [w for w in dict.fromkeys(pending) if w not in seen]
            seen.update(waiting)
            self.store.lock_items([(w.run_id, w.item_key) for w in waiting])
            ready: list[Seed] = []
            failed = NewTasks()
            for w, verdict in self._verdicts(waiting):
                if verdict is not None and verdict.failure != "wait":
                    x.barrier_rows(w, verdict, failed, ready, now)
            tasks, items, hits = x.plan(ready, now)
            tasks.failed.extend(failed.failed)
            pending = x.take_pending()
            if items:
                self.store.insert_items(items)
            if tasks:
                self.store.insert_tasks(tasks, totals, opened)
            decided.add(tasks, hits)
        return decided

    def _verdicts(self, waiting: Sequence[Pending]) -> list[tuple[Pending, Verdict | None]]:
        x = self.expander
        found: list[tuple[Pending, Verdict | None]] = []
        joins = [w for w in waiting if w.stage not in x.gathers]
        by_run: dict[str, list[Pending]] = {}
        for w in joins:
            by_run.setdefault(w.run_id, []).append(w)
        for run_id, ws in by_run.items():
            # A fan-out parent ran on the parent item: the join takes its element for this child.
            wanted = [(w.root_key, self._runs_on(w.item_key, p), p) for w in ws for p in x.join_parents[w.stage]]
            rows = self.store.stage_states(run_id, wanted)

            def status_of(w: Pending, at: str, rows: dict[tuple[str, str], StageState] = rows) -> Any:
                st = rows.get((self._runs_on(w.item_key, at), at))
                return SETTLED if st is not None and st.status == SUCCEEDED else _seen(st, {})
            # Only the joins that are ready read their parents' outputs (one that waits, the first of two
            # parents to settle, reads none).
            ready = [w for w in ws if x.joined(w.stage, functools.partial(status_of, w)) not in (None, WAIT)]
            waits = set(ws).difference(ready)
            found += [(w, WAIT) for w in ws if w in waits]
            refs = self._refs(rows[self._runs_on(w.item_key, p), p] for w in ready for p in x.join_parents[w.stage])
            for w in ready:
                def state(at: str, w: Pending = w, rows: dict[tuple[str, str], StageState] = rows,
                          refs: dict[str, Ref] = refs) -> Any:
                    seen = _seen(rows.get((self._runs_on(w.item_key, at), at)), refs)
                    if isinstance(seen, Ref) and at in self._fanouts:
                        return _element(seen, w.item_key)
                    return seen
                found.append((w, x.joined(w.stage, state)))
        gathers: dict[tuple[str, str], list[Pending]] = {}
        for w in waiting:
            if w.stage in x.gathers:
                gathers.setdefault((w.run_id, w.stage), []).append(w)
        for (run_id, stage), ws in gathers.items():
            states = self.store.children_states(run_id, [(w.root_key, w.item_key) for w in ws], x.gathers[stage].path)
            # A parent has the children its fan-out made last: the count their rows carry (a replay's fan-out that
            # made fewer leaves the others superseded), or for rows without it (made before it was kept) every
            # child with a task on the path, which it has from the moment it was made (in its fan-out's commit).
            children: dict[str, set[str]] = {}
            told: dict[str, int] = {}
            for (child, _), st in states.items():
                if st.status != "superseded":
                    parent = child.rpartition(CHILD_MARK)[0]
                    children.setdefault(parent, set()).add(child)
                    told[parent] = max(told.get(parent, 0), st.siblings)
            count = {parent: told.get(parent) or len(kids) for parent, kids in children.items()}

            def settled(child: str, at: str, states: dict[tuple[str, str], StageState] = states) -> Any:
                found = states.get((child, at))
                return SETTLED if found is not None and found.status == SUCCEEDED else _seen(found, {})
            ready = [w for w in ws if x.gathered(stage, w.item_key, count.get(w.item_key, 0), settled)
                     not in (None, WAIT)]
            # Only the gathers that are ready read their children's outputs.
            parents = {w.item_key for w in ready}
            refs = self._refs(st for (child, _), st in states.items() if child.rpartition(CHILD_MARK)[0] in parents)

            def child_state(child: str, at: str, states: dict[tuple[str, str], StageState] = states,
                            refs: dict[str, Ref] = refs) -> Any:
                return _seen(states.get((child, at)), refs)
            found += [(w, x.gathered(stage, w.item_key, count.get(w.item_key, 0), child_state))
                      for w in ready]
        return found

    def _runs_on(self, item_key: str, stage: str) -> str:
        """The item a join's parent ran on: the join's own, or for a fan-out parent the item it fanned out."""
        return item_key.rpartition(CHILD_MARK)[0] if stage in self._fanouts else item_key

    @functools.cached_property
    def _fanouts(self) -> frozenset[str]:
        return frozenset(s.name for s in self.pipeline if s.kind == "fanout")

    def _refs(self, states: Any) -> dict[str, Ref]:
        """Task key -> the output of each succeeded task among ``states``, from the memo (with its inline bytes)."""
        succeeded = {s.task_key: s for s in states if s.status == SUCCEEDED}
        memo = self.store.memo_rows(succeeded) if succeeded else {}
        refs: dict[str, Ref] = {}
        for key, s in succeeded.items():
            hit = memo.get(key)
            if hit is not None and hit[2] == s.output_digest:
                refs[key] = Ref(hit[1], hit[2], hit[4], hit[3])
            elif s.output_digest is not None and s.output_kind is not None:
                # Not in the memo (a 64-bit key taken by another): the value is read from the blob store.
                refs[key] = Ref(s.output_kind, s.output_digest, 0, None)
        return refs


def _element(fanout: Ref, child_key: str) -> Any:
    """A child's element of its parent's fan-out output (always inline), or QUEUED when it cannot be read."""
    index = child_key.rpartition(CHILD_MARK)[2]
    elements = parse_fanout(fanout.inline) if fanout.inline is not None else []
    return elements[int(index)] if index.isdigit() and int(index) < len(elements) else QUEUED


def _seen(state: StageState | None, refs: dict[str, Ref]) -> Any:
    """A task's state as ``Expander.joined``/``gathered`` take it: its output, Ended, or QUEUED (open, missing,
    superseded by a replay: what waits on it is not ready)."""
    if state is None:
        return QUEUED
    if state.status == SUCCEEDED:
        return refs.get(state.task_key, QUEUED)
    if state.status in ENDINGS:
        return Ended(state.error_class or state.status)
    return QUEUED
