"""Budgets and pauses: a run's ceiling on provider spending, kept by reservations, and runs paused whole.

This module owns the budget's rule; workers (runtime/budget.py) ask it and wait when it says so. A provider
call of a run with a budget first reserves its estimated cost; the reservation is granted only while what the
run spent plus what its calls in flight reserve plus this one fit the budget, in one conditional UPDATE, so
however many workers reserve at once the run never passes its budget by more than the difference between one
call's estimate and its real cost. After the call the reservation is settled to the real cost.

A reservation is held by the lease of the task that made it (its id and fencing token). When that lease ends
with the call unsettled (its worker was killed, or stalled past its lease and the task was reclaimed, or gave
it back), the reservation is lost: counted as spent at its estimate, because the provider was probably paid,
until a late settlement says what the call cost. So a dead worker's reservation neither blocks the run forever
nor is forgotten.

A call that fits only once the calls in flight settle waits (WAIT), but not for ever: past its patience the run
is paused with a note that says so. A run whose reservation does not fit is paused (``paused = 'budget'``); so is
one whose calls all fail the same systemic way (``'breaker'``). No task of a paused run is claimed until it is
resumed; resuming only raises the ceiling and keeps the reservations of calls still in flight.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from conveyor.store.dialect import Dialect
from conveyor.store.records import Lease, open_probes
from conveyor.store.runtotals import RunTally, RunTotalsQueries
from conveyor.store.tasks import chunks

GRANTED, NO_BUDGET, PAUSED, EXHAUSTED, WAIT = "granted", "no_budget", "paused", "exhausted", "wait"


class Reservation(NamedTuple):
    """A granted reservation of ``usd`` of a run's budget, to settle once the call it was made for ends."""

    id: int
    run_id: str
    usd: float


class Lost(NamedTuple):
    """What a lease's unsettled reservations added to its run's spending: how many calls, at their estimates."""

    calls: int
    usd: float


class BudgetQueries(RunTotalsQueries):
    db: Dialect

    def run_budget(self, run_id: str) -> tuple[float | None, str | None]:
        """(budget in USD or None, why it is paused or None)."""
        rows = self.db.execute("SELECT budget_usd, paused FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            return None, None
        return (None if rows[0][0] is None else float(rows[0][0])), rows[0][1]

    def reserve_budget(self, run_id: str, usd: float, note: str, lease: Lease | None = None, waited: float = 0.0,
                       patience: float = float("inf")) -> tuple[str, Reservation | None]:
        """Reserve ``usd`` of the run's budget for a call made under ``lease``: (GRANTED, the reservation), or
        (answer, None) with answer NO_BUDGET, PAUSED (it was), WAIT (it fits only once calls in flight settle:
        their reservations are estimates, usually above what they cost; ask again) or EXHAUSTED (it does not fit
        even with nothing in flight, or the caller ``waited`` its ``patience`` out: the run is paused now, with
        ``note``). Reservations whose lease ended unsettled are counted at their estimate first."""
        with self.db.transaction():
            if self._grant(run_id, usd):
                return GRANTED, self._hold(run_id, usd, lease)
            if self._count_released(run_id) and self._grant(run_id, usd):
                return GRANTED, self._hold(run_id, usd, lease)
            # What calls in flight hold is read from their rows: the run's running sum may keep a rounding residue.
            rows = self.db.execute(
                "SELECT budget_usd, paused, spent_usd, (SELECT COALESCE(SUM(usd), 0) FROM budget_reservations WHERE "
                "run_id = runs.run_id AND lost = 0) FROM runs WHERE run_id = ?", (run_id,))
            if not rows or (rows[0][0] is None and rows[0][1] is None):
                return NO_BUDGET, None
            budget, paused, spent, reserved = rows[0]
            if paused is not None:
                return PAUSED, None
            if float(reserved) > 0 and float(spent) + usd <= float(budget):
                if waited < patience:
                    return WAIT, None
                note = (f"{note}, and calls in flight holding ${float(reserved):.4f} of it did not settle within "
                        f"{patience:g}s")
            self.db.execute("UPDATE runs SET paused = 'budget', note = ? WHERE run_id = ? AND paused IS NULL",
                            (note, run_id))
            return EXHAUSTED, None

    def _grant(self, run_id: str, usd: float) -> bool:
        return bool(self.db.execute_rowcount(
            "UPDATE runs SET reserved_usd = reserved_usd + ? WHERE run_id = ? AND paused IS NULL AND "
            "budget_usd IS NOT NULL AND spent_usd + reserved_usd + ? <= budget_usd", (usd, run_id, usd)))

    def _hold(self, run_id: str, usd: float, lease: Lease | None) -> Reservation:
        task_id, token = lease if lease is not None else (None, None)
        rows = self.db.execute("INSERT INTO budget_reservations (run_id, task_id, lease_token, usd) VALUES "
                               "(?, ?, ?, ?) RETURNING id", (run_id, task_id, token, usd))
        return Reservation(int(rows[0][0]), run_id, usd)

    def _count_released(self, run_id: str) -> float:
        """Count the run's reservations whose lease ended without the call settling (the task was given back,
        reclaimed or finished under another token) at their estimate; returns how much that moved."""
        rows = self.db.execute(
            "UPDATE budget_reservations SET lost = 1 WHERE run_id = ? AND lost = 0 AND task_id IS NOT NULL AND "
            "NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.id = budget_reservations.task_id AND tasks.status = "
            "'running' AND tasks.lease_token = budget_reservations.lease_token) RETURNING usd", (run_id,))
        usd = sum(float(r[0]) for r in rows)
        if usd:
            self._count_lost(run_id, usd)
        return usd

    def _count_lost(self, run_id: str, usd: float) -> None:
        self.db.execute("UPDATE runs SET reserved_usd = CASE WHEN reserved_usd > ? THEN reserved_usd - ? ELSE 0 END, "
                        "spent_usd = spent_usd + ? WHERE run_id = ?", (usd, usd, usd, run_id))

    def lose_reservations(self, leases: Sequence[Lease]) -> dict[int, Lost]:
        """The reservations held by ``leases`` (expired: their worker died or stalled), counted as spent at their
        estimate; by task id, what each lease's calls added. Call it in the transaction that ends the leases."""
        tokens = {task_id: token for task_id, token in leases}
        held: list[tuple[int, int, int, str, float]] = []
        for part in chunks(sorted(tokens), 500):
            held += self.db.execute(
                f"SELECT id, task_id, lease_token, run_id, usd FROM budget_reservations WHERE lost = 0 AND task_id "
                f"IN ({','.join('?' * len(part))})", part)
        ids = [r[0] for r in held if tokens.get(int(r[1])) == r[2]]
        lost: list[tuple[int, str, float]] = []
        for part in chunks(ids, 500):
            lost += self.db.execute(f"UPDATE budget_reservations SET lost = 1 WHERE lost = 0 AND id IN "
                                    f"({','.join('?' * len(part))}) RETURNING task_id, run_id, usd", part)
        by_run: dict[str, float] = defaultdict(float)
        by_task: dict[int, Lost] = {}
        for task_id, run_id, usd in lost:
            by_run[run_id] += float(usd)
            calls, total = by_task.get(int(task_id), Lost(0, 0.0))
            by_task[int(task_id)] = Lost(calls + 1, total + float(usd))
        for run_id, usd in sorted(by_run.items()):
            self._count_lost(run_id, usd)
        return by_task

    def settle_budget(self, settled: Sequence[tuple[Reservation, float]]) -> None:
        """(reservation, what the call cost): the reservation gives way to the cost. One counted at its estimate
        because its lease was lost (a stalled worker's, settled late) is corrected to the cost."""
        with self.db.transaction():
            for hold, cost in settled:
                rows = self.db.execute("DELETE FROM budget_reservations WHERE id = ? RETURNING lost, task_id, "
                                       "lease_token", (hold.id,))
                if rows and rows[0][0]:
                    self._known(hold, cost, rows[0][1], rows[0][2])
                    continue
                self.db.execute(
                    "UPDATE runs SET reserved_usd = CASE WHEN reserved_usd > ? THEN reserved_usd - ? ELSE 0 END, "
                    "spent_usd = spent_usd + ? WHERE run_id = ?", (hold.usd, hold.usd, cost, hold.run_id))

    def _known(self, hold: Reservation, cost: float, task_id: int | None, token: int | None) -> None:
        """A lost reservation's call settled after all: the run spent ``cost``, not the estimate, and the attempt
        that counted the estimate (the lease's reclaim) gives it back; the worker's own attempt, fenced off as
        lease_lost, counts the call with what it cost."""
        self.db.execute("UPDATE runs SET spent_usd = spent_usd + ? WHERE run_id = ?", (cost - hold.usd, hold.run_id))
        if task_id is None or not self.db.execute_rowcount(
                "UPDATE attempts SET cost = cost - ?, provider_calls = provider_calls - 1 WHERE task_id = ? AND "
                "lease_token = ? AND outcome = 'lease_expired' AND provider_calls > 0", (hold.usd, task_id, token)):
            return
        given_back = RunTally()
        given_back.add(hold.run_id, "usage", "cost", value=-hold.usd)
        given_back.add(hold.run_id, "usage", "provider_calls", value=-1)
        self.add_run_totals(given_back)

    def spent(self, run_id: str) -> tuple[float, float]:
        """(spent, reserved) of a run with a budget."""
        rows = self.db.execute("SELECT spent_usd, reserved_usd FROM runs WHERE run_id = ?", (run_id,))
        return (float(rows[0][0]), float(rows[0][1])) if rows else (0.0, 0.0)

    def pause_run(self, run_id: str, why: str, note: str) -> bool:
        """Pause a run (``why``: 'budget' or 'breaker'); False when it was paused already."""
        with self.db.transaction():
            return bool(self.db.execute_rowcount(
                "UPDATE runs SET paused = ?, note = ? WHERE run_id = ? AND paused IS NULL", (why, note, run_id)))

    def paused_runs(self, pipeline: str) -> list[str]:
        return [str(r[0]) for r in self.db.execute(
            "SELECT run_id FROM runs WHERE pipeline = ? AND paused IS NOT NULL", (pipeline,))]

    def resume_paused(self, run_id: str, budget: float | None, keep_budget: bool) -> None:
        """Carry on a paused run: unpaused, with ``budget`` (or its old one when ``keep_budget``). The
        reservations of its calls still in flight are kept (they may yet be paid); a run that had no budget
        until now gets what it spent counted from its attempts (nothing was kept while it had none)."""
        with self.db.transaction():
            if keep_budget:
                self.db.execute("UPDATE runs SET paused = NULL, note = NULL WHERE run_id = ?", (run_id,))
                return
            self.db.execute("UPDATE runs SET spent_usd = (SELECT COALESCE(SUM(cost), 0) FROM attempts WHERE "
                            "attempts.run_id = runs.run_id) WHERE run_id = ? AND budget_usd IS NULL", (run_id,))
            self.db.execute("UPDATE runs SET paused = NULL, note = NULL, budget_usd = ? WHERE run_id = ?",
                            (budget, run_id))

    def any_open_tasks_outside(self, pipeline: str, runs: Sequence[str], run_id: str | None = None,
                               stages: Sequence[str] = (),
                               declared: Mapping[str, tuple[str, str]] | None = None) -> bool:
        """Whether the pipeline (``run_id``) has an open task (made under ``declared``), leaving out those of
        the paused ``runs`` at ``stages`` (the stages that call models: a paused run's other tasks still run).
        Stops at the first."""
        where = "AND run_id = ?" if run_id else ""
        params: list[object] = [pipeline, *([run_id] if run_id else [])]
        skip = (f"AND NOT (run_id IN ({','.join('?' * len(runs))}) AND stage IN ({','.join('?' * len(stages))}))"
                if runs and stages else "")
        return any(self.db.execute(f"SELECT 1 FROM tasks WHERE {state} AND pipeline = ? {where} {skip} {only} "
                                   "LIMIT 1", [*params, *(runs if skip else ()), *(stages if skip else ()), *among])
                   for state, only, among in open_probes(declared))
