"""The operator's commands as the HTTP service offers them to a caller: runs, reconciliation, the review queue,
dead letters and replays, each through the caller's TenantView (service/tenancy.py).

The command line calls service/report.py, review.py and replay.py with no tenant (it sees every run); this
module is the one place that hands them the view's scope, so no route of the API passes (or forgets) one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from conveyor.blobs import Blobs
from conveyor.service import dashboard, itempage, itemtable, report, review
from conveyor.service.records import SampleOptions
from conveyor.service.replay import ReplayOptions, replay
from conveyor.service.selection import selection_of
from conveyor.service.tenancy import TenantView


def list_runs(view: TenantView, limit: int) -> dict[str, Any]:
    return report.list_status(view.store, limit, view.scope)


def run_status(view: TenantView, run_id: str) -> dict[str, Any]:
    return report.status_report(view.store, report.find_run(view.store, run_id, view.scope))


def reconcile(view: TenantView, blobs: Blobs, run_id: str, options: SampleOptions) -> dict[str, Any]:
    run = report.find_run(view.store, run_id, view.scope)
    return report.reconcile(view.store, run, blobs=blobs, sample=options)


def reviews(view: TenantView, run_id: str | None, stage: str | None, include_decided: bool,
            limit: int) -> dict[str, Any]:
    return review.review_list(view.store, run_id, stage, include_decided, limit, None, view.scope)


def review_show(view: TenantView, blobs: Blobs, review_id: int) -> dict[str, Any]:
    return review.review_show(view.store, blobs, review_id, view.scope)


def approve(view: TenantView, blobs: Blobs, review_id: int, by: str, why: str | None) -> dict[str, Any]:
    return review.approve(view.store, blobs, [review_id], by, why, None, view.scope)


def edit(view: TenantView, blobs: Blobs, review_id: int, fields: str, by: str, why: str | None) -> dict[str, Any]:
    return review.edit(view.store, blobs, review_id, fields, by, why, None, view.scope)


def reject(view: TenantView, review_id: int, why: str, by: str) -> dict[str, Any]:
    return review.reject(view.store, [review_id], why, by, None, view.scope)


def dead_letters(view: TenantView, run_id: str | None, stage: str | None, error_class: str | None,
                 include_replayed: bool, limit: int) -> dict[str, Any]:
    return report.dlq_list(view.store, run_id, stage, error_class, include_replayed, limit, view.scope)


def dead_letter(view: TenantView, dead_letter_id: int) -> dict[str, Any]:
    return report.dlq_show(view.store, dead_letter_id, view.scope)


def replay_dead_letter(view: TenantView, dead_letter_id: int, reason: str) -> dict[str, Any]:
    return report.dlq_replay_entry(view.store, dead_letter_id, reason, view.scope)


def replay_class(view: TenantView, run_id: str, error_class: str | None, reason: str) -> dict[str, Any]:
    """Queue again every dead letter of a run the caller may see (of ``error_class``, when given)."""
    run = report.find_run(view.store, run_id, view.scope)
    return report.dlq_replay(view.store, [], reason, run_id=run.run_id, error_class=error_class)


def replay_selection(view: TenantView, blobs: Blobs, runs: Sequence[str], stages: Sequence[str],
                     statuses: Sequence[str], error_classes: Sequence[str], options: ReplayOptions) -> dict[str, Any]:
    """``conveyor replay`` of the tasks a selection names, in runs the caller may see (named, for a tenant)."""
    selection = selection_of(runs, stages, statuses, error_classes, now=view.store.clock())
    return replay(view.store, blobs, selection, replace(options, tenant=view.scope))


# --- the dashboard's pages (service/dashboard.py) --------------------------------------------------------------

def runs_page(view: TenantView, limit: int, before: float | None,
              only: dashboard.RunsFilter = dashboard.RunsFilter()) -> dict[str, Any]:
    return dashboard.runs_page(view.store, view.scope, limit, before, only)


def change_key(view: TenantView, run_id: str | None) -> str:
    return dashboard.change_key(view.store, view.scope, run_id)


def run_over(view: TenantView, run_id: str) -> bool:
    return dashboard.run_over(view.store, view.scope, run_id)


def run_page(view: TenantView, run_id: str) -> dict[str, Any]:
    return dashboard.run_page(view.store, run_id, view.scope)


def dead_letters_page(view: TenantView, run_id: str, error_class: str | None, limit: int,
                      after: int | None) -> dict[str, Any]:
    return dashboard.dead_letters_page(view.store, run_id, view.scope, error_class, limit, after)


def item_page(view: TenantView, blobs: Blobs, run_id: str, item_key: str, offset: int) -> dict[str, Any]:
    return itempage.item_page(view.store, blobs, run_id, view.stored_key(run_id, item_key), view.scope, offset)


def reviews_page(view: TenantView, blobs: Blobs, run_id: str | None, stage: str | None, limit: int,
                 after: int | None, reason_class: str | None = None) -> dict[str, Any]:
    return dashboard.reviews_page(view.store, blobs, view.scope, run_id, stage, limit, after, reason_class)


def decide_many(view: TenantView, blobs: Blobs, ids: Sequence[int], decision: str, by: str,
                why: str | None) -> dict[str, Any]:
    return review.decide_many(view.store, blobs, ids, decision, by, why, view.scope)


def review_page(view: TenantView, blobs: Blobs, review_id: int) -> dict[str, Any]:
    return dashboard.review_page(view.store, blobs, review_id, view.scope)


# --- the console's items page (service/itemtable.py) ---------------------------------------------------------

def items_page(view: TenantView, run_id: str, query: itemtable.ItemQuery, limit: int,
               after: int | None) -> dict[str, Any]:
    return itemtable.items_page(view.store, run_id, view.scope, query, limit, after)


def bulk_preview(view: TenantView, blobs: Blobs, run_id: str, query: itemtable.ItemQuery, action: str,
                 reason: str) -> dict[str, Any]:
    return itemtable.bulk_preview(view.store, blobs, run_id, view.scope, query, action, reason)


def bulk_act(view: TenantView, blobs: Blobs, run_id: str, query: itemtable.ItemQuery, action: str, by: str,
             why: str | None, expected: int | None, reason: str) -> dict[str, Any]:
    return itemtable.bulk_act(view.store, blobs, run_id, view.scope, query, action, by, why, expected, reason)
