"""Metrics scrape time at a large backlog: one `/metrics` scrape with 1,000,000 queued tasks, SQLite and PostgreSQL.

    PYTHONPATH=src .venv/bin/python bench/metrics.py [--items 1000000] [--scrapes 5] [--pg URL] [--no-write]

`conveyor submit` of a JSONL manifest of N items (the no-op pipeline of bench/noop_pipeline.py: N tasks queued
at its first stage), then, in this process, the same collector `conveyor serve` and `conveyor worker
--metrics-port` use (conveyor.metrics), through one store kept open as a worker's exporter does. Prints the
time of each part of a scrape (the queue's counts per second less the leases, the running totals, the rest) on
each backend (PostgreSQL: ``--pg`` or CONVEYOR_TEST_PG, a fresh database made and dropped; ``--pg ''`` skips it)
and writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from results import markers, pg_database, write_section  # noqa: E402

from conveyor.metrics import exposition, new_registry  # noqa: E402
from conveyor.metrics.collector import shared_store  # noqa: E402
from conveyor.runtime.target import load_target  # noqa: E402
from conveyor.store import open_store  # noqa: E402

SCRIPT = "metrics"
BEGIN, END = markers(f"{SCRIPT}.py")
TARGET = f"{ROOT / 'bench' / 'noop_pipeline.py'}:pipe"


def write_manifest(path: Path, count: int) -> Path:
    with path.open("w") as out:
        for i in range(count):
            out.write(json.dumps({"key": f"item-{i:08d}", "text": f"document {i}"}) + "\n")
    return path


def submit(manifest: Path, db: str, blobs: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), CONVEYOR_PROGRESS_S="0")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "conveyor", "submit", TARGET, "--input", str(manifest), "--db", db,
                    "--blobs", str(blobs), "--json"], check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def timed(fn: Callable[[], Any], times: int) -> tuple[list[float], Any]:
    seconds, result = [], None
    for _ in range(times):
        started = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - started)
    return seconds, result


def parts(db: str, times: int) -> dict[str, list[float]]:
    """Each store read of a scrape, alone."""
    store = open_store(db, migrate=False)
    try:
        now = store.clock()
        return {
            "queue (open_task_seconds less the leases: count, oldest, age histogram)": timed(
                store.queued_seconds, times)[0],
            "running + review backlog": timed(lambda: (store.running_counts(), store.review_backlog()), times)[0],
            "running totals (metric_totals)": timed(store.metric_totals, times)[0],
            "dead letters of the last hour": timed(lambda: store.dead_letters_since(now - 3600), times)[0],
        }
    finally:
        store.close()


def measure(db: str, work: Path, items: int, scrapes: int) -> tuple[float, list[str]]:
    """Submit ``items`` to ``db``, then time whole scrapes and each part; the table rows."""
    work.mkdir(parents=True, exist_ok=True)
    submit_s = submit(write_manifest(work / "manifest.jsonl", items), db, work / "blobs")
    print(f"{db.partition(':')[0]}: submitted {items:,} items in {submit_s:.1f} s", flush=True)
    registry = new_registry(shared_store(db), [load_target(TARGET)])
    seconds, body = timed(lambda: exposition(registry), scrapes)
    split = parts(db, scrapes)
    rows = [f"| one scrape (`/metrics` body, {len(body):,} bytes) | {ms(min(seconds))} | {ms(med(seconds))} |"]
    rows += [f"| {name} | {ms(min(s))} | {ms(med(s))} |" for name, s in split.items()]
    for line in rows:
        print(line, flush=True)
    return submit_s, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--pg", default=os.environ.get("CONVEYOR_TEST_PG", ""),
                        help="an admin URL of a PostgreSQL server ('' skips PostgreSQL)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    tables: list[str] = []
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-metrics-") as scratch:
        work = Path(scratch)
        submit_s, rows = measure(f"sqlite:///{work / 'store.db'}", work / "sqlite", args.items, args.scrapes)
        tables += [f"SQLite (`conveyor submit` {submit_s:.0f} s):", "", *HEAD, *rows, ""]
        if args.pg:
            with pg_database(args.pg, "metrics") as db:
                submit_s, rows = measure(db, work / "pg", args.items, args.scrapes)
            tables += [f"PostgreSQL (`conveyor submit` {submit_s:.0f} s):", "", *HEAD, *rows, ""]
    load = os.getloadavg()[0]
    section = "\n".join([
        BEGIN, "## Metrics scrape (bench/metrics.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (1-minute load {load:.1f}) with:", "",
        f"    PYTHONPATH=src .venv/bin/python bench/metrics.py --items {args.items} --scrapes {args.scrapes}", "",
        f"A store with {args.items:,} tasks queued at one stage (`conveyor submit`); {args.scrapes} scrapes through "
        "the collector of `conveyor serve` and `conveyor worker --metrics-port`, through one store kept open (as "
        "the worker's exporter does). No part grows with the backlog: the queue's size, oldest age and age "
        "histogram come from `open_task_seconds` (open tasks per stage and second of `available_at`, kept by "
        "triggers on `tasks`: rows bounded by the seconds the queue spans, here the submit's) less the leased "
        "tasks (the lease index); the counters read `metric_totals`.", "",
        *tables, END])
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


HEAD = ["| part | min ms | median ms |", "| --- | ---: | ---: |"]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def med(values: list[float]) -> float:
    return statistics.median(values)


if __name__ == "__main__":
    main()
