"""Leases on PostgreSQL run on the database's clock: a worker whose clock is a minute ahead takes over no
live lease. (On SQLite every worker shares one machine and its clock: nothing to skew.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.clock import FleetClock
from conveyor.runtime.target import load_target
from conveyor.runtime.worker import Worker, WorkerOptions
from conveyor.service.inputs import SourceItem
from conveyor.service.submit import submit
from conveyor.store import open_store
from tests.helpers import SRC, query, write_pipeline

SLOW = """
    import asyncio, os
    from conveyor import Pipeline, Retry

    # One attempt: a lease taken over from the healthy worker would dead-letter the item as lease_expired.
    pipe = Pipeline("skew", lease_seconds=2, retry=Retry(max_attempts=1))

    @pipe.stage
    async def slow(ctx, source: bytes) -> str:
        with open(os.environ["CALLS"], "a") as calls:
            calls.write(f"{ctx.item_key} {ctx.attempt}\\n")
        await asyncio.sleep(4)  # two lease lengths: the healthy worker renews it meanwhile
        return source.decode()
"""


def _submit(target: str, url: str, blobs: Path) -> str:
    store = open_store(url)
    try:
        items = [SourceItem("doc", text=b"hello")]
        return submit(load_target(target), target, "inline", store, FilesystemBlobs(blobs), items=items).run_id
    finally:
        store.close()



def _wait_running(url: str, run_id: str) -> None:
    deadline = time.monotonic() + 30
    while not query(url, "SELECT 1 FROM tasks WHERE run_id = ? AND status = 'running'", run_id):
        assert time.monotonic() < deadline, "the first worker never claimed the task"
        time.sleep(0.05)


def _assert_one_clean_attempt(url: str, run_id: str, calls: Path) -> None:
    attempts = query(url, "SELECT attempt, outcome FROM attempts WHERE run_id = ? ORDER BY id", run_id)
    assert attempts == [(1, "succeeded")], f"the live lease was taken over: {attempts}"
    assert query(url, "SELECT COUNT(*) FROM dead_letters WHERE run_id = ?", run_id) == [(0,)]
    assert calls.read_text().splitlines() == ["doc 1"]


@pytest.mark.timeout(120)
def test_a_worker_whose_clock_is_a_minute_ahead_takes_over_no_live_lease(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = tmp_path / "calls.log"
    monkeypatch.setenv("CALLS", str(calls))
    target = write_pipeline(tmp_path, SLOW)
    pipeline = load_target(target)
    run_id = _submit(target, pg_url, tmp_path / "blobs")
    blobs = FilesystemBlobs(tmp_path / "blobs")
    options = WorkerOptions(run_id=run_id, until_idle=True)
    healthy = Worker(pipeline, target, pg_url, blobs, options)
    ahead = Worker(pipeline, target, pg_url, blobs, WorkerOptions(run_id=run_id, until_idle=True),
                   clock=lambda: time.time() + 60)
    first = threading.Thread(target=healthy.run)
    first.start()
    _wait_running(pg_url, run_id)
    second = threading.Thread(target=ahead.run)
    second.start()
    first.join(60)
    second.join(60)
    assert not first.is_alive() and not second.is_alive()
    _assert_one_clean_attempt(pg_url, run_id, calls)
    assert ahead.stats["reclaimed_requeued"] == 0 and ahead.stats["reclaimed_dead_lettered"] == 0


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("faketime") is None, reason="faketime (Debian package faketime) is not installed")
def test_a_worker_process_under_faketime_a_minute_ahead_takes_over_no_live_lease(
    tmp_path: Path, pg_url: str,
) -> None:
    calls = tmp_path / "calls.log"
    env = {**os.environ, "PYTHONPATH": SRC, "CALLS": str(calls)}
    target = write_pipeline(tmp_path, SLOW)
    run_id = _submit(target, pg_url, tmp_path / "blobs")
    worker = [sys.executable, "-m", "conveyor", "worker", target, "--until-idle", "--run", run_id, "--db", pg_url,
              "--blobs", str(tmp_path / "blobs"), "--json"]
    healthy = subprocess.Popen(worker, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_running(pg_url, run_id)
    ahead = subprocess.Popen(["faketime", "-f", "+60s", *worker], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    out_ahead, err_ahead = ahead.communicate(timeout=60)
    healthy.communicate(timeout=60)
    assert ahead.returncode == 0, err_ahead
    assert '"reclaimed_' not in out_ahead, out_ahead
    _assert_one_clean_attempt(pg_url, run_id, calls)


def test_the_fleet_clock_follows_the_store_not_the_machine() -> None:
    clock = FleetClock(lambda: 1000.0)
    assert clock() == 1000.0
    clock.sync(lambda: 5000.0, local_is_store=True)
    assert clock() == 1000.0, "on one machine the machine's clock is the store's"
    clock.sync(lambda: 5000.0, local_is_store=False)
    assert abs(clock() - 5000.0) < 1.0
    time.sleep(0.05)
    assert 5000.04 < clock() < 5001.0, "between syncs it runs on the monotonic clock"
