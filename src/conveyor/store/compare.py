"""What `conveyor compare` reads of a run besides its reconciliation: attempts, reviews, its end, its models
(the records compared: store/diffs.py)."""

from __future__ import annotations

from typing import NamedTuple

from conveyor.store.dialect import Dialect


class RunFigures(NamedTuple):
    """A run's totals that a reconciliation does not give: its stage calls (attempts that invoked the stage:
    retries and escalation tiers, not memo answers, review decisions or replay marks), the root items that ever
    had a review entry, when its last task finished (None: none has), and the models its attempts named."""

    attempts: int
    reviewed_items: int
    last_finished_at: float | None
    models: tuple[str, ...]


class CompareQueries:
    db: Dialect

    def run_figures(self, run_id: str) -> RunFigures:
        attempts = int(self.db.execute("SELECT COUNT(*) FROM attempts WHERE run_id = ? AND invoked = 1",
                                       (run_id,))[0][0])
        reviewed = int(self.db.execute(
            "SELECT COUNT(DISTINCT t.root_key) FROM reviews r JOIN tasks t ON t.id = r.task_id WHERE r.run_id = ?",
            (run_id,))[0][0])
        last = self.db.execute("SELECT MAX(finished_at) FROM tasks WHERE run_id = ?", (run_id,))[0][0]
        return RunFigures(attempts, reviewed, None if last is None else float(last), self._models(run_id))

    def _models(self, run_id: str) -> tuple[str, ...]:
        """An attempt names the models it called comma-separated (see commits.py): split, sorted."""
        rows = self.db.execute("SELECT DISTINCT model FROM attempts WHERE run_id = ? AND model IS NOT NULL",
                               (run_id,))
        return tuple(sorted({name for (joined,) in rows for name in str(joined).split(",") if name}))
