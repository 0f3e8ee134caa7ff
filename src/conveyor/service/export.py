"""Results as datasets: one row per item of a run, or per live version of a collection, streamed in batches.

`conveyor export` and the Python API read the same rows from here; service/datasets.py writes them as
Parquet, JSON lines or CSV. A row is a flat dict:

- ``item_key``, ``outcome`` (the item's outcome as ``reconcile`` counts it, its fan-out children folded in;
  ``unaccounted`` for an item with no task yet), ``error_class`` and ``error`` (the first line of the error)
  of an item that did not make it: those of its first task, in key and stage order, whose status is the
  outcome (a task waiting to retry, for an item in progress); None for an item that made it;
- the value: the output of the item's own task at the export's stage (default: the stage whose output is
  the item's accepted record, ``records.record_stage``), when that task succeeded. A JSON object spreads its
  top-level keys into columns ``value.KEY``, their values as they are (nested objects and lists stay nested);
  any other value (a string, a number, a list, bytes) is the column ``value``;
- provenance: ``run_id``, ``stage``, ``stage_version`` and ``config_hash`` (of the item's task at that
  stage), ``model`` and ``prompt_version`` (its provenance rows; several values joined by ``,``),
  ``provenance`` (every provenance row of that task as a JSON object: name -> value, or a list of values),
  ``source_digest`` (the root item's source), and ``tokens`` and ``cost`` (every attempt of every task of
  the item and its fan-out children, retries and failures included, so the rows of a run add up to its
  usage; ``cost`` is None when every call was to a model without a price).

A collection's rows are its live versions (rolled-back and retracted items have none): ``collection`` and
``version`` first, the version's fields as the value, ``outcome`` ``published``, and the provenance of the
task that published the version (``tokens`` and ``cost``: those of that task's root item in its run).

Rows are read a batch at a time (keyset pages over the store's indexes, records from the memo or the blob
store per batch), so memory holds one batch whatever the size of the run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.blobs import Blobs
from conveyor.errors import NotFound, UserError
from conveyor.runtime.values import decode
from conveyor.service.records import RunGraph, item_depth, record_bytes
from conveyor.service.report import ACCEPTED, KNOWN_OUTCOMES, find_run, settled
from conveyor.store import RunRecord, SqlStore
from conveyor.store.diffs import RecordRef
from conveyor.store.exports import ExportTask, ItemUsage, LivePublication, PublishingTask
from conveyor.store.reports import settled_outcome

BATCH = 5000  # root items (or live versions) per read
UNACCOUNTED = "unaccounted"  # reconcile's items with no task (the store says "missing")
OUTCOMES = (*KNOWN_OUTCOMES, UNACCOUNTED)
ACCEPTED_GROUP = "accepted"  # the default --outcome: every item that made it (report.ACCEPTED)
EVERY = "all"
VALUE = "value"
VALUE_PREFIX = "value."
LEAD = ("item_key", "outcome", "error_class", "error")
COLLECTION_LEAD = ("collection", "item_key", "version", "outcome", "error_class", "error")
TRAIL = ("model", "prompt_version", "provenance", "run_id", "stage", "stage_version", "config_hash",
         "source_digest", "tokens", "cost")

Row = dict[str, Any]


@dataclass(frozen=True)
class Export:
    """An export's description and a way to read its rows: ``batches()`` opens a fresh stream of row batches
    each time it is called (a writer whose columns grew starts again: service/datasets.py)."""

    lead: tuple[str, ...]
    trail: tuple[str, ...]
    head: dict[str, Any]  # run_id or collection, stage, outcomes: what was exported
    batches: Callable[[], Iterator[list[Row]]]


def run_export(store: SqlStore, blobs: Blobs, run_id: str, stage: str | None = None,
               outcome: str | None = None, batch: int = BATCH) -> Export:
    """The rows of ``run_id``'s root items whose outcome is one of ``outcome`` (comma-separated names of
    ``OUTCOMES``; ``accepted``, the default: published, completed or accepted; ``all``: every item), with
    the output of ``stage`` as the value (default: the item's accepted record's stage)."""
    run = find_run(store, run_id)
    wanted = outcomes_wanted(outcome)
    graph = RunGraph.of(run)
    value_stage = _value_stage(run, graph, stage)
    head = {"run_id": run.run_id, "stage": value_stage, "outcomes": sorted(wanted)}
    return Export(LEAD, TRAIL, head, lambda: _run_batches(store, blobs, run, graph, value_stage, wanted, batch))


def collection_export(store: SqlStore, blobs: Blobs, collection: str, batch: int = BATCH) -> Export:
    """The rows of ``collection``'s live versions, in key order."""
    if not store.has_collection(collection):
        raise NotFound(f"no collection {collection!r} in this store; `conveyor search \"WORDS\"` lists published "
                       "items with their collections")
    head = {"collection": collection, "stage": None, "outcomes": ["published"]}
    return Export(COLLECTION_LEAD, TRAIL, head, lambda: _collection_batches(store, collection, batch))


def outcomes_wanted(outcome: str | None) -> frozenset[str]:
    """``--outcome`` as a set of outcomes: comma-separated names, ``accepted`` (what made it) or ``all``."""
    wanted: set[str] = set()
    for name in (outcome or ACCEPTED_GROUP).split(","):
        name = name.strip()
        if name == EVERY:
            wanted.update(OUTCOMES)
        elif name == ACCEPTED_GROUP:
            wanted.update(ACCEPTED)
        elif name in OUTCOMES:
            wanted.add(name)
        else:
            raise UserError(f"--outcome {name!r}: use {ACCEPTED_GROUP} (the default: published, completed or "
                            f"accepted), {EVERY}, or outcomes separated by commas ({', '.join(OUTCOMES)})")
    return frozenset(wanted)


def _value_stage(run: RunRecord, graph: RunGraph, stage: str | None) -> str | None:
    """The stage whose output is the value: ``stage`` when it runs on the run's root items (or on its group
    items: a group stage's output is its group item's value), else the record stage (None: no stage runs on
    the root items themselves)."""
    if stage is None:
        return graph.record_stage
    stages = json.loads(run.stages)
    declared = {s["name"]: s for s in stages}
    if stage not in declared:
        raise UserError(f"--stage {stage!r}: run {run.run_id}'s pipeline has no such stage "
                        f"({', '.join(declared)})")
    if declared[stage]["kind"] == "fanout":
        raise UserError(f"--stage {stage!r} is a fan-out: its output is its children; export a stage that runs "
                        "on the root items (each row is one root item)")
    if item_depth(stages, stage) > 0:
        raise UserError(f"--stage {stage!r} runs on fan-out children, and each row is one root item: export a "
                        "stage that runs on the root items, or a gather of those children")
    return stage


# --- a run's rows ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _RunWalk:
    """What every batch of a run's rows needs: where to read, which stage's output is the value, the stage
    order (to find the task that decided an outcome), the publish stages and the outcomes wanted."""

    store: SqlStore
    blobs: Blobs
    run_id: str
    stage: str | None
    order: Mapping[str, int]
    publish: tuple[str, ...]
    wanted: frozenset[str]


def _run_batches(store: SqlStore, blobs: Blobs, run: RunRecord, graph: RunGraph, stage: str | None,
                 wanted: frozenset[str], size: int) -> Iterator[list[Row]]:
    """Pages of root items in key order: with reconcile's outcome SQL, or, for a settled run (every task
    succeeded: its common end), from the items alone, each outcome then told by its tasks' stages."""
    walk = _RunWalk(store, blobs, run.run_id, stage, {s["name"]: i for i, s in enumerate(json.loads(run.stages))},
                    graph.stages.publish, wanted)
    quiet = settled(store, run)
    after: str | None = None
    while True:
        if quiet:
            roots = store.roots_after(run.run_id, after, size)
            keys, sources, outcomes = [k for k, _ in roots], dict(roots), None
        else:
            items = store.outcomes_after(run.run_id, graph.stages, after, size)
            keys, sources, outcomes = [k for k, _ in items], None, dict(items)
        if not keys:
            return
        rows = _run_rows(walk, keys, outcomes, sources)
        if rows:
            yield rows
        if len(keys) < size:
            return
        after = keys[-1]


def _run_rows(walk: _RunWalk, keys: Sequence[str], outcomes: Mapping[str, str] | None,
              sources: Mapping[str, str | None] | None) -> list[Row]:
    """The rows of these root items (a contiguous key range of the run) whose outcome is wanted; ``outcomes``
    None: the run is settled."""
    if outcomes is not None:
        keys = [k for k in keys if _named(outcomes[k]) in walk.wanted]
        if not keys:
            return []
    first, last, stage = keys[0], keys[-1], walk.stage
    tasks: dict[str, list[ExportTask]] = {}
    own: dict[str, ExportTask] = {}
    for each in walk.store.export_tasks(walk.run_id, stage, first, last):
        tasks.setdefault(each.root_key, []).append(each)
        if each.stage == stage and each.item_key == each.root_key:
            own[each.root_key] = each
    if sources is None:
        sources = walk.store.export_sources(walk.run_id, first, last)
    usage = walk.store.export_usage(walk.run_id, first, last)
    docs = _Documents()
    rows = []
    for key in keys:
        mine = tasks.get(key, ())
        outcome = _named(outcomes[key] if outcomes is not None else _settled_outcome(mine, walk.publish))
        if outcome not in walk.wanted:
            continue
        why = None if outcome in ACCEPTED else _deciding(mine, outcome, walk.order)
        row: Row = {"item_key": key, "outcome": outcome, "error_class": why.error_class if why else None,
                    "error": _first_line(why.error) if why else None}
        task = own.get(key)
        if task is not None and task.status == "succeeded" and task.output_kind and task.output_digest is not None:
            ref = RecordRef(task.task_key, task.output_kind, task.output_digest)
            memo = (None, None, task.memo_digest, task.memo_inline)
            spread(decode(ref.kind, record_bytes(ref, memo, walk.blobs)), row)
        row.update(docs.columns(task.memo_provenance if task is not None else None))
        row.update(_usage(walk.run_id, stage, task, sources.get(key), usage.get(key)))
        rows.append(row)
    return rows


def _settled_outcome(tasks: Sequence[ExportTask], publish: Collection[str]) -> str:
    """A root item's outcome in a settled run (``settled_outcome``); ``superseded`` for a group item whose every
    task a replay superseded (store/reports.py: ITEM_OUTCOMES)."""
    live = [t.stage for t in tasks if t.status != "superseded"]
    return "superseded" if tasks and not live else settled_outcome(live, publish)


def _named(outcome: str) -> str:
    """An outcome as an export names it: the store's ``missing`` (no task yet) is reconcile's unaccounted."""
    return UNACCOUNTED if outcome == "missing" else outcome


class _Documents:
    """Provenance documents (runtime/provenance.py's JSON text) as the ``model``, ``prompt_version`` and
    ``provenance`` columns, each distinct document parsed once (a run's outputs share a handful)."""

    def __init__(self) -> None:
        self.seen: dict[str | None, dict[str, Any]] = {None: {"model": None, "prompt_version": None,
                                                             "provenance": None}}

    def columns(self, text: str | None) -> dict[str, Any]:
        found = self.seen.get(text)
        if found is None:
            found = document_columns(json.loads(text) if text else {})
            self.seen[text] = found
        return found

    @staticmethod
    def of(doc: Mapping[str, list[str]]) -> dict[str, Any]:
        return document_columns({k: v[0] if len(v) == 1 else v for k, v in doc.items()})


def document_columns(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The provenance columns of a document (name -> a value, or a list of values)."""
    def joined(name: str) -> str | None:
        value = doc.get(name)
        return None if value is None else ",".join(value) if isinstance(value, list) else str(value)

    return {"model": joined("model"), "prompt_version": joined("prompt_version"),
            "provenance": json.dumps(dict(sorted(doc.items()))) if doc else None}


def _deciding(tasks: Sequence[ExportTask], outcome: str, order: Mapping[str, int]) -> ExportTask | None:
    """The task that says why an item did not make it: its first (in key and stage order) whose status is
    the item's outcome; for an item in progress, its first open task that carries an error (a retry wait)."""
    ordered = sorted(tasks, key=lambda t: (t.item_key, order.get(t.stage, len(order))))
    if outcome in ("in_progress", "accepted"):
        return next((t for t in ordered if t.status in ("queued", "running") and t.error_class), None)
    return next((t for t in ordered if t.status == outcome), None)


def _first_line(text: str | None) -> str | None:
    return text.splitlines()[0] if text else None


def spread(value: Any, row: Row) -> None:
    """The value's columns into ``row``: a JSON object's top-level keys as ``value.KEY``, anything else as
    ``value``."""
    if isinstance(value, dict):
        for name, field in value.items():
            row[VALUE_PREFIX + name] = field
    else:
        row[VALUE] = value


def _usage(run_id: str | None, stage: str | None, task: ExportTask | PublishingTask | None, source: str | None,
           usage: ItemUsage | None) -> Row:
    """The provenance columns besides the document's: the task's declaration, the source, the usage."""
    priced = usage is not None and not (usage.provider_calls and usage.unpriced_calls >= usage.provider_calls)
    return {
        "run_id": run_id, "stage": stage,
        "stage_version": task.stage_version if task else None, "config_hash": task.config_hash if task else None,
        "source_digest": source, "tokens": usage.tokens if usage else 0,
        "cost": (usage.cost if priced else None) if usage else 0.0,
    }


# --- a collection's rows -----------------------------------------------------------------------------------------

def _collection_batches(store: SqlStore, collection: str, size: int) -> Iterator[list[Row]]:
    after: str | None = None
    while True:
        live = store.live_publications_after(collection, after, size)
        if not live:
            return
        yield _collection_rows(store, collection, live)
        if len(live) < size:
            return
        after = live[-1].item_key


def _collection_rows(store: SqlStore, collection: str, live: Sequence[LivePublication]) -> list[Row]:
    tasks = store.publishing_tasks([p.task_id for p in live if p.task_id is not None])
    made_by = store.export_tasks_provenance(list(tasks.values()))
    sources: dict[tuple[str, str], str | None] = {}
    usage: dict[tuple[str, str], ItemUsage] = {}
    for run_id in sorted({t.run_id for t in tasks.values()}):
        roots = [t.root_key for t in tasks.values() if t.run_id == run_id]
        sources.update(((run_id, k), d) for k, d in store.export_roots_sources(run_id, roots).items())
        usage.update(((run_id, k), u) for k, u in store.export_roots_usage(run_id, roots).items())
    rows = []
    for p in live:
        task = tasks.get(p.task_id) if p.task_id is not None else None
        row: Row = {"collection": collection, "item_key": p.item_key, "version": p.version, "outcome": "published",
                    "error_class": None, "error": None}
        if p.fields is not None:
            spread(json.loads(p.fields), row)
        root = (task.run_id, task.root_key) if task else None
        row.update(_Documents.of(made_by.get(task.id, {}) if task else {}))
        rows.append(row | _usage(p.run_id, task.stage if task else None, task, sources.get(root) if root else None,
                                 usage.get(root) if root else None))
    return rows
