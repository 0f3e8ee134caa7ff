"""The trace context stored with each item (runtime/tracing.py): its W3C ``traceparent``, or NULL.

Written once, when a root item is admitted with tracing on and sampled in; read by the workers that
record its attempts, so that every attempt of the item, at any stage, by any worker, joins one trace.
Fan-out children have none of their own: they are read through their root.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from conveyor.store.dialect import Dialect
from conveyor.store.tasks import item_values, set_item_values


class TraceQueries:
    db: Dialect

    def set_item_traces(self, run_id: str, traces: Mapping[str, str]) -> None:
        """Record root items' traceparent (by item key), after they are inserted."""
        set_item_values(self.db, "traceparent", run_id, traces)

    def item_traces(self, roots: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """The traceparent of root items, by (run, key); items not traced are left out."""
        return item_values(self.db, "traceparent", roots)
