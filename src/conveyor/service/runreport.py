"""Everything a run's mailed report shows (`conveyor report RUN`), gathered from the service functions.

``run_report(store, run, blobs)`` returns one plain dict (the ``--json`` of `conveyor report`):

- ``run_id``, ``pipeline``, ``target``, ``input`` (as submitted), ``status``, ``created_at``,
  ``last_finished_at`` (when its last task ended; None: none has) and ``generated_at`` (epoch seconds, the
  store's clock);
- ``reconcile``: the run's ``reconcile`` (as `conveyor reconcile RUN --json` prints it, with the quality
  ``sample``; ``not_done`` lists at most ``not_done_limit`` items (also a field), ``not_done_shown`` says how
  many it lists);
- ``stages``: per stage in declaration order, ``{"stage", "counts": {task status: tasks}, "calls", "cached",
  "oldest_queued_age_s"}`` (``status_report``'s ``stages`` and ``stage_activity``);
- ``timeline``: ``{"bucket_s", "buckets": [...]}``, ``progress.timeline`` at ``progress.timeline_bucket`` of the
  run's life;
- ``ages``: how long items took from submission to their outcome: ``{"buckets": [{"label", "upper_s",
  "items"}], "ended", "open"}`` (``upper_s`` None: the last, open-ended bucket; ``open``: items not ended).
"""

from __future__ import annotations

from typing import Any

from conveyor.blobs import Blobs
from conveyor.service.progress import timeline, timeline_bucket
from conveyor.service.records import SampleOptions
from conveyor.service.report import reconcile, status_report
from conveyor.store import RunRecord, SqlStore

# Upper limits (seconds) of the age buckets, and their labels; one bucket more holds the rest.
AGE_BUCKETS = ((1.0, "< 1 s"), (10.0, "1–10 s"), (60.0, "10 s–1 min"), (600.0, "1–10 min"),
               (3600.0, "10 min–1 h"), (21600.0, "1–6 h"), (86400.0, "6–24 h"))
LAST_AGE = "≥ 1 day"
NOT_DONE_LIMIT = 100


def run_report(store: SqlStore, run: RunRecord, blobs: Blobs | None, sample: SampleOptions = SampleOptions(),
               not_done_limit: int = NOT_DONE_LIMIT) -> dict[str, Any]:
    """The report's data: reconciliation, per-stage counts, throughput and cost over time, item ages.
    ``blobs`` None leaves the quality sample out."""
    summary = reconcile(store, run, limit=not_done_limit, blobs=blobs, sample=sample)
    summary["not_done_shown"] = len(summary["not_done"])
    status = status_report(store, run)
    ages = store.item_ages(run.run_id, [upper for upper, _ in AGE_BUCKETS])
    now = store.clock()
    end = now if ages.open_items or ages.last_at is None else ages.last_at
    bucket_s = timeline_bucket(store, run.run_id, max(0.0, end - run.created_at))
    return {
        "run_id": run.run_id, "pipeline": run.pipeline, "target": run.target, "input": run.input,
        "status": summary["status"], "created_at": run.created_at, "last_finished_at": ages.last_at,
        "generated_at": now, "reconcile": summary, "not_done_limit": not_done_limit,
        "stages": [{"stage": name, "counts": counts, **status["stage_activity"].get(name, {})}
                   for name, counts in status["stages"].items()],
        "timeline": {"bucket_s": bucket_s, "buckets": timeline(store, run.run_id, bucket_s)},
        "ages": {"buckets": [{"label": label, "upper_s": upper, "items": count} for (upper, label), count
                             in zip([*AGE_BUCKETS, (None, LAST_AGE)], ages.counts, strict=True)],
                 "ended": sum(ages.counts), "open": ages.open_items},
    }

