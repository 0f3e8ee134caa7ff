"""`conveyor show RUN ITEM`: everything a run knows about one item, in one document.

Its tasks stage by stage (a root item's fan-out children after it, in key order), each with its status, its
output as a reader can take it in, its provenance, why it last ran again (a replay), and every attempt with
its error class, usage and provenance. It only reads, and reads one item: the tasks are one range of the
(run, root, item, stage) index, the attempts one lookup per few hundred tasks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from conveyor.blobs import Blobs
from conveyor.errors import BlobError, NotFound, UserError
from conveyor.runtime.attemptlog import decode as decode_logs
from conveyor.runtime.values import Ref, load_value
from conveyor.service.itemgroups import group_tasks
from conveyor.service.records import RunGraph, read_records
from conveyor.service.report import find_run
from conveyor.service.selection import provenance
from conveyor.store import RunRecord, SqlStore
from conveyor.store.diffs import RecordRef
from conveyor.store.reviews import ReviewEntry
from conveyor.store.selection import SelectedTask
from conveyor.store.show import ItemRow, ReplayedLetter

OUTPUT_MAX = 20_000  # characters of JSON shown of an output; a longer one is cut (see ``shown_output``)
TEXT_MAX = 200  # characters of a bytes output shown as text


def show_item(store: SqlStore, blobs: Blobs, run_id: str, item_key: str, stage: str | None = None,
              offset: int = 0, limit: int | None = None) -> dict[str, Any]:
    """One item of a run: ``{"run_id", "item_key", "pipeline", "outcome", "meta", "source", "trace_id", "journey",
    "tasks_total", "tasks"}`` (docs/reference/json.md names every field). ``item_key`` is a root item
    (its fan-out descendants' tasks come after its own, then those of the groups it is a member of) or a child
    (``doc.pdf¶3``: it and its descendants); ``stage`` keeps one stage; ``offset`` and ``limit`` a page of the
    tasks (outputs, attempts and reviews are read for that page only)."""
    run = find_run(store, run_id)
    item = _item(store, run, item_key)
    order = _stage_order(run)
    if stage is not None and stage not in order:
        raise UserError(f"--stage {stage!r}: run {run.run_id}'s pipeline has no such stage ({', '.join(order)})")
    root = item if item.parent_key is None else store.item_row(run.run_id, item.root_key) or item
    meta = json.loads(root.meta) if root.meta else None
    own = store.item_tasks(run.run_id, item.root_key, item.item_key, stage)
    grouped = [t for t in group_tasks(store, blobs, run, meta, own) if stage is None or t.stage == stage]
    tasks = sorted(own, key=lambda t: (t.item_key, order.get(t.stage, len(order)), t.id)) + sorted(
        grouped, key=lambda t: (t.item_key, order.get(t.stage, len(order)), t.id))
    shown = tasks[offset:] if limit is None else tasks[offset:offset + limit]
    return {
        "run_id": run.run_id, "item_key": item.item_key, "pipeline": run.pipeline,
        "outcome": _outcome(store, run, root.root_key), "meta": meta,
        "source": {"digest": root.source_digest, "size": root.source_size}, "trace_id": _trace_id(root),
        "journey": journey(tasks), "tasks_total": len(tasks),
        "tasks": [{**t, **_edges(run, t["stage"])} for t in _tasks(store, blobs, run.run_id, shown)],
    }


def journey(tasks: Sequence[SelectedTask]) -> dict[str, dict[str, int]]:
    """Stage -> the item's tasks there by status (a fan-out's children and groups counted with it): the states
    the item page colours the pipeline's graph by."""
    found: dict[str, dict[str, int]] = {}
    for t in tasks:
        at = found.setdefault(t.stage, {})
        at[t.status] = at.get(t.status, 0) + 1
    return found


def _edges(run: RunRecord, stage: str) -> dict[str, Any]:
    """A task's place in the run's graph: its stage's ``kind`` and ``after`` (every parent, in order: a join has
    several, a first stage none), so the item's journey reads as the graph it followed."""
    for s in json.loads(run.stages):
        if s["name"] == stage:
            return {"kind": s.get("kind", "map"),
                    "after": s.get("parents") or ([s["after"]] if s.get("after") is not None else [])}
    return {"kind": None, "after": []}


def _trace_id(root: ItemRow) -> str | None:
    """The id of the item's trace (runtime/tracing.py), to look it up in a tracing backend; None when untraced."""
    return root.traceparent.split("-")[1] if root.traceparent else None


def _item(store: SqlStore, run: RunRecord, item_key: str) -> ItemRow:
    item = store.item_row(run.run_id, item_key)
    if item is None:
        raise NotFound(f"no item {item_key!r} in run {run.run_id}; `conveyor select --run {run.run_id}` lists its "
                       "items' tasks")
    return item


def _stage_order(run: RunRecord) -> dict[str, int]:
    """Stage name -> its place in the run's graph (declaration order runs parents first)."""
    return {s["name"]: i for i, s in enumerate(json.loads(run.stages))}


def _outcome(store: SqlStore, run: RunRecord, root_key: str) -> str | None:
    """The root item's reconciliation outcome; None while it has no task (reconcile counts it unaccounted)."""
    outcome = store.outcomes_of(run.run_id, RunGraph.of(run).stages, [root_key]).get(root_key)
    return None if outcome in (None, "missing") else outcome


def _tasks(store: SqlStore, blobs: Blobs, run_id: str, tasks: Sequence[SelectedTask]) -> list[dict[str, Any]]:
    ids = [t.id for t in tasks]
    made_by = provenance(store, tasks)
    outputs = _outputs(store, blobs, tasks)
    history = store.attempt_history(run_id, ids)
    replays = _replays(store, run_id, tasks)
    reviews = _reviews(store, blobs, tasks)
    return [{
        "task_id": t.id, "item_key": t.item_key, "stage": t.stage, "status": t.status, "cached": bool(t.cached),
        "attempts": t.attempts, "tier": t.tier, "error_class": t.error_class, "error": t.last_error,
        "stage_version": t.stage_version, "config_hash": t.config_hash, "task_key": t.task_key,
        "created_at": t.created_at, "finished_at": t.finished_at, "provenance": made_by[t.id],
        "output": outputs[t.id][0], "output_error": outputs[t.id][1], "replay": replays.get(t.id),
        "history": [attempt(row) for row in history.get(t.id, [])],
        "reviews": reviews.get(t.id, []),
    } for t in tasks]


# --- outputs -----------------------------------------------------------------------------------------------

def _outputs(store: SqlStore, blobs: Blobs, tasks: Sequence[SelectedTask]) -> dict[int, tuple[Any, str | None]]:
    """Task id -> (its output as shown, or None; why there is none, or None). The bytes are read as records
    are (inline in the memo, else from the blob store), in one memo lookup for every task that has them."""
    found: dict[int, tuple[Any, str | None]] = {}
    refs: dict[str, RecordRef] = {}
    for t in tasks:
        if t.status != "succeeded":
            found[t.id] = (None, f"no output: the task is {t.status}")
        elif t.output_kind is None or t.output_digest is None:
            found[t.id] = (None, "no output recorded for this task")
        else:
            refs[str(t.id)] = RecordRef(t.task_key, t.output_kind, t.output_digest)
    values = read_records(store, blobs, refs, strict=False)
    for key, ref in refs.items():
        if key in values:
            found[int(key)] = (shown_output(ref.kind, values[key]), None)
        else:
            found[int(key)] = (None, _unreadable(store, blobs, key, ref))
    return found


def _unreadable(store: SqlStore, blobs: Blobs, key: str, ref: RecordRef) -> str:
    """Why an output's bytes could not be read (read again, alone, for the blob store's own words)."""
    try:
        read_records(store, blobs, {key: ref})
    except BlobError as exc:
        return f"cannot read the output: {exc}"
    return "cannot read the output"


def shown_output(kind: str, value: Any) -> Any:
    """An output as ``show`` gives it: JSON values as they are, bytes as ``{"bytes": N, "text": ...}`` (the
    first TEXT_MAX characters when they are UTF-8, else None), a fan-out list as ``{"fanout": N}``, and a JSON
    value longer than OUTPUT_MAX characters as ``{"cut": true, "chars": N, "head": "<its first OUTPUT_MAX
    characters of JSON>"}``."""
    if kind == "fanout":
        return {"fanout": len(value)}
    if isinstance(value, bytes):
        return {"bytes": len(value), "text": _text(value)}
    text = json.dumps(value, ensure_ascii=False)
    if len(text) > OUTPUT_MAX:
        return {"cut": True, "chars": len(text), "head": text[:OUTPUT_MAX]}
    return value


def _text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")[:TEXT_MAX]
    except UnicodeDecodeError:
        return None


# --- why it ran again, and how each attempt went --------------------------------------------------------------

def _replays(store: SqlStore, run_id: str, tasks: Sequence[SelectedTask]) -> dict[int, dict[str, Any]]:
    """Task id -> the last time it was queued again with a reason: the replay that re-opened (or superseded)
    it, or a `dlq replay` of a dead letter that came after that replay (which records no id, note or who)."""
    entries = store.replay_entries([t.replay_id for t in tasks if t.replay_id is not None])
    letters = store.replayed_letters(run_id, [t.id for t in tasks])
    found: dict[int, dict[str, Any]] = {}
    for t in tasks:
        entry = entries.get(t.replay_id) if t.replay_id is not None else None
        letter = letters.get(t.id)
        if letter is not None and (entry is None or letter.created_at > entry[2]):
            found[t.id] = _from_letter(letter)
        elif entry is not None and t.replay_id is not None:
            reason, note, at, by = entry
            found[t.id] = {"id": t.replay_id, "reason": reason, "note": note, "at": at, "by": by}
    return found


def _from_letter(letter: ReplayedLetter) -> dict[str, Any]:
    return {"id": None, "reason": letter.reason, "note": None, "at": letter.replayed_at, "by": None}


def attempt(row: dict[str, Any]) -> dict[str, Any]:
    """An attempt row as JSON: flags as booleans, its provenance document and its log lines decoded."""
    repaired = row["repaired"]
    return row | {"invoked": bool(row["invoked"]), "repaired": None if repaired is None else bool(repaired),
                  "provenance": json.loads(row["provenance"]) if row["provenance"] else None,
                  "logs": decode_logs(row["logs"]), "logs_dropped": int(row["logs_dropped"] or 0)}


def _reviews(store: SqlStore, blobs: Blobs, tasks: Sequence[SelectedTask]) -> dict[int, list[dict[str, Any]]]:
    """Task id -> its review entries: why each waited, the answer a reviewer saw (``candidate``, as ``show``
    gives outputs) and what they decided (``decision``, ``by``, ``why``, ``edits``)."""
    found: dict[int, list[dict[str, Any]]] = {}
    for task_id, entries in store.task_reviews([t.id for t in tasks]).items():
        found[task_id] = [_review(e, blobs) for e in entries]
    return found


def _review(e: ReviewEntry, blobs: Blobs) -> dict[str, Any]:
    try:
        value = load_value(Ref(e.candidate_kind, e.candidate_digest, e.candidate_size, e.candidate_inline), blobs)
        candidate, unreadable = shown_output(e.candidate_kind, value), None
    except BlobError as exc:
        candidate, unreadable = None, f"cannot read the answer: {exc}"
    return {"id": e.id, "reason_class": e.reason_class, "reason": e.reason, "confidence": e.confidence,
            "tier": e.tier, "created_at": e.created_at, "candidate": candidate, "candidate_error": unreadable,
            "decision": e.decision, "decided_at": e.decided_at, "by": e.decided_by, "why": e.why,
            "edits": json.loads(e.edits) if e.edits else None}
