"""The trace context stored with each item (runtime/tracing.py): its W3C ``traceparent``, or NULL.

Written once, when a root item is admitted with tracing on and sampled in; read by the workers that
record its attempts, so that every attempt of the item, at any stage, by any worker, joins one trace.
Fan-out children have none of their own: they are read through their root.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from conveyor.store.dialect import Dialect
from conveyor.store.tasks import chunks


class TraceQueries:
    db: Dialect

    def set_item_traces(self, run_id: str, traces: Mapping[str, str]) -> None:
        """Record root items' traceparent (by item key), after they are inserted."""
        self.db.executemany("UPDATE items SET traceparent = ? WHERE run_id = ? AND item_key = ?",
                            [(parent, run_id, key) for key, parent in traces.items()])

    def item_traces(self, roots: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """The traceparent of root items, by (run, key); items not traced are left out."""
        found: dict[tuple[str, str], str] = {}
        by_run: dict[str, list[str]] = {}
        for run_id, key in set(roots):
            by_run.setdefault(run_id, []).append(key)
        for run_id, keys in by_run.items():
            for part in chunks(keys, 900):
                marks = ",".join("?" * len(part))
                for key, parent in self.db.execute(
                        f"SELECT item_key, traceparent FROM items WHERE run_id = ? AND item_key IN ({marks}) "
                        "AND traceparent IS NOT NULL", (run_id, *part)):
                    found[run_id, str(key)] = str(parent)
        return found
