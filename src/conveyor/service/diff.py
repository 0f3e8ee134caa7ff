"""What a reprocess changed: ``conveyor diff RUN_A RUN_B``, root item by root item.

Both runs are walked in key order, a chunk at a time, and merged; a record is read only when the two
runs' records of an item differ by digest, so memory holds one chunk of each run, never a run. A group item
(``group:KEY``) is compared by its members and its group stages' outputs (service/groupdiff.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

from conveyor.blobs import Blobs
from conveyor.errors import UserError
from conveyor.service.groupdiff import GroupSide, is_group, member_changes
from conveyor.service.records import ABSENT, RunGraph, read_records, shown
from conveyor.service.report import find_run
from conveyor.store import RunRecord, SqlStore
from conveyor.store.diffs import RecordRef

CHUNK = 1000
CHANGES = ("new", "removed", "changed", "unchanged", "newly_failing", "newly_accepted")
MADE_IT = ("accepted", "published", "completed")
REFUSED = ("failed", "dead_lettered", "rejected")

T = TypeVar("T")


class Side(NamedTuple):
    """An item in one run: its outcome (``missing`` when it has no task) and where its record is."""

    outcome: str
    ref: RecordRef | None


Pair = tuple[str, Side | None, Side | None]


def diff_runs(store: SqlStore, blobs: Blobs, run_a: str, run_b: str, limit: int = 1000,
              chunk: int = CHUNK) -> dict[str, Any]:
    """Every root item of either run, classified (``CHANGES``); ``items`` lists the first ``limit`` that
    are not unchanged, in key order, with their changed record fields; ``counts`` covers them all."""
    a, b = find_run(store, run_a), find_run(store, run_b)
    if a.pipeline != b.pipeline:
        raise UserError(f"run {a.run_id} is of pipeline {a.pipeline!r} and run {b.run_id} of {b.pipeline!r}: "
                        "diff compares two runs of one pipeline")
    counts = dict.fromkeys(CHANGES, 0)
    items: list[dict[str, Any]] = []
    groups = (GroupSide(store, blobs, a), GroupSide(store, blobs, b))
    for batch in batched(merge_walks(walk_items(store, a, chunk), walk_items(store, b, chunk)), chunk):
        for entry in _compare(store, blobs, batch, groups):
            counts[entry["change"]] += 1
            if entry["change"] != "unchanged" and len(items) < limit:
                items.append(entry)
    return {"run_a": a.run_id, "run_b": b.run_id, "pipeline": a.pipeline, "counts": counts, "items": items}


def walk_items(store: SqlStore, run: RunRecord, chunk: int) -> Iterator[tuple[str, Side]]:
    """(key, Side) of every root item of ``run``, in key order, ``chunk`` items per read."""
    graph = RunGraph.of(run)
    after: str | None = None
    while True:
        rows = store.outcomes_after(run.run_id, graph.stages, after, chunk)
        if not rows:
            return
        refs = (store.record_refs_between(run.run_id, graph.record_stage, rows[0][0], rows[-1][0])
                if graph.record_stage else {})
        yield from ((key, Side(outcome, refs.get(key))) for key, outcome in rows)
        if len(rows) < chunk:
            return
        after = rows[-1][0]


def merge_walks(left: Iterator[tuple[str, Side]], right: Iterator[tuple[str, Side]]) -> Iterator[Pair]:
    """Two key-ordered streams as one, an item of both runs as one pair (keys compare as the store orders
    them: by code point, which is UTF-8 byte order)."""
    a, b = next(left, None), next(right, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a[0] < b[0]):
            assert a is not None
            yield a[0], a[1], None
            a = next(left, None)
        elif a is None or b[0] < a[0]:
            yield b[0], None, b[1]
            b = next(right, None)
        else:
            yield a[0], a[1], b[1]
            a, b = next(left, None), next(right, None)


def batched(things: Iterable[T], size: int) -> Iterator[list[T]]:
    """Lists of ``size`` (the last one shorter), streamed."""
    batch: list[T] = []
    for thing in things:
        batch.append(thing)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _compare(store: SqlStore, blobs: Blobs, batch: Sequence[Pair],
             groups: tuple[GroupSide, GroupSide]) -> Iterator[dict[str, Any]]:
    """Each pair's entry; the records of the items whose records differ are read, a batch at a time."""
    differ = [(key, a.ref, b.ref) for key, a, b in batch
              if a is not None and b is not None and a.ref is not None and b.ref is not None
              and (a.ref.digest, a.ref.kind) != (b.ref.digest, b.ref.kind)]
    records_a = read_records(store, blobs, {key: ref_a for key, ref_a, _ in differ})
    records_b = read_records(store, blobs, {key: ref_b for key, _, ref_b in differ})
    grouped = _group_entries(store, blobs, [key for key, _, _ in batch if is_group(key)], groups)
    for key, a, b in batch:
        fields = field_changes(records_a[key], records_b[key]) if key in records_a else []
        members: dict[str, Any] = {}
        if key in grouped:
            fields, members = grouped[key]
        entry: dict[str, Any] = {"item_key": key, "change": change(a, b, fields),
                                 "outcome_a": a.outcome if a else None, "outcome_b": b.outcome if b else None,
                                 "fields": fields}
        if is_group(key):
            if members and entry["change"] == "unchanged":
                entry["change"] = "changed"
            entry["members"] = members
        yield entry


def _group_entries(store: SqlStore, blobs: Blobs, keys: Sequence[str], groups: tuple[GroupSide, GroupSide]
                   ) -> dict[str, tuple[list[dict[str, Any]], dict[str, Any]]]:
    """Group item key -> (its changed output fields, by stage: ``STAGE.FIELD``; its member changes by stage)."""
    if not keys:
        return {}
    side_a, side_b = groups
    tasks_a, tasks_b = side_a.tasks(keys), side_b.tasks(keys)
    found: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {}
    for key in keys:
        mine_a, mine_b = tasks_a.get(key, {}), tasks_b.get(key, {})
        refs_a, refs_b = side_a.records(mine_a), side_b.records(mine_b)
        differ = {stage for stage in refs_a.keys() & refs_b.keys()
                  if (refs_a[stage].digest, refs_a[stage].kind) != (refs_b[stage].digest, refs_b[stage].kind)}
        read_a = read_records(store, blobs, {stage: refs_a[stage] for stage in differ})
        read_b = read_records(store, blobs, {stage: refs_b[stage] for stage in differ})
        fields = field_changes(read_a, read_b) if differ else []
        found[key] = (fields, member_changes(side_a.members(mine_a), side_b.members(mine_b)))
    return found


def change(a: Side | None, b: Side | None, fields: Sequence[dict[str, Any]]) -> str:
    """How an item changed from run A to run B (see ``CHANGES``)."""
    if a is None:
        return "new"
    if b is None:
        return "removed"
    if a.outcome in MADE_IT and b.outcome in REFUSED:
        return "newly_failing"
    if (a.outcome in REFUSED or a.outcome == "awaiting_review") and b.outcome in MADE_IT:
        return "newly_accepted"
    same_record = (a.ref is None) == (b.ref is None)
    return "unchanged" if not fields and same_record and a.outcome == b.outcome else "changed"


def field_changes(a: Any, b: Any, path: str = "") -> list[dict[str, Any]]:
    """``[{"field", "a", "b"}]`` for each field that differs: nested dicts by dotted path, anything else
    (lists too) compared whole; a field one record lacks is ``null`` there. A record that is not a dict
    is one field, ``(record)``."""
    if isinstance(a, dict) and isinstance(b, dict):
        found: list[dict[str, Any]] = []
        for name in sorted(a.keys() | b.keys()):
            found += field_changes(a.get(name, ABSENT), b.get(name, ABSENT), f"{path}.{name}" if path else name)
        return found
    if _same(a, b):
        return []
    return [{"field": path or "(record)", "a": _value(a), "b": _value(b)}]


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON says it (``1`` is not ``true``, nor ``1.0``)."""
    if a is ABSENT or b is ABSENT or isinstance(a, bytes) or isinstance(b, bytes):
        return a is b or (type(a) is type(b) and a == b)
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _value(value: Any) -> Any:
    return None if value is ABSENT else shown(value)
