"""`make demo`: run the manual-page pipeline twice over this machine's man pages.

The first run parses, extracts and publishes every page (on the embedded
SQLite default under ./.conveyor/); the second run over the same pages makes
zero stage calls, because every task is answered from the memo.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGET = f"{HERE / 'pipeline.py'}:pipe"
CORPUS = Path(os.environ.get("MANPAGES", "/usr/share/man"))
CATALOGUE = Path(".conveyor/manpages-catalogue.db")


def conveyor(*args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "conveyor", *args]
    print(f"\n$ conveyor {' '.join(args)}", flush=True)
    return subprocess.run(cmd, text=True, stdout=subprocess.PIPE if capture else None, check=False)


def corpus() -> Path:
    if CORPUS.is_dir() and next(CORPUS.rglob("*.gz"), None) is not None:
        return CORPUS
    print(f"{CORPUS} has no manual pages here; using the sample pages shipped in {HERE / 'sample'}")
    return HERE / "sample"


def show_catalogue() -> None:
    with sqlite3.connect(CATALOGUE) as db:
        total, redelivered = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(deliveries > 1), 0) FROM manpages").fetchone()
        rows = db.execute(
            "SELECT source, names, section, description FROM manpages WHERE alias_of IS NULL"
            " AND source LIKE '%man1/ls.1%' OR source LIKE '%man1/gzip.1%' OR source LIKE '%man1/tar.1%' LIMIT 3"
        ).fetchall()
    print(f"\ncatalogue {CATALOGUE}: {total} records, {redelivered} delivered more than once (the publish key "
          "held them to one effect each)")
    for source, names, section, description in rows:
        print(f"  {source}: {names} ({section}) — {description}")


def main() -> int:
    source = corpus()
    first = conveyor("run", TARGET, "--input", str(source), "--workers", "2")
    if first.returncode not in (0, 3):
        return first.returncode
    second = conveyor("run", TARGET, "--input", str(source), "--workers", "2", "--json", capture=True)
    summary = json.loads(second.stdout)
    print(f"second run {summary['run_id']}: stage_calls={summary['stage_calls']}, cached={summary['cached']}, "
          f"outcomes={summary['outcomes']}, unaccounted={summary['unaccounted']}")
    show_catalogue()
    print("\nnext: `conveyor status`, `conveyor reconcile RUN_ID`, `conveyor dlq list` (store: ./.conveyor/)")
    return 0 if summary["stage_calls"] == 0 and summary["unaccounted"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
