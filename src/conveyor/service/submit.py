"""Create a run: stream the input, ingest sources, create the first tasks.

A submission is all or nothing: if any input is bad, the run's rows are
removed again and the error says which line or file to fix.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from conveyor.blobs import Blobs
from conveyor.errors import InputError, UserError
from conveyor.pipeline import Pipeline
from conveyor.runtime.expand import LANE_RANKS, Expander
from conveyor.runtime.values import INLINE_MAX, Ref
from conveyor.service.inputs import SourceItem, iter_items
from conveyor.store import RunRecord, SqlStore

BATCH = 5000


@dataclass(frozen=True)
class Submitted:
    run_id: str
    expected: int
    cached: int


def new_run_id(now: float) -> str:
    return time.strftime("r%Y%m%d-%H%M%S-", time.gmtime(now)) + secrets.token_hex(3)


def stages_json(pipeline: Pipeline) -> str:
    return json.dumps([
        {"name": s.name, "version": s.version, "kind": s.kind, "after": s.after, "config_hash": s.config_hash}
        for s in pipeline
    ])


def submit(
    pipeline: Pipeline, target: str, input_path: str, store: SqlStore, blobs: Blobs,
    clock: Callable[[], float] = time.time, items: Iterable[SourceItem] | None = None,
    on_work: Callable[[str], None] | None = None, lane: str = "bulk",
) -> Submitted:
    """Create a run for every item of ``input_path`` (or of ``items``); return its id.

    ``on_work(run_id)`` is called once, as soon as the first task to run is queued, so
    workers can start on the first items while the rest are still being submitted; it is
    not called when the memo answers every task. ``lane="interactive"`` puts the run's tasks
    ahead of every bulk task and lets its provider calls use the quota's reserved share.
    """
    if lane not in LANE_RANKS:
        raise UserError(f"lane {lane!r} is not a lane; use {' or '.join(LANE_RANKS)}")
    now = clock()
    run_id = new_run_id(now)
    store.create_run(RunRecord(run_id, pipeline.name, target, str(input_path), "submitting", 0,
                               pipeline.has_publish, stages_json(pipeline), now, None, None, lane))
    try:
        cached = _ingest(pipeline, run_id, items if items is not None else iter_items(input_path),
                         store, blobs, clock, on_work, lane)
    except BaseException:
        store.discard_run(run_id)
        raise
    expected = store.item_count(run_id)
    store.set_run_status(run_id, "submitted", clock(), expected)
    return Submitted(run_id, expected, cached)


def _ingest(
    pipeline: Pipeline, run_id: str, items: Iterable[SourceItem], store: SqlStore, blobs: Blobs,
    clock: Callable[[], float], on_work: Callable[[str], None] | None, lane: str,
) -> int:
    expander = Expander(pipeline, store)
    expander.set_lane(run_id, lane)
    read_limit = _read_limit(pipeline)
    cached, batch = 0, []
    for item in itertools.chain(items, [None]):  # streamed: None marks the end
        if item is not None:
            batch.append(item)
        if batch and (item is None or len(batch) >= BATCH):
            hits, queued = _add_batch(expander, run_id, batch, blobs, read_limit, clock())
            cached, batch = cached + hits, []
            if queued and on_work is not None:
                on_work(run_id)
                on_work = None
    return cached


def _add_batch(
    expander: Expander, run_id: str, batch: list[SourceItem], blobs: Blobs, read_limit: int | None, now: float,
) -> tuple[int, int]:
    # expand_sources() plans (memo lookups, rows) before it opens its write transaction: with SQLite's one
    # writer, workers processing the first items keep committing while the next batch is planned.
    return expander.expand_sources(run_id, [(item.key, source_ref(item, blobs, read_limit)) for item in batch], now)


def source_ref(item: SourceItem, blobs: Blobs, read_limit: int | None) -> Ref:
    """Store an item's bytes (inline when small) and return the reference.

    A file larger than every root stage accepts is never read: its task is
    refused on the size check, so its key comes from its path, size and mtime.
    """
    if item.text is not None:
        return _bytes_ref(item.text, blobs)
    assert item.path is not None
    try:
        stat = item.path.stat()
        if read_limit is not None and stat.st_size > read_limit:
            marker = f"unread\0{item.path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
            return Ref("bytes", hashlib.sha256(marker.encode()).hexdigest(), stat.st_size, None)
        if stat.st_size <= INLINE_MAX:
            return _bytes_ref(item.path.read_bytes(), blobs)
        digest, size = blobs.put_file(item.path)
    except OSError as exc:
        raise InputError(f"cannot read input {str(item.path)!r}: {exc.strerror}; fix or remove it") from None
    return Ref("bytes", digest, size, None)


def _bytes_ref(data: bytes, blobs: Blobs) -> Ref:
    if len(data) <= INLINE_MAX:
        return Ref("bytes", hashlib.sha256(data).hexdigest(), len(data), data)
    return Ref("bytes", blobs.put(data), len(data), None)


def _read_limit(pipeline: Pipeline) -> int | None:
    limits = [s.max_input_bytes for s in pipeline.roots]
    if any(limit is None for limit in limits):
        return None
    return max(limit for limit in limits if limit is not None)
