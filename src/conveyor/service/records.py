"""An item's accepted record: which stage's output it is, reading it, and a seeded quality sample of them
(for ``reconcile``; ``conveyor diff`` compares them)."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, NamedTuple

from conveyor.errors import BlobError
from conveyor.runtime.values import decode
from conveyor.store import RunRecord, SqlStore
from conveyor.store.diffs import RecordRef
from conveyor.store.reports import OutcomeStages

if TYPE_CHECKING:
    from conveyor.blobs import Blobs

MAX_SLICE_VALUES = 50
KEY_CHUNK = 5000


@dataclass(frozen=True)
class RunGraph:
    """What a run's graph (``runs.stages``) says about its items' outcomes and records: the stages outcomes
    depend on, and ``record_stage``, whose output is an item's accepted record (see ``record_stage``)."""

    stages: OutcomeStages
    record_stage: str | None

    @classmethod
    def of(cls, run: RunRecord) -> RunGraph:
        graph = json.loads(run.stages)
        accept = tuple(s["name"] for s in graph if s.get("accept"))
        publish = tuple(s["name"] for s in graph if s["kind"] == "publish")
        past = tuple(s["name"] for s in graph if _ancestors(graph, s) & set(accept))
        gathers = [s for s in graph if s["kind"] == "gather" and s.get("on_child_failure") == "skip"]
        skipped = tuple(sorted({name for g in gathers for name in _gather_path(graph, g)}))
        return cls(OutcomeStages(publish, accept, past, skipped, tuple(g["name"] for g in gathers)),
                   record_stage(graph))


def _ancestors(graph: Sequence[dict[str, Any]], stage: dict[str, Any]) -> set[str]:
    """Every stage upstream of ``stage`` in a run's recorded graph (a join's every parent)."""
    parents = {s["name"]: s.get("parents") or ([s["after"]] if s.get("after") is not None else []) for s in graph}
    found: set[str] = set()
    frontier = list(parents.get(stage["name"], []))
    while frontier:
        name = frontier.pop()
        if name not in found:
            found.add(name)
            frontier += parents.get(name, [])
    return found


def _gather_path(graph: Sequence[dict[str, Any]], gather: dict[str, Any]) -> set[str]:
    """The stages a gather's children pass from their fan-out to the gathered stage (that one included)."""
    by_name = {s["name"]: s for s in graph}
    found: set[str] = set()
    frontier = [gather["after"]]
    while frontier:
        name = frontier.pop()
        stage = by_name.get(name)
        if stage is None or stage["kind"] == "fanout" or name in found:
            continue
        found.add(name)
        frontier += stage.get("parents") or ([stage["after"]] if stage.get("after") is not None else [])
    return found


def _depth(graph: Sequence[dict[str, Any]], stage: dict[str, Any]) -> int:
    """How many fan-outs lie between a run's items and the items ``stage`` works on (a gather undoes one), as the
    run's graph (runs.stages) records it; -1 for a group's items."""
    by_name = {s["name"]: s for s in graph}
    depth, seen, current = 0, set(), stage
    while current.get("after") is not None and current["name"] not in seen:
        seen.add(current["name"])
        if current["kind"] in ("group", "reduce"):
            return -1
        depth -= 1 if current["kind"] == "gather" else 0
        current = by_name.get(current["after"], {"name": None, "kind": "map"})
        depth += 1 if current["kind"] == "fanout" else 0
    return depth


def item_depth(graph: Sequence[dict[str, Any]], name: str) -> int:
    """Where the stage called ``name`` works (``_depth``): 0 on the run's root items, 1 on their fan-out
    children and so on, -1 on group items."""
    return _depth(graph, next(s for s in graph if s["name"] == name))


def record_stage(graph: Sequence[dict[str, Any]]) -> str | None:
    """The stage whose output is a root item's accepted record: among the map stages that run on the root
    item itself (not after a fan-out, unless gathered back), the last with an acceptance boundary, else the
    last (declaration order runs parents first)."""
    own = [s for s in graph if s["kind"] == "map" and _depth(graph, s) == 0]
    accepted = [s for s in own if s.get("accept")]
    return (accepted or own)[-1]["name"] if own else None


class SampleOptions(NamedTuple):
    """The quality sample of ``reconcile``: ``size`` items per slice value (0: none), the record fields to
    slice by besides ``language`` and ``source_type``, and the seed (default: the run id)."""

    size: int = 3
    slices: tuple[str, ...] = ()
    seed: str | None = None


def quality_sample(store: SqlStore, blobs: Blobs, run: RunRecord, graph: RunGraph,
                   options: SampleOptions) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """A seeded random sample of accepted records for a reviewer: ``{slice: {value: [{"item_key", "outcome",
    "record"}]}}``, at most ``options.size`` per value and MAX_SLICE_VALUES values per slice. ``language``
    (the manifest's ``meta.language``) and ``source_type`` (the key's extension) are sampled from the keys
    alone, streamed in key order; a record FIELD's values are read from a random pool of at most
    MAX_SLICE_VALUES x size records. No other record is read."""
    if options.size <= 0 or graph.record_stage is None:
        return {}
    picks = _Picks(options.size, random.Random(options.seed or run.run_id), bool(options.slices))
    for key, meta in _recorded_items(store, run.run_id, graph.record_stage):
        picks.offer(key, meta)
    read = _SampleReader(store, blobs, run.run_id, graph.record_stage)
    chosen = picks.chosen
    pool = read.records(picks.pool)
    for field in options.slices:
        chosen[field] = _by_field([(key, pool[key]) for key in picks.pool if key in pool], field, options.size)
    keys = sorted({k for values in chosen.values() for ks in values.values() for k in ks})
    records = pool | read.records([k for k in keys if k not in pool])
    outcomes = store.outcomes_of(run.run_id, graph.stages, keys)
    return {name: {value: [{"item_key": k, "outcome": outcomes.get(k), "record": shown(records[k])}
                           for k in sorted(ks) if k in records] for value, ks in sorted(values.items())}
            for name, values in chosen.items()}


class _Picks:
    """Seeded reservoir samples of item keys per slice value, and a pool for record fields: memory bounded
    by the sample whatever the run's size, the same picks for the same seed and items."""

    def __init__(self, size: int, rng: random.Random, pool: bool) -> None:
        self.size, self.rng = size, rng
        self.chosen: dict[str, dict[str, list[str]]] = {"language": {}, "source_type": {}}
        self.seen: dict[tuple[str, str], int] = defaultdict(int)
        self.pool: list[str] = []
        self.pool_size = MAX_SLICE_VALUES * size if pool else 0

    def offer(self, key: str, meta: str | None) -> None:
        language = _language(meta)
        if language is not None:
            self._keep("language", language, key)
        self._keep("source_type", source_type(key), key)
        if self.pool_size:
            self.seen["", ""] += 1
            _reservoir(self.pool, self.pool_size, self.seen["", ""], key, self.rng)

    def _keep(self, name: str, value: str, key: str) -> None:
        values = self.chosen[name]
        if value not in values:
            if len(values) >= MAX_SLICE_VALUES:
                return
            values[value] = []
        self.seen[name, value] += 1
        _reservoir(values[value], self.size, self.seen[name, value], key, self.rng)


def _reservoir(kept: list[str], size: int, seen: int, key: str, rng: random.Random) -> None:
    """Algorithm R: after ``seen`` offers, each key offered is kept with probability size/seen."""
    if len(kept) < size:
        kept.append(key)
        return
    slot = rng.randrange(seen)
    if slot < size:
        kept[slot] = key


def _recorded_items(store: SqlStore, run_id: str, stage: str) -> Iterator[tuple[str, str | None]]:
    """(key, meta) of every root item with a record, in key order, a chunk at a time."""
    after: str | None = None
    while True:
        rows = store.recorded_items_after(run_id, stage, after, KEY_CHUNK)
        yield from rows
        if len(rows) < KEY_CHUNK:
            return
        after = rows[-1][0]


def _language(meta: str | None) -> str | None:
    if meta is None:
        return None
    value = json.loads(meta).get("language")
    return None if value is None else str(value)


def source_type(key: str) -> str:
    """An item's source type as its key's extension (``man1/ls.1.gz`` → ``.gz``; none → ``(none)``)."""
    return PurePosixPath(key).suffix or "(none)"


def _by_field(records: Sequence[tuple[str, Any]], field: str, size: int) -> dict[str, list[str]]:
    """Keys by the value of a record ``field`` (a dotted path), at most ``size`` per value."""
    groups: dict[str, list[str]] = {}
    for key, record in records:
        value = slice_value(field_value(record, field))
        if value not in groups and len(groups) >= MAX_SLICE_VALUES:
            continue
        bucket = groups.setdefault(value, [])
        if len(bucket) < size:
            bucket.append(key)
    return groups


ABSENT = object()


def field_value(record: Any, field: str) -> Any:
    """``record``'s value at a dotted path (``ABSENT`` when it has none)."""
    for part in field.split("."):
        if not isinstance(record, dict) or part not in record:
            return ABSENT
        record = record[part]
    return record


def slice_value(value: Any) -> str:
    if value is ABSENT or value is None:
        return "(none)"
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def shown(record: Any) -> Any:
    return f"<{len(record)} bytes>" if isinstance(record, bytes) else record


class _SampleReader:
    """Records of a few items of a run (a missing blob leaves its item out of the sample)."""

    def __init__(self, store: SqlStore, blobs: Blobs, run_id: str, stage: str) -> None:
        self.store, self.blobs, self.run_id, self.stage = store, blobs, run_id, stage

    def records(self, keys: Sequence[str]) -> dict[str, Any]:
        if not keys:
            return {}
        refs = self.store.record_refs_of(self.run_id, self.stage, keys)
        return read_records(self.store, self.blobs, refs, strict=False)


def read_records(store: SqlStore, blobs: Blobs, refs: Mapping[str, RecordRef], strict: bool = True) -> dict[str, Any]:
    """The decoded records behind ``refs``: inline in the memo (under their task key, when its digest is the
    record's), else from the blob store. A missing or corrupt blob raises, or with ``strict=False`` leaves
    its item out."""
    memo = store.memo_rows({ref.task_key for ref in refs.values()})
    found: dict[str, Any] = {}
    for key, ref in refs.items():
        try:
            found[key] = decode(ref.kind, record_bytes(ref, memo.get(ref.task_key), blobs))
        except BlobError:
            if strict:
                raise
    return found


def record_bytes(ref: RecordRef, row: tuple[Any, ...] | None, blobs: Blobs) -> bytes:
    """A record's bytes: inline in its memo ``row`` (``memo_rows``' (stage, kind, digest, inline, ...)) when
    that row's digest is the record's, else from the blob store."""
    if ref.kind == "none":
        return b""
    if row is not None and row[2] == ref.digest and row[3] is not None:
        return bytes(row[3])
    return blobs.get(ref.digest)
