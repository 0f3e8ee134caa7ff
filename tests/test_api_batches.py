"""POST /v1/batches against a real `conveyor serve`: a manifest becomes one run, processed and ended with
its outcome counts; bad manifests leave nothing behind; a server killed while reading one finishes it later."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from tests.apiserver import SMALL_PIPELINE, Server, served, stop
from tests.helpers import query, write_pipeline

NDJSON = {"Content-Type": "application/x-ndjson"}
ONE_STAGE = """
from conveyor import Pipeline

pipe = Pipeline("api")

@pipe.stage()
def measure(ctx, source: bytes) -> dict:
    return {"n": len(source)}
"""


def manifest(count: int, **extra: Any) -> bytes:
    return b"".join(json.dumps({"key": f"doc{i:05d}", "text": f"document {i}", **extra}).encode() + b"\n"
                    for i in range(count))


def wait_finished(server: Server, token: str, batch_id: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with server.client(token) as c:
        while True:
            view: dict[str, Any] = c.get(f"/v1/batches/{batch_id}").json()
            if view.get("status") == "finished" or time.monotonic() > deadline:
                return view
            time.sleep(0.2)


def wait_for_items(store_url: str, run_id: str, timeout: float = 30) -> int:
    """How many items the run has, once it has some (the first group of them is committed)."""
    deadline = time.monotonic() + timeout
    while True:
        count = int(query(store_url, "SELECT COUNT(*) FROM items WHERE run_id = ?", run_id)[0][0])
        if count or time.monotonic() > deadline:
            return count
        time.sleep(0.02)


def events(server: Server, token: str, batch_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The batch's events through SSE (the stream ends after batch.finished)."""
    found = []
    with server.client(token) as c, c.stream("GET", f"/v1/batches/{batch_id}/events") as stream:
        kind = None
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: ") and kind:
                found.append((kind, json.loads(line.removeprefix("data: "))["data"]))
    return found


def test_a_manifest_becomes_a_batch_that_ends_with_its_outcomes(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, SMALL_PIPELINE)
    body = manifest(199) + b'{"key": "bad", "text": "poison pill"}\n'
    with served(tmp_path, store_url, target, workers=2) as server:
        token = server.token("acme")
        with server.client(token) as c:
            first = c.post("/v1/batches", content=body, headers={**NDJSON, "Idempotency-Key": "k1"})
            assert first.status_code == 202, first.text
            accepted = first.json()
            assert accepted["items"] == 200 and accepted["batch_id"] == accepted["run_id"] == accepted["job_id"]
            again = c.post("/v1/batches", content=body, headers={**NDJSON, "Idempotency-Key": "k1"})
            assert again.status_code == 200 and again.json()["batch_id"] == accepted["batch_id"]
            other = c.post("/v1/batches", content=manifest(3), headers={**NDJSON, "Idempotency-Key": "k1"})
            assert other.status_code == 422
        view = wait_finished(server, token, accepted["batch_id"])
        assert view["status"] == "finished" and view["expected"] == 200
        assert view["outcomes"] == {"completed": 199, "dead_lettered": 1} and view["outcome"] == "partial"
        told = events(server, token, accepted["batch_id"])
        assert [kind for kind, _ in told] == ["batch.accepted", "batch.finished"]
        assert told[1][1]["outcomes"] == {"completed": 199, "dead_lettered": 1}
        assert server.client(server.token("other")).get(f"/v1/batches/{accepted['batch_id']}").status_code == 404
        assert server.client().get(f"/v1/batches/{accepted['batch_id']}").status_code == 401


def test_a_bad_manifest_is_refused_naming_its_line_and_creates_nothing(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, SMALL_PIPELINE)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for clients")
    bad = {
        "path": manifest(2) + json.dumps({"key": "x", "path": str(secret)}).encode() + b"\n",
        "JSON": manifest(2) + b"{not json\n",
        "also on line 1": manifest(2) + json.dumps({"key": "doc00000", "text": "again"}).encode() + b"\n",
    }
    with served(tmp_path, store_url, target, workers=0) as server, server.client(server.token()) as c:
        for said, body in bad.items():
            answer = c.post("/v1/batches", content=body, headers=NDJSON)
            assert answer.status_code == 422, answer.text
            assert "line 3" in answer.json()["detail"] and said in answer.json()["detail"]
        form = c.post("/v1/batches", files={"file": ("m.jsonl", bad["JSON"])}, data={"lane": "interactive"})
        assert form.status_code == 422 and "line 3" in form.json()["detail"]
        assert c.post("/v1/batches", content=b"", headers=NDJSON).status_code == 422
        assert c.post("/v1/batches", json={"text": "one"}).status_code == 415
    assert query(store_url, "SELECT COUNT(*) FROM runs")[0][0] == 0
    assert query(store_url, "SELECT COUNT(*) FROM jobs")[0][0] == 0


def test_a_batch_whose_server_is_killed_while_reading_it_is_finished_after_a_restart(
        tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, ONE_STAGE)
    with served(tmp_path, store_url, target, workers=0) as server:
        token = server.token("acme")
        with server.client(token) as c:
            files = {"file": ("big.jsonl", manifest(20_000))}
            accepted = c.post("/v1/batches", files=files, data={"lane": "bulk"})
        assert accepted.status_code == 202, accepted.text
        batch_id = accepted.json()["batch_id"]
        read = wait_for_items(store_url, batch_id)
        stop(server.proc, signal.SIGKILL)
    assert 0 < read < 20_000  # killed while reading it
    with served(tmp_path, store_url, target, workers=2) as server:
        view = wait_finished(server, token, batch_id, timeout=240)
    assert view["status"] == "finished", view
    assert view["outcomes"] == {"completed": 20_000} and view["outcome"] == "completed"
    assert query(store_url, "SELECT COUNT(*), COUNT(DISTINCT item_key) FROM items WHERE run_id = ?",
                 batch_id)[0] == (20_000, 20_000)
    assert query(store_url, "SELECT COUNT(*) FROM events WHERE job_id = ? AND type = 'batch.finished'",
                 batch_id)[0][0] == 1

