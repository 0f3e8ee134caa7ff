"""Create a run: check the input, stream it, ingest sources, create the first tasks.

What the user must fix (a manifest line that is not JSON, a key given twice)
is found before the run exists, so it leaves nothing behind. An entry whose
source cannot be read becomes a ``bad_input`` item instead of stopping the
batch. A submission holds its run with a heartbeat; one that stops (killed,
interrupted, or failing on something it cannot turn into an item) leaves the
run ``abandoned``, never half-discarded once a worker may have seen its work,
and ``resume`` (or running the same command again) finishes it without
duplicating an item.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.blobs import Blobs
from conveyor.errors import InputError, UserError
from conveyor.pipeline import Pipeline, declarations
from conveyor.pipeline import params as params_rule
from conveyor.runtime.fingerprint import code_fingerprint
from conveyor.runtime.heartbeat import ABANDON_AFTER_S, Heartbeat, submitter_gone, submitter_id
from conveyor.runtime.lanes import LANE_RANKS
from conveyor.runtime.target import absolute_target
from conveyor.runtime.transitions import Transitions
from conveyor.runtime.values import INLINE_MAX, Ref
from conveyor.service.inputs import RemoteSource, SourceItem, check_input, iter_items, manifest_signature
from conveyor.service.report import stale_code
from conveyor.store import UNFINISHED_RUNS, RunRecord, SqlStore, lost_connection, sqlite_path

BATCH = 5000
SOURCE_THREADS = 8
"""Sources read and stored at once by a submission (files hashed, blobs written and fsynced or uploaded): the
hashing releases the GIL and the rest waits on the disk or the network, so a folder of large files is not read
one file at a time."""


@dataclass(frozen=True)
class Submitted:
    run_id: str
    expected: int
    cached: int
    resumed: bool = False  # an unfinished submission of this run was finished
    stale_code: list[dict[str, Any]] = field(default_factory=list)  # as report.stale_code gives them


@dataclass(frozen=True)
class SubmitOptions:
    """How to read the input, and which run to finish.

    ``skip_bad_lines``: a manifest line that is not JSON or has no usable key becomes a ``bad_input``
    item instead of refusing the submission. ``strict_inputs``: an unreadable source refuses the
    submission instead of becoming a ``bad_input`` item. ``resume``: finish this run's submission.
    ``resume_same``: finish the latest unfinished run of the same pipeline, graph and input instead
    of starting a new one (running the same command again). ``accept_code_change``: stages whose
    memoised outputs, made by other code under the same version, are accepted for the current code
    (``"*"``: every stage). ``budget_usd``: the new run's ceiling on provider spending.
    """

    skip_bad_lines: bool = False
    strict_inputs: bool = False
    resume: str | None = None
    resume_same: bool = True
    accept_code_change: Sequence[str] = ()
    budget_usd: float | None = None  # the run's ceiling on provider spending (default: the pipeline's budget_usd)
    # Run parameters (conveyor.pipeline.params): ``sets`` as ``--set NAME=VALUE`` texts, ``params`` as values
    # (from Python); the rest from their environment variables and defaults. A resumed run keeps its own.
    sets: Sequence[str] = ()
    params: Mapping[str, Any] | None = None
    # Set from another thread (the Python API's, on Ctrl-C): the submission stops as Ctrl-C stops it, leaving the
    # run resumable. Read between items.
    stop: threading.Event | None = None


def new_run_id(now: float) -> str:
    return time.strftime("r%Y%m%d-%H%M%S-", time.gmtime(now)) + secrets.token_hex(3)


def stages_json(pipeline: Pipeline, params: Mapping[str, Any] | None = None) -> str:
    """The run's graph: each stage's name, version, kind, parent, config hash and code fingerprint; and
    ``accept`` (true) on a stage with an acceptance boundary, ``into`` on one that publishes into the
    built-in target, ``params`` (their values) on one that reads run parameters, ``parents`` (every parent, in
    order; ``after`` is the first) on a join, ``on_child_failure`` on a gather (absent otherwise, so a graph
    without them reads as it always did)."""
    values = params or {}
    return json.dumps([
        {"name": s.name, "version": s.version, "kind": s.kind, "after": s.after, "config_hash": s.config_hash,
         "code": code_fingerprint(s.fn), **({"accept": True} if s.accept else {}),
         **({"into": s.into if isinstance(s.into, str) else type(s.into).__qualname__} if s.into else {}),
         **({"params": {n: values.get(n) for n in s.params}} if s.params else {}),
         **({"parents": list(s.parents)} if s.is_join else {}),
         **({"on_child_failure": s.on_child_failure} if s.kind == "gather" else {})}
        for s in pipeline
    ])


def run_params(pipeline: Pipeline, sets: Sequence[str] = (), values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A new run's parameter values: ``values``, then ``sets`` (``NAME=VALUE``), then each parameter's
    environment variable, then its default (conveyor.pipeline.params)."""
    return params_rule.resolve(pipeline.params, sets, os.environ, pipeline.name, values)


def recorded_params(run: RunRecord) -> dict[str, Any]:
    """The parameter values a run was submitted with."""
    return params_rule.decode(run.params)


def submit(
    pipeline: Pipeline, target: str, input_path: str, store: SqlStore, blobs: Blobs,
    clock: Callable[[], float] | None = None, items: Iterable[SourceItem] | None = None,
    on_work: Callable[[str], None] | None = None, lane: str = "bulk", options: SubmitOptions | None = None,
    on_run: Callable[[str], None] | None = None,
) -> Submitted:
    """Create a run for every item of ``input_path`` (or of ``items``), or finish one; return it.

    ``on_work(run_id)`` is called once, as soon as the first task to run is queued, so
    workers can start on the first items while the rest are still being submitted; it is
    not called when the memo answers every task. ``on_run(run_id)`` is called once the run
    exists (or is taken over to be finished). ``lane="interactive"`` puts the run's tasks
    ahead of every bulk task and lets its provider calls use the quota's reserved share.
    ``clock`` defaults to the store's (the database server's on PostgreSQL).
    """
    options = options or SubmitOptions()
    if lane not in LANE_RANKS:
        raise UserError(f"lane {lane!r} is not a lane; use {' or '.join(LANE_RANKS)}")
    accepted = _accepted_stages(pipeline, options.accept_code_change)
    clock = clock or store.clock
    if items is None:
        _check(input_path, options.skip_bad_lines, store, clock)
    source = _input_label(input_path)
    values = _params_for(pipeline, store, options)
    graph = stages_json(pipeline, values)
    me = submitter_id()
    store.note_declarations(declarations.rows(pipeline), clock())
    run, resumed = _hold_run(pipeline, target, source, graph, store, clock, me, lane, options, values)
    if on_run is not None:
        on_run(run.run_id)
    if accepted:
        store.accept_code([(pipeline.name, name, pipeline[name].version, code_fingerprint(pipeline[name].fn),
                            run.run_id, clock()) for name in accepted])
    stream = items if items is not None else iter_items(
        input_path, skip_bad_lines=options.skip_bad_lines, strict=options.strict_inputs, own=_own(store, blobs))
    ingest = _Ingest(pipeline, run.run_id, store, blobs, clock, run.lane, options.strict_inputs, resumed, me)
    ingest.stop = options.stop
    ingest.transitions.expander.set_params(run.run_id, recorded_params(run))
    with Heartbeat(store.url, run.run_id, me), store.checkpointing():
        try:
            ingest.all(stream, on_work)
        except BaseException as exc:
            kept = ingest.visible or resumed
            lost = lost_connection(store, exc, "run the same command again once it answers" + (
                f", or `conveyor submit --resume {run.run_id}`, to finish the submission" if kept else ""))
            _stop(store, run.run_id, kept, exc, clock)
            if lost is not None:
                raise lost from None
            raise
    expected = store.item_count(run.run_id)
    store.set_run_status(run.run_id, "submitted", clock(), expected)
    if any(s.kind in ("group", "reduce") for s in pipeline):
        # A run answered whole from the memo has no worker to make its groups when nothing is left: made here.
        queued = ingest.transitions.make_groups(clock(), blobs, run.run_id)
        if queued and on_work is not None and not ingest.working:
            on_work(run.run_id)
    return Submitted(run.run_id, expected, ingest.cached, resumed, stale_code(store, run.run_id))


def _check(input_path: str, skip_bad_lines: bool, store: SqlStore, clock: Callable[[], float]) -> None:
    """check_input, unless this very manifest or table (unchanged, read by the same columns) passed it before."""
    signature = manifest_signature(input_path, skip_bad_lines)
    if signature is not None and store.input_checked(*signature):
        return
    check_input(input_path, skip_bad_lines)
    if signature is not None:
        store.record_input_check(*signature, clock())


def _accepted_stages(pipeline: Pipeline, names: Sequence[str]) -> list[str]:
    """The stages named (``*``: every stage); PipelineError for a name the pipeline does not declare."""
    if "*" in names:
        return [stage.name for stage in pipeline]
    return [pipeline[name].name for name in names]


def _own(store: SqlStore, blobs: Blobs) -> list[str]:
    """conveyor's own files, which an input folder may hold (``--input .``): the store and its blobs."""
    db = sqlite_path(store.url)
    files = [db + suffix for suffix in ("", "-wal", "-shm", "-journal", ".lock")] if db else []
    root = getattr(blobs, "root", None)
    return files + ([str(root)] if root is not None else [])


def _input_label(input_path: str) -> str:
    """What the run records as its input: an absolute path when it is one (a resume reads it again)."""
    path = Path(input_path)
    return str(path.absolute()) if path.exists() or path.is_symlink() else str(input_path)


def _params_for(pipeline: Pipeline, store: SqlStore, options: SubmitOptions) -> dict[str, Any]:
    """The parameter values of the run this submission fills: a resumed run's own, else a new run's."""
    if options.resume is not None:
        run = store.get_run(options.resume)
        if run is not None:
            return recorded_params(run)
    return run_params(pipeline, options.sets, options.params)


def _hold_run(
    pipeline: Pipeline, target: str, source: str, graph: str, store: SqlStore, clock: Callable[[], float],
    me: str, lane: str, options: SubmitOptions, values: Mapping[str, Any],
) -> tuple[RunRecord, bool]:
    """The run this submission fills: the one to resume, else a new one. Returns (run, resumed)."""
    if options.resume is not None:
        return _take(store, options.resume, pipeline, graph, clock, me), True
    if options.resume_same:
        unfinished = store.unfinished_run(pipeline.name, graph, source)
        if unfinished is not None and store.take_submission(unfinished.run_id, me, clock(), _quiet(unfinished)):
            return unfinished, True
    now = clock()
    budget = options.budget_usd if options.budget_usd is not None else pipeline.budget_usd
    run = RunRecord(new_run_id(now), pipeline.name, absolute_target(target), source, "submitting", 0,
                    pipeline.has_publish, graph, now, None, None, lane, me, now, budget_usd=budget,
                    params=params_rule.encode(values) if values else None)
    store.create_run(run)
    return run, False


def _take(store: SqlStore, run_id: str, pipeline: Pipeline, graph: str, clock: Callable[[], float],
          me: str) -> RunRecord:
    run = store.get_run(run_id)
    if run is None:
        raise UserError(f"no run {run_id!r} in this store; `conveyor status` lists the runs")
    if run.pipeline != pipeline.name or run.stages != graph:
        raise UserError(f"run {run_id} was submitted with another pipeline or graph than {pipeline.name!r} has now "
                        "(a stage, version, config or its code changed); start a new run instead")
    if run.status not in UNFINISHED_RUNS:
        raise UserError(f"run {run_id} is already submitted ({run.status}); "
                        f"process it with `conveyor worker TARGET --run {run_id} --until-idle`")
    if not store.take_submission(run_id, me, clock(), _quiet(run)):
        raise UserError(f"run {run_id} is being submitted by {run.submitter} right now; wait for it, or stop "
                        f"it first (its heartbeat is kept every few seconds)")
    return run


def _quiet(run: RunRecord) -> float:
    """How long the run's submitter must have been silent before it may be taken over: not at all when
    its process is known to be gone."""
    return 0.0 if submitter_gone(run.submitter) else ABANDON_AFTER_S


def _stop(store: SqlStore, run_id: str, visible: bool, exc: BaseException, clock: Callable[[], float]) -> None:
    """A submission that stops leaves no half run: discarded while no worker could have seen any of
    its work, else abandoned (resumable) with why."""
    try:
        if not visible:
            store.discard_run(run_id)
            return
        why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
        store.set_run_status(run_id, "abandoned", clock(), note=f"submission stopped: {why}"[:500])
    except Exception:  # the store may be what failed; the workers' heartbeat check covers that case
        pass


class _Ingest:
    """Streams source items into the run in batches."""

    def __init__(self, pipeline: Pipeline, run_id: str, store: SqlStore, blobs: Blobs, clock: Callable[[], float],
                 lane: str, strict: bool, resumed: bool, me: str) -> None:
        self.run_id, self.store, self.blobs, self.clock = run_id, store, blobs, clock
        self.strict, self.resumed, self.me = strict, resumed, me
        self.transitions = Transitions(pipeline, store, me)
        self.transitions.expander.set_lane(run_id, lane)
        self.read_limit = _read_limit(pipeline)
        self.cached = 0
        self.pool: ThreadPoolExecutor | None = None  # reads sources (sources()), made at the first batch with files
        self.visible = False  # some of the run's work is committed: a worker may have started on it
        self.working = False  # on_work was called: workers were told of the run
        self.stop: threading.Event | None = None  # set: stop as on Ctrl-C (SubmitOptions.stop)

    def all(self, items: Iterable[SourceItem], on_work: Callable[[str], None] | None) -> None:
        batch: list[SourceItem] = []
        try:
            for item in itertools.chain(items, [None]):  # streamed: None marks the end
                if self.stop is not None and self.stop.is_set():
                    raise KeyboardInterrupt("stopped")
                if item is not None:
                    batch.append(item)
                if batch and (item is None or len(batch) >= BATCH):
                    queued = self.batch(batch)
                    batch = []
                    if queued and on_work is not None:
                        on_work(self.run_id)
                        on_work = None
                        self.working = True
        finally:
            if self.pool is not None:  # a failed batch's other reads are not started, and those running end
                self.pool.shutdown(wait=True, cancel_futures=True)
                self.pool = None

    def batch(self, batch: list[SourceItem]) -> int:
        if self.resumed:
            done = self.store.existing_roots(self.run_id, [item.key for item in batch])
            batch = [item for item in batch if item.key not in done]
        good: list[tuple[str, Ref]] = []
        bad: list[tuple[str, str]] = []
        metas = {item.key: item.meta for item in batch if item.meta is not None}
        sha256 = hashlib.sha256
        stored = self.sources([item for item in batch if item.problem is None and (
            item.text is None or len(item.text) > INLINE_MAX)])
        for item in batch:
            text = item.text
            if text is not None and len(text) <= INLINE_MAX:  # the common case, inline: no blob, no file
                good.append((item.key, Ref("bytes", sha256(text).hexdigest(), len(text), text)))
                continue
            ref = item.problem if item.problem is not None else next(stored)
            if isinstance(ref, str):
                bad.append((item.key, ref))
            else:
                good.append((item.key, ref))
        hits, queued = self.transitions.admit(self.run_id, good, self.clock(), bad, metas)
        self.visible = True
        self.cached += hits
        return queued

    def sources(self, items: list[SourceItem]) -> Iterator[Ref | str]:
        """Each item's stored source (``source``), in order. Sources stored as blobs (larger than INLINE_MAX) are
        read SOURCE_THREADS at a time when there are more than one; a small file is read here, where a thread
        would cost more than the read. The first error, in item order, is raised as a serial read raises it."""
        large = [index for index, item in enumerate(items) if _stored_as_blob(item)]
        pending: dict[int, Future[Ref | str]] = {}
        if len(large) > 1:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(SOURCE_THREADS, thread_name_prefix="conveyor-source")
            pending = {index: self.pool.submit(self.source, items[index]) for index in large}
        for index, item in enumerate(items):
            future = pending.get(index)
            yield self.source(item) if future is None else future.result()

    def source(self, item: SourceItem) -> Ref | str:
        """The item's stored source, or why it could not be read (``strict``: InputError)."""
        try:
            return source_ref(item, self.blobs, self.read_limit)
        except OSError as exc:
            where = item.where
            if self.strict:
                raise InputError(f"cannot read input {where!r}: {exc.strerror}; fix or remove it") from None
            return f"{where!r} could not be read: {exc.strerror or exc}"


def source_ref(item: SourceItem, blobs: Blobs, read_limit: int | None) -> Ref:
    """Store an item's bytes (inline when small) and return the reference; OSError when the source
    cannot be read, BlobError when the blob store cannot take it.

    A file larger than every root stage accepts is never read: its task is
    refused on the size check, so its key comes from its path, size and mtime
    (an S3 object's: its URL, size and ETag).
    """
    if item.text is not None:
        return _bytes_ref(item.text, blobs)
    if item.remote is not None:
        return _remote_ref(item.remote, blobs, read_limit)
    assert item.path is not None
    stat = item.path.stat()
    if read_limit is not None and stat.st_size > read_limit:
        marker = f"unread\0{item.path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
        return Ref("bytes", hashlib.sha256(marker.encode()).hexdigest(), stat.st_size, None)
    if stat.st_size <= INLINE_MAX:
        with item.path.open("rb") as source:  # opened once: a file that grows meanwhile is read as it is now
            data = source.read(INLINE_MAX + 1)
        if len(data) <= INLINE_MAX:
            return Ref("bytes", hashlib.sha256(data).hexdigest(), len(data), data)
    digest, size = blobs.put_file(item.path)
    return Ref("bytes", digest, size, None)


def _remote_ref(remote: RemoteSource, blobs: Blobs, read_limit: int | None) -> Ref:
    """An S3 object's reference: read and stored as a local file is (inline when small, streamed otherwise)."""
    if read_limit is not None and remote.size > read_limit:
        marker = f"unread\0{remote.url}\0{remote.size}\0{remote.version}"
        return Ref("bytes", hashlib.sha256(marker.encode()).hexdigest(), remote.size, None)
    if remote.size <= INLINE_MAX:
        data = b"".join(remote.chunks())
        if len(data) <= INLINE_MAX:
            return Ref("bytes", hashlib.sha256(data).hexdigest(), len(data), data)
        return Ref("bytes", blobs.put(data), len(data), None)
    digest, size = blobs.put_stream(remote.chunks())
    return Ref("bytes", digest, size, None)


def _stored_as_blob(item: SourceItem) -> bool:
    """Whether the item's source is larger than INLINE_MAX (a file that cannot be looked at: no, and ``source``
    says why)."""
    if item.text is not None:
        return len(item.text) > INLINE_MAX
    if item.remote is not None:
        return item.remote.size > INLINE_MAX
    try:
        return item.path is not None and item.path.stat().st_size > INLINE_MAX
    except OSError:
        return False


def _bytes_ref(data: bytes, blobs: Blobs) -> Ref:
    if len(data) <= INLINE_MAX:
        return Ref("bytes", hashlib.sha256(data).hexdigest(), len(data), data)
    return Ref("bytes", blobs.put(data), len(data), None)


def _read_limit(pipeline: Pipeline) -> int | None:
    limits = [s.max_input_bytes for s in pipeline.roots]
    if any(limit is None for limit in limits):
        return None
    return max(limit for limit in limits if limit is not None)
