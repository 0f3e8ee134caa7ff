"""The fleet view (``conveyor workers``, ``GET /v1/workers``): which workers are live, lost or stopped.

By default the workers that have not stopped and beat within ``SHOW_LOST_S``: the live ones and those lost
lately; ``every=True`` adds the stopped ones and the older lost ones (rows are kept for
runtime/fleet.py ``FORGET_AFTER_S``).
"""

from __future__ import annotations

import json
from typing import Any

from conveyor.runtime.fleet import worker_state
from conveyor.store import SqlStore, WorkerRow

SHOW_LOST_S = 3600.0
LIMIT = 1000


def list_workers(store: SqlStore, every: bool = False, limit: int = LIMIT) -> dict[str, Any]:
    """``{"workers": [{"worker", "host", "pid", "pipeline", "run", "started_at", "heartbeat_at",
    "heartbeat_age_s", "tasks_held", "tasks_done", "state", "stopped_at", "serves"}]}``, oldest start first."""
    now = store.clock()
    rows = store.list_workers(0.0 if every else now - SHOW_LOST_S, every, limit)
    return {"workers": [_worker(row, now) for row in rows]}


def workers_change_key(store: SqlStore, every: bool = False, limit: int = LIMIT) -> str:
    """What the workers page shows, but the ages: it moves when a worker starts, beats, takes or finishes tasks,
    is lost or stops (the dashboard's change stream, api/dashboard/live.py)."""
    shown = list_workers(store, every, limit)["workers"]
    return json.dumps([{k: v for k, v in w.items() if k != "heartbeat_age_s"} for w in shown], sort_keys=True)


def _worker(row: WorkerRow, now: float) -> dict[str, Any]:
    state = worker_state(row.stopped_at, row.heartbeat_at, row.beat_s, now)
    return {
        "worker": row.worker, "host": row.host, "pid": row.pid, "pipeline": row.pipeline, "run": row.run_id,
        "started_at": row.started_at, "heartbeat_at": row.heartbeat_at,
        "heartbeat_age_s": round(max(0.0, now - row.heartbeat_at), 3),
        "tasks_held": row.tasks_held,
        "tasks_done": row.tasks_done, "state": state, "stopped_at": row.stopped_at,
        # The stage declarations whose tasks it claims: {stage: [version, config hash]}.
        "serves": json.loads(row.serves) if row.serves else {},
    }
