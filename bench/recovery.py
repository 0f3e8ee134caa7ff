"""Recovery at speed (issue 27 point 10): a healthy worker SIGKILLed mid-batch, and a poison item.

    .venv/bin/python bench/recovery.py [--src DIR] [--db URL] [--items N] [--latency S]

1. A healthy worker killed: a pipeline whose one async stage waits ``--latency`` seconds (a model call, say; 16
   at a time per worker). Worker A claims every item and is SIGKILLed mid-call; worker B, started then, runs
   them once their leases (2 s) run out. Recovery rate: the tasks over the time from their reclaim to the last
   one's end; normal rate: one worker alone on the same pipeline and items, from the first task's start to the
   last one's end (the store's clock both). Target: recovery >= 0.5 of normal.
2. A poison item: a sync stage that calls ``os._exit`` on one item (every time), 20 healthy items, `conveyor run
   --workers 2`. Counted: the poison item's attempts, the worker processes it took down (distinct pids that
   called it) and its outcome. Target: dead-lettered within its attempts (3), no more workers taken down than
   that.

``--db`` defaults to the PostgreSQL of $CONVEYOR_TEST_PG (else 127.0.0.1:5432; a fresh database per case) and
falls back to SQLite when none answers. ``--src`` runs another source tree (the code before the change).
Prints a table; figures go into bench/RESULTS.md by hand. Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

SLOW = """
import asyncio
from conveyor import Pipeline, Retry

pipe = Pipeline("recovery", lease_seconds=2, retry=Retry(max_attempts=3))

@pipe.stage(concurrency=16)
async def call(ctx, source: bytes) -> dict:
    await asyncio.sleep({latency})
    return {{"n": len(source)}}
"""

POISON = """
import os
from conveyor import Pipeline, Retry

pipe = Pipeline("poison", lease_seconds=2, retry=Retry(max_attempts=3, base=0.01, cap=0.05))

@pipe.stage
def parse(ctx, source: bytes) -> str:
    with open({log!r}, "a") as f:
        f.write(f"{{ctx.item_key}} {{ctx.attempt}} {{os.getpid()}}\\n")
    if source.startswith(b"poison"):
        os._exit(1)
    return source.decode()
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", default=str(ROOT / "src"))
    parser.add_argument("--db", default=None)
    parser.add_argument("--items", type=int, default=32)
    parser.add_argument("--latency", type=float, default=1.0)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": args.src}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        normal = _normal_rate(folder / "normal", env, args)
        recovered, count = _killed(folder / "killed", env, args)
        poison = _poison(folder / "poison", env, args)
    print(f"source: {args.src}")
    print(f"backend: {'postgresql' if _pg(args) else 'sqlite'}; {args.items} items, {args.latency:g} s a call")
    print(f"normal rate, one worker: {normal:.1f} tasks/s")
    print(f"recovery rate of the killed worker's {count} tasks: {recovered:.1f} tasks/s "
          f"({recovered / normal:.2f} of normal; target >= 0.5: {'met' if recovered >= normal / 2 else 'NOT met'})")
    print(f"poison item: {poison['outcome']} after {poison['attempts']} attempt(s), {poison['deaths']} worker(s) "
          f"taken down, {poison['seconds']:.1f} s (target: dead-lettered within 3, deaths <= 3: "
          f"{'met' if poison['outcome'] == 'dead_lettered' and poison['deaths'] <= 3 else 'NOT met'})")


def _pg(args: argparse.Namespace) -> str | None:
    if args.db is not None:
        return args.db if args.db.startswith("postgresql") else None
    url = os.environ.get("CONVEYOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    try:
        import psycopg

        psycopg.connect(url, connect_timeout=3).close()
    except Exception:
        return None
    return url


def _store(folder: Path, args: argparse.Namespace) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    base = _pg(args)
    if base is None:
        return args.db or f"sqlite:///{folder}/conveyor.db"
    import psycopg

    name = f"conveyor_recovery_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"{base.rpartition('/')[0]}/{name}"


def _cli(env: dict[str, str], folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conveyor", *args], cwd=folder, env=env, text=True,
                          capture_output=True, timeout=600, check=False)


def _docs(folder: Path, count: int) -> Path:
    docs = folder / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (docs / f"doc{i:05d}.txt").write_text(f"document {i} " + "x" * (i % 97))
    return docs


def _submit(folder: Path, env: dict[str, str], args: argparse.Namespace) -> tuple[str, dict[str, str], str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pipe.py").write_text(SLOW.format(latency=args.latency))
    db = _store(folder, args)
    common = {**env, "CONVEYOR_DB": db, "CONVEYOR_BLOBS": str(folder / "blobs")}
    submitted = _cli(common, folder, "submit", "pipe.py:pipe", "--input", str(_docs(folder, args.items)), "--json")
    if submitted.returncode != 0:
        raise SystemExit(submitted.stderr)
    return db, common, "pipe.py:pipe"


def _worker(folder: Path, env: dict[str, str], target: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "conveyor", "worker", target, "--until-idle", "--quiet"],
                            cwd=folder, env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _normal_rate(folder: Path, env: dict[str, str], args: argparse.Namespace) -> float:
    """Tasks a second of one worker alone, from the first task's start to the last one's end (the store's
    clock: start-up not counted)."""
    db, common, target = _submit(folder, env, args)
    code = _worker(folder, common, target).wait(timeout=600)
    assert code == 0, code
    first, last = _query(db, "SELECT MIN(started_at), MAX(finished_at) FROM tasks")[0]
    return args.items / (float(last) - float(first))


def _query(db: str, sql: str) -> list[tuple[Any, ...]]:
    sys.path.insert(0, str(ROOT / "src"))
    from conveyor.store import open_store

    store = open_store(db, migrate=False)
    try:
        return store.db.execute(sql)
    finally:
        store.close()


def _killed(folder: Path, env: dict[str, str], args: argparse.Namespace) -> tuple[float, int]:
    """Worker A claims the items and is SIGKILLed mid-call; worker B, started then, recovers them once their
    leases run out. Tasks a second from the reclaim (each task's available_at, set when it was queued again)
    to the last one's end."""
    db, common, target = _submit(folder, env, args)
    a = _worker(folder, common, target)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if _query(db, "SELECT COUNT(*) FROM tasks WHERE status = 'running'")[0][0] >= args.items:
            break
        time.sleep(0.05)
    time.sleep(min(args.latency / 2, 0.5))  # mid-call
    a.send_signal(signal.SIGKILL)
    a.wait()
    code = _worker(folder, common, target).wait(timeout=600)
    assert code == 0, code
    first, last, count = _query(db, "SELECT MIN(available_at), MAX(finished_at), COUNT(*) FROM tasks "
                                    "WHERE id IN (SELECT task_id FROM attempts WHERE outcome = 'lease_expired')")[0]
    return int(count) / (float(last) - float(first)), int(count)


def _poison(folder: Path, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "calls.log"
    (folder / "pipe.py").write_text(POISON.format(log=str(log)))
    docs = _docs(folder, 20)
    (docs / "poison").write_text("poison pill")
    db = _store(folder, args)
    common = {**env, "CONVEYOR_DB": db, "CONVEYOR_BLOBS": str(folder / "blobs")}
    started = time.monotonic()
    _cli(common, folder, "run", "pipe.py:pipe", "--input", str(docs), "--workers", "2", "--json")
    seconds = time.monotonic() - started
    calls = [line.split() for line in log.read_text().splitlines()]
    poison = [c for c in calls if c[0] == "poison"]
    outcome = _query(db, "SELECT status FROM tasks WHERE item_key = 'poison'")[0][0]
    return {"outcome": outcome, "attempts": len(poison), "deaths": len({c[2] for c in poison}), "seconds": seconds}


if __name__ == "__main__":
    main()
