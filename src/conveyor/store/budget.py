"""Budgets and pauses: a run's ceiling on provider spending, kept by reservations, and runs paused whole.

A provider call of a run with a budget first reserves its estimated cost; the reservation is granted only
while what the run spent plus what its calls in flight reserve plus this one fit the budget, in one
conditional UPDATE, so however many workers reserve at once the run never passes its budget by more than the
difference between one call's estimate and its real cost. After the call the reservation is settled to the
real cost. A run whose reservation no longer fits is paused (``paused = 'budget'``); so is one whose calls all
fail the same systemic way (``'breaker'``). No task of a paused run is claimed until it is resumed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from conveyor.store.dialect import Dialect
from conveyor.store.records import open_probes

GRANTED, NO_BUDGET, PAUSED, EXHAUSTED, WAIT = "granted", "no_budget", "paused", "exhausted", "wait"


class BudgetQueries:
    db: Dialect

    def run_budget(self, run_id: str) -> tuple[float | None, str | None]:
        """(budget in USD or None, why it is paused or None)."""
        rows = self.db.execute("SELECT budget_usd, paused FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            return None, None
        return (None if rows[0][0] is None else float(rows[0][0])), rows[0][1]

    def reserve_budget(self, run_id: str, usd: float, note: str) -> str:
        """Reserve ``usd`` of the run's budget: GRANTED, NO_BUDGET, PAUSED (it was), WAIT (it fits only once calls
        in flight settle: their reservations are estimates, usually above what they cost), or EXHAUSTED (it does
        not fit even with nothing in flight: the run is paused now, with ``note``)."""
        with self.db.transaction():
            if self.db.execute_rowcount(
                    "UPDATE runs SET reserved_usd = reserved_usd + ? WHERE run_id = ? AND paused IS NULL AND "
                    "budget_usd IS NOT NULL AND spent_usd + reserved_usd + ? <= budget_usd", (usd, run_id, usd)):
                return GRANTED
            rows = self.db.execute("SELECT budget_usd, paused, spent_usd, reserved_usd FROM runs WHERE run_id = ?",
                                   (run_id,))
            if not rows or (rows[0][0] is None and rows[0][1] is None):
                return NO_BUDGET
            budget, paused, spent, reserved = rows[0]
            if paused is not None:
                return PAUSED
            if float(reserved) > 0 and float(spent) + usd <= float(budget):
                return WAIT
            self.db.execute("UPDATE runs SET paused = 'budget', note = ? WHERE run_id = ? AND paused IS NULL",
                            (note, run_id))
            return EXHAUSTED

    def settle_budget(self, rows: Sequence[tuple[float, float, str]]) -> None:
        """(reserved, spent, run): a call's reservation settled to what it cost."""
        with self.db.transaction():
            self.db.executemany(
                "UPDATE runs SET reserved_usd = CASE WHEN reserved_usd > ? THEN reserved_usd - ? ELSE 0 END, "
                "spent_usd = spent_usd + ? WHERE run_id = ?", [(r, r, s, run) for r, s, run in rows])

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
        """Carry on a paused run: unpaused, with ``budget`` (or its old one when ``keep_budget``); what it
        spent is counted again from its attempts and nothing is reserved (no call of it is in flight)."""
        with self.db.transaction():
            if keep_budget:
                self.db.execute("UPDATE runs SET paused = NULL, note = NULL WHERE run_id = ?", (run_id,))
            else:
                self.db.execute("UPDATE runs SET paused = NULL, note = NULL, budget_usd = ? WHERE run_id = ?",
                                (budget, run_id))
            self.db.execute("UPDATE runs SET reserved_usd = 0, spent_usd = (SELECT COALESCE(SUM(cost), 0) FROM "
                            "attempts WHERE attempts.run_id = runs.run_id) WHERE run_id = ?", (run_id,))

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
