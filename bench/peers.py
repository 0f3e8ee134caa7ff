"""Peer queues on the engine benchmark's workload, so their ratios are measured in the same run (bench/engine.py).

The workload is the one bench/engine.py gives conveyor: N items, three no-op stages a → b → c per item (each
stage's job enqueues the next one with its payload), the first stage's jobs enqueued in bulk before the clock
starts, two worker processes, the clock from their start until the last ``c`` is done.

- **pgqueuer** (PostgreSQL): ``QueueManager.run(mode=drain)`` in two processes, ``batch_size`` 100, the next
  stage enqueued from inside the entrypoint with ``queries.enqueue``; done when both have drained.
- **huey** (``SqliteHuey``): ``huey_consumer -k process -w 2`` (polling delay 10 ms, at most 100 ms), the next
  stage enqueued by calling the task; ``c`` returns a value, so huey stores one result per item, and the run
  is done when the result store holds N. Huey deletes a task when it dequeues it and keeps no per-stage
  history: it does less than conveyor or the floor for each item-stage.

Each adapter runs as ``python bench/peers.py <queue> worker ...`` in its own processes; ``measure_*`` enqueue,
start them and time them.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve()
STAGES = ("a", "b", "c")
PGQ_BATCH = 100


def payloads(n: int) -> list[bytes]:
    return [f"document {i}: nothing to see here".encode() for i in range(n)]


# --- pgqueuer ------------------------------------------------------------------------------------------------


async def _pgq_connect(url: str):  # type: ignore[no-untyped-def]
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    return conn, Queries(PsycopgDriver(conn))


async def _pgq_enqueue(url: str, n: int) -> None:
    conn, queries = await _pgq_connect(url)
    try:
        await queries.install()
        data = payloads(n)
        for start in range(0, n, 5_000):
            part = data[start:start + 5_000]
            await queries.enqueue(["a"] * len(part), list(part), [0] * len(part))
    finally:
        await conn.close()


async def _pgq_worker(url: str) -> None:
    from pgqueuer import QueueManager
    from pgqueuer.models import Job
    from pgqueuer.types import QueueExecutionMode

    conn, queries = await _pgq_connect(url)
    qm = QueueManager(queries)

    def stage(name: str, after: str | None) -> None:
        async def run(job: Job) -> None:
            if after is not None:
                await queries.enqueue(after, job.payload)
        qm.entrypoint(name)(run)

    for index, name in enumerate(STAGES):
        stage(name, STAGES[index + 1] if index + 1 < len(STAGES) else None)
    try:
        await qm.run(batch_size=PGQ_BATCH, mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1))
    finally:
        await conn.close()


def measure_pgqueuer(url: str, n: int) -> tuple[float, int]:
    """Seconds for two drained pgqueuer workers to run N items through a → b → c, and the c jobs done."""
    asyncio.run(_pgq_enqueue(url, n))
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(HERE), "pgqueuer", "worker", url]) for _ in range(2)]
    for proc in procs:
        if proc.wait() != 0:
            raise RuntimeError(f"pgqueuer worker exited {proc.returncode}")
    wall = time.perf_counter() - started
    import psycopg

    with psycopg.connect(url) as conn:
        left = conn.execute("SELECT COUNT(*) FROM pgqueuer").fetchone()
        done = conn.execute("SELECT COUNT(*) FROM pgqueuer_log WHERE entrypoint = 'c' "
                            "AND status = 'successful'").fetchone()
    if left is None or left[0]:
        raise RuntimeError(f"pgqueuer left {left} jobs")
    return wall, int(done[0]) if done else 0


# --- huey ----------------------------------------------------------------------------------------------------


def _huey(path: str):  # type: ignore[no-untyped-def]
    from huey import SqliteHuey

    huey = SqliteHuey("bench", filename=path)

    @huey.task(name="c")
    def c(payload: bytes) -> int:
        return 1

    @huey.task(name="b")
    def b(payload: bytes) -> None:
        c(payload)

    @huey.task(name="a")
    def a(payload: bytes) -> None:
        b(payload)

    return huey, a


huey, _a = _huey(os.environ.get("CONVEYOR_BENCH_HUEY", ":memory:"))  # what huey_consumer imports


def measure_huey(path: Path, n: int) -> tuple[float, int]:
    """Seconds for huey's consumer (two worker processes) to run N items through a → b → c, and results."""
    local, a = _huey(str(path))
    rows = [(local.storage.name, local.serialize_task(a.s(p)), 0.0) for p in payloads(n)]
    with sqlite3.connect(path) as conn:  # bulk: one transaction, as conveyor's submit and pgqueuer's batch
        conn.executemany("INSERT INTO task (queue, data, priority) VALUES (?, ?, ?)", rows)
    env = dict(os.environ, CONVEYOR_BENCH_HUEY=str(path), PYTHONPATH=str(HERE.parent))
    started = time.perf_counter()
    consumer = subprocess.Popen([sys.executable, "-m", "huey.bin.huey_consumer", "peers.huey", "-k", "process",
                                 "-w", "2", "-d", "0.01", "-m", "0.1", "-q"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while (done := local.result_count()) < n:
            if consumer.poll() is not None:
                raise RuntimeError(f"huey_consumer exited {consumer.returncode} with {done} of {n} done")
            time.sleep(0.05)
        wall = time.perf_counter() - started
    finally:
        consumer.terminate()
        consumer.wait(timeout=30)
    return wall, done


if __name__ == "__main__":
    queue, role, *rest = sys.argv[1:]
    if (queue, role) == ("pgqueuer", "worker"):
        asyncio.run(_pgq_worker(rest[0]))
    else:
        raise SystemExit(f"usage: {HERE.name} pgqueuer worker URL")
