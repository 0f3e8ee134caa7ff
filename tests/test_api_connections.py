"""`conveyor serve` on PostgreSQL holds a bounded number of connections: the requests' stores come from a pool
(api/context.py), at most IDLE_STORES of them idle after a burst of requests on many threads, and none is left
once the server has shut down. Counted in pg_stat_activity, on a database of this test's own."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest

from conveyor.api.context import IDLE_STORES
from tests.apiserver import SMALL_PIPELINE, served, stop
from tests.helpers import write_pipeline

CLIENTS = 48
REQUESTS = 600


def connections(pg_url: str) -> int:
    """Connections to the test's database, other than the one counting."""
    dbname = pg_url.rpartition("/")[2]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                           (dbname,)).fetchone()
    assert row is not None
    return int(row[0])


def settle(pg_url: str, at_most: int, timeout: float = 10.0) -> int:
    """The count once it is at most ``at_most`` (a closed connection leaves pg_stat_activity a moment later),
    or the last count after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = connections(pg_url)
        if found <= at_most or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_serve_pools_its_connections_and_closes_them_at_shutdown(tmp_path: Path, pg_url: str) -> None:
    target = write_pipeline(tmp_path, SMALL_PIPELINE)
    assert connections(pg_url) == 0
    with served(tmp_path, pg_url, target, "--no-auth", workers=0) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.get("/healthz").status_code == 200
        idle = settle(pg_url, 0, timeout=1.0)  # the server's own parts (alert watch, batch keeper) and one store

        def ask(n: int) -> int:
            with httpx.Client(base_url=server.url, timeout=30) as client:
                return sum(client.get("/v1/jobs" if i % 2 else "/healthz").status_code == 200
                           for i in range(n))

        with ThreadPoolExecutor(CLIENTS) as pool:
            answered = sum(pool.map(ask, [REQUESTS // CLIENTS] * CLIENTS))
        assert answered == REQUESTS // CLIENTS * CLIENTS
        after = settle(pg_url, idle + IDLE_STORES)
        assert after <= idle + IDLE_STORES, f"{after} connections after the burst ({idle} before it)"
        stop(server.proc)  # SIGTERM: uvicorn shuts the app down, then raises the signal again
        assert server.proc.wait(timeout=30) in (0, -15), server.log.read_text()
    assert settle(pg_url, 0) == 0, "connections left after the server shut down"
