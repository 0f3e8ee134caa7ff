"""What the dashboard's pages show, each page one call: the same service functions as the CLI and the API
(``list_status``, ``progress.overview``, ``timeline``, ``dlq_list``, ``review_list``, ...), composed and cut to a
page (the item page: service/itempage.py).

Every list is a page of at most ``MAX_PAGE`` rows with a keyset cursor to the next (``next_before`` for runs,
newest first; ``next_after`` for dead letters and reviews, by id), so no page grows with the store. ``tenant``
narrows every call as it does for the API (None: an operator, who sees every run).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from conveyor.blobs import Blobs
from conveyor.errors import UserError
from conveyor.service import report, review
from conveyor.service.plots import graph_chart, line_chart
from conveyor.service.progress import done_at, overview, progress_stages, timeline, timeline_bucket
from conveyor.service.tenancy import tenant_runs
from conveyor.store import RunRecord, SqlStore

MAX_PAGE = 100
PREVIEW_CHARS = 2_000  # characters of JSON shown of a candidate or an output on a page
EDIT_CHARS = 200_000  # a candidate longer than this is edited with `conveyor review edit`, not in a text area
REPLAYS_SHOWN = 20
OUTCOMES_UP_TO = 20_000  # items of a run whose outcomes a run page counts (each read)
RUNS_SCANNED = 200  # runs a filtered runs page looks at before it answers short
ENDS = ("failed", "dead_lettered", "awaiting_review", "rejected")  # task statuses the runs page counts per run
# A run's badge: its status, except that a finished run with refused tasks or answers waiting says so.
BADGES = ("submitting", "submitted", "paused_budget", "paused_breaker", "abandoned", "finished", "finished_failed",
          "finished_waiting")


@dataclass(frozen=True)
class RunsFilter:
    """What the runs page is narrowed to (every field optional): a pipeline, a status badge (``BADGES``), and
    runs created from ``since`` and before ``until`` (epoch seconds)."""

    pipeline: str | None = None
    status: str | None = None
    since: float | None = None
    until: float | None = None


def runs_page(store: SqlStore, tenant: str | None, limit: int, before: float | None = None,
              only: RunsFilter = RunsFilter()) -> dict[str, Any]:
    """The newest runs (``run_status`` each, narrowed by ``only``) with their accepted and published items of
    expected and their tasks that failed, were dead-lettered, wait for review or were rejected. Newest first,
    a page from ``before`` (the keyset cursor: a creation time). A status is known only once a run's totals are
    read, so a page looks at no more than RUNS_SCANNED runs: when it stops short, ``next_before`` goes on from
    the last run it looked at."""
    if only.status is not None and only.status not in BADGES:
        raise UserError(f"status {only.status!r}: use one of {', '.join(BADGES)}")
    shown: list[dict[str, Any]] = []
    cursor = before if before is not None else only.until
    scanned, ended = 0, False
    while len(shown) <= limit and scanned < RUNS_SCANNED and not ended:
        batch = _newest(store, tenant, limit + 1, cursor, only.pipeline)
        ended = len(batch) <= limit
        for run in batch:
            if only.since is not None and run.created_at < only.since:
                ended = True
                break
            scanned, cursor = scanned + 1, run.created_at
            if only.pipeline is not None and run.pipeline != only.pipeline:
                continue
            status = _run_row(store, run)
            if only.status is None or status["badge"] == only.status:
                shown.append(status)
            if len(shown) > limit:
                break
    if len(shown) > limit:
        return {"runs": shown[:limit], "next_before": shown[limit - 1]["created_at"], "short": False}
    return {"runs": shown, "next_before": None if ended else cursor, "short": not ended}


def _newest(store: SqlStore, tenant: str | None, limit: int, before: float | None,
            pipeline: str | None) -> list[RunRecord]:
    """The newest runs the caller may see before ``before`` (a tenant's through its jobs, which do not say their
    pipeline: those the caller filters)."""
    return store.list_runs(limit, before, pipeline) if tenant is None else tenant_runs(store, tenant, limit, before)


def _run_row(store: SqlStore, run: RunRecord) -> dict[str, Any]:
    status = report.run_status(store, run)
    status["progress"] = progress_of(run, status)
    mark_ends(status)
    return status


def change_key(store: SqlStore, tenant: str | None, run_id: str | None = None, limit: int = 20) -> str:
    """What a live page's content depends on, cheaply: one run's status and its running totals of tasks and
    attempts (``run_id``), or the newest ``limit`` runs' (the runs list). Equal keys, equal pages; the page's
    stream tells its browser to fetch the page again only when the key moves (api/dashboard/live.py)."""
    runs = ([report.find_run(store, run_id, tenant)] if run_id is not None
            else store.list_runs(limit) if tenant is None else tenant_runs(store, tenant, limit))
    parts = []
    for run in runs:
        parts.append(f"{run.run_id}:{run.status}:{run.paused}:{run.expected}")
        if run.status != "finished" or run_id is not None:
            for name in ("tasks", "attempts"):
                parts += [f"{name}:{a}:{b}:{c}:{v:g}" for a, b, c, v in sorted(store.run_totals(run.run_id, name))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def run_over(store: SqlStore, tenant: str | None, run_id: str) -> bool:
    """Whether a run's page can change no more: its status is ``finished`` (as ``run_page`` says it)."""
    run = report.find_run(store, run_id, tenant)
    return report.run_state(store, run, int(store.any_open_tasks(run.pipeline, run.run_id))) == "finished"


def mark_ends(status: dict[str, Any]) -> None:
    """Add to a ``run_status`` its tasks that ended refused (``failed``: failed, dead-lettered or rejected), those
    waiting for a reviewer (``waiting``), each kind's count (``ends``), and the ``badge`` its status is drawn
    with: a finished run with refused tasks is ``finished_failed``, one with answers waiting
    ``finished_waiting``, never a plain green "finished"."""
    stages = status["stages"].values()
    status["ends"] = {name: sum(c.get(name, 0) for c in stages) for name in ENDS}
    status["failed"] = sum(c.get(name, 0) for c in stages for name in report.REFUSED)
    status["waiting"] = sum(c.get("awaiting_review", 0) for c in stages)
    finished = status["status"] == "finished"
    status["badge"] = ("finished_failed" if finished and status["failed"] else
                       "finished_waiting" if finished and status["waiting"] else status["status"])


def progress_of(run: RunRecord, status: dict[str, Any]) -> dict[str, Any]:
    """Accepted and published items of expected, from the per-stage counts of ``run_status``: tasks done at
    the run's acceptance stages (its record stage when it declares none) and at its publish stages, as
    ``timeline`` counts them; ``published`` is None for a run without a publish stage."""
    accept, publish = progress_stages(run)
    expected = int(status["expected"] or 0)
    accepted = done_at(status["stages"], accept)
    published = done_at(status["stages"], publish) if publish else None
    return {"expected": expected, "accepted": accepted, "published": published,
            "accepted_pct": _pct(accepted, expected), "published_pct": _pct(published, expected)}


def _pct(count: int | None, expected: int) -> float | None:
    if count is None or expected <= 0:
        return None
    return round(min(100.0, 100.0 * count / expected), 1)


def run_page(store: SqlStore, run_id: str, tenant: str | None, charts: bool = True) -> dict[str, Any]:
    """One run, in bounded work at any size: ``progress.overview`` (stages with their activity and queued ages,
    usage, accepted and published), its items by outcome when it has at most OUTCOMES_UP_TO items (else None:
    counting them reads every item; `conveyor reconcile` does), its replays, its dead letters by error class,
    and (``charts``) its throughput and cost over time as SVG."""
    run = report.find_run(store, run_id, tenant)
    status = overview(store, run.run_id)
    status["progress"] = progress_of(run, status)
    mark_ends(status)
    accepted = status["progress"]["accepted"]
    status["outcomes"] = report.outcomes_of(store, run, status) if status["expected"] <= OUTCOMES_UP_TO else None
    if status["outcomes"] is not None:
        status["unaccounted"] = status["expected"] - sum(status["outcomes"].values())
        accepted = sum(status["outcomes"].get(k, 0) for k in report.ACCEPTED)
    status["usage"] = status["usage"] | report.per_accepted_item_usage(status["usage"], accepted)
    replays = store.replays_of(run.run_id)
    status["replays_total"] = len(replays)
    status["replays"] = [{"id": i, "reason": reason, "note": note, "at": at, "by": by, "reopened": reopened,
                          "superseded": superseded}
                         for i, reason, note, at, by, reopened, superseded in replays[-REPLAYS_SHOWN:]]
    status["dead_letter_classes"] = store.dead_letter_classes(run.run_id)
    status["waiting_for_workers"] = report.waiting_for_workers(store, run, status)
    status["charts"] = _charts(store, run, status["open_tasks"]) if charts else None
    status["graph"] = graph_chart(json.loads(run.stages), status["stages"], title="Pipeline graph (tasks done)")
    return status


def _charts(store: SqlStore, run: RunRecord, open_tasks: int) -> dict[str, str]:
    bucket = timeline_bucket(store, run.run_id, _life(store, run, open_tasks))
    points = timeline(store, run.run_id, bucket)
    per_minute = 60.0 / bucket
    throughput = {name: [(p["t"], p[name] * per_minute) for p in points]
                  for name in ("succeeded", "failed", "accepted", "published")}
    cost, spent = [], 0.0
    for p in points:
        spent += p["cost_usd"]
        cost.append((p["t"], spent))
    tokens = [(p["t"], float(p["tokens"])) for p in points]
    return {
        "throughput": line_chart(throughput, title=f"Throughput (attempts per minute, {bucket} s buckets)",
                                 y_label="per minute"),
        "cost": line_chart({"cost (USD, cumulative)": cost}, title="Cost over time", y_label="USD"),
        "tokens": line_chart({"tokens": tokens}, title=f"Tokens per {bucket} s", y_label="tokens"),
    }


def _life(store: SqlStore, run: RunRecord, open_tasks: int) -> float:
    """How long the run has lived: until now while tasks are open, else until the minute its last attempt
    ended (the running totals say which, in bounded work), so a finished run keeps its timeline's buckets."""
    now = store.clock()
    minutes = [float(minute) for minute, *_ in store.run_totals(run.run_id, "timeline")]
    end = now if open_tasks or not minutes else min(now, (max(minutes) + 1) * 60.0)
    return max(0.0, end - run.created_at)


def dead_letters_page(store: SqlStore, run_id: str, tenant: str | None, error_class: str | None, limit: int,
                      after: int | None = None) -> dict[str, Any]:
    """A run's dead letters not replayed yet: their count by error class, and a page of them by id."""
    run = report.find_run(store, run_id, tenant)
    entries = report.dlq_list(store, run.run_id, None, error_class, False, limit + 1, tenant, after)["entries"]
    shown = entries[:limit]
    for entry in shown:
        entry["error_line"] = (entry["error"] or "").splitlines()[0] if entry["error"] else None
    return {"run_id": run.run_id, "pipeline": run.pipeline, "classes": report.dlq_classes(store, run.run_id, tenant),
            "error_class": error_class, "entries": shown,
            "next_after": shown[-1]["id"] if len(entries) > limit else None}


def reviews_page(store: SqlStore, blobs: Blobs, tenant: str | None, run_id: str | None, stage: str | None,
                 limit: int, after: int | None = None, reason_class: str | None = None) -> dict[str, Any]:
    """A page of the open review queue (of one reason class, when given), each entry with a preview of its
    answer, grouped on the page by reason class; the open entries counted by reason class; the store's time
    (the deadlines' countdowns start from it, not from the browser's clock)."""
    entries = review.review_list(store, run_id, stage, False, limit + 1, None, tenant, after,
                                 reason_class)["reviews"]
    shown = entries[:limit]
    for entry in shown:
        entry["preview"] = preview(review.review_candidate(store, blobs, entry["id"], tenant))
    reasons = review.review_reasons(store, run_id, stage, tenant)
    order = {r["reason_class"]: i for i, r in enumerate(reasons)}
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in sorted(shown, key=lambda e: (order.get(e["reason_class"], len(order)), e["id"])):
        groups.setdefault(entry["reason_class"], []).append(entry)
    return {"reviews": shown, "groups": [{"reason_class": reason, "open": dict(
                (r["reason_class"], r["open"]) for r in reasons).get(reason, len(members)), "reviews": members}
                for reason, members in groups.items()],
            "reasons": reasons, "reason": reason_class, "run": run_id, "stage": stage, "now": store.clock(),
            "next_after": shown[-1]["id"] if len(entries) > limit else None}


def review_page(store: SqlStore, blobs: Blobs, review_id: int, tenant: str | None) -> dict[str, Any]:
    """One review entry: its answer (whole, for editing, when not too long) and its attempts."""
    entry = review.review_show(store, blobs, review_id, tenant)
    text = json.dumps(entry["candidate"], indent=2, ensure_ascii=False)
    entry["editable"] = isinstance(entry["candidate"], dict) and len(text) <= EDIT_CHARS
    entry["candidate_json"] = text if entry["editable"] else None
    entry["preview"] = preview(entry["candidate"])
    return entry


def preview(value: Any) -> str:
    """A value as indented JSON, cut to ``PREVIEW_CHARS`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if len(text) <= PREVIEW_CHARS:
        return text
    return f"{text[:PREVIEW_CHARS]}\n… ({len(text) - PREVIEW_CHARS:,} more characters)"
