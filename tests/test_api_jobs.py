"""POST /v1/jobs and what a client learns of its job: a real `conveyor serve`, a real HTTP client, both backends."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.service.tokens import revoke_token
from conveyor.store import open_store
from tests.apiserver import SMALL_PIPELINE, Server, served
from tests.helpers import cli, query, write_pipeline

FINAL = ("published", "completed", "failed", "dead_lettered", "rejected")


@pytest.fixture
def server(tmp_path: Path, store_url: str) -> Any:
    target = write_pipeline(tmp_path, SMALL_PIPELINE)
    with served(tmp_path, store_url, target, "--max-upload-bytes", "200000",
                env={"CONVEYOR_SSE_KEEPALIVE_S": "0.3"}) as s:
        yield s


def sse(client: httpx.Client, path: str, headers: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], str]:
    """Read an event stream to its end: its events, and the raw text (comments included)."""
    events, raw, current = [], [], {}  # type: ignore[var-annotated]
    with client.stream("GET", path, headers=headers, timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            raw.append(line)
            if not line:
                if "data" in current:
                    events.append({"id": int(current["id"]), "type": current["event"],
                                   **json.loads(current["data"])})
                current = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                current[name] = value
    return events, "\n".join(raw)


def test_a_document_is_accepted_at_once_and_its_result_is_read_back(server: Server) -> None:
    token = server.token()
    with server.client(token) as c:
        answer = c.post("/v1/jobs", json={"text": "hello conveyor", "metadata": {"lang": "en"}})
        assert answer.status_code == 202
        body = answer.json()
        assert set(body) == {"job_id", "status", "status_url", "events_url"}
        assert body["status_url"].endswith(f"/v1/jobs/{body['job_id']}")
        assert body["events_url"].endswith(f"/v1/jobs/{body['job_id']}/events")
        view = server.wait_for(token, body["job_id"], FINAL)
        assert view["status"] == view["outcome"] == "completed"
        assert view["output"] == {"upper": "HELLO CONVEYOR", "n": 14}
        assert view["lane"] == "interactive"  # API jobs are interactive unless asked otherwise
        assert view["metadata"] == {"lang": "en"}
        assert [(s["stage"], s["status"]) for s in view["stages"]] == [("parse", "succeeded"), ("shout", "succeeded")]
        assert c.get(f"{body['status_url']}").json()["job_id"] == body["job_id"]
        listed = c.get("/v1/jobs").json()["jobs"]
        assert [j["job_id"] for j in listed] == [body["job_id"]]
    lanes = query(server.store_url, "SELECT lane FROM runs WHERE run_id = ?", body["job_id"])
    assert lanes == [("interactive",)]


def test_a_multipart_upload_is_streamed_into_the_blob_store_whatever_its_file_name(
        server: Server, tmp_path: Path) -> None:
    token = server.token()
    document = b"x" * 50_000  # past the inline size: a blob
    with server.client(token) as c:
        answer = c.post("/v1/jobs", files={"file": ("../../../escape.txt", document, "text/plain")},
                        data={"metadata": json.dumps({"source": "upload"}), "key": "doc-1"})
        assert answer.status_code == 202, answer.text
        view = server.wait_for(token, answer.json()["job_id"], FINAL)
    assert view["outcome"] == "completed"
    assert view["key"] == "doc-1"
    assert view["output"]["n"] == 50_000
    assert not (tmp_path.parent / "escape.txt").exists() and not (tmp_path / "escape.txt").exists()
    stored = [p for p in server.blobs.rglob("*") if p.is_file() and p.stat().st_size == 50_000]
    assert len(stored) == 1 and stored[0].parent.parent.parent == server.blobs


def test_an_idempotency_key_names_one_job_even_under_a_hundred_concurrent_requests(server: Server) -> None:
    token = server.token()
    with server.client(token) as c:
        first = c.post("/v1/jobs", json={"text": "same"}, headers={"Idempotency-Key": "k-1"})
        again = c.post("/v1/jobs", json={"text": "same"}, headers={"Idempotency-Key": "k-1"})
        other = c.post("/v1/jobs", json={"text": "different"}, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["job_id"] == first.json()["job_id"]
    assert other.status_code == 422 and other.json()["code"] == "conflict"
    assert other.headers["content-type"] == "application/problem+json"

    def post(_: int) -> httpx.Response:
        with server.client(token) as client:
            return client.post("/v1/jobs", json={"text": "raced"}, headers={"Idempotency-Key": "race"})

    with ThreadPoolExecutor(max_workers=25) as pool:
        answers = list(pool.map(post, range(100)))
    assert sorted({a.status_code for a in answers}) in ([200, 202], [202])
    assert [a.status_code for a in answers].count(202) == 1
    assert len({a.json()["job_id"] for a in answers}) == 1
    # The same key is the caller's: another tenant's request with it makes its own job.
    with server.client(server.token("globex")) as c:
        theirs = c.post("/v1/jobs", json={"text": "raced"}, headers={"Idempotency-Key": "race"})
    assert theirs.status_code == 202 and theirs.json()["job_id"] != answers[0].json()["job_id"]
    assert query(server.store_url, "SELECT COUNT(*) FROM jobs")[0][0] == 3


def test_tokens_tenants_and_their_errors(server: Server) -> None:
    token = server.token()
    with server.client(token) as c:
        job = c.post("/v1/jobs", json={"text": "mine"}).json()["job_id"]
    with server.client() as anonymous:
        missing = anonymous.post("/v1/jobs", json={"text": "x"})
        assert missing.status_code == 401 and missing.json()["status"] == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = anonymous.get("/v1/jobs", headers={"Authorization": "Bearer cvy_000000000000_nope-nope-nope-nope"})
        assert wrong.status_code == 401
    with server.client(server.token("globex")) as theirs:
        assert theirs.get(f"/v1/jobs/{job}").status_code == 404
        assert theirs.get(f"/v1/jobs/{job}/events").status_code == 404
        assert theirs.get("/v1/jobs").json()["jobs"] == []
    store = open_store(server.store_url)
    try:
        revoke_token(store, token)
    finally:
        store.close()
    with server.client(token) as c:
        revoked = c.get(f"/v1/jobs/{job}")
    assert revoked.status_code == 403 and revoked.json()["code"] == "forbidden"


def test_bad_requests_are_problems_that_say_what_to_do(server: Server) -> None:
    with server.client(server.token()) as c:
        plain = c.post("/v1/jobs", content=b"hello", headers={"Content-Type": "text/plain"})
        assert plain.status_code == 415 and "multipart/form-data" in plain.json()["detail"]
        extra = c.post("/v1/jobs", json={"text": "x", "colour": "red"})
        assert extra.status_code == 422 and extra.json()["code"] == "invalid_request"
        lane = c.post("/v1/jobs", json={"text": "x", "lane": "fast"})
        assert lane.status_code == 422
        pipeline = c.post("/v1/jobs", json={"text": "x", "pipeline": "other"})
        assert pipeline.status_code == 404 and "serves: api" in pipeline.json()["detail"]
        key = c.post("/v1/jobs", json={"text": "x", "key": "a¶b"})
        assert key.status_code == 422
        no_file = c.post("/v1/jobs", files={"other": ("a.txt", b"x")})
        assert no_file.status_code == 422 and "'file'" in no_file.json()["detail"]
        unknown = c.get("/v1/jobs/j-nope")
        assert unknown.status_code == 404 and unknown.headers["content-type"] == "application/problem+json"


def test_a_body_over_the_limit_is_refused_with_413_before_it_is_read(server: Server) -> None:
    with server.client(server.token()) as c:
        declared = c.post("/v1/jobs", content=b"x" * 300_000, headers={"Content-Type": "application/json"})
        assert declared.status_code == 413 and declared.json()["code"] == "too_large"

        def chunks() -> Any:  # no Content-Length: the limit is found while streaming
            yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n'
            for _ in range(40):
                yield b"y" * 10_000

        streamed = c.post("/v1/jobs", content=chunks(), headers={"Content-Type": "multipart/form-data; boundary=b"})
        assert streamed.status_code == 413
        garbled = c.post("/v1/jobs", content=b"y" * 1000, headers={"Content-Type": "multipart/form-data; boundary=b"})
        assert garbled.status_code == 422 and "multipart" in garbled.json()["detail"]
    leftovers = list((server.blobs / "tmp").glob("*")) if (server.blobs / "tmp").exists() else []
    assert leftovers == []
    assert query(server.store_url, "SELECT COUNT(*) FROM jobs")[0][0] == 0


def test_events_stream_to_the_end_resume_after_last_event_id_and_keep_alive(server: Server) -> None:
    token = server.token()
    with server.client(token) as c:
        job = c.post("/v1/jobs", json={"text": "follow me"}).json()["job_id"]
        events, raw = sse(c, f"/v1/jobs/{job}/events")
        assert [e["type"] for e in events] == ["job.accepted", "job.stage_done", "job.stage_done", "job.completed"]
        assert [e["data"].get("stage") for e in events[1:3]] == ["parse", "shout"]
        ids = [e["id"] for e in events]
        assert ids == sorted(ids) and len(set(ids)) == 4
        later, _ = sse(c, f"/v1/jobs/{job}/events", headers={"Last-Event-ID": str(ids[1])})
        assert [e["id"] for e in later] == ids[2:]
        done, _ = sse(c, f"/v1/jobs/{job}/events", headers={"Last-Event-ID": str(ids[-1])})
        assert done == []  # nothing after the final event: the stream ends at once
    with server.client(token) as c:  # a job that takes a while: the stream keeps the connection alive meanwhile
        slow = c.post("/v1/jobs", json={"text": "slow one"}).json()["job_id"]
        events, raw = sse(c, f"/v1/jobs/{slow}/events")
        assert events[-1]["type"] == "job.completed"
        assert ": keep-alive" in raw
        poison = c.post("/v1/jobs", json={"text": "poison pill"}).json()["job_id"]
        events, raw = sse(c, f"/v1/jobs/{poison}/events")
    assert events[-1]["type"] == "job.dead_lettered"
    view = server.wait_for(token, poison, FINAL)
    assert view["errors"] == [{"stage": "parse", "item_key": poison, "error_class": "value_error",
                               "error": "ValueError: poison document"}]


def test_a_job_the_memo_answers_whole_ends_in_its_own_transaction(server: Server) -> None:
    token = server.token()
    with server.client(token) as c:
        first = c.post("/v1/jobs", json={"text": "twice"}).json()["job_id"]
        server.wait_for(token, first, FINAL)
        second = c.post("/v1/jobs", json={"text": "twice"})
        assert second.status_code == 202 and second.json()["status"] == "completed"
        events, _ = sse(c, f"/v1/jobs/{second.json()['job_id']}/events")
    assert [e["type"] for e in events] == ["job.accepted", "job.stage_done", "job.stage_done", "job.completed"]
    assert all(e["data"].get("cached") for e in events[1:3])


def test_a_large_upload_keeps_the_server_memory_flat(tmp_path: Path, store_url: str) -> None:
    if not store_url.startswith("sqlite"):
        pytest.skip("the upload path does not depend on the backend")
    psutil = pytest.importorskip("psutil")
    target = write_pipeline(tmp_path, SMALL_PIPELINE)
    with served(tmp_path, store_url, target, workers=0) as s:
        process = psutil.Process(s.proc.pid)
        before = process.memory_info().rss
        peak = [before]
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.05):
                peak.append(process.memory_info().rss)

        watcher = threading.Thread(target=watch)
        watcher.start()
        block = b"z" * (1 << 20)

        def body() -> Any:
            yield b'--bound\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n\r\n'
            for _ in range(900):
                yield block
            yield b"\r\n--bound--\r\n"

        try:
            with s.client(s.token(), timeout=300) as c:
                answer = c.post("/v1/jobs", content=body(),
                                headers={"Content-Type": "multipart/form-data; boundary=bound"})
        finally:
            stop.set()
            watcher.join()
        assert answer.status_code == 202, answer.text
        assert max(peak) - before < 64 << 20, f"grew {(max(peak) - before) >> 20} MB"
    sizes = [p.stat().st_size for p in (tmp_path / "blobs").rglob("*") if p.is_file()]
    assert 900 << 20 in sizes


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_no_worker_outlives_its_server(tmp_path: Path, store_url: str, how: signal.Signals) -> None:
    if not store_url.startswith("sqlite"):
        pytest.skip("process handling does not depend on the backend")
    psutil = pytest.importorskip("psutil")
    target = write_pipeline(tmp_path, SMALL_PIPELINE)
    with served(tmp_path, store_url, target, workers=2) as s:
        deadline = time.monotonic() + 20
        while len(psutil.Process(s.proc.pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = psutil.Process(s.proc.pid).children()
        assert len(workers) == 2
        os.kill(s.proc.pid, how)  # the server alone, not its process group
        s.proc.wait(timeout=30)
        _, alive = psutil.wait_procs(workers, timeout=20)
    assert alive == [], f"workers left running after the server got {how.name}"


def test_serve_says_in_one_line_what_keeps_it_from_starting(tmp_path: Path, store_url: str) -> None:
    if not store_url.startswith("sqlite"):
        pytest.skip("start-up errors do not depend on the backend")
    target = write_pipeline(tmp_path, SMALL_PIPELINE)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        taken = cli("serve", "-p", target, "--port", str(port), "--db", store_url, cwd=tmp_path)
    missing = cli("serve", "-p", str(tmp_path / "nope.py:pipe"), "--db", store_url, cwd=tmp_path)
    webhook = cli("serve", "-p", target, "--allow-webhook", "not a network", "--db", store_url, cwd=tmp_path)
    for proc, words in ((taken, "choose another --port"), (missing, "does not exist"), (webhook, "--allow-webhook")):
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr, proc.stderr
