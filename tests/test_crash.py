"""Crashes, kills and races, on both backends: nothing lost, no effect twice, stale work fenced off.

Real worker processes are SIGKILLed at random moments; a stage that kills its own
process must end dead-lettered; a stale worker whose lease was taken over cannot
commit; SIGTERM drains or releases in-flight work. Stages record every call they
get in append-only files (O_APPEND writes, one line each) so that the tests can
count what actually ran, the way an external system would see it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import Pipeline
from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.transitions import Outcome, Transitions
from conveyor.runtime.values import Ref, encode, store_value
from conveyor.service.inputs import SourceItem
from conveyor.service.submit import submit
from conveyor.store import SqlStore, open_store
from tests.helpers import SRC, cli_json, make_docs, query, reconciled, submit_run, write_pipeline

# Every pipeline file below starts with this: a process-safe append-only journal.
JOURNAL = """
    import asyncio, os, random, time
    from conveyor import Pipeline, Retry

    def record(name, *fields):
        fd = os.open(os.path.join(os.environ["JOURNAL"], name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (" ".join(map(str, fields)) + "\\n").encode())
        finally:
            os.close(fd)
"""


# --- small helpers ------------------------------------------------------------

_started: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_stray_workers() -> Iterator[None]:
    """A failed test must not leave the worker processes it started running."""
    yield
    while _started:
        proc = _started.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def journal(tmp_path: Path) -> Path:
    folder = tmp_path / "journal"
    folder.mkdir(exist_ok=True)
    return folder


def env_for(folder: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC, "JOURNAL": str(folder)}


def lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []



def start_worker(target: str, run_id: str, store_url: str, blobs: Path, env: dict[str, str],
                 *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "conveyor", "worker", target, "--until-idle", "--run", run_id,
           "--db", store_url, "--blobs", str(blobs), "--quiet", *extra]
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    _started.append(proc)
    return proc



def lease_holders(store_url: str, run_id: str) -> set[int]:
    """Pids of the workers holding leases (a worker id is host:pid:nonce)."""
    owners = query(store_url, "SELECT DISTINCT lease_owner FROM tasks WHERE run_id = ? AND status = 'running'",
                   run_id)
    return {int(owner.split(":")[1]) for (owner,) in owners if owner}



def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.02)


# --- 1. SIGKILL chaos ---------------------------------------------------------------

CHAOS = JOURNAL + """
    # A generous attempt budget: a kill charges an attempt to every task the worker held (see
    # test_killed_worker_does_not_use_up_attempts_of_items_it_never_started); this test is about effects.
    pipe = Pipeline("chaos", lease_seconds=2, retry=Retry(max_attempts=10))

    @pipe.stage
    def parse(ctx, source: bytes) -> dict:
        record("calls.log", ctx.stage, ctx.item_key, os.getpid())
        return {"text": source.decode()}

    @pipe.stage(after=parse)
    def extract(ctx, doc: dict) -> dict:
        record("calls.log", ctx.stage, ctx.item_key, os.getpid())
        time.sleep(random.uniform(0.005, 0.05))  # so that kills land mid-stage
        return {"words": doc["text"].split()}

    @pipe.stage(after=extract, kind="publish")
    def publish(ctx, fields: dict) -> None:
        record("calls.log", ctx.stage, ctx.item_key, os.getpid())
        record("external.log", ctx.idempotency_key, ctx.item_key)  # the external system sees every call
        time.sleep(random.uniform(0.002, 0.01))  # its reply takes a moment: a kill may land before the commit
"""


@pytest.mark.timeout(120)
def test_sigkilled_workers_lose_nothing_and_publish_each_item_once(tmp_path: Path, store_url: str) -> None:
    items, kills_wanted = 60, 8
    folder = journal(tmp_path)
    env = env_for(folder)
    target = write_pipeline(tmp_path, CHAOS)
    blobs = tmp_path / "blobs"
    started = time.monotonic()
    run_id = submit_run(target, make_docs(tmp_path / "docs", items, "chaos document {i}"), store_url, blobs)

    seed = random.randrange(2**32)
    print(f"chaos seed {seed}")
    rng = random.Random(seed)

    def spawn() -> subprocess.Popen[bytes]:
        # A small batch size makes workers commit in many groups, so kills land between commits too.
        return start_worker(target, run_id, store_url, blobs, env, "--batch-size", "10")

    workers = [spawn() for _ in range(3)]
    kills = 0
    while kills < kills_wanted:
        time.sleep(rng.uniform(0.2, 0.8))  # a random moment, on purpose: this is not waiting for a condition
        alive = [p for p in workers if p.poll() is None]
        if not alive:
            break  # the run finished before every kill landed
        busy = [p for p in alive if p.pid in lease_holders(store_url, run_id)]
        victim = rng.choice(busy or alive)  # prefer a worker that holds leases: that is where kills hurt
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        workers.remove(victim)
        workers.append(spawn())
        kills += 1
    for proc in workers:
        proc.wait(timeout=max(1.0, 55 - (time.monotonic() - started)))
        assert proc.returncode == 0, f"a surviving worker exited {proc.returncode}"
    elapsed = time.monotonic() - started

    report = reconciled(store_url, run_id)
    assert report["unaccounted"] == 0, report["not_done"]
    assert report["outcomes"] == {"published": items}

    # The external system deduplicates by idempotency key: each item's effect exactly once,
    # and every delivery of one item carried the same key.
    keys_by_item: dict[str, set[str]] = defaultdict(set)
    items_by_key: dict[str, set[str]] = defaultdict(set)
    publish_calls = lines(folder / "external.log")
    for key, item in publish_calls:
        keys_by_item[item].add(key)
        items_by_key[key].add(item)
    assert len(keys_by_item) == items, "every item must be published"
    assert {item: len(keys) for item, keys in keys_by_item.items() if len(keys) != 1} == {}, \
        "an item was published under more than one idempotency key"
    assert all(len(owners) == 1 for owners in items_by_key.values()), "two items shared an idempotency key"
    assert len(items_by_key) == items

    # Every stage output committed exactly once.
    per_key = query(store_url, "SELECT task_key, COUNT(*) FROM outputs WHERE run_id = ? GROUP BY task_key", run_id)
    assert len(per_key) == items * 3 and {n for _, n in per_key} == {1}
    succeeded = query(store_url, "SELECT item_key, stage, COUNT(*) FROM tasks WHERE run_id = ? "
                                 "AND status = 'succeeded' GROUP BY item_key, stage", run_id)
    assert len(succeeded) == items * 3 and {n for *_, n in succeeded} == {1}
    commits = query(store_url, "SELECT task_id, COUNT(*) FROM attempts WHERE run_id = ? "
                               "AND outcome IN ('succeeded', 'cached') GROUP BY task_id", run_id)
    assert len(commits) == items * 3 and {n for _, n in commits} == {1}, "a task was committed twice"
    assert query(store_url, "SELECT COUNT(*) FROM tasks WHERE run_id = ? AND status = 'running'", run_id) == [(0,)]
    assert query(store_url, "SELECT COUNT(*) FROM tasks WHERE run_id = ? AND lease_owner IS NOT NULL",
                 run_id) == [(0,)], "a lease is still held after the run finished"

    outcomes = dict(query(store_url, "SELECT outcome, COUNT(*) FROM attempts WHERE run_id = ? GROUP BY outcome",
                          run_id))
    calls = Counter(stage for stage, *_ in lines(folder / "calls.log"))
    most = query(store_url, "SELECT MAX(attempts) FROM tasks WHERE run_id = ?", run_id)[0][0]
    print(f"{kills} kills in {elapsed:.1f}s; attempts by outcome {outcomes} (most on one task: {most}); "
          f"stage calls {dict(calls)}; "
          f"publish calls {len(publish_calls)} for {items} items")
    assert elapsed < 60


# --- 1b. A kill must not use up the attempts of tasks that never started ----------

GREEDY = JOURNAL + """
    pipe = Pipeline("greedy", retry=Retry(max_attempts=3, base=0.01, cap=0.05), lease_seconds=1)

    @pipe.stage
    def parse(ctx, source: bytes) -> str:
        record("calls.log", ctx.item_key, ctx.attempt)
        time.sleep(0.3)
        return source.decode()
"""


@pytest.mark.timeout(120)
def test_killed_worker_does_not_use_up_attempts_of_items_it_never_started(tmp_path: Path, store_url: str) -> None:
    folder = journal(tmp_path)
    env = env_for(folder)
    target = write_pipeline(tmp_path, GREEDY)
    blobs = tmp_path / "blobs"
    run_id = submit_run(target, make_docs(tmp_path / "docs", 10, "greedy document {i}"), store_url, blobs)
    calls = folder / "calls.log"

    for kill in range(3):  # as many kills as the attempt budget, each one mid-call
        worker = start_worker(target, run_id, store_url, blobs, env)
        wait_until(lambda n=kill: len(lines(calls)) > n, 30, "the next stage call")
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    ran_before = {item for item, _ in lines(calls)}
    assert start_worker(target, run_id, store_url, blobs, env).wait(timeout=60) == 0

    report = reconciled(store_url, run_id)
    assert report["unaccounted"] == 0
    never_ran = {e["item_key"] for e in report["not_done"]} - ran_before
    assert never_ran == set(), f"dead-lettered although their stage never ran: {sorted(never_ran)}"
    assert report["outcomes"].get("completed", 0) >= 10 - len(ran_before)


# --- 2. A stale worker cannot commit ---------------------------------------------

RACE = Pipeline("race", lease_seconds=5)


@RACE.stage
def first(ctx: Any, source: bytes) -> str:
    return source.decode()


@RACE.stage(after=first)
def second(ctx: Any, text: str) -> str:
    return text


T0 = 1_700_000_000.0


def race_store(store_url: str, tmp_path: Path) -> tuple[SqlStore, FilesystemBlobs, str]:
    store = open_store(store_url)
    blobs = FilesystemBlobs(tmp_path / "blobs")
    done = submit(RACE, "race", "inline", store, blobs, clock=lambda: T0, items=[SourceItem("doc", text=b"hello")])
    return store, blobs, done.run_id


def result(value: str, blobs: FilesystemBlobs) -> Ref:
    return store_value(*encode(value), blobs)


def task_row(store: SqlStore, run_id: str, stage: str) -> list[tuple[Any, ...]]:
    return store.db.execute("SELECT id, status, output_digest, input_digest FROM tasks "
                            "WHERE run_id = ? AND stage = ?", (run_id, stage))


def attempt_rows(store: SqlStore, task_id: int) -> list[tuple[Any, ...]]:
    return store.db.execute("SELECT attempt, outcome, worker FROM attempts WHERE task_id = ? ORDER BY id",
                            (task_id,))


@pytest.mark.timeout(120)
def test_stale_worker_cannot_commit_after_its_lease_was_taken_over(tmp_path: Path, store_url: str) -> None:
    store, blobs, run_id = race_store(store_url, tmp_path)
    try:
        [a] = store.claim("race", ["first"], 10, "A", T0, 5, run_id)
        # A stalls past its lease; whoever notices requeues the task (its attempt spent; it runs beside others
        # after a first death), and B takes it.
        assert Transitions(RACE, store, "reaper").reclaim_expired(T0 + 10)["requeued"] == 1
        assert store.claim_suspect("race", "B", T0 + 10, 5, run_id) == []
        [b] = store.claim("race", ["first"], 10, "B", T0 + 10, 5, run_id)
        assert b.id == a.id and b.lease_token > a.lease_token

        mine, stale = result("B's result", blobs), result("A's result", blobs)
        counts_b = Transitions(RACE, store, "B").commit([Outcome(b, T0 + 10, 0.1, True, mine)], T0 + 11)
        assert counts_b["succeeded"] == 1
        counts_a = Transitions(RACE, store, "A").commit([Outcome(a, T0, 0.1, True, stale)], T0 + 12)
        assert counts_a["lease_lost"] == 1 and counts_a["succeeded"] == 0

        assert task_row(store, run_id, "first") == [(a.id, "succeeded", mine.digest, a.input_digest)]
        assert store.db.execute("SELECT digest FROM outputs WHERE task_key = ?", (a.task_key,)) == [(mine.digest,)]
        assert attempt_rows(store, a.id) == [
            (1, "lease_expired", "A"), (2, "succeeded", "B"), (1, "lease_lost", "A")]
        downstream = task_row(store, run_id, "second")
        assert len(downstream) == 1, "the downstream task must exist exactly once"
        assert downstream[0][1:] == ("queued", None, mine.digest), "downstream must consume B's output"
    finally:
        store.close()


@pytest.mark.timeout(120)
def test_stale_worker_cannot_commit_a_requeued_task(tmp_path: Path, store_url: str) -> None:
    store, blobs, run_id = race_store(store_url, tmp_path)
    try:
        [a] = store.claim("race", ["first"], 10, "A", T0, 5, run_id)
        assert Transitions(RACE, store, "reaper").reclaim_expired(T0 + 10)["requeued"] == 1
        # A comes back after the reclaim but before anyone claimed the task again.
        counts_a = Transitions(RACE, store, "A").commit([Outcome(a, T0, 0.1, True, result("A", blobs))], T0 + 11)
        assert counts_a["lease_lost"] == 1 and counts_a["succeeded"] == 0
        assert task_row(store, run_id, "first") == [(a.id, "queued", None, a.input_digest)]
        assert store.db.execute("SELECT COUNT(*) FROM outputs WHERE task_key = ?", (a.task_key,)) == [(0,)]
        assert task_row(store, run_id, "second") == []
        assert attempt_rows(store, a.id) == [(1, "lease_expired", "A"), (1, "lease_lost", "A")]

        # The task is still runnable, and B's commit is the one that counts.
        [b] = store.claim("race", ["first"], 10, "B", T0 + 12, 5, run_id)
        mine = result("B", blobs)
        counts_b = Transitions(RACE, store, "B").commit([Outcome(b, T0 + 12, 0.1, True, mine)], T0 + 13)
        assert counts_b["succeeded"] == 1
        assert task_row(store, run_id, "first") == [(a.id, "succeeded", mine.digest, a.input_digest)]
        assert [row[1:] for row in task_row(store, run_id, "second")] == [("queued", None, mine.digest)]
    finally:
        store.close()


# --- 3. A poison item that kills its worker --------------------------------------

POISON = JOURNAL + """
    pipe = Pipeline("poison", retry=Retry(max_attempts=3, base=0.01, cap=0.05), lease_seconds=1)

    @pipe.stage
    def parse(ctx, source: bytes) -> str:
        record("calls.log", ctx.item_key, ctx.attempt, os.getpid())
        if source.startswith(b"poison"):
            os._exit(1)  # a segfaulting parser, say: no exception, no cleanup
        return source.decode().upper()
"""


@pytest.mark.timeout(120)
def test_item_that_kills_its_worker_is_dead_lettered_after_max_attempts(tmp_path: Path, store_url: str) -> None:
    folder = journal(tmp_path)
    env = env_for(folder)
    target = write_pipeline(tmp_path, POISON)
    docs = make_docs(tmp_path / "docs", 5, "fine document {i}")
    (docs / "poison").write_text("poison pill")
    common = ("--db", store_url, "--blobs", str(tmp_path / "blobs"))

    started = time.monotonic()
    summary = cli_json("run", target, "--input", str(docs), "--workers", "1", *common, cwd=tmp_path, env=env,
                       timeout=60)
    elapsed = time.monotonic() - started

    assert summary["unaccounted"] == 0, summary["not_done"]
    assert summary["outcomes"] == {"completed": 5, "dead_lettered": 1}, summary["not_done"]
    assert [e["item_key"] for e in summary["not_done"]] == ["poison"]
    poison_calls = [attempt for item, attempt, _ in lines(folder / "calls.log") if item == "poison"]
    # Every death costs each task in flight its attempt, so the poison item takes down no more workers than
    # it has attempts: the healthy items that died beside it twice run alone and finish on their last one.
    assert poison_calls == ["1", "2", "3"], "the poison item must be charged every crash"
    healthy = Counter(item for item, _, _ in lines(folder / "calls.log") if item != "poison")
    assert set(healthy) == {f"doc{i:04d}.txt" for i in range(5)} and max(healthy.values()) <= 3

    listed = cli_json("dlq", "list", "--run", summary["run_id"], "--db", store_url, cwd=tmp_path, env=env)
    assert [(e["item_key"], e["stage"], e["error_class"], e["attempts"]) for e in listed["entries"]] == [
        ("poison", "parse", "lease_expired", 3)]
    assert "lease" in listed["entries"][0]["error"]
    print(f"poison run took {elapsed:.1f}s; calls {Counter(i for i, *_ in lines(folder / 'calls.log'))}")
    assert elapsed < 60


# --- 4. SIGTERM drains or releases ----------------------------------------------

SLOW = JOURNAL + """
    pipe = Pipeline("drain")

    @pipe.stage(concurrency=4)
    async def slow(ctx, source: bytes) -> str:
        record("calls.log", ctx.item_key, time.time())
        await asyncio.sleep(0.5)
        return source.decode()
"""


@pytest.mark.timeout(120)
def test_sigterm_finishes_or_releases_in_flight_work(tmp_path: Path, store_url: str) -> None:
    items = 24
    folder = journal(tmp_path)
    env = env_for(folder)
    target = write_pipeline(tmp_path, SLOW)
    blobs = tmp_path / "blobs"
    run_id = submit_run(target, make_docs(tmp_path / "docs", items, "slow document {i}"), store_url, blobs)

    worker = start_worker(target, run_id, store_url, blobs, env)
    calls = folder / "calls.log"
    # Four at a time, half a second each: the ninth call starts about a second in.
    wait_until(lambda: len(lines(calls)) >= 9, 30, "the third round of calls")
    terminated = time.time()
    worker.send_signal(signal.SIGTERM)
    code = worker.wait(timeout=30)
    took = time.time() - terminated
    assert code == 0
    assert took < 5, f"the worker took {took:.1f}s to stop after SIGTERM"

    statuses = dict(query(store_url, "SELECT status, COUNT(*) FROM tasks WHERE run_id = ? GROUP BY status",
                          run_id))
    assert "running" not in statuses, f"in-flight tasks were neither finished nor released: {statuses}"
    assert query(store_url, "SELECT COUNT(*) FROM tasks WHERE run_id = ? AND lease_owner IS NOT NULL",
                 run_id) == [(0,)]
    assert query(store_url, "SELECT COUNT(*) FROM tasks WHERE run_id = ? AND status = 'queued' AND attempts > 0",
                 run_id) == [(0,)], "a released task must not have used up an attempt"
    after_term = sum(1 for _, at in lines(calls) if float(at) > terminated + 0.05)
    print(f"stopped {took:.2f}s after SIGTERM; statuses then {statuses}; {after_term} calls started after it")

    proc = subprocess.run([sys.executable, "-m", "conveyor", "worker", target, "--until-idle", "--run", run_id,
                           "--db", store_url, "--blobs", str(blobs), "--quiet"], env=env, timeout=60)
    assert proc.returncode == 0
    report = reconciled(store_url, run_id)
    assert report["unaccounted"] == 0 and report["outcomes"] == {"completed": items}
    per_item = Counter(item for item, _ in lines(calls))
    assert len(per_item) == items and set(per_item.values()) == {1}, f"an item ran twice: {per_item}"
    assert query(store_url, "SELECT DISTINCT attempts FROM tasks WHERE run_id = ?", run_id) == [(1,)]


@pytest.mark.timeout(120)
def test_sigterm_drain_keeps_its_leases_while_a_replacement_starts(tmp_path: Path, store_url: str) -> None:
    """A rolling deploy: the new worker starts as the old one drains; no item may run twice."""
    items = 32
    folder = journal(tmp_path)
    env = env_for(folder)
    target = write_pipeline(tmp_path, SLOW.replace('Pipeline("drain")', 'Pipeline("drain", lease_seconds=1)'))
    blobs = tmp_path / "blobs"
    run_id = submit_run(target, make_docs(tmp_path / "docs", items, "slow document {i}"), store_url, blobs)

    old = start_worker(target, run_id, store_url, blobs, env)
    calls = folder / "calls.log"
    wait_until(lambda: len(lines(calls)) >= 9, 30, "the third round of calls")
    old.send_signal(signal.SIGTERM)
    new = start_worker(target, run_id, store_url, blobs, env)
    assert old.wait(timeout=30) == 0 and new.wait(timeout=60) == 0

    report = reconciled(store_url, run_id)
    assert report["unaccounted"] == 0 and report["outcomes"] == {"completed": items}
    per_item = Counter(item for item, _ in lines(calls))
    assert {item: n for item, n in per_item.items() if n != 1} == {}, "items ran twice across the handover"
    lost = query(store_url, "SELECT COUNT(*) FROM attempts WHERE run_id = ? AND outcome = 'lease_lost'", run_id)
    assert lost == [(0,)], "the draining worker's finished work was thrown away"


@pytest.mark.timeout(120)
def test_the_loser_of_a_memo_race_builds_on_the_winners_output(tmp_path: Path, store_url: str) -> None:
    # Two items with the same content: one task key, run by two workers at once, with different answers
    # (a model call is not deterministic). The first commit is memoised; the second takes its output.
    store = open_store(store_url)
    blobs = FilesystemBlobs(tmp_path / "blobs")
    try:
        items = [SourceItem("one", text=b"same"), SourceItem("two", text=b"same")]
        run_id = submit(RACE, "race", "inline", store, blobs, clock=lambda: T0, items=items).run_id
        [a] = store.claim("race", ["first"], 1, "A", T0, 5, run_id)
        [b] = store.claim("race", ["first"], 1, "B", T0, 5, run_id)
        assert a.task_key == b.task_key and a.item_key != b.item_key
        won, lost = result("A's answer", blobs), result("B's answer", blobs)
        assert Transitions(RACE, store, "A").commit([Outcome(a, T0, 0.1, True, won)], T0 + 1)["succeeded"] == 1
        assert Transitions(RACE, store, "B").commit([Outcome(b, T0, 0.1, True, lost)], T0 + 2)["succeeded"] == 1

        assert store.db.execute("SELECT digest FROM outputs WHERE task_key = ?", (a.task_key,)) == [(won.digest,)]
        rows = store.db.execute("SELECT item_key, output_digest FROM tasks WHERE run_id = ? AND stage = 'first'"
                                " ORDER BY item_key", (run_id,))
        assert rows == [("one", won.digest), ("two", won.digest)]
        downstream = store.db.execute("SELECT item_key, input_digest FROM tasks WHERE run_id = ?"
                                      " AND stage = 'second' ORDER BY item_key", (run_id,))
        assert downstream == [("one", won.digest), ("two", won.digest)], "both items go on from the memoised one"
        assert attempt_rows(store, b.id) == [(1, "succeeded", "B")], "B's call is still recorded as made"
    finally:
        store.close()


def test_a_submission_that_stops_mid_stream_resumes_without_duplicates(
        tmp_path: Path, store_url: str) -> None:
    """An input that breaks off after a whole batch was written leaves that batch in an abandoned run, and
    resuming it adds each missing item once."""
    from conveyor.service.submit import BATCH, SubmitOptions

    keys = [f"doc{i:05d}" for i in range(BATCH + 50)]

    def broken() -> Iterator[SourceItem]:
        for key in keys[:BATCH + 10]:
            yield SourceItem(key, text=key.encode())
        raise KeyboardInterrupt  # Ctrl-C in the middle of the second batch

    store = open_store(store_url)
    blobs = FilesystemBlobs(tmp_path / "blobs")
    try:
        with pytest.raises(KeyboardInterrupt):
            submit(RACE, "race", "inline", store, blobs, clock=lambda: T0, items=broken())
        [(run_id, status)] = store.db.execute("SELECT run_id, status FROM runs")
        assert status == "abandoned" and store.item_count(run_id) == BATCH
        done = submit(RACE, "race", "inline", store, blobs, clock=lambda: T0 + 1,
                      items=[SourceItem(key, text=key.encode()) for key in keys],
                      options=SubmitOptions(resume=run_id))
        assert done.run_id == run_id and done.expected == len(keys)
        rows = store.db.execute("SELECT item_key, COUNT(*) FROM tasks WHERE run_id = ? GROUP BY item_key", (run_id,))
        assert sorted(rows) == [(key, 1) for key in keys]
    finally:
        store.close()
