"""The spans of items' traces (imported only when tracing is on: runtime/tracing.py).

An item's root span, ``conveyor.item``, is made when it is admitted; its context is stored with the item.
Each committed attempt becomes a ``conveyor.attempt <stage>`` span under it, with the attempt's real start
and duration, made after the commit (a rolled-back commit leaves no span), so the stage's own path is
untouched. Spans carry names, keys, counts and error classes: never a document's text, an output, a prompt
or an error message (which may quote the input).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from conveyor import __version__
from conveyor.store import AttemptRecord, ClaimedTask, ExpiredLease, PlainAttempt, SqlStore

CACHE_ITEMS = 100_000  # items whose trace context a worker keeps at hand between batches
_W3C = TraceContextTextMapPropagator()


@dataclass
class Started:
    """Root spans of items being admitted: their traceparents are written with the items, and the spans
    are ended (exported) once that is committed."""

    traceparents: dict[str, str] = field(default_factory=dict)
    spans: list[tuple[Span, int]] = field(default_factory=list)

    def end(self) -> None:
        for span, at in self.spans:
            span.end(end_time=at)
        self.spans.clear()


class ItemTracer:
    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("conveyor", __version__)
        self._parents: dict[tuple[str, str], Context | None] = {}  # by (run, root key); None: not traced

    def start_items(self, pipeline: str, run_id: str, keys: Iterable[str], now: float) -> Started:
        """Start the trace of each new root item; the sampler keeps some (Started.traceparents)."""
        started, at = Started(), _ns(now)
        for key in keys:
            span = self.tracer.start_span("conveyor.item", context=Context(), kind=SpanKind.INTERNAL, start_time=at,
                                          attributes={"conveyor.pipeline": pipeline, "conveyor.run_id": run_id,
                                                      "conveyor.item_key": key})
            if span.get_span_context().trace_flags.sampled:
                started.traceparents[key] = _traceparent(span)
                started.spans.append((span, at))
        return started

    def record_attempts(self, store: SqlStore, pipeline: str, tasks: Mapping[int, ClaimedTask],
                        attempts: Sequence[AttemptRecord | PlainAttempt]) -> int:
        """A span for each committed attempt of a traced item; returns how many were made."""
        parents = self._parents_of(store, {(t.run_id, t.root_key) for t in tasks.values()})
        made = 0
        for attempt in attempts:
            task = tasks.get(attempt.task_id)
            parent = parents.get((task.run_id, task.root_key)) if task is not None else None
            if task is not None and parent is not None:
                self._attempt_span(pipeline, task, attempt, parent)
                made += 1
        return made

    def record_reclaimed(self, store: SqlStore, pipeline: str, expired: Sequence[ExpiredLease], now: float) -> int:
        """A span for each attempt of a traced item whose worker stopped renewing its lease (it died or
        stalled): from its claim to its reclaim, outcome and error class ``lease_expired``."""
        parents = self._parents_of(store, {(lease.run_id, lease.root_key) for lease in expired})
        made = 0
        for lease in expired:
            parent = parents.get((lease.run_id, lease.root_key))
            if parent is None:
                continue
            attributes = _where(pipeline, lease.run_id, lease.stage, lease.item_key, lease.root_key)
            attributes.update({"conveyor.attempt": lease.attempts, "conveyor.outcome": "lease_expired",
                               "conveyor.error_class": "lease_expired", "conveyor.cached": False,
                               "conveyor.invoked": True})
            if lease.lease_owner:
                attributes["conveyor.worker"] = lease.lease_owner
            start = _ns(lease.started_at if lease.started_at is not None else now)
            span = self.tracer.start_span(f"conveyor.attempt {lease.stage}", context=parent, kind=SpanKind.INTERNAL,
                                          start_time=start, attributes=attributes)
            span.set_status(Status(StatusCode.ERROR, "lease_expired"))
            span.end(end_time=max(start, _ns(now)))
            made += 1
        return made

    def _parents_of(self, store: SqlStore, roots: set[tuple[str, str]]) -> dict[tuple[str, str], Context | None]:
        """The stored trace context of these items (one read per batch for the items not seen yet)."""
        missing = [root for root in roots if root not in self._parents]
        if missing:
            if len(self._parents) + len(missing) > CACHE_ITEMS:
                self._parents.clear()
            found = store.item_traces(missing)
            for root in missing:
                parent = found.get(root)
                self._parents[root] = _W3C.extract({"traceparent": parent}) if parent is not None else None
        return {root: self._parents.get(root) for root in roots}

    def _attempt_span(self, pipeline: str, task: ClaimedTask, a: AttemptRecord | PlainAttempt,
                      parent: Context) -> None:
        start = _ns(a.started_at) if a.started_at is not None else None
        span = self.tracer.start_span(f"conveyor.attempt {task.stage}", context=parent, kind=SpanKind.INTERNAL,
                                      start_time=start, attributes=_attributes(pipeline, task, a))
        error_class = a.error_class if isinstance(a, AttemptRecord) else None
        if error_class is not None and a.outcome != "paused":  # paused: given back, not the attempt's fault
            span.set_status(Status(StatusCode.ERROR, error_class))
        end = start + int((a.duration or 0.0) * 1e9) if start is not None else None
        span.end(end_time=end)


def _attributes(pipeline: str, task: ClaimedTask, a: AttemptRecord | PlainAttempt) -> dict[str, AttributeValue]:
    attributes = _where(pipeline, task.run_id, task.stage, task.item_key, task.root_key)
    attributes.update({"conveyor.attempt": a.attempt, "conveyor.outcome": a.outcome,
                       "conveyor.cached": a.outcome == "cached", "conveyor.invoked": bool(a.invoked)})
    if a.worker:
        attributes["conveyor.worker"] = a.worker
    if isinstance(a, PlainAttempt):
        return attributes
    if a.error_class is not None:
        attributes["conveyor.error_class"] = a.error_class
    if a.tier is not None:
        attributes["conveyor.tier"] = a.tier
    if a.provider_calls:
        attributes.update({"conveyor.provider_calls": a.provider_calls, "conveyor.cost_usd": a.cost,
                           "gen_ai.usage.input_tokens": a.prompt_tokens,
                           "gen_ai.usage.output_tokens": a.completion_tokens})
        if a.model:
            attributes["gen_ai.request.model"] = a.model
    return attributes


def _where(pipeline: str, run_id: str, stage: str, item_key: str, root_key: str) -> dict[str, AttributeValue]:
    """Where an attempt ran: its pipeline, run, stage and item (and root, for a fan-out child)."""
    where: dict[str, AttributeValue] = {"conveyor.pipeline": pipeline, "conveyor.run_id": run_id,
                                        "conveyor.stage": stage, "conveyor.item_key": item_key}
    if root_key != item_key:
        where["conveyor.root_key"] = root_key
    return where


def _traceparent(span: Span) -> str:
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, trace.set_span_in_context(span))
    return carrier["traceparent"]


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
