"""Reads have no side effects: listing reviews (the CLI, `GET /v1/reviews`, the dashboard) applies no deadline and
loads no pipeline, so one run whose pipeline file moved breaks nothing; deadlines are applied by the workers as
they keep their leases and by `conveyor review expire`, run by run (both backends)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.target import load_target
from conveyor.runtime.worker import Worker, WorkerOptions
from conveyor.service import review
from conveyor.store import open_store
from tests.apiserver import served
from tests.helpers import cli, cli_json, query, submit_and_work, write_pipeline
from tests.test_acceptance import ITEMS, PIPE
from tests.test_api_webhooks import wait_until

# What a decision changes: none of it may change when the queue is only read.
DOMAIN = ("runs", "items", "tasks", "attempts", "outputs", "reviews", "dead_letters", "run_totals", "events")
DAYS = 3 * 86400


@pytest.fixture
def two_runs(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Two runs of one pipeline from two files, each with an entry waiting for review (item b), both past their
    deadline; the second run's pipeline file then deleted."""
    monkeypatch.setenv("SINK", str(tmp_path / "sink.jsonl"))
    monkeypatch.setenv("CALLS", str(tmp_path / "calls.log"))
    manifest = tmp_path / "in.jsonl"
    manifest.write_text("".join(json.dumps(i) + "\n" for i in ITEMS if i["key"] == "b"))
    # The second run's b is another document: the same one would wait on the first run's entry (issue 27 point 3).
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({**i, "text": i["text"] + " again"}) + "\n" for i in ITEMS if i["key"] == "b"))
    (tmp_path / "kept").mkdir()
    (tmp_path / "moved").mkdir()
    kept = submit_and_work(write_pipeline(tmp_path / "kept", PIPE), manifest, store_url, tmp_path / "blobs")
    moved_target = write_pipeline(tmp_path / "moved", PIPE)
    moved = submit_and_work(moved_target, other, store_url, tmp_path / "blobs")
    Path(moved_target.rpartition(":")[0]).unlink()
    query(store_url, "UPDATE reviews SET deadline_at = deadline_at - ?", DAYS)  # both deadlines passed
    env = {"SINK": str(tmp_path / "sink.jsonl"), "CALLS": str(tmp_path / "calls.log")}
    return {"kept": kept.run_id, "moved": moved.run_id, "env": env, "blobs": tmp_path / "blobs"}


def snapshot(store_url: str) -> dict[str, list[tuple[Any, ...]]]:
    rows = {}
    for table in DOMAIN:
        found = query(store_url, f"SELECT * FROM {table}")
        rows[table] = sorted(tuple(map(repr, r)) for r in found)
    return rows


def open_entries(store_url: str) -> dict[str, str | None]:
    """run id -> its entry's decision (None: still open)."""
    return {r[0]: r[1] for r in query(store_url, "SELECT run_id, decision FROM reviews")}


def test_reading_the_queue_changes_nothing_even_with_a_moved_pipeline(
        two_runs: dict[str, Any], store_url: str, tmp_path: Path) -> None:
    before = snapshot(store_url)
    listed = cli_json("review", "list", "--db", store_url, cwd=tmp_path, env=two_runs["env"])
    assert sorted(e["run_id"] for e in listed["reviews"]) == sorted([two_runs["kept"], two_runs["moved"]])
    assert {e["status"] for e in listed["reviews"]} == {"open"} and listed["overdue"] == 2
    text = cli("review", "list", "--db", store_url, cwd=tmp_path, env=two_runs["env"])
    assert text.returncode == 0 and "2 entries are past the deadline; `conveyor review expire`" in text.stdout
    entry_id = str(listed["reviews"][0]["id"])
    shown = cli_json("review", "show", entry_id, "--db", store_url, "--blobs", str(two_runs["blobs"]),
                     cwd=tmp_path, env=two_runs["env"])
    assert shown["status"] == "open"
    for run_id in (two_runs["kept"], two_runs["moved"]):
        reads = (("status", run_id), ("reconcile", run_id), ("show", run_id, "b"), ("dlq", "list", "--run", run_id))
        for read in reads:
            answer = cli(*read, "--db", store_url, "--json", cwd=tmp_path)
            assert answer.returncode in (0, 5) and json.loads(answer.stdout), (read, answer.stderr)
    store = open_store(store_url)
    try:
        assert len(review.review_list(store)["reviews"]) == 2
    finally:
        store.close()

    (tmp_path / "served").mkdir()
    served_target = write_pipeline(tmp_path / "served", PIPE.replace('"products"', '"served"'))
    with served(tmp_path, store_url, served_target, workers=0, env=two_runs["env"]) as server:
        ops = server.token("ops", operator=True)
        with server.client(ops) as api:
            answer = api.get("/v1/reviews")
            assert answer.status_code == 200, answer.text
            assert len(answer.json()["reviews"]) == 2 and answer.json()["overdue"] == 2
            page = api.get("/reviews")
            assert page.status_code == 200 and two_runs["moved"] in page.text and two_runs["kept"] in page.text
            pages = ["/", "/workers", f"/reviews/{entry_id}", "/v1/runs", f"/v1/reviews/{entry_id}",
                     "/v1/dead-letters", "/v1/workers"]
            for run_id in (two_runs["kept"], two_runs["moved"]):
                pages += [f"/runs/{run_id}", f"/runs/{run_id}/dead-letters", f"/runs/{run_id}/items/b",
                          f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/reconcile"]
            for path in pages:
                assert api.get(path).status_code == 200, path
    assert snapshot(store_url) == before, "a read changed the store"


def test_review_expire_applies_deadlines_run_by_run_and_says_which_it_could_not(
        two_runs: dict[str, Any], store_url: str, tmp_path: Path) -> None:
    done = cli_json("review", "expire", "--db", store_url, cwd=tmp_path, env=two_runs["env"])
    by_run = {r["run_id"]: r for r in done["runs"]}
    assert by_run[two_runs["kept"]]["decided"] == {"rejected": 1} and by_run[two_runs["kept"]]["reason"] is None
    moved = by_run[two_runs["moved"]]
    assert moved["decided"] == {} and moved["not_applicable"] == 1
    assert "does not exist" in moved["reason"] and "\n" not in moved["reason"]
    assert done["decided"] == {"rejected": 1} and done["not_applicable"] == 1
    assert open_entries(store_url) == {two_runs["kept"]: "rejected", two_runs["moved"]: None}
    assert query(store_url, "SELECT status FROM tasks WHERE run_id = ? AND stage = 'extract'",
                 two_runs["kept"]) == [("rejected",)]

    again = cli("review", "expire", two_runs["moved"], "--db", store_url, cwd=tmp_path, env=two_runs["env"])
    assert again.returncode == 0
    assert f"{two_runs['moved']}: 1 entry not applied: its pipeline" in again.stdout
    nothing = cli("review", "expire", two_runs["kept"], "--db", store_url, cwd=tmp_path, env=two_runs["env"])
    assert nothing.stdout.strip() == "no entries past their deadline"
    unknown = cli("review", "expire", "no-such-run", "--db", store_url, cwd=tmp_path)
    assert unknown.returncode == 2 and "no run 'no-such-run'" in unknown.stderr


def test_review_expire_says_what_the_deadline_decided(store_url: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SINK", str(tmp_path / "sink.jsonl"))
    monkeypatch.setenv("CALLS", str(tmp_path / "calls.log"))
    monkeypatch.setenv("ON_DEADLINE", "accept")
    manifest = tmp_path / "in.jsonl"
    manifest.write_text("".join(json.dumps(i) + "\n" for i in ITEMS))
    done = submit_and_work(write_pipeline(tmp_path, PIPE), manifest, store_url, tmp_path / "blobs")
    store = open_store(store_url)
    try:
        entry = review.review_list(store)["reviews"][0]
        report = review.expire_deadlines(store, done.run_id, now=entry["deadline_at"] + 1)
    finally:
        store.close()
    assert report["runs"] == [{"run_id": done.run_id, "pipeline": "products", "due": 1, "decided": {"accepted": 1},
                               "not_applicable": 0, "reason": None}]
    assert query(store_url, "SELECT decided_by, decision FROM reviews") == [("deadline", "accepted")]


def test_a_worker_applies_passed_deadlines_as_it_keeps_its_leases(store_url: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SINK", str(tmp_path / "sink.jsonl"))
    monkeypatch.setenv("CALLS", str(tmp_path / "calls.log"))
    manifest = tmp_path / "in.jsonl"
    manifest.write_text("".join(json.dumps(i) + "\n" for i in ITEMS))
    target = write_pipeline(tmp_path, PIPE)
    done = submit_and_work(target, manifest, store_url, tmp_path / "blobs")
    query(store_url, "UPDATE reviews SET deadline_at = deadline_at - ?", DAYS)  # the deadline passed
    store = open_store(store_url)
    try:
        assert review.review_list(store)["overdue"] == 1
    finally:
        store.close()
    assert open_entries(store_url) == {done.run_id: None}, "a listing leaves the deadline to a worker"
    worker = Worker(load_target(target), target, store_url, FilesystemBlobs(tmp_path / "blobs"),
                    WorkerOptions(lease_seconds=0.6, poll_interval=0.05))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: open_entries(store_url) == {done.run_id: "rejected"}, timeout=30)
    finally:
        worker.request_stop()
        thread.join(30)
    assert worker.stats["review_rejected"] == 1
    assert query(store_url, "SELECT decided_by FROM reviews") == [("deadline",)]
