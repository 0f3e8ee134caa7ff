"""SIGKILL the server and every worker at once while a client submits: no job answered 202 is lost, no
Idempotency-Key makes two jobs, and every job's events are all there, once each, in order (issue 14, point 5).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from conveyor.service.jobs import job_events
from conveyor.service.tenancy import TenantView
from conveyor.service.tokens import Caller
from conveyor.store import open_store
from tests.apiserver import Server, served, stop
from tests.helpers import SRC, query, write_pipeline

# Async stages, so that each worker has many tasks in flight when it dies; a short lease, so that the
# restarted workers take the dead ones' tasks over within the test.
CRASHY = """
import asyncio
from conveyor import Pipeline, Retry

pipe = Pipeline("crashy", lease_seconds=2, retry=Retry(max_attempts=10, base=0.05, cap=0.1))

@pipe.stage()
async def parse(ctx, source: bytes) -> dict:
    await asyncio.sleep(0.2)
    return {"text": source.decode()}

@pipe.stage(after=parse)
async def shout(ctx, doc: dict) -> dict:
    await asyncio.sleep(0.2)
    return {"upper": doc["text"].upper()}
"""
STAGES = ("parse", "shout")
SUBMIT_S = 2.0  # how long the client submits at least before the kill
ENOUGH = 20  # jobs accepted before the kill (waited for, up to READY_S, on a slow machine)
READY_S = 30.0


@dataclass
class Submissions:
    """What the client was told: job ids answered 202 or 200, and the job each Idempotency-Key named."""

    accepted: dict[str, str] = field(default_factory=dict)  # job id -> text
    by_key: dict[str, set[str]] = field(default_factory=dict)  # Idempotency-Key -> job ids answered
    sent_keys: dict[str, str] = field(default_factory=dict)  # Idempotency-Key -> text, answered or not

    def record(self, text: str, key: str | None, answer: httpx.Response) -> None:
        assert answer.status_code in (200, 202), answer.text
        job_id = answer.json()["job_id"]
        self.accepted[job_id] = text
        if key is not None:
            self.by_key.setdefault(key, set()).add(job_id)


def submit_until(server: Server, token: str, done: threading.Event, seen: Submissions) -> None:
    """POST distinct documents as fast as one client can; every third carries an Idempotency-Key, and every
    tenth repeats an earlier key with its body (a client retrying)."""
    with server.client(token, timeout=5) as client:
        for n in itertools.count():
            if done.is_set():
                return
            text, key = f"document {n}", (f"key-{n}" if n % 3 == 0 else None)
            if n % 10 == 9 and seen.sent_keys:
                key = f"key-{(n // 30) * 3}"
                text = seen.sent_keys.get(key, text)
            if key is not None:
                seen.sent_keys.setdefault(key, text)
            headers = {"Idempotency-Key": key} if key else {}
            try:
                answer = client.post("/v1/jobs", json={"text": text}, headers=headers)
            except httpx.HTTPError:  # the server died under this request: its answer is unknown
                if done.wait(0.05):
                    return
                continue
            seen.record(text, key, answer)


def test_sigkill_of_server_and_workers_loses_no_accepted_job_and_no_event(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, CRASHY)
    seen, token = submit_then_kill(tmp_path, store_url, target)
    assert len(seen.accepted) >= ENOUGH, f"only {len(seen.accepted)} jobs were accepted before the kill"
    assert query(store_url, "SELECT COUNT(*) FROM tasks WHERE status IN ('queued', 'running')")[0][0] > 0, \
        "every job had finished before the kill: the test killed nothing in flight"

    with served(tmp_path, store_url, target, workers=2) as second:
        # A client that lost its answers retries with the same key: it gets the job the first request made.
        with second.client(token) as client:
            for key, text in seen.sent_keys.items():
                answer = client.post("/v1/jobs", json={"text": text}, headers={"Idempotency-Key": key})
                seen.record(text, key, answer)
        # Every job the store holds, answered or not (an answer the kill cut off), must finish too.
        stored = [row[0] for row in query(store_url, "SELECT job_id FROM jobs")]
        lost = set(seen.accepted) - set(stored)
        assert not lost, f"{len(lost)} jobs answered 202 are not in the store, e.g. {sorted(lost)[:3]}"
        unfinished = wait_all_final(second, token, stored)
        assert not unfinished, f"{len(unfinished)} jobs never finished, e.g. {unfinished[:3]}"
        streamed = {job_id: streamed_events(second, token, job_id) for job_id in sorted(seen.accepted)[::25]}

    for key, jobs in seen.by_key.items():
        assert len(jobs) == 1, f"Idempotency-Key {key} named {len(jobs)} jobs: {sorted(jobs)}"
    per_key = query(store_url, "SELECT idempotency_key, COUNT(*) FROM jobs WHERE idempotency_key IS NOT NULL "
                               "GROUP BY idempotency_key HAVING COUNT(*) > 1")
    assert per_key == [], f"one Idempotency-Key made several jobs: {per_key}"
    assert_events_whole(store_url, seen.accepted, streamed)


def submit_then_kill(tmp_path: Path, store_url: str, target: str) -> tuple[Submissions, str]:
    """Serve with two workers; a client submits for SUBMIT_S; then SIGKILL while it still submits."""
    seen, done = Submissions(), threading.Event()
    with served(tmp_path, store_url, target, workers=2) as first:
        token = first.token()
        client = threading.Thread(target=submit_until, args=(first, token, done, seen))
        client.start()
        time.sleep(SUBMIT_S)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline and not (len(seen.accepted) >= ENOUGH and in_flight(store_url)):
            time.sleep(0.1)
        stop(first.proc, signal.SIGKILL)  # the server and its workers (one process group), all at once
        time.sleep(0.2)  # the client sees the server gone while it is still submitting
        done.set()
        client.join(timeout=10)
    return seen, token


def in_flight(store_url: str) -> bool:
    return bool(query(store_url, "SELECT COUNT(*) FROM tasks WHERE status IN ('queued', 'running')")[0][0])


def streamed_events(server: Server, token: str, job_id: str) -> list[tuple[int, str]]:
    """(id, type) of each event of the job's SSE stream (GET /v1/jobs/{id}/events), which ends at its end."""
    with server.client(token) as client, client.stream("GET", f"/v1/jobs/{job_id}/events") as stream:
        assert stream.status_code == 200
        lines = [line for line in stream.iter_lines() if line.startswith(("id: ", "event: "))]
    return [(int(i.removeprefix("id: ")), t.removeprefix("event: ")) for i, t in zip(lines[::2], lines[1::2],
                                                                                    strict=True)]


def wait_all_final(server: Server, token: str, job_ids: list[str], timeout: float = 45) -> list[str]:
    """Poll every job (GET /v1/jobs/{id}) until each has a final status; the ones that did not, by then."""
    deadline, waiting = time.monotonic() + timeout, list(job_ids)
    with server.client(token) as client:
        while waiting and time.monotonic() < deadline:
            still = []
            for job_id in waiting:
                answer = client.get(f"/v1/jobs/{job_id}")
                assert answer.status_code == 200, f"accepted job {job_id} is gone: {answer.status_code} {answer.text}"
                if answer.json()["status"] != "completed":
                    still.append(job_id)
            waiting = still
            if waiting:
                time.sleep(0.2)
    return waiting


def assert_events_whole(store_url: str, accepted: dict[str, str], streamed: dict[str, list[tuple[int, str]]]) -> None:
    """Each job: one job.accepted, one job.stage_done per stage, one final event (completed), ids increasing;
    and the SSE stream of a sample of them says the same."""
    store = open_store(store_url)
    try:
        for job_id in accepted:
            events = job_events(TenantView(store, Caller("ops", operator=True)), job_id)
            if job_id in streamed:
                assert streamed[job_id] == [(e["id"], e["type"]) for e in events], f"job {job_id}: SSE differs"
            ids = [e["id"] for e in events]
            assert ids == sorted(set(ids)), f"job {job_id}: event ids not strictly increasing: {ids}"
            types = [e["type"] for e in events]
            assert types[0] == "job.accepted" and types[-1] == "job.completed", f"job {job_id}: {types}"
            assert sorted(types) == sorted(["job.accepted", *["job.stage_done"] * len(STAGES), "job.completed"]), \
                f"job {job_id}: events lost or doubled: {types}"
            assert sorted(e["data"]["stage"] for e in events if e["type"] == "job.stage_done") == sorted(STAGES), \
                f"job {job_id}: {[e['data'] for e in events]}"
    finally:
        store.close()


# A test that holds a `conveyor serve` (and its worker) from a fixture, says when it is up, and waits.
HOLDS_A_SERVER = """
    import os
    import time
    from pathlib import Path

    import pytest

    from tests.apiserver import SMALL_PIPELINE, served
    from tests.helpers import write_pipeline

    @pytest.fixture
    def server(tmp_path):
        with served(tmp_path, f"sqlite:///{tmp_path}/conveyor.db", write_pipeline(tmp_path, SMALL_PIPELINE)) as s:
            yield s

    def test_holds_a_server(server):
        Path(os.environ["SERVER_UP"]).write_text(str(server.proc.pid))
        time.sleep(300)
"""


@pytest.mark.parametrize("ending", ["ctrl-c", "sigterm", "sigkill"])
def test_an_interrupted_test_session_leaves_no_server_running(tmp_path: Path, ending: str) -> None:
    """Ctrl-C (SIGINT to the session's process group, as a terminal sends it), SIGTERM, or SIGKILL of pytest
    alone while a test holds a server: afterwards no process that session started is left."""
    (tmp_path / "test_holds.py").write_text(textwrap.dedent(HOLDS_A_SERVER))
    mark, up = uuid.uuid4().hex, tmp_path / "up"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(Path(SRC).parent)]), "SERVER_UP": str(up),
           "CONVEYOR_TEST_MARK": mark}
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir",
         str(tmp_path), str(tmp_path / "test_holds.py")], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a shell may have started us ignoring it
    try:
        deadline = time.monotonic() + 60
        while not up.exists() and session.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert up.exists(), "the inner test never had its server up"
        assert _marked(mark) - {session.pid}, "the server and its worker carry the mark"
        if ending == "ctrl-c":
            os.killpg(session.pid, signal.SIGINT)
        else:
            session.send_signal(signal.SIGTERM if ending == "sigterm" else signal.SIGKILL)
        session.wait(timeout=60)
        deadline = time.monotonic() + 30
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _marked(mark), f"left running after {ending}: {sorted(_marked(mark))}"
    finally:
        for pid in _marked(mark):  # never leave them behind, whatever the test found
            os.kill(pid, signal.SIGKILL)


def _marked(mark: str) -> set[int]:
    """The processes alive with ``CONVEYOR_TEST_MARK=mark`` in their environment (zombies left out)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and f"CONVEYOR_TEST_MARK={mark}".encode() in (entry / "environ").read_bytes()
                    and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"):
                found.add(int(entry.name))
        except OSError:
            continue
    return found
