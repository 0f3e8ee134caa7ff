"""The dashboard's item page: why an item came to its outcome, at a glance.

``conveyor show``'s document (service/show.py), one page of its tasks, with what a reader takes in at once: the
pipeline's graph coloured by this item's tasks (its fan-out children and its groups counted at their stages),
each task's provenance as rows, its answer before and after a format repair or a review, and each attempt's
duration, usage, error and log lines. The page is the tenant's: ``tenant`` narrows the run as the API does, so
another tenant's item (and its log lines) is a 404. Its reads go by the item's key (primary keys, the (run,
root, item, stage) index, attempts by (run, task)), so it costs the same in a store of a million items.
"""

from __future__ import annotations

import json
from typing import Any

from conveyor.blobs import Blobs
from conveyor.service import report
from conveyor.service.dashboard import preview
from conveyor.service.plots import graph_chart
from conveyor.service.show import show_item
from conveyor.store import SqlStore

TASKS_SHOWN = 200  # tasks of one item on a page (a fan-out root may have thousands)
ATTEMPTS_SHOWN = 100  # attempts of one task on a page, the latest (`conveyor show --json` has them all)
HASHES = ("config_hash", "code", "source")


def item_page(store: SqlStore, blobs: Blobs, run_id: str, item_key: str, tenant: str | None,
              offset: int = 0) -> dict[str, Any]:
    """One item's journey: ``show_item``'s document for ``TASKS_SHOWN`` tasks from ``offset``, with ``graph``
    (SVG), and per task ``output_preview``, ``provenance_rows``, ``repair`` and ``reviews`` with previews."""
    run = report.find_run(store, run_id, tenant)
    item = show_item(store, blobs, run.run_id, item_key, offset=offset, limit=TASKS_SHOWN)
    item["graph"] = graph_chart(json.loads(run.stages), item["journey"], title="This item's journey",
                                unreached="not reached")
    for task in item["tasks"]:
        task["output_preview"] = None if task["output"] is None else preview(task["output"])
        task["provenance_rows"] = provenance_rows(task["provenance"])
        for entry in task["reviews"]:
            entry["candidate_preview"] = None if entry["candidate"] is None else preview(entry["candidate"])
        task["repair"] = repair_of(task)
        task["attempts_hidden"] = max(0, len(task["history"]) - ATTEMPTS_SHOWN)
        task["history"] = task["history"][-ATTEMPTS_SHOWN:]
    item["offset"] = offset
    item["next_offset"] = offset + TASKS_SHOWN if offset + TASKS_SHOWN < item["tasks_total"] else None
    return item


def provenance_rows(doc: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A provenance document as (name, value) rows: what the stage declared or set first, then the hashes; a
    list's values joined."""
    if not doc:
        return []
    named = [k for k in doc if k not in HASHES and doc[k] is not None]
    hashes = [k for k in HASHES if doc.get(k)]
    return [(k, ", ".join(map(str, doc[k])) if isinstance(doc[k], list) else str(doc[k])) for k in [*named, *hashes]]


def repair_of(task: dict[str, Any]) -> dict[str, Any] | None:
    """The answer before and after the acceptance boundary repaired its format, for the task's latest repaired
    attempt: ``before`` as the stage returned it, ``after`` the record it became (the task's output, or the
    answer a reviewer was given when it was refused), ``attempt`` its number."""
    repaired = [a for a in task["history"] if a["repaired"] and a.get("unrepaired") is not None]
    if not repaired:
        return None
    last = repaired[-1]
    after = task["output_preview"]
    if after is None and task["reviews"]:
        after = task["reviews"][-1]["candidate_preview"]
    return {"attempt": last["attempt"], "before": last["unrepaired"], "after": after}
