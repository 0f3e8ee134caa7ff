"""The fleet view on both backends: real worker processes register, beat, are lost when killed and stopped
when they exit cleanly (`conveyor workers`); `conveyor status RUN` tells calls from memo answers per stage,
and how long the oldest task of each stage has waited."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.fleet import worker_state
from conveyor.runtime.target import load_target
from conveyor.service.submit import submit
from conveyor.store import open_store
from tests.helpers import SRC, cli, cli_json, make_docs, write_pipeline

# A lease of 1.5 s: workers beat every 0.5 s and are lost 1.5 s after their last beat.
GATED = """
    import os, time
    from conveyor import Pipeline

    pipe = Pipeline("fleet", lease_seconds=1.5)

    @pipe.stage
    def wait(ctx, source: bytes) -> dict:
        while not os.path.exists(os.environ["GATE"]):  # busy until the test opens the gate
            time.sleep(0.02)
        return {"n": len(source)}
"""

TWO_STAGES = """
    from conveyor import Pipeline

    pipe = Pipeline("twostage")

    @pipe.stage
    def parse(ctx, source: bytes) -> dict:
        return {"text": source.decode()}

    @pipe.stage(after=parse)
    def shout(ctx, doc: dict) -> dict:
        return {"text": doc["text"].upper()}
"""

_started: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_stray_workers() -> Iterator[None]:
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start_worker(target: str, run_id: str, store_url: str, blobs: Path,
                  env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A worker that runs until stopped (no --until-idle)."""
    cmd = [sys.executable, "-m", "conveyor", "worker", target, "--run", run_id, "--db", store_url,
           "--blobs", str(blobs), "--quiet"]
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    _started.append(proc)
    return proc


def _wait_for(read: Callable[[], Any], ok: Callable[[Any], bool], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}: {value}"
        time.sleep(0.1)


def _by_pid(listing: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {w["pid"]: w for w in listing["workers"]}


@pytest.mark.timeout(120)
def test_workers_live_lost_and_stopped(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, GATED)
    gate = tmp_path / "gate"
    env = {**os.environ, "PYTHONPATH": SRC, "GATE": str(gate)}
    blobs = tmp_path / "blobs"
    store = open_store(store_url)
    try:
        run_id = submit(load_target(target), target, str(make_docs(tmp_path / "docs", 40)), store,
                        FilesystemBlobs(blobs)).run_id
    finally:
        store.close()
    killed, stopped = (_start_worker(target, run_id, store_url, blobs, env) for _ in range(2))
    db = ["--db", store_url]

    def listing(*extra: str) -> dict[str, Any]:
        return cli_json("workers", *extra, *db, cwd=tmp_path)

    # Both live and busy: each holds tasks (at most 8 of a stage whose pace is unknown yet).
    busy = _wait_for(listing, lambda d: all(_by_pid(d).get(p.pid, {}).get("tasks_held", 0) > 0
                                            for p in (killed, stopped)), 60, "two busy workers")
    for proc in (killed, stopped):
        worker = _by_pid(busy)[proc.pid]
        assert worker["state"] == "live" and worker["host"] == socket.gethostname()
        assert worker["pipeline"] == "fleet" and worker["run"] == run_id
        assert worker["worker"].startswith(f"{socket.gethostname()}:{proc.pid}:")
        assert worker["heartbeat_age_s"] < 1.5 and worker["started_at"] <= worker["heartbeat_at"]
    status = cli_json("status", run_id, *db, cwd=tmp_path)
    assert status["stage_activity"]["wait"]["oldest_queued_age_s"] > 0, "24 tasks wait to be claimed"
    assert status["stage_activity"]["wait"]["calls"] == 0

    killed.send_signal(signal.SIGKILL)
    killed.wait()
    lost = _wait_for(listing, lambda d: _by_pid(d)[killed.pid]["state"] == "lost", 30, "the killed one lost")
    assert _by_pid(lost)[killed.pid]["heartbeat_age_s"] > 1.5
    assert _by_pid(lost)[stopped.pid]["state"] == "live"

    gate.touch()
    _wait_for(listing, lambda d: _by_pid(d)[stopped.pid]["tasks_done"] == 40, 60, "every task done")
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=60) == 0
    after = listing()
    assert stopped.pid not in _by_pid(after), "a stopped worker is listed with --all only"
    assert _by_pid(after)[killed.pid]["state"] == "lost"
    every = _by_pid(listing("--all"))
    assert every[stopped.pid]["state"] == "stopped" and every[stopped.pid]["tasks_held"] == 0
    assert every[stopped.pid]["tasks_done"] == 40, "its own 8, the killed one's 8 (reclaimed) and the 24 left"


def test_status_tells_calls_from_memo_answers(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, TWO_STAGES)
    docs = make_docs(tmp_path / "docs", 5)
    args = ["run", target, "--input", str(docs), "--workers", "1", "--db", store_url, "--blobs",
            str(tmp_path / "blobs")]
    first = cli_json(*args, cwd=tmp_path)
    again = cli_json(*args, cwd=tmp_path)
    one = cli_json("status", first["run_id"], "--db", store_url, cwd=tmp_path)
    two = cli_json("status", again["run_id"], "--db", store_url, cwd=tmp_path)
    done = {"calls": 5, "cached": 0, "oldest_queued_age_s": None}
    assert one["stage_activity"] == {"parse": done, "shout": done}
    free = {"calls": 0, "cached": 5, "oldest_queued_age_s": None}
    assert two["stage_activity"] == {"parse": free, "shout": free}
    assert two["stages"]["parse"] == {"succeeded": 5}, "the existing fields stay as they were"
    table = cli("status", again["run_id"], "--db", store_url, cwd=tmp_path, check=True).stdout
    assert "calls" in table and "cached" in table and "oldest queued" in table


def test_no_workers_yet_and_the_human_table(tmp_path: Path, store_url: str) -> None:
    assert cli_json("workers", "--db", store_url, cwd=tmp_path) == {"workers": []}
    target = write_pipeline(tmp_path, TWO_STAGES)
    cli("run", target, "--input", str(make_docs(tmp_path / "docs", 2)), "--workers", "1", "--db", store_url,
        "--blobs", str(tmp_path / "blobs"), cwd=tmp_path, check=True)
    every = cli_json("workers", "--all", "--db", store_url, cwd=tmp_path)["workers"]
    assert every and {w["state"] for w in every} == {"stopped"}
    assert sum(w["tasks_done"] for w in every) == 4
    table = cli("workers", "--all", "--db", store_url, cwd=tmp_path, check=True).stdout
    assert "stopped" in table and socket.gethostname()[:10] in table


def test_worker_state_window() -> None:
    assert worker_state(None, 100.0, 0.5, 101.5) == "live"
    assert worker_state(None, 100.0, 0.5, 101.6) == "lost"
    assert worker_state(105.0, 100.0, 0.5, 200.0) == "stopped"


def test_api_lists_the_served_workers_to_operators_only(tmp_path: Path, store_url: str) -> None:
    from tests.apiserver import served

    with served(tmp_path, store_url, write_pipeline(tmp_path, TWO_STAGES), workers=1) as server:
        operator, tenant = server.token("ops", operator=True), server.token("acme")

        def read() -> dict[str, Any]:
            with server.client(operator) as c:
                answer = c.get("/v1/workers")
            assert answer.status_code == 200, answer.text
            data: dict[str, Any] = answer.json()
            return data

        listed = _wait_for(read, lambda d: any(w["state"] == "live" for w in d["workers"]), 30, "a live worker")
        (worker,) = listed["workers"]
        assert worker["pipeline"] == "twostage" and worker["run"] is None and worker["host"] == socket.gethostname()
        same = cli_json("workers", "--db", store_url, cwd=tmp_path)["workers"]
        assert [w["worker"] for w in same] == [worker["worker"]] and set(same[0]) == set(worker)
        with server.client(tenant) as c:
            refused = c.get("/v1/workers")
        assert refused.status_code == 403 and "operator" in refused.json()["detail"]


def test_rows_of_long_silent_workers_are_forgotten_at_a_start(store_url: str) -> None:
    from conveyor.store import WorkerRow

    store = open_store(store_url)
    try:
        now = store.clock()
        store.register_worker(WorkerRow("h:1:old", "h", 1, "p", None, 10.0, now - 9e5, now - 8e5), now - 7e5)
        store.register_worker(WorkerRow("h:2:new", "h", 2, "p", "r1", 10.0, now, now), now - 9e5)
        assert [w.worker for w in store.list_workers(0.0, True, 10)] == ["h:1:old", "h:2:new"]
        store.register_worker(WorkerRow("h:3:newer", "h", 3, "p", None, 10.0, now, now), now - 7e5)
        assert [w.worker for w in store.list_workers(0.0, True, 10)] == ["h:2:new", "h:3:newer"]
    finally:
        store.close()
