"""Review queue, dead letters, replays, run status and reconciliation over HTTP: a real `conveyor serve`, a real
client, both backends; answers match the command line's --json, and a tenant sees only its own jobs' runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver import Server, served
from tests.helpers import cli_json, write_pipeline

FINAL = ("published", "completed", "failed", "dead_lettered", "rejected")

PIPELINE = """
import json
from pydantic import BaseModel
from conveyor import Pipeline, Retry
from conveyor.acceptance import Accept, Record, Review

class Title(BaseModel):
    title: str
    confidence: float

pipe = Pipeline("ops", retry=Retry(max_attempts=2, base=0.05, cap=0.1))

@pipe.stage(accept=Accept(schema=Title, confidence="confidence", threshold=0.8, review=Review(deadline="1h")))
def extract(ctx, source: bytes) -> str:
    text = source.decode()
    if text.startswith("poison"):
        raise ValueError("poison document")
    return json.dumps({"title": text, "confidence": 0.5 if "unsure" in text else 0.9})

@pipe.stage(after=extract, kind="publish", into="titles")
def publish(ctx, record: dict) -> Record:
    return Record(fields={"title": record["title"]})
"""


@pytest.fixture
def server(tmp_path: Path, store_url: str) -> Any:
    with served(tmp_path, store_url, write_pipeline(tmp_path, PIPELINE)) as s:
        yield s


def submit(server: Server, token: str, text: str, until: tuple[str, ...] = FINAL) -> str:
    with server.client(token) as c:
        answer = c.post("/v1/jobs", json={"text": text})
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["job_id"]
    assert server.wait_for(token, job_id, until)["status"] in until
    return job_id


def event_types(server: Server, token: str, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The job's events from its stream (it closes once the job has ended)."""
    events, kind = [], ""
    with server.client(token) as c, c.stream("GET", f"/v1/jobs/{job_id}/events") as stream:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((kind, json.loads(line.removeprefix("data: "))["data"]))
    return events


def test_reviews_are_listed_approved_edited_and_rejected(server: Server) -> None:
    acme, globex = server.token("acme"), server.token("globex")
    operator = server.token("ops", operator=True)
    jobs = [submit(server, acme, f"unsure {n}", ("awaiting_review",)) for n in range(3)]
    with server.client(acme) as c:
        listed = c.get("/v1/reviews").json()["reviews"]
        assert sorted(e["run_id"] for e in listed) == sorted(jobs)
        review = {e["run_id"]: e["id"] for e in listed}
        approved, edited, rejected = (review[j] for j in jobs)
        assert c.get(f"/v1/reviews/{edited}").json()["candidate"] == {"title": "unsure 1", "confidence": 0.5}

        answer = c.post(f"/v1/reviews/{approved}/approve", json={"why": "looks right"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["by"] == "api:acme" and answer.json()["decided"][0]["decision"] == "approved"
        broken = c.post(f"/v1/reviews/{edited}/edit", json={"fields": {"confidence": "very"}})
        assert broken.status_code == 422 and "schema" in broken.json()["detail"]
        assert c.post(f"/v1/reviews/{edited}/edit", json={"fields": {"title": "fixed"}}).status_code == 200
        assert c.post(f"/v1/reviews/{rejected}/reject", json={}).status_code == 422  # "why" is required
        assert c.post(f"/v1/reviews/{rejected}/reject", json={"why": "not ours"}).status_code == 200

        again = c.post(f"/v1/reviews/{approved}/approve")
        assert again.status_code == 409 and again.json()["code"] == "state_conflict"
        assert again.headers["content-type"].startswith("application/problem+json")
    assert server.wait_for(acme, jobs[0], FINAL)["status"] == "published"
    done = [data for kind, data in event_types(server, acme, jobs[0]) if kind == "job.stage_done"]
    assert [(d["stage"], d.get("decision"), d.get("by")) for d in done] == [("extract", "approved", "api:acme"),
                                                                            ("publish", None, None)]
    assert server.wait_for(acme, jobs[1], FINAL)["record"]["fields"] == {"title": "fixed"}
    assert server.wait_for(acme, jobs[2], FINAL)["status"] == "rejected"

    with server.client(globex) as c:  # another tenant's entry does not exist for it
        assert c.get(f"/v1/reviews/{approved}").status_code == 404
        assert c.post(f"/v1/reviews/{approved}/approve").status_code == 404
        assert c.get("/v1/reviews", params={"all": True}).json()["reviews"] == []
    with server.client(operator) as c:
        decided = c.get("/v1/reviews", params={"all": True}).json()["reviews"]
        assert {e["id"]: e["status"] for e in decided} == {approved: "approved", edited: "edited",
                                                            rejected: "rejected"}
        assert c.get(f"/v1/reviews/{approved}").json()["decided_by"] == "api:acme"


def test_a_dead_letter_is_listed_and_replayed(server: Server) -> None:
    acme, globex = server.token("acme"), server.token("globex")
    job = submit(server, acme, "poison pill")
    with server.client(acme) as c:
        (entry,) = c.get("/v1/dead-letters").json()["entries"]
        assert (entry["run_id"], entry["stage"], entry["error_class"]) == (job, "extract", "value_error")
        with server.client(globex) as other:
            assert other.get("/v1/dead-letters").json()["entries"] == []
            assert other.post(f"/v1/dead-letters/{entry['id']}/replay").status_code == 404
        answer = c.post(f"/v1/dead-letters/{entry['id']}/replay", json={"reason": "parser fixed"})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"replayed": 1, "ids": [entry["id"]], "reason": "parser fixed", "skipped": []}
        again = c.post(f"/v1/dead-letters/{entry['id']}/replay")
        assert again.status_code == 409 and "replayed already" in again.text
        assert server.wait_for(acme, job, FINAL)["status"] == "dead_lettered"  # still poison
        (second,) = c.get("/v1/dead-letters").json()["entries"]
        assert "job.reopened" in [kind for kind, _ in event_types(server, acme, job)]

        selection = {"runs": [job], "statuses": ["dead_lettered"], "reason": "retry", "note": "once more"}
        dry = c.post("/v1/replays", json={**selection, "dry_run": True}).json()
        assert (dry["dry_run"], dry["reopened"], dry["replay_id"]) == (True, 1, None)
        done = c.post("/v1/replays", json=selection).json()
        assert done["reopened"] == 1 and done["runs"] == [job] and done["stages"]["extract"]["reopen"] == 1
        superseded = c.post(f"/v1/dead-letters/{second['id']}/replay")  # the replay queued its task since
        assert superseded.status_code == 409 and f"superseded: replay {done['replay_id']}" in superseded.text
        assert c.post("/v1/replays", json={"reason": "retry"}).status_code == 422  # a tenant names its runs
    with server.client(globex) as other:
        assert other.post("/v1/replays", json=selection).status_code == 404


def test_run_status_and_reconciliation_match_the_command_line(server: Server, tmp_path: Path) -> None:
    acme, globex = server.token("acme"), server.token("globex")
    job = submit(server, acme, "a sure thing")
    flags = ("--db", server.store_url)
    with server.client(acme) as c:
        assert [r["run_id"] for r in c.get("/v1/runs").json()["runs"]] == [job]
        status = c.get(f"/v1/runs/{job}").json()
        assert status == cli_json("status", job, *flags, cwd=tmp_path)
        assert status["outcomes"] == {"published": 1}
        reconciled = c.get(f"/v1/runs/{job}/reconcile").json()
        assert reconciled == cli_json("reconcile", job, *flags, "--blobs", str(server.blobs), cwd=tmp_path)
        assert reconciled["unaccounted"] == 0
        assert c.get("/v1/runs/no-such-run").status_code == 404
    with server.client(globex) as other:
        assert other.get("/v1/runs").json()["runs"] == []
        assert other.get(f"/v1/runs/{job}").status_code == 404
        assert other.get(f"/v1/runs/{job}/reconcile").status_code == 404
