"""Selection benchmark: picking 1,000 failures out of a run of 1,000,000 items, on SQLite and PostgreSQL.

    .venv/bin/python bench/selection.py [--items 1000000] [--failed 1000] [--pg URL] [--no-write]

A run's rows are written straight into a fresh store (the engine's own schema and migrations): 1,000,000 root
items, each with a ``parse`` task and an ``extract`` task that succeeded, except ``--failed`` items whose
``parse`` failed with ``cid_leak``; every ``parse`` task has a ``parser`` provenance row (1.24.9 for the
failures, 1.24.10 for the rest). Then `conveyor select`'s service function answers, each timed (best of three,
after one warm-up):

1. ``--run R --status failed`` (count and list);
2. ``--run R --stage parse --error-class cid_leak --where "parser < 1.24.10"``;
3. ``--run R --outcome failed`` (items judged by their reconciliation outcome);
4. ``--run R --where "parser < 1.24.10"`` (the provenance index alone);

against the target of under a second for the first three. Writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from results import markers, pg_database, write_section  # noqa: E402

from conveyor.service.selection import Selection, parse_where, select_report  # noqa: E402
from conveyor.store import SqlStore, open_store  # noqa: E402
from conveyor.store.provenance import sort_key  # noqa: E402

SCRIPT = "selection"
BEGIN, END = markers(f"{SCRIPT}.py")
STAGES = '[{"name": "parse", "after": null, "kind": "map", "version": "1", "config_hash": "c"}, ' \
         '{"name": "extract", "after": "parse", "kind": "map", "version": "1", "config_hash": "c"}]'
TASK_COLUMNS = ("run_id", "pipeline", "stage", "item_key", "root_key", "status", "task_key", "stage_version",
                "config_hash", "input_digest", "input_kind", "input_size", "max_attempts", "available_at",
                "created_at", "finished_at", "error_class", "last_error", "attempts", "cached")
BATCH = 50_000


def populate(store: SqlStore, run_id: str, items: int, failed: int) -> float:
    """Write the run's rows; returns the seconds it took."""
    started, now = time.perf_counter(), time.time()
    store.db.execute(
        "INSERT INTO runs (run_id, pipeline, target, input, status, expected, has_publish, stages, created_at) "
        "VALUES (?, 'bench', 'bench.py:pipe', 'bench', 'submitted', ?, 0, ?, ?)", (run_id, items, STAGES, now))
    every = max(1, items // failed)
    for start in range(0, items, BATCH):
        numbers = range(start, min(items, start + BATCH))
        keys = [f"doc{i:08d}" for i in numbers]
        hexes = {f"doc{i:08d}": f"{i:063x}" for i in numbers}  # task keys are hex digests
        bad = {key for i, key in enumerate(keys, start) if i % every == 0 and i // every < failed}
        with store.transaction():
            store.db.append("items", ("run_id", "item_key", "root_key", "source_digest", "source_size", "created_at"),
                            [(run_id, k, k, "d" * 64, 100, now) for k in keys])
            rows: list[tuple[Any, ...]] = []
            for k in keys:
                head = (run_id, "bench", "parse", k, k)
                if k in bad:
                    rows.append((*head, "failed", hexes[k] + "0", "1", "c", "d", "bytes", 100, 3, now, now, now,
                                 "cid_leak", "a cid leaked", 1, 0))
                    continue
                rows.append((*head, "succeeded", hexes[k] + "0", "1", "c", "d", "bytes", 100, 3, now, now, now, None,
                             None, 1, 0))
                rows.append((run_id, "bench", "extract", k, k, "succeeded", hexes[k] + "1", "1", "c", "d", "json", 10,
                             3, now, now, now, None, None, 1, 0))
            store.db.append("tasks", TASK_COLUMNS, rows)
            store.db.append("provenance", ("run_id", "root_key", "item_key", "stage", "name", "value", "sort_key"),
                            [(run_id, k, k, "parse", "parser", v, sort_key(v))
                             for k in keys for v in (("1.24.9",) if k in bad else ("1.24.10",))])
    store.db.refresh_statistics(("tasks", "items", "provenance"))
    store.recount_run_totals(run_id)  # the rows were written around the engine: count the run's totals once
    store.recount_open_task_seconds()
    return time.perf_counter() - started


def best(fn: Callable[[], dict[str, Any]], runs: int = 3) -> tuple[float, dict[str, Any]]:
    fn()  # warm-up: the page cache, the planner
    times, out = [], {}
    for _ in range(runs):
        started = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - started)
    return min(times), out


def queries(run_id: str) -> list[tuple[str, Selection, float | None]]:
    return [
        ("--status failed", Selection(runs=(run_id,), statuses=("failed",)), 1.0),
        ('--stage parse --error-class cid_leak --where "parser < 1.24.10"',
         Selection(runs=(run_id,), stages=("parse",), error_classes=("cid_leak",),
                   where=parse_where("parser < 1.24.10")), 1.0),
        ("--outcome failed", Selection(runs=(run_id,), outcomes=("failed",)), 1.0),
        ('--where "parser < 1.24.10"', Selection(runs=(run_id,), where=parse_where("parser < 1.24.10")), None),
    ]


def bench(url: str, backend: str, items: int, failed: int) -> list[str]:
    store = open_store(url)
    rows = []
    try:
        run_id = f"rbench-{uuid.uuid4().hex[:6]}"
        seconds = populate(store, run_id, items, failed)
        print(f"{backend}: wrote {items:,} items, {2 * items - failed:,} tasks in {seconds:.1f} s", flush=True)
        for label, selection, target in queries(run_id):
            took, out = best(lambda s=selection: select_report(store, s, limit=1000))
            verdict = "" if target is None else ("PASS" if took < target and out["count"] == failed else "FAIL")
            shown = f"< {target:g} s" if target is not None else ""
            rows.append(f"| {backend} | `select --run R {label}` | {out['count']:,} | {took:.3f} | {shown} | "
                        f"{verdict} |")
            print(rows[-1], flush=True)
    finally:
        store.close()
    return rows



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--failed", type=int, default=1_000)
    parser.add_argument("--pg", default=os.environ.get("CONVEYOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
                        help="an admin URL of a PostgreSQL server ('' to leave PostgreSQL out)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-sel-") as work:
        rows += bench(f"sqlite:///{work}/bench.db", "sqlite", args.items, args.failed)
    if args.pg:
        with pg_database(args.pg, "sel") as url:
            rows += bench(url, "postgres", args.items, args.failed)
    section = "\n".join([
        BEGIN, "## Selection (bench/selection.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:", "",
        f"    .venv/bin/python bench/selection.py --items {args.items} --failed {args.failed}", "",
        f"Machine: nproc {os.cpu_count()}; {platform.platform()}; Python {platform.python_version()}. "
        f"A run of {args.items:,} items (two tasks each, {args.failed:,} of them failed at the first, every first "
        "task with a `parser` provenance row) written straight into a fresh store; each selection is "
        "`select_report` (count every match, list the first 1,000), best of three after a warm-up.", "",
        "| backend | selection | tasks | seconds | target | result |", "| --- | --- | ---: | ---: | --- | --- |",
        *rows, "", END])
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


if __name__ == "__main__":
    main()
