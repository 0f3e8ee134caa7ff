"""The autoscaler's signal: per stage, the tasks ready to run now, when the oldest of them became so, and the
tasks being worked on (leased).

``QUEUE_DEPTH`` is a documented, stable query (docs/how-to/keda.md; deploy/keda/scaledobject.yaml sums it over a
pipeline's stages): scalers outside conveyor run it as written. It reads the hot queue's three partial
indexes only: ``tasks_runnable`` for tasks ready to run, ``tasks_suspect`` for the few that were in flight when a
worker died, ``tasks_leased`` for the running ones. Retry waits not due yet and finished tasks are never counted
(nor read).
"""

from __future__ import annotations

from typing import NamedTuple

from conveyor.store.dialect import Dialect

# Both ? are the store's clock in epoch seconds (the KEDA query: CAST(EXTRACT(EPOCH FROM now()) AS DOUBLE PRECISION)).
QUEUE_DEPTH = """
SELECT pipeline, stage, SUM(runnable), SUM(running), MIN(oldest_at) FROM (
    SELECT pipeline, stage, COUNT(*) AS runnable, 0 AS running, MIN(available_at) AS oldest_at FROM tasks
    WHERE status = 'queued' AND crashes = 0 AND available_at <= ? GROUP BY pipeline, stage
    UNION ALL
    SELECT pipeline, stage, COUNT(*), 0, MIN(available_at) FROM tasks
    WHERE status = 'queued' AND crashes > 0 AND available_at <= ? GROUP BY pipeline, stage
    UNION ALL
    SELECT pipeline, stage, 0, COUNT(*), NULL FROM tasks WHERE status = 'running' AND lease_expires_at IS NOT NULL
    GROUP BY pipeline, stage
) AS open_work GROUP BY pipeline, stage ORDER BY pipeline, stage"""


class StageDepth(NamedTuple):
    pipeline: str
    stage: str
    runnable: int
    running: int
    oldest_at: float | None  # None: no task of the stage is ready to run


class DepthQueries:
    db: Dialect

    def queue_depth(self, now: float) -> list[StageDepth]:
        """``QUEUE_DEPTH`` at ``now``: one row per (pipeline, stage) with tasks ready to run or running."""
        rows = self.db.execute(QUEUE_DEPTH, (now, now))
        return [StageDepth(str(p), str(s), int(n), int(r), None if at is None else float(at))
                for p, s, n, r, at in rows]
