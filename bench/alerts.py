"""Alert evaluation time against a large dead-letter history: what a worker's lease keeper spends every 30 s.

    PYTHONPATH=src .venv/bin/python bench/alerts.py [--pg ADMIN_URL] [--old 1000000] [--recent 20000] [--runs 5]
                                                    [--no-write]

A SQLite store (and, with ``--pg``, a scratch PostgreSQL database) with ``--old`` dead letters older than an
hour and ``--recent`` in the last hour, half of them of the watched pipeline and half of another. Then, through
the store a worker holds, a full evaluation of ``Alerts(dead_letters_per_hour=..., review_overdue=True)`` (the
claim, both counts, the state rows' transaction), ``--runs`` times. The dead-letter count reads the last hour's
range of ``dead_letters_created`` (every pipeline's, each checked against its run), never the older history.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from results import markers, pg_database, write_section  # noqa: E402

from conveyor import Alerts, Pipeline  # noqa: E402
from conveyor.runtime.alerts import evaluate  # noqa: E402
from conveyor.store import NewDeadLetter, RunRecord, SqlStore, open_store  # noqa: E402

SCRIPT = "alerts"
BEGIN, END = markers(f"{SCRIPT}.py")
BATCH = 50_000


def fill(store: SqlStore, old: int, recent: int, now: float) -> None:
    """Two pipelines' runs; ``old`` dead letters two hours back, ``recent`` within the hour (half each)."""
    for pipeline in ("watched", "other"):
        store.create_run(RunRecord(f"r-{pipeline}", pipeline, "bench", "bench", "finished", 0, False, "[]",
                                   now - 7200, now - 7200, None))
    rows = ((i, "r-watched" if i % 2 else "r-other", now - 7200 + i * 1e-4 if i < old else now - 60 + i * 1e-6)
            for i in range(old + recent))
    batch: list[NewDeadLetter] = []
    for task_id, run_id, at in rows:
        batch.append(NewDeadLetter(task_id, run_id, f"item-{task_id}", "parse", "value_error", "boom", 3, at))
        if len(batch) == BATCH:
            _insert(store, batch)
            batch = []
    _insert(store, batch)


def _insert(store: SqlStore, batch: list[NewDeadLetter]) -> None:
    with store.transaction():
        store.insert_dead_letters(batch)


def measure(url: str, old: int, recent: int, runs: int) -> str:
    """Fill the store at ``url`` and time ``runs`` evaluations; the table row."""
    pipeline = Pipeline("watched", alerts=Alerts(dead_letters_per_hour=100, review_overdue=True))
    store = open_store(url)
    try:
        now = store.clock()
        started = time.perf_counter()
        fill(store, old, recent, now)
        store.db.refresh_statistics(("dead_letters", "runs"))  # PostgreSQL's autovacuum would have, by now
        print(f"{store.backend}: wrote {old + recent:,} dead letters in {time.perf_counter() - started:.1f} s",
              flush=True)
        seconds, fired = [], 0
        for i in range(runs):
            began = time.perf_counter()
            fired += len(evaluate(store, pipeline, now + i, every=0, operator_webhook=""))
            seconds.append(time.perf_counter() - began)
        return (f"| {store.backend} | {old:,} | {recent:,} | {ms(min(seconds))} | {ms(statistics.median(seconds))} "
                f"| {fired} |")
    finally:
        store.close()



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg", default=os.environ.get("CONVEYOR_TEST_PG"),
                        help="a PostgreSQL server (admin URL) to measure too, in a scratch database "
                             "(default: $CONVEYOR_TEST_PG; none: SQLite only)")
    parser.add_argument("--old", type=int, default=1_000_000)
    parser.add_argument("--recent", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-alerts-") as scratch:
        rows = [measure(f"sqlite:///{Path(scratch) / 'store.db'}", args.old, args.recent, args.runs)]
    if args.pg:
        with pg_database(args.pg, "alerts") as url:
            rows.append(measure(url, args.old, args.recent, args.runs))
    load = os.getloadavg()[0]
    for row in rows:
        print(row)
    pg = " --pg postgresql://..." if args.pg else ""
    section = "\n".join([
        BEGIN, "## Alert evaluation (bench/alerts.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (1-minute load {load:.1f}) with:", "",
        f"    PYTHONPATH=src .venv/bin/python bench/alerts.py{pg} --old {args.old} --recent {args.recent} "
        f"--runs {args.runs}", "",
        "One evaluation of a pipeline's alerts (claim, dead letters of the last hour, overdue reviews, the state "
        "rows' transaction), as a worker's lease keeper makes every 30 s; `old` dead letters are two hours back, "
        "`recent` ones within the hour, half of them the watched pipeline's; statistics refreshed after the load "
        "(as PostgreSQL's autovacuum does). `fired`: transitions over the runs (the first fires, the rest find it "
        "firing). The old history is never read: before the query named its join order (CROSS JOIN), SQLite "
        "started from the pipeline's runs and read every dead letter they ever had, 573.7 ms min / 711.9 ms "
        "median at these sizes; PostgreSQL without statistics did the same (523.6 / 668.4 ms) and picks the "
        "creation-time range once it has them.", "",
        "| backend | old | recent | min ms | median ms | fired |", "| --- | ---: | ---: | ---: | ---: | ---: |",
        *rows, "", END])
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


if __name__ == "__main__":
    main()
