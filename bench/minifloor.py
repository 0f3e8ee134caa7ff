"""The minimal one-table floor of the side by side (bench/engine.py, issue 32 point 2).

One table, ``mini (id, payload, stage, status, lease)``, seeded with N rows at stage 0; each of two worker
processes claims 500 queued rows in one statement, passes every payload through (a no-op stage) and completes
the 500 in one statement that moves each row to its next stage (queued again) or, after the third, to ``done``,
fenced by the claim's lease token. On PostgreSQL the claim is ``UPDATE ... WHERE id IN (SELECT ... LIMIT 500
FOR UPDATE SKIP LOCKED) RETURNING`` and the completion one ``UPDATE ... FROM unnest(ids, payloads)``, each an
autocommitted statement; on SQLite the same claim (without the row lock, which SQLite's one writer makes moot)
and an executemany of the completion, each in ``BEGIN IMMEDIATE``, with the store's own pragmas (WAL,
``synchronous=NORMAL``). It records no attempt, no output, no memo and no successor row: it says what a queue
with nothing else costs on this backend, so conveyor / this floor is what the schema and the Python around it
cost together (the schema floor in bench/engine.py, the conveyor schema by hand, gives the schema's share).

The clock is the side by side's: from the first claim's start to the last completion's stamp, taken by the
workers (each prints its two stamps as JSON) because the table keeps no times.

    python bench/minifloor.py worker URL    # one worker process (bench/engine.py starts two)
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
BATCH = 500
STAGES = 3
SQLITE_PRAGMAS = ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=60000")  # as store/dialect.py

PG_SCHEMA = ("CREATE TABLE mini (id bigserial PRIMARY KEY, payload bytea NOT NULL, stage int NOT NULL, "
             "status text NOT NULL, lease bigint)",
             "CREATE INDEX mini_queued ON mini (id) WHERE status = 'queued'")
SQLITE_SCHEMA = ("CREATE TABLE mini (id INTEGER PRIMARY KEY, payload BLOB NOT NULL, stage INTEGER NOT NULL, "
                 "status TEXT NOT NULL, lease INTEGER)",
                 "CREATE INDEX mini_queued ON mini (id) WHERE status = 'queued'")
CLAIM = """UPDATE mini SET status = 'running', lease = {p} WHERE id IN (SELECT id FROM mini WHERE status = 'queued'
    ORDER BY id LIMIT {batch} {lock}) RETURNING id, payload"""
PG_COMPLETE = f"""UPDATE mini SET stage = mini.stage + 1, payload = u.payload, lease = NULL,
    status = CASE WHEN mini.stage + 1 >= {STAGES} THEN 'done' ELSE 'queued' END
FROM unnest(%s::bigint[], %s::bytea[]) AS u(id, payload) WHERE mini.id = u.id AND mini.lease = %s"""
SQLITE_COMPLETE = f"""UPDATE mini SET stage = stage + 1, payload = ?, lease = NULL,
    status = CASE WHEN stage + 1 >= {STAGES} THEN 'done' ELSE 'queued' END WHERE id = ? AND lease = ?"""
OPEN = "SELECT 1 FROM mini WHERE status IN ('queued', 'running') LIMIT 1"


class MiniTable:
    """One connection to the floor's table, on either backend."""

    def __init__(self, url: str) -> None:
        self.postgres = url.startswith("postgres")
        self.conn: Any
        if self.postgres:
            import psycopg

            self.conn = psycopg.connect(url, autocommit=True)
        else:
            self.conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, timeout=60.0)
            for pragma in SQLITE_PRAGMAS:
                self.conn.execute(f"PRAGMA {pragma}")
        mark = "%s" if self.postgres else "?"
        self.claim_sql = CLAIM.format(p=mark, batch=BATCH, lock="FOR UPDATE SKIP LOCKED" if self.postgres else "")

    @contextlib.contextmanager
    def immediate(self) -> Iterator[None]:
        """SQLite: one write transaction, the writer lock taken at its start."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def create(self, payloads: Sequence[bytes]) -> None:
        """The table, its index and one row per payload at stage 0 (not timed)."""
        rows = [(p, 0, "queued") for p in payloads]
        if self.postgres:
            with self.conn.transaction():
                for statement in PG_SCHEMA:
                    self.conn.execute(statement)
                with self.conn.cursor() as cur, cur.copy("COPY mini (payload, stage, status) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
            self.conn.execute("ANALYZE mini")
            return
        with self.immediate():
            for statement in SQLITE_SCHEMA:
                self.conn.execute(statement)
            self.conn.executemany("INSERT INTO mini (payload, stage, status) VALUES (?, ?, ?)", rows)

    def claim(self, lease: int) -> list[tuple[int, bytes]]:
        if self.postgres:
            return self.conn.execute(self.claim_sql, (lease,)).fetchall()  # type: ignore[no-any-return]
        with self.immediate():
            return self.conn.execute(self.claim_sql, (lease,)).fetchall()  # type: ignore[no-any-return]

    def complete(self, lease: int, rows: list[tuple[int, bytes]]) -> int:
        """Each claimed row to its next stage (the no-op's output, its input); returns the rows moved."""
        if self.postgres:
            return int(self.conn.execute(PG_COMPLETE, ([r[0] for r in rows], [r[1] for r in rows], lease)).rowcount)
        with self.immediate():
            cur = self.conn.executemany(SQLITE_COMPLETE, [(payload, task_id, lease) for task_id, payload in rows])
            return int(cur.rowcount)

    def still_open(self) -> bool:
        return self.conn.execute(OPEN).fetchone() is not None

    def count(self, status: str) -> int:
        mark = "%s" if self.postgres else "?"
        return int(self.conn.execute(f"SELECT COUNT(*) FROM mini WHERE status = {mark}", (status,)).fetchone()[0])

    def close(self) -> None:
        self.conn.close()


def worker(url: str) -> dict[str, float]:
    """Claim and complete until no row is open; the first claim's start and the last completion's stamp."""
    table = MiniTable(url)
    lease, first, last = os.getpid() << 32, 0.0, 0.0
    try:
        while True:
            lease += 1
            started = time.time()
            if rows := table.claim(lease):
                first = first or started
                last = time.time()  # stamped before the write, as conveyor's finished_at and the schema floor's
                done = table.complete(lease, [(task_id, bytes(payload)) for task_id, payload in rows])
                if done != len(rows):
                    raise RuntimeError(f"minimal floor: {len(rows) - done} of {len(rows)} leases lost")
            elif table.still_open():
                time.sleep(0.001)  # the other process holds the last rows
            else:
                return {"first": first, "last": last}
    finally:
        table.close()


def measure(url: str, payloads: Sequence[bytes], processes: int = 2) -> tuple[float, float, int]:
    """Seed, then ``processes`` workers together: (seconds spawn to exit, seconds first claim to last
    completion, rows done)."""
    table = MiniTable(url)
    try:
        table.create(payloads)
        started = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, str(HERE), "worker", url], stdout=subprocess.PIPE, text=True)
                 for _ in range(processes)]
        stamps = []
        for proc in procs:
            out, _ = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"minimal floor worker exited {proc.returncode}")
            stamps.append(json.loads(out))
        spawn = time.perf_counter() - started
        spans = [s for s in stamps if s["first"]]
        span = max(s["last"] for s in spans) - min(s["first"] for s in spans)
        return spawn, span, table.count("done")
    finally:
        table.close()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "worker":
        raise SystemExit("usage: python bench/minifloor.py worker URL")
    print(json.dumps(worker(sys.argv[2])))
