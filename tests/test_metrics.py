"""Prometheus metrics: `conveyor serve` at /metrics and `conveyor worker --metrics-port`, scraped for real and
parsed with the Prometheus text parser; the counts agree with what reconcile says, on both backends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from conveyor.blobs import FilesystemBlobs
from conveyor.metrics import exposition, new_registry
from conveyor.metrics.collector import shared_store
from conveyor.runtime.target import load_target
from conveyor.service import review
from conveyor.store import open_store
from tests.apiserver import free_port, served
from tests.helpers import SRC, cli, reconciled, submit_and_work, work, write_pipeline

PIPE = """
from conveyor import Pipeline, Retry, TerminalError
from conveyor.acceptance import Accept, Review

pipe = Pipeline("metered", retry=Retry(max_attempts=2, base=0.01, cap=0.01))

@pipe.stage()
def parse(ctx, source: bytes) -> dict:
    text = source.decode()
    if text.startswith("poison"):
        raise ValueError("poison document")
    if text.startswith("bad"):
        raise TerminalError("unreadable")
    return {"text": text}

@pipe.stage(after=parse, accept=Accept(confidence="c", threshold=0.8, review=Review()))
def judge(ctx, doc: dict) -> dict:
    return {"c": 0.5 if "unsure" in doc["text"] else 0.9}

@pipe.stage(after=judge, kind="publish")
def publish(ctx, record: dict) -> None:
    pass
"""

DOCS = ["ok1", "ok2", "ok3", "ok4", "ok5", "unsure1", "unsure2", "poison1", "bad1"]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in DOCS:
        (folder / f"{name}.txt").write_text(f"{name} text")
    return folder


def parse(text: str) -> Samples:
    """Every sample: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def scrape_store(store_url: str, target: str) -> Samples:
    registry = new_registry(shared_store(store_url), [load_target(target)])
    return parse(exposition(registry).decode())


def test_queue_gauges_before_any_work(store_url: str, tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = _docs(tmp_path)
    cli("submit", target, "--input", str(docs), "--db", store_url, "--blobs", str(tmp_path / "blobs"),
        cwd=tmp_path, check=True)
    s = scrape_store(store_url, target)
    assert value(s, "conveyor_tasks", pipeline="metered", stage="parse", state="queued") == len(DOCS)
    assert value(s, "conveyor_queue_age_seconds_bucket", stage="parse", le="+Inf") == len(DOCS)
    assert value(s, "conveyor_queue_age_seconds_gcount", stage="parse") == len(DOCS)
    assert 0 <= value(s, "conveyor_queue_oldest_age_seconds", stage="parse") < 120
    assert value(s, "conveyor_tasks_finished_total") == 0


# One per AGE_BUCKETS bin (the first waits out a backoff: age 0), each a few seconds inside it (ages are read to
# the second, at a later clock), then one past the last bound.
AGES = [-30.0, 2.0, 10.0, 40.0, 200.0, 600.0, 2000.0, 10_000.0, 50_000.0]


def test_queue_age_histogram_is_exact_at_the_second(store_url: str, tmp_path: Path) -> None:
    """Tasks made runnable at known ages (by SQL, then counted again from the rows) land in their bins; leased
    tasks are not queued; folding the writers' shards changes no count."""
    target = write_pipeline(tmp_path, PIPE)
    cli("submit", target, "--input", str(_docs(tmp_path)), "--db", store_url, "--blobs", str(tmp_path / "blobs"),
        cwd=tmp_path, check=True)
    store = open_store(store_url)
    try:
        now = store.clock()
        ids = [int(r[0]) for r in store.db.execute("SELECT id FROM tasks WHERE stage = 'parse' ORDER BY id")]
        ages = [*AGES, 100_000.0][: len(ids)]
        with store.transaction():
            for task_id, age in zip(ids, ages, strict=True):
                store.db.execute("UPDATE tasks SET available_at = ? WHERE id = ?", (now - age, task_id))
        store.recount_open_task_seconds()
        leased = store.claim("metered", ["parse"], 2, "test-owner", store.clock(), 600.0)
        store.compact_open_task_seconds()
        assert not store.open_task_mismatches()
    finally:
        store.close()
    queued = [max(0.0, age) for task_id, age in zip(ids, ages, strict=True) if task_id not in {t.id for t in leased}]
    s = scrape_store(store_url, target)
    assert value(s, "conveyor_tasks", stage="parse", state="queued") == len(queued)
    assert value(s, "conveyor_tasks", stage="parse", state="running") == 2
    for bound in (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0):
        within = sum(1 for age in queued if age <= bound)
        assert value(s, "conveyor_queue_age_seconds_bucket", stage="parse", le=repr(bound)) == within, bound
    assert value(s, "conveyor_queue_oldest_age_seconds", stage="parse") >= max(queued)
    assert abs(value(s, "conveyor_queue_age_seconds_gsum", stage="parse") - sum(queued)) <= 2 * len(queued) + 5


def _assert_agrees(s: Samples, rec: dict[str, Any]) -> None:
    outcomes = rec["outcomes"]
    assert outcomes == {"published": 5, "awaiting_review": 2, "dead_lettered": 1, "failed": 1}
    finished = "conveyor_tasks_finished_total"
    assert value(s, finished, stage="parse", outcome="dead_lettered") == outcomes["dead_lettered"]
    assert value(s, finished, stage="parse", outcome="failed") == outcomes["failed"]
    assert value(s, finished, stage="parse", outcome="succeeded") == 7
    assert value(s, finished, stage="publish", outcome="succeeded") == outcomes["published"]
    assert value(s, "conveyor_items_published_total", pipeline="metered") == outcomes["published"]
    assert value(s, "conveyor_items_accepted_total", pipeline="metered") == outcomes["published"]
    assert value(s, "conveyor_dead_letters_total") == outcomes["dead_lettered"]
    assert value(s, "conveyor_dead_letters_last_hour") == outcomes["dead_lettered"]
    assert value(s, "conveyor_review_backlog", stage="judge") == outcomes["awaiting_review"]
    assert value(s, "conveyor_tasks", stage="judge", state="awaiting_review") == outcomes["awaiting_review"]
    assert 0 <= value(s, "conveyor_review_oldest_age_seconds", stage="judge") < 120
    retries = {dict(ls)["error_class"]: v for (n, ls), v in s.items() if n == "conveyor_retries_total"}
    assert sum(retries.values()) == rec["retries"] == 1
    assert set(retries) <= set(rec["attempt_errors"])
    ran = value(s, "conveyor_attempt_duration_seconds_count", stage="parse")
    assert ran == 10  # 7 good, 2 tries of the poison, 1 bad
    assert value(s, "conveyor_attempt_duration_seconds_bucket", stage="parse", le="+Inf") == ran
    assert value(s, "conveyor_tasks", state="queued") == 0


def test_serve_metrics_agree_with_reconcile(store_url: str, tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, PIPE)
    done = submit_and_work(target, _docs(tmp_path), store_url, tmp_path / "blobs")
    rec = reconciled(store_url, done.run_id)
    with served(tmp_path, store_url, target, workers=1) as server:
        answer = httpx.get(f"{server.url}/metrics", timeout=30)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    _assert_agrees(parse(answer.text), rec)


def test_worker_metrics_port(store_url: str, tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, PIPE)
    blobs = tmp_path / "blobs"
    submitted = cli("submit", target, "--input", str(_docs(tmp_path)), "--db", store_url, "--blobs", str(blobs),
                    "--json", cwd=tmp_path, check=True)
    assert submitted.returncode == 0
    port = free_port()
    env = {**os.environ, "PYTHONPATH": SRC}
    worker = subprocess.Popen([sys.executable, "-m", "conveyor", "worker", target, "--db", store_url, "--blobs",
                               str(blobs), "--metrics-port", str(port), "-q"], cwd=tmp_path, env=env,
                              start_new_session=True)
    try:
        # The poison item's second attempt may still be running when the others are done: wait for its end too.
        s = _scrape_until(f"http://127.0.0.1:{port}/metrics", lambda s: value(
            s, "conveyor_items_published_total") == 5 and value(s, "conveyor_review_backlog") == 2 and value(
            s, "conveyor_tasks_finished_total", outcome="dead_lettered") >= 1)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
    assert value(s, "conveyor_tasks_finished_total", outcome="dead_lettered") == 1


def _scrape_until(url: str, done: Any, timeout: float = 60) -> Samples:
    deadline, samples = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        try:
            samples = parse(httpx.get(url, timeout=5).text)
        except httpx.HTTPError:
            samples = {}
        if samples and done(samples):
            return samples
        time.sleep(0.2)
    raise AssertionError(f"{url} never reported the finished run: {samples}")


def test_review_decisions_move_the_backlog(store_url: str, tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, PIPE)
    blobs = tmp_path / "blobs"
    done = submit_and_work(target, _docs(tmp_path), store_url, blobs)
    store = open_store(store_url)
    try:
        first, second = (r["id"] for r in review.review_list(store)["reviews"])
        review.approve(store, FilesystemBlobs(blobs), [first], by="ann")
        review.reject(store, [second], why="not ours", by="bob")
    finally:
        store.close()
    work(target, store_url, blobs, run_id=done.run_id)
    s = scrape_store(store_url, target)
    assert reconciled(store_url, done.run_id)["outcomes"]["published"] == 6
    assert value(s, "conveyor_review_backlog") == 0 and value(s, "conveyor_tasks", state="awaiting_review") == 0
    assert value(s, "conveyor_items_accepted_total") == 6
    assert value(s, "conveyor_items_published_total") == 6
    assert value(s, "conveyor_tasks_finished_total", stage="judge", outcome="rejected") == 1
    assert value(s, "conveyor_tasks_finished_total", stage="judge", outcome="succeeded") == 6


QUOTA_PIPE = """
from conveyor import Pipeline, RateLimit

pipe = Pipeline("limited", limits={"gpt-4o-mini": RateLimit(tpm=5000, rpm=50)})

@pipe.stage()
def parse(ctx, source: bytes) -> bytes:
    return source
"""


def test_quota_used_against_limit(store_url: str, tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, QUOTA_PIPE)
    store = open_store(store_url)
    try:
        store.reserve_quota("openai/gpt-4o-mini", [("bulk", 1200), ("bulk", 300)], tpm=5000, rpm=50,
                            interactive_share=0.1, window=60, worker="test")
    finally:
        store.close()
    s = scrape_store(store_url, target)
    key = "openai/gpt-4o-mini"
    assert value(s, "conveyor_quota_tokens_used", key=key) == 1500
    assert value(s, "conveyor_quota_requests_used", key=key) == 2
    assert value(s, "conveyor_quota_tokens_limit", key=key) == 5000
    assert value(s, "conveyor_quota_requests_limit", key=key) == 50


SIMPLE = """
from conveyor import Pipeline

pipe = Pipeline("folded")

@pipe.stage()
def a(ctx, source: bytes) -> dict:
    return {"n": len(source), "text": source.decode()}

@pipe.stage(after=a)
def b(ctx, doc: dict) -> dict:
    return doc
"""


def test_folding_the_counts_while_two_workers_run(store_url: str, tmp_path: Path) -> None:
    """The keeper's fold (store/queuecounts.py) runs over and over while two worker processes commit: it never
    waits on them, never fails one, and no count is lost (the conftest compares the counts with the rows)."""
    target = write_pipeline(tmp_path, SIMPLE)
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(400):
        (docs / f"d{i:04d}.txt").write_text(f"document {i}")
    env = {**os.environ, "PYTHONPATH": SRC}
    run = subprocess.Popen([sys.executable, "-m", "conveyor", "run", target, "--input", str(docs), "--db",
                            store_url, "--blobs", str(tmp_path / "blobs"), "--workers", "2", "--json"],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folds = 0
    store = open_store(store_url)
    try:
        while run.poll() is None:
            store.compact_open_task_seconds()
            folds += 1
            time.sleep(0.01)
        store.compact_open_task_seconds()
        assert not store.open_task_mismatches()
        rows = store.db.execute("SELECT COUNT(*) FROM open_task_seconds")[0][0]
    finally:
        store.close()
    _out, err = run.communicate()
    assert run.returncode == 0, err
    assert folds > 3
    assert rows == 0  # every task finished: nothing is open, and the fold dropped every spent row
