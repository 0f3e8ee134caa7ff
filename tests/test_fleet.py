"""A fleet of workers: an idle worker on PostgreSQL wakes on NOTIFY, SIGTERM drains (finishes or gives back, exit
0, nothing lost), a lost or refused connection to the store is waited out; the autoscaler's query, as
`conveyor queue-depth` prints it and as deploy/keda/scaledobject.yaml runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.target import load_target
from conveyor.service.submit import submit
from conveyor.store import open_store
from tests.conftest import PG_URL
from tests.helpers import SRC, cli, cli_json, make_docs, query, reconciled, submit_run, work, write_pipeline

STAMPED = """
    import os, time
    from conveyor import Pipeline

    pipe = Pipeline("stamped")

    @pipe.stage
    def stamp(ctx, source: bytes) -> dict:
        with open(os.environ["STAMPS"], "a") as f:  # when the stage ran, for the wake latency
            f.write(f"{time.time()}\\n")
        return {"n": len(source)}
"""

# Odd documents take 50 ms; even ones wait for the gate (longer than a worker's 10 s drain, unless opened).
GATED = """
    import asyncio, os
    from conveyor import Pipeline

    pipe = Pipeline("gated")

    @pipe.stage
    async def wait(ctx, source: bytes) -> dict:
        if int(source.split()[-1]) % 2 == 0:
            while not os.path.exists(os.environ["GATE"]):
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)
        return {"n": len(source)}
"""

SLOW = """
    import time
    from conveyor import Pipeline

    pipe = Pipeline("slow")

    @pipe.stage
    def nap(ctx, source: bytes) -> dict:
        time.sleep(0.05)
        return {"n": len(source)}
"""

TWO_STAGES = """
    from conveyor import Pipeline

    pipe = Pipeline("docs")

    @pipe.stage
    def parse(ctx, source: bytes) -> dict:
        return {"text": source.decode()}

    @pipe.stage(after=parse)
    def shout(ctx, doc: dict) -> dict:
        return {"text": doc["text"].upper()}
"""

# A worker whose idle wait grows to 30 s: only a NOTIFY wakes it quickly.
SLEEPY_WORKER = """
import sys
from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.target import load_target
from conveyor.runtime.worker import Worker, WorkerOptions

target, db, blobs = sys.argv[1:4]
Worker(load_target(target), target, db, FilesystemBlobs(blobs), WorkerOptions(poll_interval=30.0)).run()
"""

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
_started: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_stray_workers() -> Iterator[None]:
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _admin(sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        cur = conn.execute(sql)
        return cur.fetchall() if cur.description else []


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(args, env={**os.environ, "PYTHONPATH": SRC, **env}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _started.append(proc)
    return proc


def _worker(target: str, store_url: str, blobs: Path, *extra: str, env: dict[str, str] | None = None,
            ) -> subprocess.Popen[str]:
    return _spawn([sys.executable, "-m", "conveyor", "worker", target, "--db", store_url, "--blobs", str(blobs),
                   *extra], env or {})



def _wait_for(read: Callable[[], Any], ok: Callable[[Any], bool], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}: {value}"
        time.sleep(0.05)


def _done(store_url: str, run_id: str) -> int:
    rows = query(store_url, "SELECT COUNT(*) FROM tasks WHERE run_id = ? AND status = 'succeeded'", run_id)
    return int(rows[0][0])


@pytest.mark.timeout(120)
def test_an_idle_worker_wakes_on_notify_well_before_its_poll(tmp_path: Path, pg_url: str) -> None:
    target = write_pipeline(tmp_path, STAMPED)
    stamps, blobs = tmp_path / "stamps", tmp_path / "blobs"
    script = tmp_path / "sleepy.py"
    script.write_text(SLEEPY_WORKER)
    worker = _spawn([sys.executable, str(script), target, pg_url, str(blobs)], {"STAMPS": str(stamps)})
    _wait_for(lambda: query(pg_url, "SELECT COUNT(*) FROM workers")[0][0], lambda n: n == 1, 30, "registered")
    pipeline, store = load_target(target), open_store(pg_url)
    latencies = []
    try:
        for round_ in range(4):  # the first round warms the worker up (its first stage call), and is not measured
            time.sleep(3.0)  # idle long enough that its wait has grown past 2 s (0.01 s doubling, up to 30 s)
            docs = make_docs(tmp_path / f"docs{round_}", 1, f"round {round_} {{i}}")
            before = time.time()
            run_id = submit(pipeline, target, str(docs), store, FilesystemBlobs(blobs)).run_id
            after = time.time()
            _wait_for(lambda run_id=run_id: _done(pg_url, run_id), lambda n: n == 1, 10, "the task done")
            started = float(stamps.read_text().split()[-1])
            latencies += [(started - before, started - after)] if round_ else []
    finally:
        store.close()
    print("wake latency (ms), from the submit's start / end to the stage's start:",
          [(round(x * 1000, 1), round(y * 1000, 1)) for x, y in latencies])
    # From the submission's end (its commit): a busy machine can take most of a second to submit one item, which
    # the worker cannot wake before; woken by its poll instead, it would start seconds later.
    assert max(y for _, y in latencies) < 0.5, f"an idle worker sleeping 2 s or more woke after {latencies} s"
    assert max(x for x, _ in latencies) < 2.0, f"an idle worker sleeping 2 s or more woke after {latencies} s"
    assert worker.poll() is None
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


@pytest.mark.timeout(180)
def test_sigterm_mid_batch_finishes_or_gives_back_and_nothing_is_lost(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, GATED)
    gate, blobs = tmp_path / "gate", tmp_path / "blobs"
    run_id = submit_run(target, make_docs(tmp_path / "docs", 40), store_url, blobs)
    first = _worker(target, store_url, blobs, "--json", env={"GATE": str(gate)})
    _wait_for(lambda: _done(store_url, run_id), lambda n: n >= 3, 60, "a few odd documents done")
    first.send_signal(signal.SIGTERM)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    stats = json.loads(out)
    assert stats["released"] > 0, "the gated tasks outlived the 10 s drain and were given back"
    held = query(store_url, "SELECT COUNT(*) FROM tasks WHERE run_id = ? AND status = 'running'", run_id)
    assert held[0][0] == 0, "nothing is left leased to the stopped worker"

    gate.touch()
    second = _worker(target, store_url, blobs, "--until-idle", env={"GATE": str(gate)})
    assert second.wait(timeout=120) == 0, second.communicate()[1]
    report = reconciled(store_url, run_id)
    assert report["unaccounted"] == 0 and report["outcomes"] == {"completed": 40}
    crashes = query(store_url, "SELECT COUNT(*) FROM attempts WHERE run_id = ? AND error_class = 'lease_expired'",
                    run_id)[0][0] + query(store_url, "SELECT COALESCE(SUM(crashes), 0) FROM tasks WHERE run_id = ?",
                                          run_id)[0][0]
    assert crashes == 0, "a drained worker's tasks are given back, not found abandoned"


def _cut_off(dbname: str, refuse_s: float) -> None:
    """End every connection to ``dbname``; with ``refuse_s``, refuse new ones that long (the server unreachable)."""
    if refuse_s:
        _admin(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS false")
    _admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{dbname}'")
    if refuse_s:
        time.sleep(refuse_s)
        _admin(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS true")


@pytest.mark.timeout(180)
def test_a_worker_waits_out_lost_connections_and_carries_on(tmp_path: Path, pg_url: str) -> None:
    target = write_pipeline(tmp_path, SLOW)
    blobs, dbname = tmp_path / "blobs", pg_url.rpartition("/")[2]
    # 150 tasks of 50 ms: the four cuts come within the first 40 or so, and the worker carries on past them.
    run_id = submit_run(target, make_docs(tmp_path / "docs", 150), pg_url, blobs)
    worker = _worker(target, pg_url, blobs, "--batch-size", "5")  # small batches: a store call every 0.25 s
    done = 0
    for refuse_s in (0.0, 2.0, 0.0, 3.0):  # terminated backends; connections refused for a while
        done = _wait_for(lambda: _done(pg_url, run_id), lambda n, floor=done: n >= floor + 5, 60, "progress")
        _cut_off(dbname, refuse_s)
        assert worker.poll() is None, worker.communicate()[1]
    _wait_for(lambda: _done(pg_url, run_id), lambda n: n == 150, 120, "every task done")
    assert worker.poll() is None
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    lost = [line for line in err.splitlines() if "lost the connection to the store" in line]
    assert 2 <= len(lost) <= 4, err
    assert "Traceback" not in err, err
    report = reconciled(pg_url, run_id)
    assert report["unaccounted"] == 0 and report["outcomes"] == {"completed": 150}


@pytest.mark.timeout(180)
def test_a_submission_that_loses_its_connection_says_so_in_one_line_and_finishes_when_run_again(
    tmp_path: Path, pg_url: str,
) -> None:
    target = write_pipeline(tmp_path, TWO_STAGES)
    dbname = pg_url.rpartition("/")[2]
    cli("submit", target, "--input", str(make_docs(tmp_path / "one", 1)), "--db", pg_url, "--blobs",
        str(tmp_path / "blobs"), cwd=tmp_path, check=True)  # the schema, made before the clock starts
    count, proc = 12000, None  # past the first of the batches a submission commits in (5,000 items)
    for _ in range(3):  # a submission that finished before it was cut off: again, larger
        docs = make_docs(tmp_path / f"docs{count}", count)
        args = ["submit", target, "--input", str(docs), "--db", pg_url, "--blobs", str(tmp_path / "blobs"), "--json"]
        proc = _spawn([sys.executable, "-m", "conveyor", *args], {})
        _wait_for(lambda: query(pg_url, "SELECT COUNT(*) FROM tasks")[0][0], lambda n: n > 1, 60, "submitted tasks")
        _cut_off(dbname, 0.0)
        if proc.wait(timeout=60) != 0:
            break
        count *= 2
    assert proc is not None and proc.returncode == 2, "the submission was never cut off part way"
    err = proc.communicate()[1]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: lost the connection to the store at postgresql://") and "--resume r" in err, err
    again = cli_json(*args[:-1], cwd=tmp_path)
    assert again["resumed"] is True and again["expected"] == count, again


@pytest.mark.timeout(120)
def test_sigterm_while_the_store_is_out_of_reach_still_exits_0(tmp_path: Path, pg_url: str) -> None:
    target = write_pipeline(tmp_path, SLOW)
    blobs, dbname = tmp_path / "blobs", pg_url.rpartition("/")[2]
    run_id = submit_run(target, make_docs(tmp_path / "docs", 300), pg_url, blobs)
    worker = _worker(target, pg_url, blobs, "--batch-size", "5")
    _wait_for(lambda: _done(pg_url, run_id), lambda n: n >= 5, 60, "progress")
    _admin(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS false")
    try:
        _admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{dbname}'")
        time.sleep(1.0)
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    finally:
        _admin(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS true")
    assert worker.returncode == 0, err
    assert "lost the connection to the store" in err and "stayed out of reach" in err and "Traceback" not in err


@pytest.mark.timeout(150)
def test_a_worker_stopped_past_its_lease_carries_on_fenced(tmp_path: Path, pg_url: str) -> None:
    target = write_pipeline(tmp_path, SLOW.replace('Pipeline("slow")', 'Pipeline("slow", lease_seconds=2.0)'))
    blobs = tmp_path / "blobs"
    run_id = submit_run(target, make_docs(tmp_path / "docs", 200), pg_url, blobs)
    stalled, other = (_worker(target, pg_url, blobs, "--batch-size", "5", "--json") for _ in range(2))
    _wait_for(lambda: _done(pg_url, run_id), lambda n: n >= 20, 60, "progress")
    stalled.send_signal(signal.SIGSTOP)
    time.sleep(6.0)  # three leases
    stalled.send_signal(signal.SIGCONT)
    _wait_for(lambda: _done(pg_url, run_id), lambda n: n == 200, 90, "every task done")
    stats = []
    for proc in (stalled, other):
        assert proc.poll() is None, "both kept running"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "Traceback" not in err, err
        stats.append(json.loads(out))
    assert stats[0]["succeeded"] + stats[1]["succeeded"] == 200, f"each task committed once (late ones fenced): {stats}"
    assert reconciled(pg_url, run_id)["outcomes"] == {"completed": 200}


def test_queue_depth_per_stage_and_its_filters(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, TWO_STAGES)
    blobs = tmp_path / "blobs"
    empty = {"runnable": 0, "running": 0, "oldest_age_s": 0.0, "stages": []}
    assert cli_json("queue-depth", "--db", store_url, cwd=tmp_path) == empty
    submit_run(target, make_docs(tmp_path / "docs", 7), store_url, blobs)
    time.sleep(0.2)
    data = cli_json("queue-depth", "--db", store_url, cwd=tmp_path)
    (parse,) = data["stages"]
    assert (parse["pipeline"], parse["stage"], parse["runnable"], parse["running"]) == ("docs", "parse", 7, 0)
    assert 0.2 <= parse["oldest_age_s"] < 60 and data["runnable"] == 7 and data["oldest_age_s"] == parse["oldest_age_s"]
    # Tasks waiting to retry, not due yet, are not ready to run.
    query(store_url, "UPDATE tasks SET available_at = available_at + 3600 WHERE item_key IN ('doc0000.txt', "
                     "'doc0001.txt')")
    only = cli_json("queue-depth", "--pipeline", "docs", "--stage", "parse", "--db", store_url, cwd=tmp_path)
    assert [(s["stage"], s["runnable"]) for s in only["stages"]] == [("parse", 5)]
    assert cli_json("queue-depth", "--pipeline", "other", "--db", store_url, cwd=tmp_path)["stages"] == []
    assert cli_json("queue-depth", "--stage", "shout", "--db", store_url, cwd=tmp_path)["runnable"] == 0
    assert "parse" in cli("queue-depth", "--db", store_url, cwd=tmp_path, check=True).stdout
    query(store_url, "UPDATE tasks SET available_at = available_at - 3600 WHERE item_key IN ('doc0000.txt', "
                     "'doc0001.txt')")
    work(target, store_url, blobs)
    assert cli_json("queue-depth", "--db", store_url, cwd=tmp_path) == empty


def _manifests(path: Path) -> list[dict[str, Any]]:
    import yaml

    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _keda_trigger() -> dict[str, Any]:
    docs = _manifests(DEPLOY / "keda" / "scaledobject.yaml")
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    (auth,) = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql" and trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    (secret_ref,) = auth["spec"]["secretTargetRef"]
    assert secret_ref["parameter"] == "connection" and secret_ref["name"] and secret_ref["key"]
    meta = trigger["metadata"]
    assert int(meta["targetQueryValue"]) > 0 and int(meta["activationTargetQueryValue"]) >= 0
    assert scaled["spec"]["scaleTargetRef"]["name"]
    caps = {int(n) for n in re.findall(r"LIMIT (\d+)", meta["query"])}
    enough = scaled["spec"]["maxReplicaCount"] * int(meta["targetQueryValue"])
    assert caps and min(caps) >= enough, "a capped count still asks for every replica it may"
    return dict(meta)


def test_the_keda_query_counts_open_work(tmp_path: Path, pg_url: str) -> None:
    query_text = _keda_trigger()["query"]
    assert load_target(f"{DEPLOY / 'fleet_pipeline.py'}:pipe").name == "docs" and "pipeline = 'docs'" in query_text
    target = write_pipeline(tmp_path, GATED.replace('Pipeline("gated")', 'Pipeline("docs")'))
    gate, blobs = tmp_path / "gate", tmp_path / "blobs"

    def keda() -> int:
        return int(query(pg_url, query_text)[0][0])

    def depth() -> dict[str, Any]:
        store = open_store(pg_url)
        try:
            from conveyor.service.depth import queue_depth

            return queue_depth(store, "docs")
        finally:
            store.close()

    assert keda() == 0
    run_id = submit_run(target, make_docs(tmp_path / "docs", 25), pg_url, blobs)
    assert keda() == 25 and depth()["runnable"] == 25
    query(pg_url, "UPDATE tasks SET crashes = 1 WHERE item_key = 'doc0003.txt'")  # a suspect is ready too
    query(pg_url, "UPDATE tasks SET available_at = available_at + 600 WHERE item_key = 'doc0004.txt'")
    assert keda() == 24, "a retry wait not due yet is not counted"
    query(pg_url, "UPDATE tasks SET available_at = available_at - 600 WHERE item_key = 'doc0004.txt'")
    worker = _worker(target, pg_url, blobs, env={"GATE": str(gate)})
    _wait_for(lambda: _done(pg_url, run_id), lambda n: n == 11, 60, "the odd documents but the suspect done")
    time.sleep(0.3)
    busy = depth()
    assert busy["running"] > 0 and busy["runnable"] + busy["running"] == 14, busy
    assert keda() == 14, "the 13 even documents wait on the gate (leased or queued), the suspect waits its turn"
    gate.touch()
    _wait_for(lambda: _done(pg_url, run_id), lambda n: n == 25, 60, "every task done")
    assert keda() == 0 and depth() == {"runnable": 0, "running": 0, "oldest_age_s": 0.0, "stages": []}
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert reconciled(pg_url, run_id)["outcomes"] == {"completed": 25}


def _instructions(path: Path) -> list[tuple[str, str]]:
    """A Dockerfile's instructions, (WORD, rest), continuation lines joined and comments left out."""
    lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [(word.upper(), rest.strip()) for word, _, rest in (line.strip().partition(" ")
                                                               for line in joined.splitlines() if line.strip())]


def test_the_compose_file_and_the_dockerfile_run_a_draining_fleet() -> None:
    instructions = _instructions(DEPLOY / "Dockerfile")
    first = {word: rest for word, rest in reversed(instructions)}
    last = dict(instructions)  # what counts of STOPSIGNAL, USER, ENTRYPOINT
    assert first["FROM"].startswith("python:3.11-slim")
    assert last["STOPSIGNAL"] == "SIGTERM"
    assert json.loads(last["ENTRYPOINT"]) == ["conveyor", "worker"], "exec form: the worker itself gets SIGTERM"
    assert last["USER"] not in ("root", "0")
    assert first["ARG"] == "EXTRAS=providers,metrics", "a worker's extras: model providers and --metrics-port"
    assert any(word == "RUN" and "pip install" in rest and "[${EXTRAS}]" in rest for word, rest in instructions)

    (compose,) = _manifests(DEPLOY / "compose.yaml")
    services = compose["services"]
    assert "healthcheck" in services["postgres"]
    worker = services["worker"]
    assert worker["restart"] == "unless-stopped" and "healthcheck" in worker
    assert worker["depends_on"]["postgres"]["condition"] == "service_healthy"
    grace = worker["stop_grace_period"]
    assert grace.endswith("s") and int(grace[:-1]) > 10 + 5, "longer than the 10 s drain and the give-back"
    assert worker["deploy"]["replicas"] >= 2
    env = worker["environment"]
    assert env["CONVEYOR_DB"].startswith("postgresql://") and env["CONVEYOR_BLOBS"]
