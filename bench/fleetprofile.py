"""Where a task's time goes on the fleet path (issue 32 point 2): conveyor's two workers, profiled.

    PYTHONPATH=src .venv/bin/python bench/fleetprofile.py [--backend sqlite|postgres] [--items 20000] [--top 20]

Submits N items of bench/noop_pipeline.py (a → b → c) through ``conveyor submit``, then runs two worker
processes (``Worker(...).run()``, as ``conveyor worker --until-idle``) each under cProfile (one profile per
thread) with every store statement counted and timed. Prints, per task (one item-stage):

- statements and transactions each worker sent (a statement is a round trip, but for psycopg's executemany,
  one pipeline per call, and COPY, one stream), with the rows they carried, by statement;
- on PostgreSQL the server side: rows inserted, updated (HOT or not) and deleted per table (pg_stat_user_tables),
  the index entries those writes made (an insert or a non-HOT update adds one to each index of its table whose
  predicate it meets; partial indexes are counted by their predicate where the row ends), and the CPU seconds
  of the two backends serving the workers (from /proc, the server being on this machine);
- on SQLite, how long the store's writer lock was held per task (BEGIN IMMEDIATE to COMMIT: what the other
  worker waits for), and the holder's CPU in that time;
- each worker's CPU seconds per task, the Python function calls per task (cProfile's count: it does not move with
  the host's load, as CPU seconds do), and by thread the functions with the most own time.

When the server loads pg_stat_statements and the admin database (``--pg``) has the extension, the server's own
time, buffers and WAL records by statement follow (a private cluster for that: see bench/RESULTS.md).

Timings under the profiler are slower than the bench's; the counts are exact.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
TARGET = "bench/noop_pipeline.py:pipe"
COUNTED = ("execute", "executemany", "execute_rowcount", "executemany_count", "executemany_returning",
           "insert_many", "insert_many_returning", "insert_numbered", "update_many", "append")


def _label(name: str, args: tuple[Any, ...]) -> str:
    import re

    text = f"COPY {args[0]}" if name == "append" else re.sub(r"\s+", " ", str(args[0])).strip()
    return re.sub(r"\(\?(, ?\?)*\)", "(?, ...)", text)[:110]


@contextlib.contextmanager
def counting(stats: dict[str, list[float]], transactions: list[int]) -> Iterator[None]:
    """Count, time and size every store statement (outermost call only) and every outermost transaction."""
    from conveyor.store.dialect import PostgresDialect, SqliteDialect

    depth = threading.local()
    saved = [(cls, name, getattr(cls, name)) for cls in (SqliteDialect, PostgresDialect) for name in
             (*COUNTED, "transaction") if name in vars(cls)]

    def wrap(name: str, original: Any) -> Any:
        if name == "transaction":
            @contextlib.contextmanager
            def transaction(self: Any) -> Iterator[None]:
                if not self._depth:
                    transactions[0] += 1
                with original(self):
                    yield
            return transaction

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            outer = not getattr(depth, "value", 0)
            depth.value = getattr(depth, "value", 0) + 1
            started = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                depth.value -= 1
                if outer:
                    entry = stats.setdefault(_label(name, args), [0, 0, 0.0])
                    entry[0] += 1
                    rows = args[1] if len(args) > 1 and name not in ("execute", "execute_rowcount") else None
                    if name == "append":
                        rows = args[2]
                    entry[1] += len(rows) if rows is not None else 1
                    entry[2] += time.perf_counter() - started
        return call

    for cls, name, original in saved:
        setattr(cls, name, wrap(name, original))
    try:
        yield
    finally:
        for cls, name, original in saved:
            setattr(cls, name, original)


def worker(db: str, run_id: str, blobs_dir: str, out: str, top: int) -> None:
    """One profiled worker; its figures as JSON in ``out``."""
    sys.path.insert(0, str(ROOT))
    from conveyor.blobs import open_blobs
    from conveyor.runtime.target import load_target
    from conveyor.runtime.worker import Worker, WorkerOptions

    target = str(ROOT / TARGET)
    pipeline = load_target(target)
    stats: dict[str, list[float]] = {}
    transactions = [0]
    profiles: dict[str, cProfile.Profile] = {}
    backends: list[int] = []

    def per_thread(*_: Any) -> None:
        prof = profiles.setdefault(threading.current_thread().name.split("_")[0], cProfile.Profile())
        prof.enable()

    main = profiles["MainThread (event loop)"] = cProfile.Profile()
    from conveyor.store.dialect import PostgresDialect

    opened = PostgresDialect.__init__

    def remember(self: Any, url: str) -> None:
        opened(self, url)
        backends.append(int(self.conn.info.backend_pid))

    PostgresDialect.__init__ = remember  # type: ignore[method-assign]
    import gc

    collected = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
    began = [0.0]

    def collections(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            entry = collected[info["generation"]]
            entry[0] += 1
            entry[1] += time.perf_counter() - began[0]

    gc.callbacks.append(collections)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    server: dict[int, float] = {}
    original_close = PostgresDialect.close

    def close(self: Any) -> None:
        pid = int(self.conn.info.backend_pid)
        server[pid] = _proc_cpu(pid)
        original_close(self)

    PostgresDialect.close = close  # type: ignore[method-assign]
    held = [0.0, 0.0]  # SQLite: seconds of wall and of the thread's CPU with the store's writer lock held
    from conveyor.store.dialect import SqliteDialect

    writing = SqliteDialect._write

    @contextlib.contextmanager
    def write(self: Any) -> Iterator[None]:
        wall, thread = time.perf_counter(), time.thread_time()
        try:
            with writing(self):
                yield
        finally:
            held[0] += time.perf_counter() - wall
            held[1] += time.thread_time() - thread

    SqliteDialect._write = write  # type: ignore[method-assign]
    with counting(stats, transactions):
        threading.setprofile(per_thread)
        main.enable()
        started = time.perf_counter()
        try:
            counts = Worker(pipeline, target, db, open_blobs(blobs_dir),
                            WorkerOptions(until_idle=True, run_id=run_id)).run()
        finally:
            main.disable()
            threading.setprofile(None)
        wall = time.perf_counter() - started
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    threads, function_calls = {}, 0
    for name, prof in profiles.items():
        text = io.StringIO()
        ps = pstats.Stats(prof, stream=text)
        function_calls += ps.total_calls  # type: ignore[attr-defined]
        ps.sort_stats("tottime").print_stats(top)
        threads[name] = "Ordered by" + text.getvalue().split("Ordered by", 1)[-1]
    Path(out).write_text(json.dumps({
        "wall": wall, "cpu": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
        "counts": dict(counts), "statements": stats, "transactions": transactions[0], "threads": threads,
        "server_cpu": sum(server.values()), "backends": len(set(backends)), "gc": collected,
        "function_calls": function_calls, "held": held,
    }))


def _proc_cpu(pid: int) -> float:
    """User+system seconds of a process on this machine (a PostgreSQL backend), 0 when it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PG_TABLES = """SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"""
PG_INDEXES = """SELECT t.relname, i.relname, pg_get_expr(x.indpred, x.indrelid) FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = 'public'"""


def table_writes(url: str) -> dict[str, tuple[int, int, int, int]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        return {r[0]: tuple(r[1:]) for r in conn.execute(PG_TABLES)}  # type: ignore[misc]


def indexes(url: str) -> dict[str, list[tuple[str, str | None]]]:
    import psycopg

    found: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    with psycopg.connect(url, autocommit=True) as conn:
        for table, index, predicate in conn.execute(PG_INDEXES):
            found[table].append((index, predicate))
    return found


def sizes(url: str) -> str:
    """The hot tables' heap and index sizes at the end (MB)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT relname, pg_relation_size(oid), pg_indexes_size(oid) FROM pg_class "
                            "WHERE relname IN ('tasks', 'outputs', 'attempts') ORDER BY relname").fetchall()
    return "sizes at the end (MB, heap / indexes): " + ", ".join(
        f"{name} {heap / 2**20:.1f} / {index / 2**20:.1f}" for name, heap, index in rows)


def server_statements(admin_url: str, db: str, reset: bool) -> list[tuple[Any, ...]] | None:
    """The server's own timing of each statement of the store ``db`` (pg_stat_statements, when the server loads it
    and the admin database has the extension; None otherwise): reset before the workers start, read after."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'").fetchall():
            return None
        dbname = db.rpartition("/")[2]
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchall()[0][0]
        print(f"the server's WAL position {'before' if reset else 'after'} the workers: {lsn}", file=sys.stderr)
        if reset:
            conn.execute("SELECT pg_stat_statements_reset()")
            return []
        return conn.execute(
            "SELECT calls, rows, total_exec_time, shared_blks_hit + shared_blks_read, wal_records, query "
            "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s "
            "ORDER BY total_exec_time DESC", (dbname,)).fetchall()


def statements_report(rows: list[tuple[Any, ...]], tasks: int) -> str:
    """pg_stat_statements' rows, per 1,000 tasks: the server's execution time (planning apart), buffers touched and
    WAL records by statement."""
    import re

    lines = ["", "the server, by statement (pg_stat_statements, per 1,000 tasks):",
             f"{'calls':>7} {'rows':>8} {'exec ms':>8} {'buffers':>8} {'wal rec':>8}  statement"]
    total = [0.0, 0.0, 0.0, 0.0, 0.0]
    for calls, nrows, ms, buffers, wal, query in rows:
        k = 1000 / tasks
        lines.append(f"{calls * k:7.1f} {nrows * k:8.0f} {ms * k:8.1f} {buffers * k:8.0f} {wal * k:8.0f}  "
                     + re.sub(r"\s+", " ", query)[:90])
        for i, v in enumerate((calls, nrows, ms, buffers, wal)):
            total[i] += float(v) * k
    lines.append(f"{total[0]:7.1f} {total[1]:8.0f} {total[2]:8.1f} {total[3]:8.0f} {total[4]:8.0f}  all")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--pg", default=os.environ.get("CONVEYOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--without", action="append", default=[], metavar="INDEX",
                        help="PostgreSQL: drop this index after the submission (what the hot path saves without it)")
    parser.add_argument("--before", action="append", default=[], metavar="SQL",
                        help="PostgreSQL: run this statement on the new store before the submission (a what-if: "
                             "ALTER TABLE tasks SET (fillfactor = 50))")
    parser.add_argument("--worker", nargs=4, metavar=("DB", "RUN", "BLOBS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, top=args.top)
        return 0
    sys.path.insert(0, str(HERE.parent))
    import engine

    work = Path(tempfile.mkdtemp(prefix="conveyor-fleetprofile-"))
    try:
        with contextlib.ExitStack() as stack:
            db = (engine.sqlite_url(work, "profile.db") if args.backend == "sqlite"
                  else stack.enter_context(engine.pg_database(args.pg)))
            if args.before:
                import psycopg

                from conveyor.store import open_store

                open_store(db).close()  # the schema, then the what-if
                with psycopg.connect(db, autocommit=True) as conn:
                    for statement in args.before:
                        conn.execute(statement)
            manifest = engine.write_manifest(work / "manifest.jsonl", args.items)
            blobs = work / "blobs"
            _, out = engine.cli_json("submit", TARGET, "--input", str(manifest), "--db", db, "--blobs", str(blobs))
            if args.without:
                import psycopg

                with psycopg.connect(db, autocommit=True) as conn:
                    for index in args.without:
                        conn.execute(f"DROP INDEX {index}")
            before = table_writes(db) if args.backend == "postgres" else {}
            statements = server_statements(args.pg, db, reset=True) if args.backend == "postgres" else None
            outs = [work / f"worker-{i}.json" for i in range(2)]
            procs = [subprocess.Popen([sys.executable, str(HERE), "--top", str(args.top), "--worker", db,
                                       out["run_id"], str(blobs), str(o)]) for o in outs]
            for proc in procs:
                if proc.wait() != 0:
                    raise SystemExit(f"profiled worker exited {proc.returncode}")
            results = [json.loads(o.read_text()) for o in outs]
            print(report(results, 3 * args.items, args.backend,
                         (before, table_writes(db), indexes(db)) if args.backend == "postgres" else None))
            if args.backend == "postgres":
                print(sizes(db))
            if statements is not None:
                print(statements_report(server_statements(args.pg, db, reset=False) or [], 3 * args.items))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(results: list[dict[str, Any]], tasks: int, backend: str,
           server: tuple[dict[str, Any], dict[str, Any], dict[str, list[tuple[str, str | None]]]] | None) -> str:
    lines = [f"{backend}: {tasks:,} tasks (item-stages), 2 workers under cProfile"]
    statements: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for r in results:
        for label, (calls, rows, seconds) in r["statements"].items():
            entry = statements[label]
            entry[0] += calls
            entry[1] += rows
            entry[2] += seconds
    calls = sum(e[0] for e in statements.values())
    commits = sum(r["transactions"] for r in results)
    cpu = sum(r["cpu"] for r in results)
    walls = ", ".join(f"{r['wall']:.2f}" for r in results)
    lines.append(f"worker wall {walls} s; worker CPU {cpu:.2f} s = "
                 f"{cpu / tasks * 1e6:.0f} us per task (under the profiler)")
    function_calls = sum(r["function_calls"] for r in results)
    lines.append(f"Python function calls (cProfile's count, every thread, start-up included) {function_calls:,} = "
                 f"{function_calls / tasks:.1f} per task")
    for gen in ("0", "1", "2"):
        n = sum(r["gc"][gen][0] for r in results)
        seconds = sum(r["gc"][gen][1] for r in results)
        lines.append(f"garbage collections of generation {gen}: {n:,}, {seconds:.2f} s")
    lines.append(f"statements {calls:,} = {calls / tasks * 1000:.1f} per 1,000 tasks; transactions {commits:,} = "
                 f"{commits / tasks * 1000:.1f} per 1,000 tasks")
    if backend == "sqlite":  # BEGIN IMMEDIATE to COMMIT: what the other worker waits for (one writer)
        wall, thread = (sum(r["held"][i] for r in results) for i in (0, 1))
        lines.append(f"the store's writer lock held {wall / tasks * 1e6:.1f} us per task, the holder's CPU "
                     f"{thread / tasks * 1e6:.1f} us per task of it (under the profiler)")
    if server is not None:
        server_cpu = sum(r["server_cpu"] for r in results)
        lines.append(f"server CPU of the workers' backends {server_cpu:.2f} s = {server_cpu / tasks * 1e6:.0f} us "
                     "per task")
    lines.append("")
    lines.append(f"{'calls':>7} {'rows':>8} {'sec':>7}  statement (by time)")
    for label, (n, rows, seconds) in sorted(statements.items(), key=lambda kv: -kv[1][2]):
        lines.append(f"{n:7,d} {rows:8,d} {seconds:7.2f}  {label}")
    if server is not None:
        before, after, index_map = server
        lines += ["", "rows written per task, and index entries made (inserts and non-HOT updates x indexes):",
                  f"{'table':<22} {'ins/task':>8} {'upd/task':>8} {'hot/task':>8} {'del/task':>8} {'indexes':>7} "
                  f"{'entries/task':>12}"]
        total_rows = total_entries = 0.0
        for table, (ins, upd, hot, dele) in sorted(after.items()):
            b = before.get(table, (0, 0, 0, 0))
            ins, upd, hot, dele = ins - b[0], upd - b[1], hot - b[2], dele - b[3]
            if not (ins or upd or dele):
                continue
            count = len(index_map.get(table, []))
            entries = (ins + upd - hot) * count
            total_rows += ins + upd + dele
            total_entries += entries
            lines.append(f"{table:<22} {ins / tasks:8.2f} {upd / tasks:8.2f} {hot / tasks:8.2f} {dele / tasks:8.2f} "
                         f"{count:7d} {entries / tasks:12.2f}")
        lines.append(f"{'all':<22} rows written {total_rows / tasks:.2f} per task; index entries at most "
                     f"{total_entries / tasks:.2f} per task (a partial index whose predicate a row does not meet "
                     "gets none)")
        for table in sorted(index_map):
            if table in ("tasks", "attempts", "outputs"):
                named = [f"{i}{' WHERE ' + p if p else ''}" for i, p in index_map[table]]
                lines.append(f"  {table}: " + "; ".join(named))
    for i, r in enumerate(results):
        for thread, text in r["threads"].items():
            lines += ["", f"--- worker {i}, thread {thread}:", text.strip()]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
