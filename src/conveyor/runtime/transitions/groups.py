"""Making a run's groups: once every item of the run has settled at a group stage's parent, one task per group.

A worker with nothing to claim asks for the group stages of its pipeline whose runs have settled upstream
(store/groups.py: the run's task totals, not a scan of its items). For each, in one transaction: it takes the
run's wait (one process makes a run's groups), reads the members (the items that succeeded at the parent, by
key), gives each its group key (``by="meta.FIELD"``: the item's manifest meta; ``by=`` a function: of its output,
memoised by the output's digest so a re-run reads no output again; ``kind="reduce"``: one group, ``*``) and
plans one task per group on a group item ``group:KEY``, whose input hashes the sorted (item key, output digest)
pairs of its members: an unchanged group is answered from the memo.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from conveyor.blobs import Blobs
from conveyor.pipeline import GROUP_PREFIX, Stage
from conveyor.runtime.expand import Seed
from conveyor.runtime.groups import REDUCE_KEY, member_entry, members_data
from conveyor.runtime.transitions.readiness import Readiness
from conveyor.runtime.values import Ref, load_value, store_value
from conveyor.store import NewItem
from conveyor.store.groups import Member
from conveyor.store.queuecounts import OpenTally
from conveyor.store.runtotals import RunTally

log = logging.getLogger("conveyor.transitions")
NO_KEY = "null"  # the group of members whose meta field is missing, or whose by= gave None
PAGE = 5_000  # members read, keyed and encoded at a time


class _NotReady(Exception):
    """Rolls back taking a wait whose run turned out not to have settled."""


class KeyFailures:
    """The members a making of groups left out because the stage's by= function raised on them: how many, and
    the first one (its key and error)."""

    def __init__(self) -> None:
        self.count = 0
        self.first: str | None = None

    def add(self, item_key: str, error: str) -> None:
        self.count += 1
        if self.first is None:
            self.first = f"{item_key}: {error}"


class Groups(Readiness):
    def make_groups(self, now: float, blobs: Blobs, run_id: str | None = None) -> int:
        """Make the groups of every group stage whose run has settled at its parent (of one run, when given);
        returns the tasks this queued (group tasks not answered from the memo, and what follows those that were)."""
        made = 0
        for run, stage in self.store.group_waits(self.pipeline.name, run_id):
            if stage not in self.pipeline.graph.order or self.pipeline[stage].kind not in ("group", "reduce"):
                continue  # a stage of another declaration: its workers make it
            upstream = self.pipeline.graph.above(stage)
            if self.store.open_tasks_at(run, upstream):
                continue
            try:
                with self.store.transaction():
                    if not self.store.take_group_wait(run, stage, now):
                        continue
                    if self.store.open_tasks_at(run, upstream):  # settled is read again with the wait held
                        raise _NotReady
                    made += self._make(run, self.pipeline[stage], now, blobs)
            except _NotReady:
                continue
        return made

    def _make(self, run_id: str, stage: Stage, now: float, blobs: Blobs) -> int:
        assert stage.after is not None
        groups: dict[str, list[bytes]] = {}  # group key -> its members' encoded entries, in item-key order
        members = 0
        failures = KeyFailures()
        for page in _pages(self.store.group_members(run_id, stage.after), PAGE):
            refs = self._member_refs(page, blobs)
            keys = self._group_keys(run_id, stage, page, refs, blobs, failures)
            for member in page:
                key, ref = keys.get(member.item_key), refs.get(member.task_key)
                if key is not None and ref is not None:
                    groups.setdefault(key, []).append(member_entry(member.item_key, ref))
            members += len(page)
        if stage.kind == "reduce" and not groups:
            groups[REDUCE_KEY] = []  # one group for the whole run, even an empty one
        seeds: list[Seed] = []
        items: list[NewItem] = []
        for key in sorted(groups):
            ref = store_value(*members_data(key, groups.pop(key)), blobs)
            if ref.inline is not None and not blobs.exists(ref.digest):
                blobs.put(ref.inline)  # kept whatever its size: `conveyor diff` reads a group's members from it
            item = GROUP_PREFIX + key
            seeds.append(Seed(run_id, item, item, stage.name, ref))
            items.append(NewItem(run_id, item, None, item, ref.digest, ref.size, now))
        self.store.note_key_failures(run_id, stage.name, stage.version, failures.count, failures.first, now)
        if failures.count:
            log.warning("%d member(s) of run %s left out of every group of %s: its by= failed on them (first: %s)",
                        failures.count, run_id, stage.name, failures.first,
                        extra={"event": "group_key_failed", "run": run_id, "stage": stage.name})
        totals, opened = RunTally(), OpenTally()
        queued = self.write_planned(seeds, items, now, totals, opened)
        self.store.add_run_totals(totals)
        self.store.add_open_tasks(opened)
        self.store.notify()
        log.info("made %d group(s) of %s for run %s from %d member(s)", len(seeds), stage.name, run_id,
                 members, extra={"event": "groups_made", "run": run_id, "stage": stage.name})
        return queued

    def _member_refs(self, members: Sequence[Member], blobs: Blobs) -> dict[str, Ref]:
        """Task key -> each member's output, from the memo (with its inline bytes)."""
        refs: dict[str, Ref] = {}
        for start in range(0, len(members), 1000):
            part = members[start:start + 1000]
            memo = self.store.memo_rows([m.task_key for m in part])
            for m in part:
                hit = memo.get(m.task_key)
                if hit is not None and hit[2] == m.output_digest:
                    refs[m.task_key] = Ref(hit[1], hit[2], hit[4], hit[3])
                elif blobs.exists(m.output_digest):  # not memoised (a 64-bit key taken): read from the blobs
                    refs[m.task_key] = Ref(m.output_kind, m.output_digest, 0, None)
        return refs

    def _group_keys(self, run_id: str, stage: Stage, members: Sequence[Member], refs: dict[str, Ref],
                    blobs: Blobs, failures: KeyFailures) -> dict[str, str]:
        """Item key -> its group key; members whose key cannot be made (the by= function raised) are left out of
        every group and counted in ``failures``."""
        if stage.kind == "reduce":
            return {m.item_key: REDUCE_KEY for m in members}
        if isinstance(stage.by, str):
            field = stage.by.removeprefix("meta.")
            metas = self.store.item_metas({(run_id, m.root_key) for m in members})
            return {m.item_key: group_key(json.loads(metas[run_id, m.root_key]).get(field)
                                     if (run_id, m.root_key) in metas else None) for m in members}
        assert stage.by is not None
        declaration = key_declaration(self.pipeline.name, stage.name, stage.version, stage.config_hash)
        known = self.store.group_keys(declaration, [m.output_digest for m in members])
        made: dict[str, str] = {}
        failed: dict[str, str] = {}  # output digest -> the by= function's error on it
        for m in members:
            if m.output_digest in known or m.output_digest in made or m.output_digest in failed \
                    or m.task_key not in refs:
                continue
            try:
                made[m.output_digest] = group_key(stage.by(load_value(refs[m.task_key], blobs)))
            except Exception as exc:  # the by= function's error leaves this member out of every group
                failed[m.output_digest] = f"{type(exc).__name__}: {exc}"[:300]
        self.store.keep_group_keys(declaration, made)
        known.update(made)
        for m in members:
            if m.output_digest in failed:
                failures.add(m.item_key, failed[m.output_digest])
        return {m.item_key: known[m.output_digest] for m in members if m.output_digest in known}


def _pages(members: Iterator[Member], size: int) -> Iterator[list[Member]]:
    page: list[Member] = []
    for member in members:
        page.append(member)
        if len(page) >= size:
            yield page
            page = []
    if page:
        yield page


def key_declaration(pipeline: str, stage: str, version: str, config_hash: str) -> str:
    """What the group keys a by= function gave are memoised under (``group_keys.declaration``)."""
    return json.dumps([pipeline, stage, version, config_hash])


def group_key(value: Any) -> str:
    """The group key of a by= value: a string as it is, None as NO_KEY, anything else as sorted JSON."""
    if value is None:
        return NO_KEY
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)
