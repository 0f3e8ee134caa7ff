"""The console's items page: a run's tasks as a table, filtered, a page at a time, and the same filter acted on
as a whole (replay, approve, reject), with a dry run first.

A filter is a ``Selection`` of `conveyor select` (service/selection.py), so the page shows what `select` names
and a bulk action re-opens or decides exactly that: by outcome, stage, status, error class, provenance (the
``--where`` expressions), review state, a key prefix and words of the error message. Pages go in key order
(root item, item, stage) with a keyset cursor (the last row's task id), never an offset: each page is a walk
of an index from where the last one stopped (store/selection.py ``task_page``). Conditions the store cannot
answer (an item's outcome, built-in ``--where`` names) are checked here on a bounded number of candidates; a
page that found fewer rows than asked after ``ROUNDS`` reads says so and goes on from where it stopped.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from conveyor.blobs import Blobs
from conveyor.errors import NotFound, StateConflict, UserError
from conveyor.service import review
from conveyor.service.records import RunGraph
from conveyor.service.replay import ReplayOptions, replay
from conveyor.service.report import find_run
from conveyor.service.selection import (
    Condition,
    Selection,
    check,
    check_stages,
    checked_here,
    select,
    selection_of,
    task_filter,
)
from conveyor.service.tenancy import client_key, owned_key
from conveyor.store import RunRecord, SqlStore
from conveyor.store.selection import SelectedTask, TaskFilter

ROUNDS = 8  # candidate reads a page makes before it is answered short (outcome and built-in --where filters)
CANDIDATES = 250  # tasks a read takes when some of them may be dropped here
ACTIONS = ("replay", "approve", "reject")
BULK_MAX = 10_000  # review entries one approve or reject decides (a larger selection: narrow it, or the CLI)
REPLAY_MAX = 100_000  # tasks one replay from the console re-opens (its dry run plans each one while you wait)


@dataclass(frozen=True)
class ItemQuery:
    """The items page's filter, as its URL says it (every field optional; one value each)."""

    outcome: str | None = None
    stage: str | None = None
    status: str | None = None
    error_class: str | None = None
    where: str | None = None
    review: str | None = None
    prefix: str | None = None
    text: str | None = None

    def selection(self, run_id: str, now: float, tenant: str | None = None) -> Selection:
        """The `conveyor select` selection of run ``run_id`` this filter names (one-line errors when wrong); a
        tenant's key prefix is of its own keys (stored under its namespace: service/tenancy.py)."""
        prefix = owned_key(tenant, self.prefix) if tenant is not None and self.prefix else self.prefix
        return check(selection_of([run_id], stages=_one(self.stage), statuses=_one(self.status),
                                  error_classes=_one(self.error_class), where=self.where, outcomes=_one(self.outcome),
                                  now=now, key_prefix=prefix, error_text=self.text,
                                  review_states=_one(self.review)))

    def params(self) -> dict[str, str]:
        """The filter's query parameters (for links: the next page, the bulk forms)."""
        return {k: v for k, v in asdict(self).items() if v}


def _one(value: str | None) -> tuple[str, ...]:
    return (value,) if value else ()


def items_page(store: SqlStore, run_id: str, tenant: str | None, query: ItemQuery, limit: int,
               after: int | None = None) -> dict[str, Any]:
    """A page of the run's tasks that ``query`` selects, after task ``after`` (the previous page's last row):
    each with its item's outcome and its review entry; ``next_after`` the cursor of the next page (None: the
    last), ``short`` True when the page stopped looking before it was full."""
    run = find_run(store, run_id, tenant)
    selection = query.selection(run.run_id, store.clock(), tenant)
    check_stages(selection, {run.run_id: run})
    position = None
    if after is not None:
        position = store.task_position(run.run_id, after)
        if position is None:
            raise NotFound(f"no task {after} in run {run.run_id}; start again from the first page")
    rows, next_after, short = _page(store, run, selection, position, limit)
    return {"run_id": run.run_id, "pipeline": run.pipeline, "stages": _stage_names(run),
            "filter": query.params(), "selection": selection.as_json(), "rows": _shown(store, run, rows, tenant),
            "next_after": next_after, "short": short}


def _page(store: SqlStore, run: RunRecord, selection: Selection, position: tuple[str, str, str] | None,
          limit: int) -> tuple[list[SelectedTask], int | None, bool]:
    """(rows, the next page's cursor, whether the page stopped short)."""
    f, here = task_filter(selection, run.run_id)
    if not _any_counted(store, run.run_id, f):
        return [], None, False
    judged = bool(selection.outcomes or here)
    want = max(limit + 1, CANDIDATES) if judged else limit + 1
    found: list[SelectedTask] = []
    for _ in range(ROUNDS):
        page = store.task_page(f, position, want)
        found += _kept(store, run, selection, here, page)
        if len(found) > limit:
            return found[:limit], found[limit - 1].id, False
        if len(page) < want:
            return found, None, False
        position = (page[-1].root_key, page[-1].item_key, page[-1].stage)
    return found, page[-1].id, True


def _kept(store: SqlStore, run: RunRecord, selection: Selection, here: list[Condition],
          page: list[SelectedTask]) -> list[SelectedTask]:
    """The tasks of ``page`` that pass what the store did not check: built-in names and item outcomes."""
    kept = checked_here(store, page, here)
    if not selection.outcomes or not kept:
        return kept
    outcomes = store.outcomes_of(run.run_id, RunGraph.of(run).stages, sorted({t.root_key for t in kept}))
    return [t for t in kept if outcomes.get(t.root_key) in selection.outcomes]


def _any_counted(store: SqlStore, run_id: str, f: TaskFilter) -> bool:
    """Whether the run's running totals hold any task of the filter's stages and statuses: when none does, the
    answer is an empty page without a walk of the run (queued tasks of a finished run, a stage not reached)."""
    for stage, status, _, count in store.task_counts(run_id):
        if count and (not f.stages or stage in f.stages) and (not f.statuses or status in f.statuses):
            return True
    return False


def _shown(store: SqlStore, run: RunRecord, rows: list[SelectedTask], tenant: str | None) -> list[dict[str, Any]]:
    """The rows as the page shows them: a tenant sees its keys as it chose them."""
    outcomes = store.outcomes_of(run.run_id, RunGraph.of(run).stages, sorted({t.root_key for t in rows}))
    reviews = store.reviews_of_tasks([t.id for t in rows])
    return [{"task_id": t.id, "item_key": t.item_key if tenant is None else client_key(tenant, t.item_key),
             "stage": t.stage, "status": t.status,
             "error_class": t.error_class, "error": t.last_error, "attempts": t.attempts, "finished_at": t.finished_at,
             "outcome": outcomes.get(t.root_key), "review_id": reviews[t.id][0] if t.id in reviews else None,
             "review": reviews[t.id][1] if t.id in reviews else None} for t in rows]


def _stage_names(run: RunRecord) -> list[str]:
    return [s["name"] for s in _graph(run)]


def _graph(run: RunRecord) -> list[dict[str, Any]]:
    """The stages the run recorded (``runs.stages``), in declaration order."""
    stages: list[dict[str, Any]] = json.loads(run.stages)
    return stages


# --- acting on the whole selection ------------------------------------------------------------------------------

def bulk_preview(store: SqlStore, blobs: Blobs, run_id: str, tenant: str | None, query: ItemQuery, action: str,
                 reason: str = "retry") -> dict[str, Any]:
    """What ``action`` would do to every task ``query`` selects, without doing it: for ``replay``, the dry run
    of `conveyor replay` (tasks per stage, the memo's answers, its forecast of time and cost); for ``approve`` and
    ``reject``, the open review entries the selection holds, by stage, and what follows them."""
    run, selection = _selected(store, run_id, tenant, query, action)
    preview: dict[str, Any] = {"run_id": run.run_id, "action": action, "filter": query.params(),
                               "selection": selection.as_json()}
    if action == "replay":
        report = replay(store, blobs, selection, ReplayOptions(reason, dry_run=True, tenant=tenant))
        return preview | {"count": report["reopened"], "selected": report["selected"], "replay": report,
                          "forecast": report.get("forecast")}
    entries = open_entries(store, selection)
    stages = Counter(stage for _, stage in entries)
    return preview | {"count": len(entries), "stages": dict(sorted(stages.items())),
                      "forecast": _decision_forecast(run, action, stages)}


def bulk_act(store: SqlStore, blobs: Blobs, run_id: str, tenant: str | None, query: ItemQuery, action: str,
             by: str, why: str | None, expected: int | None, reason: str = "retry") -> dict[str, Any]:
    """Do ``action`` to every task ``query`` selects, through the functions `conveyor replay` and `conveyor
    review` call. ``expected`` is the count the dry run showed: an approval or rejection refuses when the
    selection has changed since (someone decided meanwhile), so nobody decides entries they did not see."""
    _, selection = _selected(store, run_id, tenant, query, action)
    if action == "replay":
        options = ReplayOptions(reason, note=why, by=by, tenant=tenant)
        report = replay(store, blobs, selection, options)
        return {"action": action, "count": report["reopened"], "replay_id": report["replay_id"]}
    ids = [review_id for review_id, _ in open_entries(store, selection)]
    if expected is not None and expected != len(ids):
        raise StateConflict(f"the selection now holds {len(ids):,} open review entries, not the {expected:,} shown; "
                            "look at the dry run again")
    if action == "approve":
        done = review.approve(store, blobs, ids, by, why, None, tenant)
    else:
        if not why or not why.strip():
            raise UserError("a rejection needs a reason; it is recorded with each item")
        done = review.reject(store, ids, why, by, None, tenant)
    return {"action": action, "count": len(done["decided"])}


def _selected(store: SqlStore, run_id: str, tenant: str | None, query: ItemQuery,
              action: str) -> tuple[RunRecord, Selection]:
    if action not in ACTIONS:
        raise UserError(f"action {action!r}: use one of {', '.join(ACTIONS)}")
    run = find_run(store, run_id, tenant)
    selection = query.selection(run.run_id, store.clock(), tenant)
    check_stages(selection, {run.run_id: run})
    if action == "replay":
        f, _ = task_filter(selection, run.run_id)
        if sum(store.count_tasks(f).values()) > REPLAY_MAX:
            raise UserError(f"this selection holds more than {REPLAY_MAX:,} tasks; narrow it (by status, stage, error "
                            "class, key prefix) or replay it with `conveyor replay`")
    return run, selection


def open_entries(store: SqlStore, selection: Selection) -> list[tuple[int, str]]:
    """(review id, stage) of the open review entries of the selected tasks, found through the run's review
    entries (the selection narrowed to tasks with an open one), at most BULK_MAX."""
    if selection.review_states and "open" not in selection.review_states:
        return []
    narrowed = Selection(**{**selection.__dict__, "review_states": ("open",)})
    entries: list[tuple[int, str]] = []
    for page in select(store, narrowed).pages:
        found = store.reviews_of_tasks([t.id for t in page])
        entries += [(found[t.id][0], t.stage) for t in page if found.get(t.id, (0, ""))[1] == "open"]
        if len(entries) > BULK_MAX:
            raise UserError(f"the selection holds more than {BULK_MAX:,} open review entries; narrow it (by stage, "
                            "error class, key prefix) or decide them with `conveyor review`")
    return entries


def _decision_forecast(run: RunRecord, action: str, stages: Counter[str]) -> dict[str, Any]:
    """What follows a decision: approved items go on to the stages after theirs; rejected ones end there."""
    count = sum(stages.values())
    if action == "reject":
        return {"items_end_rejected": count, "next_stages": []}
    graph = _graph(run)
    following = sorted({s["name"] for s in graph for stage in stages
                        if stage in (s.get("parents") or ([s["after"]] if s.get("after") else []))})
    return {"items_go_on": count, "next_stages": following}
