"""Loaded by bench/graph_statements.py's `conveyor run` processes (first on their PYTHONPATH): counts the statements
each sends its store (a call of the dialect's execute or batch methods, nested calls once), the seconds spent in
them, the readiness reads of the writing transaction (store/barriers.py) and the joins and gathers left to it, the
process's CPU seconds (user + sys) and, on PostgreSQL, the CPU seconds of the server backends serving its
connections (read from /proc when the server runs on this host, at each connection's close and at exit); writes
them, per process, to a file in CONVEYOR_BENCH_STATEMENTS at exit (os._exit included: the forked workers end that
way). Nothing without that variable."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

OUT = os.environ.get("CONVEYOR_BENCH_STATEMENTS")
if OUT:
    import multiprocessing.util

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/, for this import only
    from exithook import on_exit
    del sys.path[0]

    from conveyor.store import barriers, dialect

    counts: dict[str, float] = {"statements": 0, "seconds": 0.0}
    depth = [0]
    TICK = os.sysconf("SC_CLK_TCK")

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
    for name in ("lock_items", "children_states", "stage_states", "join_states"):
        if hasattr(barriers.BarrierQueries, name):
            setattr(barriers.BarrierQueries, name, _counted(getattr(barriers.BarrierQueries, name), name))

    from conveyor.runtime.transitions import readiness

    _decide_waiting = readiness.Readiness.decide_waiting

    def _counted_decisions(self: Any, pending: Any, *args: Any, **kwargs: Any) -> Any:
        counts["in_transaction"] = counts.get("in_transaction", 0) + len(pending)  # joins and gathers left pending
        return _decide_waiting(self, pending, *args, **kwargs)
    readiness.Readiness.decide_waiting = _counted_decisions  # type: ignore[method-assign]

    backends: dict[int, int] = {}  # id(connection) -> its server backend's pid

    def _backend_cpu(pid: int) -> float:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
            return (int(fields[11]) + int(fields[12])) / TICK
        except (OSError, ValueError, IndexError):
            return 0.0

    try:
        import psycopg
    except ImportError:  # SQLite only
        psycopg = None  # type: ignore[assignment]
    if psycopg is not None:
        _connect = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]
        _close = psycopg.Connection.close

        def connect(cls: Any, *args: Any, **kwargs: Any) -> Any:
            conn = _connect(cls, *args, **kwargs)
            backends[id(conn)] = conn.info.backend_pid
            return conn

        def close(self: Any) -> None:
            pid = backends.pop(id(self), None)
            if pid is not None:
                counts["server_cpu"] = counts.get("server_cpu", 0.0) + _backend_cpu(pid)
            _close(self)

        psycopg.Connection.connect = classmethod(connect)  # type: ignore[method-assign,assignment]
        psycopg.connect = psycopg.Connection.connect  # type: ignore[assignment]
        psycopg.Connection.close = close  # type: ignore[method-assign]

    def _dump() -> None:
        if not counts["statements"]:
            return
        for pid in list(backends.values()):
            counts["server_cpu"] = counts.get("server_cpu", 0.0) + _backend_cpu(pid)
        backends.clear()
        own = resource.getrusage(resource.RUSAGE_SELF)
        counts["cpu"] = own.ru_utime + own.ru_stime
        with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as out:
            json.dump(counts, out)
        counts["statements"] = 0  # written once (atexit and the worker's finaliser may both run)
    on_exit(_dump)
    multiprocessing.util.Finalize(None, _dump, exitpriority=100)  # a worker process ends without atexit
