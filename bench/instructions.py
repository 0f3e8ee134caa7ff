"""Instructions per task of one worker on the fleet path, counted by valgrind (issue 32 point 2).

    PYTHONPATH=SRC .venv/bin/python bench/instructions.py [--backend sqlite|postgres] [--small 300] [--large 2300]

One ``conveyor worker --until-idle`` under ``valgrind --tool=callgrind`` through ``--small`` and then ``--large``
items of bench/noop_pipeline.py's stages (a → b → c, with a lease long enough for the slowed worker), each on a
fresh store; the difference of the two counts over the difference of their tasks is the instructions a task
costs, the worker's start-up and close taken out. Printed by where they ran (callgrind_annotate's per-function
counts summed by shared object: the Python interpreter, the SQLite library, psycopg and libpq, libc, OpenSSL's
hashing). The counts do not move with the host's load, as CPU seconds do: to compare two trees, run this with
each on PYTHONPATH. Needs valgrind (Debian's package); a run of 2,300 items takes some minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine

PIPELINE = """from conveyor.pipeline import Pipeline

pipe = Pipeline("bench_noop", lease_seconds=3600.0)


@pipe.stage
def a(ctx, value):
    return value


@pipe.stage(after=a)
def b(ctx, value):
    return value


@pipe.stage(after=b)
def c(ctx, value):
    return value
"""
GROUPS = (("libpython", "Python interpreter"), ("libsqlite3", "SQLite library"), ("_sqlite3", "sqlite3 module"),
          ("psycopg", "psycopg and libpq"), ("libpq", "psycopg and libpq"), ("libcrypto", "hashing (OpenSSL)"),
          ("_hashlib", "hashing (OpenSSL)"), ("libc.so", "libc"))


def counted(backend: str, items: int, work: Path, store: str) -> tuple[int, Counter[str]]:
    """Instructions of one worker through ``items`` items: the total, and by shared object."""
    target = work / "noop_long.py"
    target.write_text(PIPELINE)
    manifest = engine.write_manifest(work / f"manifest-{items}.jsonl", items)
    _, out = engine.cli_json("submit", f"{target}:pipe", "--input", str(manifest), "--db", store,
                             "--blobs", str(work / "blobs"))
    profile = work / f"callgrind-{items}.out"
    proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={profile}",
                           *engine.conveyor_cmd(), "worker", f"{target}:pipe", "--until-idle", "--run", out["run_id"],
                           "--db", store, "--blobs", str(work / "blobs"), "--json"],
                          cwd=engine.ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the worker under valgrind exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    if f'"stage_calls": {3 * items}' not in proc.stdout:
        raise SystemExit(f"expected {3 * items} stage calls (a lease lost under valgrind?): {proc.stdout[-500:]}")
    text = subprocess.run(["callgrind_annotate", "--threshold=100", str(profile)], capture_output=True,
                          text=True, check=True).stdout
    total, by = 0, Counter[str]()
    for line in text.splitlines():
        if (found := re.match(r"^\s*([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", line)) is not None:
            total = int(found.group(1).replace(",", ""))
        elif (found := re.match(r"^\s*([\d,]+) \([^)]*\)\s+.*?\s+\[(.*)\]\s*$", line)) is not None:
            where = found.group(2).rsplit("/", 1)[-1]
            by[next((name for part, name in GROUPS if part in where), "other")] += int(found.group(1).replace(",", ""))
    return total, by


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--small", type=int, default=300)
    parser.add_argument("--large", type=int, default=2300)
    parser.add_argument("--pg", default=os.environ.get("CONVEYOR_TEST_PG", engine.DEFAULT_PG))
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        raise SystemExit("needs valgrind and callgrind_annotate (apt-get install valgrind)")
    work = Path(tempfile.mkdtemp(prefix="conveyor-instructions-"))
    try:
        with contextlib.ExitStack() as stack:
            stores = (engine.sqlite_stores(work, "i") if args.backend == "sqlite"
                      else stack.enter_context(engine.pg_stores(args.pg)))
            small, small_by = counted(args.backend, args.small, work, next(stores))
            large, large_by = counted(args.backend, args.large, work, next(stores))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tasks = 3 * (args.large - args.small)
    print(f"{args.backend}: {(large - small) / tasks:,.0f} instructions per task (one worker, {args.small:,} and "
          f"{args.large:,} items: {small:,} and {large:,})")
    for name in sorted(large_by, key=lambda n: small_by[n] - large_by[n]):
        print(f"  {(large_by[name] - small_by[name]) / tasks:10,.0f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
