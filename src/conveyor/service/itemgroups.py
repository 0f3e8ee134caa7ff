"""The groups an item is a member of: where its journey goes past a group stage (``kind="group"`` or
``"reduce"``), for `conveyor show` and the item page.

A group's tasks are the group item's (``group:KEY``), not the member's, so they are found by the member's
group key, in a few primary-key lookups whatever the run's size: a reduce has the one key; a by= function's
key is memoised under the stage's declaration and the member's output digest (``group_keys``); a key by a
meta field is one of the root item's meta values, the group that exists under it (when more than one does,
the one whose input names the member, read only when it is small).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from conveyor.blobs import Blobs
from conveyor.pipeline import GROUP_PREFIX
from conveyor.runtime.groups import REDUCE_KEY
from conveyor.runtime.transitions.groups import NO_KEY, group_key, key_declaration
from conveyor.store import RunRecord, SqlStore
from conveyor.store.selection import SelectedTask

GROUP_KINDS = ("group", "reduce")
READ_UP_TO = 8 * 1024 * 1024  # bytes of a group's input read to tell which of several groups holds a member


def group_tasks(store: SqlStore, blobs: Blobs, run: RunRecord, meta: dict[str, Any] | None,
                tasks: Sequence[SelectedTask]) -> list[SelectedTask]:
    """The tasks of the groups ``tasks`` (an item's and its fan-out descendants') are members of: each group
    stage's task and those of the stages below it, in the group item."""
    graph = json.loads(run.stages)
    found: dict[int, SelectedTask] = {}
    for stage in graph:
        if stage.get("kind") not in GROUP_KINDS:
            continue
        members = [t for t in tasks if t.stage == stage.get("after") and t.status == "succeeded"
                   and t.output_digest is not None]
        below = {stage["name"], *_below(graph, stage["name"])}
        for key in _group_keys(store, blobs, run, stage, members, meta):
            item = GROUP_PREFIX + key
            found.update((t.id, t) for t in store.item_tasks(run.run_id, item, item) if t.stage in below)
    return list(found.values())


def _group_keys(store: SqlStore, blobs: Blobs, run: RunRecord, stage: dict[str, Any],
                members: Sequence[SelectedTask], meta: dict[str, Any] | None) -> list[str]:
    if not members:
        return []
    if stage["kind"] == "reduce":
        return [REDUCE_KEY]
    declaration = key_declaration(run.pipeline, stage["name"], str(stage.get("version")),
                                  str(stage.get("config_hash")))
    memoised = store.group_keys(declaration, [str(t.output_digest) for t in members])
    if memoised:
        return sorted(set(memoised.values()))
    candidates = [k for k in _meta_keys(meta) if _head(store, run.run_id, stage["name"], k) is not None]
    if len(candidates) <= 1:
        return candidates
    return [k for k in candidates if _holds(blobs, _head(store, run.run_id, stage["name"], k), members)]


def _meta_keys(meta: dict[str, Any] | None) -> list[str]:
    """Every key a by="meta.FIELD" group stage could have given the root item (its meta's values; NO_KEY)."""
    values = list((meta or {}).values())
    return sorted({group_key(v) for v in values} | {NO_KEY})


def _head(store: SqlStore, run_id: str, stage: str, key: str) -> SelectedTask | None:
    item = GROUP_PREFIX + key
    return next((t for t in store.item_tasks(run_id, item, item, stage) if t.item_key == item), None)


def _holds(blobs: Blobs, head: SelectedTask | None, members: Iterable[SelectedTask]) -> bool:
    """Whether a group's input (runtime/groups.py ``members_data``) names one of ``members``; False when it is
    too large to read for a page."""
    if head is None or head.input_size > READ_UP_TO:
        return False
    data = head.input_inline if head.input_inline is not None else blobs.get(head.input_digest)
    return any(b"[" + orjson.dumps(m.item_key) + b"," in data for m in members)


def _below(graph: Sequence[dict[str, Any]], name: str) -> set[str]:
    """Every stage downstream of ``name`` in a run's recorded graph."""
    children: dict[str, list[str]] = {}
    for s in graph:
        for parent in s.get("parents") or ([s["after"]] if s.get("after") is not None else []):
            children.setdefault(parent, []).append(s["name"])
    found: set[str] = set()
    frontier = [name]
    while frontier:
        frontier = [c for f in frontier for c in children.get(f, []) if c not in found]
        found.update(frontier)
    return found
