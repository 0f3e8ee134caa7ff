"""Loaded by bench/graph_statements.py's `conveyor run` processes (first on their PYTHONPATH): counts the statements
each sends its store (a call of the dialect's execute or batch methods, nested calls once), the seconds spent in
them, and the gather readiness reads of the writing transaction (store/barriers.py); writes them, per process, to
a file in CONVEYOR_BENCH_STATEMENTS at exit. Nothing without that variable."""

from __future__ import annotations

import atexit
import json
import os
import time
from typing import Any

OUT = os.environ.get("CONVEYOR_BENCH_STATEMENTS")
if OUT:
    import multiprocessing.util

    from conveyor.store import barriers, dialect

    counts: dict[str, float] = {"statements": 0, "seconds": 0.0}
    depth = [0]

    def _counted(inner: Any, label: str | None = None) -> Any:
        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            if label is not None:
                counts[label] = counts.get(label, 0) + 1
            depth[0] += 1
            started = time.perf_counter()
            try:
                return inner(self, *args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0 and label is None:
                    counts["statements"] += 1
                    counts["seconds"] += time.perf_counter() - started
        return counted

    for cls in (dialect.SqliteDialect, dialect.PostgresDialect):
        for name in ("execute", "execute_rowcount", "executemany", "executemany_count", "executemany_returning",
                     "insert_many", "insert_many_returning", "update_many", "append"):
            if name in cls.__dict__:
                setattr(cls, name, _counted(cls.__dict__[name]))
    for name in ("lock_items", "children_states"):
        setattr(barriers.BarrierQueries, name, _counted(getattr(barriers.BarrierQueries, name), name))

    def _dump() -> None:
        if counts["statements"]:
            with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as out:
                json.dump(counts, out)
    atexit.register(_dump)
    multiprocessing.util.Finalize(None, _dump, exitpriority=100)  # a worker process ends without atexit
