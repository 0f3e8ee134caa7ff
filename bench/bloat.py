"""Bloat on PostgreSQL: a long run's throughput with and without a reader holding an old snapshot.

    CONVEYOR_TEST_PG=postgresql://postgres@127.0.0.1:5432/postgres PYTHONPATH=src \\
        .venv/bin/python bench/bloat.py [--minutes 30] [--workers 2] [--no-write]

Two runs, one after the other, each on a fresh database: ``--workers`` `conveyor worker` processes of the no-op
pipeline (bench/noop_pipeline.py) fed by this script, which submits a 20,000-item run whenever fewer than
40,000 tasks are open, for ``--minutes``. In the second, a connection holds `REPEATABLE READ` open from the
start (a reporting query left open, a forgotten `psql` session): no row version dead since then can be removed
by vacuum. Every 30 s (a twentieth of a shorter run) it samples the tasks finished (the metrics' running
totals) and the size of `tasks` and its indexes. Issue 12 point 5's target: the last ten minutes with the reader
keep at least 80% of the first ten minutes' rate (its "fresh" throughput). Prints the samples and writes its
section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from results import markers, pg_database, write_section  # noqa: E402

from conveyor.store import open_store  # noqa: E402

SCRIPT = "bloat"
BEGIN, END = markers(f"{SCRIPT}.py")
TARGET = f"{ROOT / 'bench' / 'noop_pipeline.py'}:pipe"
BATCH, LOW_WATER = 20_000, 40_000
HALVES = {"": "; then the same with a `REPEATABLE READ` transaction held open from the start",
          "fresh": " (no long reader: the first half only)",
          "reader": ", with a `REPEATABLE READ` transaction held open from the start (the second half only)"}


def manifest(path: Path, run: int) -> Path:
    with path.open("w") as out:
        for i in range(BATCH):
            out.write(json.dumps({"key": f"r{run}-{i:06d}", "text": f"document {run}/{i}"}) + "\n")
    return path


def finished(store: Any) -> int:
    return int(sum(t.value for t in store.metric_totals() if t.name == "tasks_finished"))


def open_tasks(store: Any) -> int:
    """Tasks queued or running, from the counts the commits keep (a walk of the leased tasks' index would meet
    every task run since the reader's snapshot: a second's poll is not to slow the run it measures)."""
    return int(store.db.execute("SELECT COALESCE(SUM(tasks), 0) FROM open_task_seconds")[0][0])


def sizes(store: Any) -> tuple[int, int]:
    """Bytes of the tasks table (heap) and of its indexes."""
    row = store.db.execute("SELECT pg_relation_size('tasks'), pg_indexes_size('tasks')")[0]
    return int(row[0]), int(row[1])


def one_run(db: str, work: Path, minutes: float, workers: int, reader: bool) -> list[tuple[float, int, int, int]]:
    """Samples (seconds since start, tasks finished, heap bytes, index bytes)."""
    import psycopg

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), CONVEYOR_PROGRESS_S="0")
    blobs = work / "blobs"
    store = open_store(db)
    held = None
    if reader:
        held = psycopg.connect(db)
        held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        held.execute("SELECT COUNT(*) FROM runs").fetchall()  # the snapshot is taken: held until the end
    procs = [subprocess.Popen([sys.executable, "-m", "conveyor", "worker", TARGET, "--db", db, "--blobs", str(blobs),
                               "-q"], env=env, stdout=subprocess.DEVNULL) for _ in range(workers)]
    samples: list[tuple[float, int, int, int]] = []
    started, runs, next_sample = time.monotonic(), 0, 0.0
    every = min(30.0, minutes * 60 / 20)
    try:
        while (elapsed := time.monotonic() - started) < minutes * 60:
            if open_tasks(store) < LOW_WATER:
                runs += 1
                subprocess.run([sys.executable, "-m", "conveyor", "submit", TARGET, "--input",
                                str(manifest(work / "batch.jsonl", runs)), "--db", db, "--blobs", str(blobs), "--json"],
                               check=True, env=env, stdout=subprocess.DEVNULL)
            if elapsed >= next_sample:
                heap, index = sizes(store)
                samples.append((elapsed, finished(store), heap, index))
                print(f"{'reader' if reader else 'fresh '} {elapsed:7.0f} s  finished {samples[-1][1]:>10,}  "
                      f"heap {heap / 2**20:8.1f} MiB  indexes {index / 2**20:8.1f} MiB", flush=True)
                next_sample += every
            time.sleep(1.0)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # its drain is stuck on the store: the figures are taken already
                proc.kill()
                proc.wait()
        if held is not None:
            held.close()
        store.close()
    return samples


def rate(samples: list[tuple[float, int, int, int]], first: bool, span_s: float) -> float:
    """Tasks finished per second over the first (or last) ``span_s`` seconds of the samples."""
    if first:
        window = [s for s in samples if s[0] <= span_s]
    else:
        window = [s for s in samples if s[0] >= samples[-1][0] - span_s]
    (t0, n0, *_), (t1, n1, *_) = window[0], window[-1]
    return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pg", default=os.environ.get("CONVEYOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--only", choices=("fresh", "reader"), help="run one half (its row alone is written)")
    args = parser.parse_args()
    span = min(600.0, args.minutes * 60 / 3)
    results = {}
    for reader in (False, True):
        if args.only and reader != (args.only == "reader"):
            continue
        with tempfile.TemporaryDirectory(prefix="conveyor-bench-bloat-") as scratch, \
                pg_database(args.pg, "bloat") as db:
            results[reader] = one_run(db, Path(scratch), args.minutes, args.workers, reader)
    rows = []
    for reader, samples in results.items():
        fresh, last = rate(samples, True, span), rate(samples, False, span)
        heap, index = samples[-1][2], samples[-1][3]
        rows.append(f"| {'with a reader holding a snapshot' if reader else 'no long reader'} | {fresh:,.0f} | "
                    f"{last:,.0f} | {last / fresh if fresh else 0:.2f} | {heap / 2**20:,.0f} | {index / 2**20:,.0f} |")
    both = ""
    if len(results) == 2:
        with_reader, alone = rate(results[True], False, span), rate(results[False], False, span)
        both = (f"With the reader, the last {span / 60:g} minutes ran at {with_reader / alone:.2f} of the rate "
                "without one over the same minutes.")
    for line in rows:
        print(line)
    if both:
        print(both)
    section = "\n".join([
        BEGIN, "## Bloat: a long run beside a long reader (bench/bloat.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (1-minute load {os.getloadavg()[0]:.1f}) "
        "with:", "",
        f"    PYTHONPATH=src .venv/bin/python bench/bloat.py --minutes {args.minutes:g} --workers {args.workers}"
        + (f" --only {args.only}" if args.only else ""), "",
        f"{args.workers} `conveyor worker` processes of the no-op pipeline on PostgreSQL, fed 20,000-item runs to keep "
        f"40,000 tasks open, for {args.minutes:g} minutes" + HALVES[args.only or ""]
        + f". Rates are tasks finished per second over the first and the last {span / 60:g} "
        "minutes; sizes are `tasks` and its indexes at the end. Target (issue 12 point 5): last/first >= 0.8 with "
        "the reader.", "",
        "| run | first tasks/s | last tasks/s | last/first | heap MiB | indexes MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: |", *rows, *(["", both] if both else []), "", END])
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


if __name__ == "__main__":
    main()
