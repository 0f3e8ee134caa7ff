"""Group items in `conveyor diff`: which members a group gained, lost or saw change between two runs.

A group item (``group:KEY``) has no record of a root item's kind: what it is, is its members and its group
stages' outputs. A group task's input holds its members (item key and output digest, runtime/groups.py), kept in
the blob store by its digest whatever its size (runtime/transitions/groups.py), so both runs' memberships are
read from there, one group item at a time, never a run's members at once. A group a replay made vanish (every task
superseded) has no members.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from conveyor.blobs import Blobs
from conveyor.errors import BlobError
from conveyor.pipeline.graph import GROUP_PREFIX
from conveyor.store import RunRecord, SqlStore
from conveyor.store.diffs import GroupTask, RecordRef

MEMBERS_LISTED = 100  # member keys listed per change of a group stage (counts cover them all)
Members = dict[str, str]  # member item key -> its output digest


def group_stages(run: RunRecord) -> tuple[str, ...]:
    """The run's group stages and the stages after them (a group item's tasks), in graph order."""
    graph = json.loads(run.stages)
    found: list[str] = []
    for stage in graph:
        parents = stage.get("parents") or [stage.get("after")]
        if stage["kind"] in ("group", "reduce") or any(p in found for p in parents):
            found.append(stage["name"])
    return tuple(found)


def is_group(key: str) -> bool:
    return key.startswith(GROUP_PREFIX)


class GroupSide:
    """One run's group items as the diff reads them: per item, its live tasks by stage."""

    def __init__(self, store: SqlStore, blobs: Blobs, run: RunRecord) -> None:
        self.store, self.blobs, self.run = store, blobs, run
        self.stages = group_stages(run)
        self.kinds = {s["name"]: s["kind"] for s in json.loads(run.stages)}

    def tasks(self, keys: Sequence[str]) -> dict[str, dict[str, GroupTask]]:
        """Item key -> stage -> its task (superseded tasks left out: what a replay took away is no part of it)."""
        found: dict[str, dict[str, GroupTask]] = {}
        if not self.stages or not keys:
            return found
        for task in self.store.group_tasks(self.run.run_id, keys, self.stages):
            if task.status != "superseded":
                found.setdefault(task.item_key, {})[task.stage] = task
        return found

    def members(self, tasks: Mapping[str, GroupTask]) -> dict[str, Members | None]:
        """Group stage -> its members (None: not readable, a group made before its members were kept)."""
        found: dict[str, Members | None] = {}
        for stage, task in tasks.items():
            if self.kinds.get(stage) not in ("group", "reduce"):
                continue
            data = task.input_inline
            if data is None:
                try:
                    data = self.blobs.get(task.input_digest)
                except BlobError:
                    found[stage] = None
                    continue
            found[stage] = {key: ref["d"] for key, ref in orjson.loads(data)["m"]}
        return found

    def records(self, tasks: Mapping[str, GroupTask]) -> dict[str, RecordRef]:
        """Stage -> the output of each of the item's tasks that succeeded."""
        return {stage: RecordRef(t.task_key, t.output_kind, t.output_digest) for stage, t in tasks.items()
                if t.status == "succeeded" and t.output_kind is not None and t.output_digest is not None}


def member_changes(a: Mapping[str, Members | None], b: Mapping[str, Members | None]) -> dict[str, dict[str, Any]]:
    """Per group stage whose members differ: the keys added, removed and changed (their output's digest), each
    list cut at MEMBERS_LISTED, with ``counts`` of them all; ``unknown`` when one side's members cannot be read."""
    found: dict[str, dict[str, Any]] = {}
    for stage in sorted(a.keys() | b.keys()):
        before, after = a.get(stage, {}), b.get(stage, {})
        if before is None or after is None:
            found[stage] = {"unknown": True}
            continue
        added = sorted(after.keys() - before.keys())
        removed = sorted(before.keys() - after.keys())
        changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
        if added or removed or changed:
            found[stage] = {"added": added[:MEMBERS_LISTED], "removed": removed[:MEMBERS_LISTED],
                            "changed": changed[:MEMBERS_LISTED],
                            "counts": {"added": len(added), "removed": len(removed), "changed": len(changed)}}
    return found
