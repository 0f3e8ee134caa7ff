"""Dashboard benchmark: how long each page takes at 1,000,000 items, on SQLite and PostgreSQL.

    .venv/bin/python bench/dashboard.py [--items 1000000] [--runs 30] [--repeat 7] [--pg URL] [--no-write] [--keep DIR]

A store is filled straight through SQL (bench/selection.py's ``populate``: a run of ``--items`` root items with
a ``parse`` and an ``extract`` task each, 15,000 parses failed), then given one attempt per task spread over the
run's last hour (so the timeline has points), 10,000 of the failures dead-lettered under two error classes,
5,000 ``extract`` answers waiting for review, and ``--runs`` small runs beside it (so the runs page is full).
Each page is then asked through the app `conveyor serve` runs (``create_app``, in this process, with an
operator's token): one warm-up, then ``--repeat`` requests; the table gives the best and the median against the
target of 300 ms. For the slow pages, the service calls under them are timed too, to say which one costs. The
items page (``/runs/R/items``) is asked with each of its filters alone, and each filter's query plan printed
(EXPLAIN), with the indexes it uses.
Then each page a person opens is loaded in Chromium (Debian's /usr/bin/chromium through Playwright; no browser
download) from a `conveyor serve` of the same store: the median time from the navigation's start to its load
event against the target of 1 s, and the console's errors (``--no-browser`` leaves this out).
``--keep DIR`` keeps both stores (DIR/bench.db and a PostgreSQL database named after DIR) and reuses them on the
next run with the same ``--items`` instead of writing them again (two minutes each at a million items).
Writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
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


LOAD_TARGET_S = 1.0
CHROMIUM = Path("/usr/bin/chromium")


def browser_pages(targets: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The pages a person opens (not a page's 2 s refresh), the items page with a few of its filters."""
    kept = ("runs", "runs, page 2", "one run", "dead letters", "dead letters of a class", "review queue",
            "one review", "one item's journey", "workers", "items: no filter", "items: status failed",
            "items: error class", "items: provenance, narrow", "items: approve these, the dry run")
    return [("login form", "/login"), *((label, path) for label, path in targets if label in kept)]


def browser_loads(url: str, blobs: str, backend: str, token: str, run_id: str, targets: list[tuple[str, str]],
                  repeat: int) -> list[str]:
    """Each page loaded in Chromium (Debian's /usr/bin/chromium through Playwright; no browser download) from a
    `conveyor serve` of this store, logged in with ``token``: one warm-up, then ``repeat`` loads; the time from
    the navigation's start to its load event (the Navigation Timing entry), and the console's errors."""
    import socket
    import subprocess

    import httpx
    from playwright.sync_api import sync_playwright

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    log = Path(blobs).parent / f"serve-{backend}.log"
    with log.open("wb") as said:
        server = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "serve", "--db", url, "--blobs", blobs, "--workers", "0", "--port",
             str(port), "--no-relay"], env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            stdout=said, stderr=subprocess.STDOUT)
    rows = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"conveyor serve did not start:\n{log.read_text()}")
            time.sleep(0.2)
        with sync_playwright() as play:
            browser = play.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(f"{base}/login")
                page.fill("#token", token)
                page.click("form.login button[type=submit]")
                page.wait_for_url(f"{base}/")
                for label, path in browser_pages(targets):
                    errors.clear()
                    loads = []
                    status = 0
                    for n in range(repeat + 1):
                        answer = page.goto(f"{base}{path}", wait_until="load")
                        status = answer.status if answer is not None else 0
                        entry = page.evaluate("() => { const [e] = performance.getEntriesByType('navigation'); "
                                              "return e.loadEventEnd - e.startTime; }")
                        if n:  # the first load warms up
                            loads.append(float(entry) / 1000)
                    median = statistics.median(loads)
                    ok = status == 200 and median <= LOAD_TARGET_S and not errors
                    seen = "; ".join(sorted(set(errors)))[:120] or "none"
                    rows.append(f"| {backend} | {label} | `{path.replace(run_id, 'R')}` | {status} | "
                                f"{min(loads) * 1000:,.0f} | {median * 1000:,.0f} | {seen} | "
                                f"{'PASS' if ok else 'FAIL'} |")
                    print(rows[-1], flush=True)
            finally:
                browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return rows


def status_process(url: str, run_id: str, repeat: int) -> str:
    """`conveyor status RUN` as a person runs it: the whole process (start, imports, the reads, the table)."""
    import subprocess

    def run() -> None:
        subprocess.run([sys.executable, "-m", "conveyor", "status", run_id, "--db", url], check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, stdout=subprocess.DEVNULL)

    best, median, _ = timed(run, repeat)
    label = "`conveyor status RUN` (the whole process: start, imports, the reads, the table)"
    return f"| {label} | {best * 1000:,.0f} | {median * 1000:,.0f} |"


def bench(url: str, backend: str, args: argparse.Namespace,
          blobs: str) -> tuple[list[str], list[str], list[str], list[str]]:
    from starlette.testclient import TestClient

    store = open_store(url)
    try:
        kept = store.db.execute("SELECT run_id FROM runs WHERE run_id LIKE 'rbench-%' AND expected = ? AND EXISTS "
                                "(SELECT 1 FROM reviews r WHERE r.run_id = runs.run_id)", (args.items,))
        if kept:  # --keep: the store of an earlier run of this script, as it was written
            run_id = kept[0][0]
            print(f"{backend}: reusing the store kept with run {run_id} ({args.items:,} items)", flush=True)
        else:
            run_id, seconds = fill(store, args.items, args.runs)
            print(f"{backend}: wrote {args.items:,} items ({2 * args.items:,} tasks and attempts), {DEAD} dead "
                  f"letters, {REVIEWS} reviews and {args.runs} small runs in {seconds:.1f} s", flush=True)
        token = create_token(store, "ops", operator=True)["token"]
        targets = pages(store, run_id)
        calls = [*service_calls(store, run_id, args.repeat), status_process(url, run_id, args.repeat)]
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
    loads = [] if args.no_browser else browser_loads(url, blobs, backend, token, run_id, targets, args.repeat)
    return rows, [f"| {backend} {row[1:]}" for row in calls], explained, loads


@contextlib.contextmanager
def kept_pg_database(admin: str, keep: Path) -> Iterator[str]:
    """A PostgreSQL database named after ``keep`` (made when missing), left in place afterwards."""
    import psycopg

    name = "conveyor_bench_dash_" + "".join(c if c.isalnum() else "_" for c in keep.resolve().name.lower())
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f"CREATE DATABASE {name}")
    yield f"{admin.partition('?')[0].rpartition('/')[0]}/{name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=30, help="small runs beside the big one")
    parser.add_argument("--repeat", type=int, default=7, help="timed requests per page, after one warm-up")
    parser.add_argument("--pg", default=os.environ.get("CONVEYOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
                        help="an admin URL of a PostgreSQL server ('' to leave PostgreSQL out)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--no-browser", action="store_true", help="leave out the page loads in Chromium")
    parser.add_argument("--keep", metavar="DIR", type=Path,
                        help="keep the stores (DIR/bench.db and a PostgreSQL database named after DIR) and reuse "
                             "them on the next run with the same --items, instead of writing fresh ones")
    args = parser.parse_args()
    rows: list[str] = []
    calls: list[str] = []
    explained: list[str] = []
    loads: list[str] = []
    load_before = os.getloadavg()
    if not args.no_browser and not CHROMIUM.exists():
        raise SystemExit(f"no {CHROMIUM} for the page loads: `apt-get install chromium`, or --no-browser")
    with contextlib.ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            work = str(args.keep.resolve())
        else:
            work = stack.enter_context(tempfile.TemporaryDirectory(prefix="conveyor-bench-dash-"))
        found = bench(f"sqlite:///{work}/bench.db", "sqlite", args, f"{work}/blobs")
        rows += found[0]
        calls += found[1]
        explained += found[2]
        loads += found[3]
        if args.pg:
            with kept_pg_database(args.pg, args.keep) if args.keep else pg_database(args.pg, "dash") as url:
                found = bench(url, "postgres", args, f"{work}/blobs")
                rows += found[0]
                calls += found[1]
                explained += found[2]
                loads += found[3]
    section = "\n".join([
        BEGIN, "## Dashboard pages (bench/dashboard.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:", "",
        f"    .venv/bin/python bench/dashboard.py {' '.join(sys.argv[1:])}", "",
        f"Machine: nproc {os.cpu_count()}; {platform.platform()}; Python {platform.python_version()}. "
        f"A run of {args.items:,} items (two tasks and two attempts each; {DEAD} dead letters in two classes, "
        f"{REVIEWS} answers waiting for review) and {args.runs} small runs, written straight into a fresh store; "
        "each page asked through `create_app` in this process with an operator's token, one warm-up then "
        f"{args.repeat} requests. Target: a median under {TARGET_S * 1000:.0f} ms. Load average (1, 5, 15 min) "
        f"{' / '.join(f'{x:.1f}' for x in load_before)} at the start, "
        f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} at the end (a shared machine).", "",
        "| backend | page | path | status | KiB | best ms | median ms | result |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |", *rows, "",
        "The service calls under the run pages, alone (best and median ms):", "",
        "| backend call | best ms | median ms |", "| --- | ---: | ---: |", *calls, "",
        "The items page's filters, each first read's plan (EXPLAIN) and the indexes it uses:", "",
        "| backend filter | indexes | plan |", "| --- | --- | --- |", *explained, "",
        *([f"Each page loaded in Chromium ({CHROMIUM}, headless, through Playwright) from a `conveyor serve` of the "
           "same store, logged in as the operator: one warm-up, then "
           f"{args.repeat} loads; the time from the navigation's start to its load event (Navigation Timing), and "
           f"the console's errors. Target: a median of at most {LOAD_TARGET_S * 1000:.0f} ms and no error.", "",
           "| backend | page | path | status | best ms | median ms | console errors | result |",
           "| --- | --- | --- | ---: | ---: | ---: | --- | --- |", *loads, ""] if loads else []), END])
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


if __name__ == "__main__":
    main()
