"""Dashboard benchmark: how long each page takes at 1,000,000 items, on SQLite and PostgreSQL.

    .venv/bin/python bench/dashboard.py [--items 1000000] [--runs 30] [--repeat 7] [--pg URL] [--no-write]

A store is filled straight through SQL (bench/selection.py's ``populate``: a run of ``--items`` root items with
a ``parse`` and an ``extract`` task each, 15,000 parses failed), then given one attempt per task spread over the
run's last hour (so the timeline has points), 10,000 of the failures dead-lettered under two error classes,
5,000 ``extract`` answers waiting for review, and ``--runs`` small runs beside it (so the runs page is full).
Each page is then asked through the app `conveyor serve` runs (``create_app``, in this process, with an
operator's token): one warm-up, then ``--repeat`` requests; the table gives the best and the median against the
target of 300 ms. For the slow pages, the service calls under them are timed too, to say which one costs. The
items page (``/runs/R/items``) is asked with each of its filters alone, and each filter's query plan printed
(EXPLAIN), with the indexes it uses.
Writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from results import (  # noqa: E402
    markers,
    pg_database,
    write_section,
)
from selection import populate  # noqa: E402

from conveyor.api import ApiSettings, create_app  # noqa: E402
from conveyor.service import report  # noqa: E402
from conveyor.service.progress import overview, timeline  # noqa: E402
from conveyor.service.tokens import create_token  # noqa: E402
from conveyor.store import SqlStore, open_store  # noqa: E402

SCRIPT = "dashboard"
BEGIN, END = markers(f"{SCRIPT}.py")
TARGET_S = 0.300
FAILED = 15_000
DEAD = 10_000
REVIEWS = 5_000
SPAN_S = 3600.0


def fill(store: SqlStore, items: int, small_runs: int) -> tuple[str, float]:
    """The big run (returned) and the small ones; the seconds it took."""
    started = time.perf_counter()
    for n in range(small_runs):
        populate(store, f"rsmall-{n:03d}-{uuid.uuid4().hex[:4]}", 10, 1)
    run_id = f"rbench-{uuid.uuid4().hex[:6]}"  # the newest run: first on the runs page
    populate(store, run_id, items, min(FAILED, items // 10))
    now = time.time()
    with store.transaction():
        store.db.execute("UPDATE runs SET created_at = created_at - ? WHERE run_id LIKE 'rsmall-%'", (2 * SPAN_S,))
        store.db.execute("UPDATE runs SET created_at = ? WHERE run_id = ?", (now - SPAN_S, run_id))
        store.db.execute(
            "INSERT INTO attempts (task_id, run_id, attempt, outcome, invoked, error_class, message, worker, "
            "started_at, duration, provider_calls, prompt_tokens, completion_tokens, cost, model) "
            "SELECT id, run_id, 1, CASE WHEN status = 'succeeded' THEN 'succeeded' ELSE 'failed' END, 1, "
            "error_class, last_error, 'bench', ? + (id % 3600), 0.5, 1, 100, 20, 0.0001, 'bench-model' "
            "FROM tasks WHERE run_id = ?", (now - SPAN_S, run_id))
        store.db.execute(
            "INSERT INTO dead_letters (task_id, run_id, item_key, stage, error_class, error, attempts, created_at) "
            "SELECT id, run_id, item_key, stage, CASE WHEN id % 2 = 0 THEN 'cid_leak' ELSE 'timeout' END, "
            "last_error, 1, ? FROM tasks WHERE run_id = ? AND status = 'failed' ORDER BY id LIMIT ?",
            (now, run_id, DEAD))
        store.db.execute("UPDATE tasks SET status = 'dead_lettered', error_class = (SELECT d.error_class FROM "
                         "dead_letters d WHERE d.task_id = tasks.id) WHERE id IN "
                         "(SELECT task_id FROM dead_letters WHERE run_id = ?)", (run_id,))
        _reviews(store, run_id, now)
    store.recount_run_totals(run_id)  # the statuses above were changed around the engine: count them once
    store.db.refresh_statistics(("tasks", "attempts", "dead_letters", "reviews", "provenance"))
    return run_id, time.perf_counter() - started


def _reviews(store: SqlStore, run_id: str, now: float) -> None:
    rows = store.db.execute("SELECT id, item_key FROM tasks WHERE run_id = ? AND stage = 'extract' "
                            "AND status = 'succeeded' ORDER BY id LIMIT ?", (run_id, REVIEWS))
    entries = []
    for task_id, key in rows:
        answer = json.dumps({"title": f"title of {key}", "confidence": 0.4}).encode()
        entries.append((task_id, run_id, "bench", key, "extract", "low_confidence", "confidence 0.4 is below 0.8",
                        0.4, 0, "json", "e" * 64, answer, len(answer), now + 86400, "reject", now))
    store.db.append("reviews", ("task_id", "run_id", "pipeline", "item_key", "stage", "reason_class", "reason",
                                "confidence", "tier", "candidate_kind", "candidate_digest", "candidate_inline",
                                "candidate_size", "deadline_at", "on_deadline", "created_at"), entries)
    store.db.execute("UPDATE tasks SET status = 'awaiting_review', error_class = 'low_confidence', last_error = "
                     "'confidence 0.4 is below 0.8' WHERE id IN (SELECT task_id FROM reviews WHERE run_id = ?)",
                     (run_id,))


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """(best, median) seconds of ``repeat`` calls after one warm-up, and the last answer."""
    out = fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times), out


def pages(store: SqlStore, run_id: str) -> list[tuple[str, str]]:
    dead = store.db.execute("SELECT id FROM dead_letters WHERE run_id = ? ORDER BY id LIMIT 1 OFFSET 49",
                            (run_id,))[0][0]
    review = store.db.execute("SELECT id FROM reviews WHERE run_id = ? ORDER BY id LIMIT 1", (run_id,))[0][0]
    item = store.db.execute("SELECT item_key FROM tasks WHERE run_id = ? AND status = 'dead_lettered' LIMIT 1",
                            (run_id,))[0][0]
    created = store.db.execute("SELECT created_at FROM runs WHERE run_id = ?", (run_id,))[0][0]
    runs = f"/runs/{run_id}"
    return [
        ("runs", "/"), ("runs, page 2", f"/?before={created}"),
        ("one run", runs), ("one run, its 2 s refresh", f"{runs}?fragment=1"),
        ("dead letters", f"{runs}/dead-letters"), ("dead letters, page 2", f"{runs}/dead-letters?after={dead}"),
        ("dead letters of a class", f"{runs}/dead-letters?error_class=timeout"),
        ("review queue", "/reviews"), ("review queue, page 2", f"/reviews?after={review + 19}"),
        ("one review", f"/reviews/{review}"), ("one item's journey", f"{runs}/items/{item}"),
        ("workers", "/workers"),
        *((f"items: {label}", f"{runs}/items?{query}") for label, query in item_filters(store, run_id)),
        ("items: approve these, the dry run", f"{runs}/selection?review=open&action=approve"),
    ]


def item_filters(store: SqlStore, run_id: str) -> list[tuple[str, str]]:
    """The items page (issue 30 point 1) with each filter alone, and a second page of each kind of walk."""
    after = store.db.execute("SELECT id FROM tasks WHERE run_id = ? AND root_key = 'doc00500000' AND stage = "
                             "'parse'", (run_id,))
    failed = store.db.execute("SELECT id FROM tasks WHERE run_id = ? AND status = 'failed' ORDER BY root_key "
                              "LIMIT 1 OFFSET 49", (run_id,))
    return [
        ("no filter", "limit=50"), ("no filter, a page from the middle", f"after={after[0][0]}" if after else ""),
        ("stage", "stage=extract"), ("status failed", "status=failed"),
        ("status failed, page 2", f"status=failed&after={failed[0][0]}" if failed else "status=failed"),
        ("status dead_lettered", "status=dead_lettered"), ("status succeeded", "status=succeeded"),
        ("status queued (none left)", "status=queued"), ("error class", "error_class=timeout"),
        ("outcome failed", "outcome=failed"), ("outcome dead_lettered", "outcome=dead_lettered"),
        ("outcome completed", "outcome=completed"), ("review open", "review=open"),
        ("key prefix", "prefix=doc0070"), ("error text", "text=cid+leaked"),
        ("provenance, narrow", "where=parser+%3C+1.24.10"), ("provenance, broad", "where=parser+%3E%3D+1.24.10"),
        ("stage + status + error class", "stage=parse&status=dead_lettered&error_class=cid_leak"),
    ]


def plans(store: SqlStore, run_id: str) -> list[str]:
    """Each items filter's query plan (EXPLAIN): the index it walks."""
    from urllib.parse import parse_qs

    from conveyor.service.itemtable import ItemQuery
    from conveyor.service.selection import task_filter

    rows = []
    for label, query in item_filters(store, run_id):
        fields = {k: v[0] for k, v in parse_qs(query).items() if k in ItemQuery.__dataclass_fields__}
        f, _ = task_filter(ItemQuery(**fields).selection(run_id, time.time()), run_id)
        plan = store.task_page_plan(f, None, 51)
        used = sorted({word.strip("(),") for line in plan for word in line.split()
                       if word.strip("(),").startswith(("tasks_", "sqlite_autoindex_tasks", "task_error_text",
                                                        "provenance_", "reviews_"))})
        rows.append(f"| {label} | {', '.join(used) or 'none'} | {' / '.join(line.strip() for line in plan)[:300]} |")
    return rows


def service_calls(store: SqlStore, run_id: str, repeat: int) -> list[str]:
    """The service calls under the run pages, each timed alone: what a slow page spends its time on."""
    run = report.find_run(store, run_id)
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("report.list_status(limit=21)", lambda: report.list_status(store, 21)),
        ("progress.overview(run) (the run page)", lambda: overview(store, run_id)),
        ("report.status_report(run) (`conveyor status RUN`: items by outcome, each read)",
         lambda: report.status_report(store, run)),
        ("progress.timeline(run, 60 s buckets)", lambda: timeline(store, run_id, 60)),
        ("store.dead_letter_classes(run)", lambda: store.dead_letter_classes(run_id)),
    ]
    rows = []
    for label, fn in calls:
        best, median, _ = timed(fn, repeat)
        rows.append(f"| `{label}` | {best * 1000:,.0f} | {median * 1000:,.0f} |")
    return rows


def bench(url: str, backend: str, args: argparse.Namespace,
          blobs: str) -> tuple[list[str], list[str], list[str]]:
    from starlette.testclient import TestClient

    store = open_store(url)
    try:
        run_id, seconds = fill(store, args.items, args.runs)
        print(f"{backend}: wrote {args.items:,} items ({2 * args.items:,} tasks and attempts), {DEAD} dead letters, "
              f"{REVIEWS} reviews and {args.runs} small runs in {seconds:.1f} s", flush=True)
        token = create_token(store, "ops", operator=True)["token"]
        targets = pages(store, run_id)
        calls = service_calls(store, run_id, args.repeat)
        explained = [f"| {backend} {row[1:]}" for row in plans(store, run_id)]
        for row in explained:
            print(row, flush=True)
    finally:
        store.close()
    settings = ApiSettings(db=url, blobs=blobs, relay=False)
    rows = []
    for label, path in targets:
        # An app per page, closed after it: the server keeps a store per worker thread, and threads come and go
        # over a long run of pages, so one app would hold more PostgreSQL connections than a shared server allows.
        with TestClient(create_app(settings), headers={"Authorization": f"Bearer {token}"}) as client:
            best, median, answer = timed(lambda p=path: client.get(p), args.repeat)
        ok = answer.status_code == 200 and median < TARGET_S
        rows.append(f"| {backend} | {label} | `{path.replace(run_id, 'R')}` | {answer.status_code} | "
                    f"{len(answer.content) // 1024:,} | {best * 1000:,.0f} | {median * 1000:,.0f} | "
                    f"{'PASS' if ok else 'FAIL'} |")
        print(rows[-1], flush=True)
    for row in calls:
        print(f"{backend} {row}", flush=True)
    return rows, [f"| {backend} {row[1:]}" for row in calls], explained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=30, help="small runs beside the big one")
    parser.add_argument("--repeat", type=int, default=7, help="timed requests per page, after one warm-up")
    parser.add_argument("--pg", default=os.environ.get("CONVEYOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
                        help="an admin URL of a PostgreSQL server ('' to leave PostgreSQL out)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    rows: list[str] = []
    calls: list[str] = []
    explained: list[str] = []
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-dash-") as work:
        found = bench(f"sqlite:///{work}/bench.db", "sqlite", args, f"{work}/blobs")
        rows += found[0]
        calls += found[1]
        explained += found[2]
        if args.pg:
            with pg_database(args.pg, "dash") as url:
                found = bench(url, "postgres", args, f"{work}/blobs")
                rows += found[0]
                calls += found[1]
                explained += found[2]
    section = "\n".join([
        BEGIN, "## Dashboard pages (bench/dashboard.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:", "",
        f"    .venv/bin/python bench/dashboard.py --items {args.items} --runs {args.runs} --repeat {args.repeat}", "",
        f"Machine: nproc {os.cpu_count()}; {platform.platform()}; Python {platform.python_version()}. "
        f"A run of {args.items:,} items (two tasks and two attempts each; {DEAD} dead letters in two classes, "
        f"{REVIEWS} answers waiting for review) and {args.runs} small runs, written straight into a fresh store; "
        "each page asked through `create_app` in this process with an operator's token, one warm-up then "
        f"{args.repeat} requests. Target: a median under {TARGET_S * 1000:.0f} ms.", "",
        "| backend | page | path | status | KiB | best ms | median ms | result |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |", *rows, "",
        "The service calls under the run pages, alone (best and median ms):", "",
        "| backend call | best ms | median ms |", "| --- | ---: | ---: |", *calls, "",
        "The items page's filters, each first read's plan (EXPLAIN) and the indexes it uses:", "",
        "| backend filter | indexes | plan |", "| --- | --- | --- |", *explained, "", END])
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


if __name__ == "__main__":
    main()
