"""How long `conveyor report RUN --html FILE` takes on a large finished run, part by part.

    PYTHONPATH=src .venv/bin/python bench/report.py [--items 100000] [--db URL] [--times 3] [--no-write]

`conveyor run` of a JSONL manifest of N items through the no-op pipeline of bench/noop_pipeline.py (three
stages: 3 x N tasks and attempts), then, in this process, each read `run_report` makes (the reconciliation, the
per-stage status, the item-age histogram, the timeline) and the page's rendering, and finally the command
itself. A SQLite store in a scratch folder unless --db names another (a PostgreSQL database is used as it is:
give an empty one). Writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
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

from metrics import write_manifest  # noqa: E402
from results import markers, write_section  # noqa: E402

from conveyor.blobs import open_blobs  # noqa: E402
from conveyor.cli.htmlreport import render_html  # noqa: E402
from conveyor.service.progress import timeline  # noqa: E402
from conveyor.service.report import find_run, reconcile, status_report  # noqa: E402
from conveyor.service.runreport import AGE_BUCKETS, run_report  # noqa: E402
from conveyor.store import open_store  # noqa: E402

SCRIPT = "report"
BEGIN, END = markers(f"{SCRIPT}.py")
TARGET = f"{ROOT / 'bench' / 'noop_pipeline.py'}:pipe"
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src"), CONVEYOR_PROGRESS_S="0")


def conveyor(*args: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "conveyor", *args], check=True, env=ENV, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def timed(fn: Callable[[], Any], times: int) -> list[float]:
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return seconds


def parts(db: str, blobs: Path, times: int) -> dict[str, list[float]]:
    store = open_store(db, create=False)
    try:
        run = find_run(store, None)
        data = run_report(store, run, open_blobs(str(blobs)))
        return {
            "reconcile (with the quality sample)": timed(lambda: reconcile(store, run, 100, open_blobs(str(blobs))),
                                                         times),
            "status_report (stages, stage activity)": timed(lambda: status_report(store, run), times),
            "item_ages (one pass over the run's tasks)": timed(
                lambda: store.item_ages(run.run_id, [upper for upper, _ in AGE_BUCKETS]), times),
            f"timeline ({data['timeline']['bucket_s']:g} s buckets)": timed(
                lambda: timeline(store, run.run_id, data["timeline"]["bucket_s"]), times),
            "render_html (template and 5 SVG charts)": timed(lambda: render_html(data), times),
        }
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--db", help="a store URL (default: SQLite in a scratch folder)")
    parser.add_argument("--times", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-report-") as scratch:
        work = Path(scratch)
        db, blobs = args.db or f"sqlite:///{work / 'store.db'}", work / "blobs"
        run_s = conveyor("run", TARGET, "--input", str(write_manifest(work / "manifest.jsonl", args.items)),
                         "--db", db, "--blobs", str(blobs), "--workers", "2", "--json")
        print(f"ran {args.items:,} items in {run_s:.1f} s", flush=True)
        split = parts(db, blobs, args.times)
        store = open_store(db, create=False)
        run_id = find_run(store, None).run_id
        store.close()
        page = work / "report.html"
        command = [conveyor("report", run_id, "--html", str(page), "--db", db, "--blobs", str(blobs))
                   for _ in range(args.times)]
        size = page.stat().st_size
    load = os.getloadavg()[0]
    backend = db.split(":", 1)[0]
    rows = [f"| `conveyor report RUN --html FILE` (the process; a {size:,}-byte page) | {s(min(command))} | "
            f"{s(statistics.median(command))} |"]
    rows += [f"| {name} | {s(min(t))} | {s(statistics.median(t))} |" for name, t in split.items()]
    for line in rows:
        print(line)
    section = "\n".join([
        BEGIN, "## Run report (bench/report.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (1-minute load {load:.1f}) on {backend} "
        "with:", "",
        f"    PYTHONPATH=src .venv/bin/python bench/report.py --items {args.items} --times {args.times}", "",
        f"A finished run of {args.items:,} items through the three no-op stages ({3 * args.items:,} tasks and "
        f"attempts; `conveyor run`, {run_s:.0f} s); the reads of `run_report` one by one, the rendering, then the "
        "whole command (Python start and imports included).", "",
        "| part | min s | median s |", "| --- | ---: | ---: |", *rows, "", END])
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


def s(seconds: float) -> str:
    return f"{seconds:,.3f}"


if __name__ == "__main__":
    main()
