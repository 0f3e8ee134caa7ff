"""The dashboard over HTTP: a real `conveyor serve`, an httpx client acting as a browser (cookies, forms), both
backends. Login and logout, the redirect to /login, tenant isolation, every page with data, pagination, the
CSRF check, and the actions (replay, approve, edit, reject)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.service.tokens import revoke_token
from conveyor.store import open_store
from tests.apiserver import Server, served
from tests.helpers import write_pipeline
from tests.test_api_operations import FINAL, PIPELINE, submit

COOKIE = "conveyor_session"


@pytest.fixture
def server(tmp_path: Path, store_url: str) -> Any:
    with served(tmp_path, store_url, write_pipeline(tmp_path, PIPELINE)) as s:
        yield s


@contextmanager
def browser(server: Server, token: str | None = None) -> Iterator[httpx.Client]:
    """A client that keeps cookies and does not follow redirects; logged in with ``token`` when given."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        if token is not None:
            answer = log_in(client, token)
            assert answer.status_code == 303, answer.text
        yield client


def log_in(client: httpx.Client, token: str, next: str = "/") -> httpx.Response:
    """Post the login form as a browser does: its page first (the form's CSRF value and its cookie)."""
    form = client.get("/login")
    return client.post("/login", data={"token": token, "next": next, "csrf": csrf(form.text)})


def ends(row: str) -> dict[str, int]:
    """A runs page row's counts of tasks failed, dead-lettered, awaiting review and rejected."""
    return {name: int(re.sub(r"<[^>]+>", "", count)) for name, count in re.findall(r'data-end="(\w+)">(.*?)</td>', row)}


def csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "the page has no form with a CSRF value"
    return found.group(1)


def test_login_logout_and_the_redirect_to_login(server: Server) -> None:
    acme = server.token("acme")
    with browser(server) as b:
        icon = b.get("/favicon.ico")  # asked for by every browser, before any login
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
        assert icon.text.startswith("<svg") and 'rel="icon"' in b.get("/login").text
        answer = b.get("/reviews?stage=extract")
        assert answer.status_code == 303 and answer.headers["location"] == "/login?next=%2Freviews%3Fstage%3Dextract"
        login = b.get("/login", params={"next": "/reviews"})
        assert login.status_code == 200 and 'name="token"' in login.text
        wrong = log_in(b, "cvy_000000000000_nope-nope-nope-nope-nope")
        assert wrong.status_code == 401 and "not known" in wrong.text and COOKIE not in b.cookies
        right = log_in(b, acme, next="https://evil.example/")
        assert right.status_code == 303 and right.headers["location"] == "/"  # never to another site
        cookie = right.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" not in cookie  # plain http here
        page = b.get("/")
        assert page.status_code == 200 and "Log out" in page.text and "acme" in page.text
        assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]

        refused = b.post("/logout", data={})
        assert refused.status_code == 403 and "session check failed" in refused.text
        out = b.post("/logout", data={"csrf": csrf(page.text)})
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert b.get("/").status_code == 303

    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {acme}"}) as api:
        assert api.get("/").status_code == 200  # the API's header works as well
    with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer cvy_nope"}) as api:
        assert api.get("/").status_code == 401

    revoked = server.token("initech")
    with browser(server, revoked) as b:
        store = open_store(server.store_url)
        try:
            revoke_token(store, revoked)
        finally:
            store.close()
        answer = b.get("/")
        assert answer.status_code == 303 and "reason=revoked" in answer.headers["location"]
        assert "was revoked" in b.get(answer.headers["location"]).text


def test_every_page_renders_and_a_tenant_sees_only_its_runs(server: Server) -> None:
    acme, globex = server.token("acme"), server.token("globex")
    operator = server.token("ops", operator=True)
    sure = submit(server, acme, "a sure thing")
    unsure = submit(server, acme, "unsure <b>bold</b>", ("awaiting_review",))
    poison = submit(server, acme, "poison pill")
    theirs = submit(server, globex, "globex's own")
    with browser(server, acme) as b:
        runs = b.get("/").text
        assert all(job in runs for job in (sure, unsure, poison)) and theirs not in runs
        assert 'data-accepted>1</span> / 1 accepted' in runs and 'data-published>1</span> / 1 published' in runs
        rows = {run: re.search(rf'<tr data-run="{run}">(.*?)</tr>', runs, re.S).group(1)  # type: ignore[union-attr]
                for run in (sure, unsure, poison)}
        assert ends(rows[poison]) == {"failed": 0, "dead_lettered": 1, "awaiting_review": 0, "rejected": 0}
        assert "s-finished_failed" in rows[poison] and "finished with failures" in rows[poison], "not a green finished"
        assert ends(rows[unsure])["awaiting_review"] == 1 and "waiting for review" in rows[unsure]
        assert not any(ends(rows[sure]).values()) and 'data-badge="finished">finished<' in rows[sure]
        assert f'href="/runs/{poison}/items?status=dead_lettered">1<' in rows[poison]

        run = b.get(f"/runs/{sure}").text
        assert 'data-stage="extract"' in run and 'data-stage="publish"' in run and "<svg" in run
        assert "Throughput" in run and "Cost over time" in run and 'data-outcome="published">1<' in run

        dead = b.get(f"/runs/{poison}/dead-letters").text
        assert 'data-class="value_error"' in dead and "poison document" in dead and "Replay all 1" in dead

        queue = b.get("/reviews").text
        assert f"/runs/{unsure}/items/" in queue and "&lt;b&gt;bold&lt;/b&gt;" in queue and "<b>bold" not in queue
        review_id = re.search(r'data-review="(\d+)"', queue).group(1)  # type: ignore[union-attr]
        detail = b.get(f"/reviews/{review_id}").text
        assert "<textarea" in detail and "unsure &lt;b&gt;bold&lt;/b&gt;" in detail

        item_key = re.search(rf'href="/runs/{poison}/items/([^"]+)"', dead).group(1)  # type: ignore[union-attr]
        journey = b.get(f"/runs/{poison}/items/{item_key}").text
        assert 'data-task="extract"' in journey and "value_error" in journey and "dead_lettered" in journey
        assert "2 attempts" in journey
        published = b.get(f"/runs/{sure}/items/{sure}").text  # an API job's item key is its job id
        assert "a sure thing" in published and "Output" in published
        found = b.get(f"/runs/{poison}/items", params={"key": "no such item"})
        assert found.status_code == 303
        missing = b.get(found.headers["location"])
        assert missing.status_code == 404 and "no item &#39;no such item&#39;" in missing.text
        assert "Traceback" not in missing.text

        workers = b.get("/workers")
        assert workers.status_code == 403 and "operator" in workers.text

    with browser(server, globex) as b:
        assert sure not in b.get("/").text and theirs in b.get("/").text
        for path in (f"/runs/{sure}", f"/runs/{poison}/dead-letters", f"/reviews/{review_id}",
                     f"/runs/{poison}/items/{item_key}"):
            answer = b.get(path)
            assert answer.status_code == 404 and answer.headers["content-type"].startswith("text/html"), path
        assert 'data-review="' not in b.get("/reviews").text
    with browser(server, operator) as b:
        everything = b.get("/").text
        assert all(job in everything for job in (sure, unsure, poison, theirs))
        fleet = b.get("/workers")
        # The serve's worker says which stage declarations it takes (issue 27 point 1).
        assert fleet.status_code == 200 and "<th>Serves</th>" in fleet.text and " v1 <code" in fleet.text
        assert b.get(f"/runs/{sure}", params={"fragment": 1}).text.lstrip().startswith("<section")


def test_actions_need_the_csrf_value_and_do_what_the_api_does(server: Server) -> None:
    acme, globex = server.token("acme"), server.token("globex")
    poison = submit(server, acme, "poison pill")
    unsure = [submit(server, acme, f"unsure {n}", ("awaiting_review",)) for n in range(3)]
    with browser(server, acme) as b:
        dead = b.get(f"/runs/{poison}/dead-letters").text
        entry = re.search(r'data-dead-letter="(\d+)"', dead).group(1)  # type: ignore[union-attr]
        replay = f"/runs/{poison}/dead-letters/{entry}/replay"
        assert b.post(replay, data={}).status_code == 403
        assert b.post(replay, data={"csrf": "0" * 64}).status_code == 403
        with browser(server, globex) as other:  # another tenant's entry does not exist for it
            mine = csrf(other.get("/").text)
            assert other.post(replay, data={"csrf": mine}).status_code == 404
        done = b.post(replay, data={"csrf": csrf(dead)})
        assert done.status_code == 303 and done.headers["location"].endswith("?replayed=1")
        assert "Replayed 1 dead letter" in b.get(done.headers["location"]).text
        assert server.wait_for(acme, poison, FINAL)["status"] == "dead_lettered"  # still poison
        again = b.post(replay, data={"csrf": csrf(dead)})
        assert again.status_code == 409 and "replayed already" in again.text
        with server.client(acme) as api:  # a replay that replays nothing leaves the ended job ended
            assert api.get(f"/v1/jobs/{poison}").json()["status"] == "dead_lettered"
        by_class = b.post(f"/runs/{poison}/dead-letters/replay",
                          data={"csrf": csrf(dead), "error_class": "value_error"})
        assert by_class.status_code == 303 and "replayed=" in by_class.headers["location"]

        queue = b.get("/reviews").text
        entries = re.findall(r'data-review="(\d+)"[^>]*>\s*<header>\s*<input[^>]*>\s*<strong>#\d+</strong> '
                             r'<a href="/runs/([^/]+)/', queue)
        ids = dict(entries)
        by_run = {run: int(review_id) for review_id, run in ids.items()}
        approved, edited, rejected = (by_run[j] for j in unsure)
        token = csrf(queue)
        assert b.post(f"/reviews/{approved}/approve", data={}).status_code == 403
        answer = b.post(f"/reviews/{approved}/approve", data={"csrf": token, "next": "/reviews"})
        assert answer.status_code == 303 and answer.headers["location"] == f"/reviews?decided=approved&id={approved}"
        assert f"Review {approved} approved" in b.get(answer.headers["location"]).text
        assert b.post(f"/reviews/{approved}/approve", data={"csrf": token}).status_code == 409

        bad = b.post(f"/reviews/{edited}/edit", data={"csrf": token, "fields": '{"confidence": "very"}'})
        assert bad.status_code == 422 and "schema" in bad.text
        not_json = b.post(f"/reviews/{edited}/edit", data={"csrf": token, "fields": "{oops"})
        assert not_json.status_code == 422 and "not JSON" in not_json.text
        fields = '{"title": "fixed", "confidence": 0.5}'
        fixed = b.post(f"/reviews/{edited}/edit", data={"csrf": token, "fields": fields})
        assert fixed.status_code == 303
        assert b.post(f"/reviews/{rejected}/reject", data={"csrf": token}).status_code == 422  # why is needed
        assert b.post(f"/reviews/{rejected}/reject", data={"csrf": token, "why": "not ours"}).status_code == 303

    assert server.wait_for(acme, unsure[0], FINAL)["status"] == "published"
    assert server.wait_for(acme, unsure[1], FINAL)["record"]["fields"] == {"title": "fixed"}
    assert server.wait_for(acme, unsure[2], FINAL)["status"] == "rejected"
    with server.client(server.token("ops", operator=True)) as api:
        listed = api.get("/v1/reviews", params={"all": True}).json()["reviews"]
    decided = {e["id"]: (e["status"], e["decided_by"]) for e in listed}
    assert decided[approved] == ("approved", "dashboard:acme") and decided[rejected] == ("rejected", "dashboard:acme")


def test_the_review_queue_is_grouped_by_reason_and_decides_a_selection(server: Server) -> None:
    acme, globex = server.token("acme"), server.token("globex")
    mine = [submit(server, acme, f"unsure {n}", ("awaiting_review",)) for n in range(4)]
    theirs = submit(server, globex, "unsure of globex", ("awaiting_review",))
    with browser(server, globex) as other:
        their_id = int(re.search(r'data-review="(\d+)"', other.get("/reviews").text).group(1))  # type: ignore[union-attr]
    with browser(server, acme) as b:
        queue = b.get("/reviews").text
        ids = [int(i) for i in re.findall(r'name="ids" value="(\d+)" form="bulk"', queue)]
        assert len(ids) == 4 and their_id not in ids
        assert "low_confidence (4)" in queue and "all (4)" in queue  # counted by reason class, this tenant's only
        assert 'data-reason-class="low_confidence"' in queue and "data-deadline=" in queue
        assert 'data-review="' not in b.get("/reviews?reason=invalid_content").text
        assert len(re.findall(r'data-review="', b.get("/reviews?reason=low_confidence").text)) == 4
        token = csrf(queue)
        assert b.post("/reviews/decide", data={"decision": "approve", "ids": ids[:2]}).status_code == 403
        # Another tenant's entry in the selection is skipped, never decided, never named.
        done = b.post("/reviews/decide", data={"csrf": token, "decision": "approve", "ids": [*ids[:2], their_id],
                                               "next": "/reviews"})
        assert done.status_code == 303 and done.headers["location"] == "/reviews?decided=approved&many=2&skipped=1"
        assert "2 review(s) approved; 1 skipped" in b.get(done.headers["location"]).text
        no_reason = b.post("/reviews/decide", data={"csrf": token, "decision": "reject", "ids": ids[2:]})
        assert no_reason.status_code == 422 and "needs a reason" in no_reason.text
        # A reviewer who decides twice: the entry approved a moment ago is skipped; the other is rejected.
        again = b.post("/reviews/decide", data={"csrf": token, "decision": "reject", "ids": [ids[0], ids[2]],
                                                "why": "off topic"})
        assert again.headers["location"] == "/reviews?decided=rejected&many=1&skipped=1"
        assert b.post("/reviews/decide", data={"csrf": token, "decision": "maybe", "ids": ids}).status_code == 422
    assert [server.wait_for(acme, job, FINAL)["status"] for job in mine[:3]] == ["published", "published", "rejected"]
    with server.client(globex) as api:
        assert api.get(f"/v1/jobs/{theirs}").json()["status"] == "awaiting_review"


def _events(stream: Any, wanted: str) -> list[str]:
    """The stream's event names up to and including ``wanted`` (comments and retry lines left out)."""
    seen: list[str] = []
    for line in stream.iter_lines():
        if line.startswith("event: "):
            seen.append(line.removeprefix("event: "))
            if seen[-1] == wanted:
                return seen
    return seen


def test_live_pages_are_told_when_they_change_over_server_sent_events(server: Server) -> None:
    acme, globex = server.token("acme"), server.token("globex")
    done = submit(server, acme, "a sure thing")
    with browser(server, acme) as b:
        page = b.get(f"/runs/{done}").text
        assert f'data-changes="/runs/{done}/changes"' not in page  # a finished run's page is not live
        with b.stream("GET", f"/runs/{done}/changes") as stream:  # asked anyway: it says the run is over
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert _events(stream, "end") == ["end"]
        with b.stream("GET", "/changes") as stream:
            submit(server, acme, "another sure thing")  # the runs list changes: its page is told, once it moved
            assert _events(stream, "changed")[-1] == "changed"
        assert b.get("/runs/nope/changes").status_code == 404
    with browser(server, globex) as other:
        assert other.get(f"/runs/{done}/changes").status_code == 404  # another tenant's run does not exist
        assert other.get("/workers/changes").status_code == 403  # the workers are an operator's view
    with browser(server, server.token("ops", operator=True)) as b:
        assert 'data-changes="/workers/changes"' in b.get("/workers").text
        assert 'data-changes="/workers/changes?all=1"' in b.get("/workers?all=1").text
        with b.stream("GET", "/workers/changes") as stream:
            submit(server, acme, "a third sure thing")  # the serve's worker takes and finishes it: its row moves
            assert _events(stream, "changed")[-1] == "changed"
    with browser(server, acme) as b, b.stream("GET", "/changes") as stream:
        store = open_store(server.store_url)
        try:
            revoke_token(store, acme)
        finally:
            store.close()
        assert _events(stream, "changed") == []  # the stream ends when its token is revoked


def walk(b: httpx.Client, path: str | None, pattern: str) -> list[str]:
    """Every match of ``pattern`` on a page and the pages after it (its rel="next" links)."""
    seen: list[str] = []
    while path is not None:
        html = b.get(path).text
        seen += re.findall(pattern, html)
        found = re.search(r'rel="next" href="([^"]+)"', html)
        path = found.group(1).replace("&amp;", "&") if found else None
    return seen


def test_every_list_is_paginated(server: Server) -> None:
    acme = server.token("acme")
    jobs = [submit(server, acme, f"unsure {n}", ("awaiting_review",)) for n in range(3)]
    poison = [submit(server, acme, f"poison {n}") for n in range(2)]
    newest_first = [*reversed(poison), *reversed(jobs)]
    for token in (acme, server.token("ops", operator=True)):  # a tenant's runs, and every run
        with browser(server, token) as b:
            assert walk(b, "/?limit=2", r'<tr data-run="([^"]+)"') == newest_first  # each once
            reviews = walk(b, "/reviews?limit=1", r'data-review="(\d+)"')
            assert len(reviews) == 3 and reviews == sorted(reviews, key=int)
            assert walk(b, f"/reviews?run={jobs[1]}&limit=1", r'data-review="(\d+)"') == [reviews[1]]
            assert b.get("/?limit=1000").status_code == 422  # a page is at most 100 rows
            assert "less than or equal to 100" in b.get("/reviews?limit=101").text


def test_no_auth_opens_the_pages_without_login(tmp_path: Path, store_url: str) -> None:
    with served(tmp_path, store_url, write_pipeline(tmp_path, PIPELINE), "--no-auth") as s:
        job = submit(s, "", "a sure thing")
        with httpx.Client(base_url=s.url) as b:
            assert job in b.get("/").text
            assert b.get("/login").status_code == 303
            assert b.get("/workers").status_code == 200
            page = b.get(f"/runs/{job}").text
            assert "Log out" not in page and 'data-stage="extract"' in page


def test_a_runs_dead_letters_come_in_pages(tmp_path: Path, store_url: str) -> None:
    from conveyor.service import dashboard
    from tests.helpers import make_docs, submit_and_work

    target = write_pipeline(tmp_path, PIPELINE)
    docs = make_docs(tmp_path / "docs", 5, "poison {i}")
    run_id = submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id
    store = open_store(store_url)
    try:
        first = dashboard.dead_letters_page(store, run_id, None, None, limit=2)
        assert first["classes"] == {"value_error": 5} and len(first["entries"]) == 2
        seen = [e["id"] for e in first["entries"]]
        after = first["next_after"]
        while after is not None:
            page = dashboard.dead_letters_page(store, run_id, None, None, limit=2, after=after)
            seen += [e["id"] for e in page["entries"]]
            after = page["next_after"]
        assert len(seen) == 5 and seen == sorted(seen)
        assert dashboard.dead_letters_page(store, run_id, None, "timeout", limit=2)["entries"] == []
    finally:
        store.close()


JOURNEY = """
import json
from pydantic import BaseModel
from conveyor import Pipeline, Retry
from conveyor.acceptance import Accept, Review

class Title(BaseModel):
    title: str
    confidence: float

pipe = Pipeline("journey", retry=Retry(max_attempts=2, base=0.05, cap=0.1))

@pipe.stage(accept=Accept(schema=Title, repair=True, confidence="confidence", threshold=0.8,
                          review=Review(deadline="1h")))
def extract(ctx, source: bytes) -> str:
    text = source.decode()
    ctx.log.info("extracting %d bytes", len(source))
    if ctx.attempt == 1 and "flaky" in text:
        ctx.log.warning("the model is busy <b>now</b>")
        raise RuntimeError("the model was busy")
    answer = json.dumps({"title": text, "confidence": 0.5 if "unsure" in text else 0.9})
    return "```json\\n" + answer + ",\\n```"  # a fence and a trailing comma: repaired

@pipe.stage(after=extract, kind="fanout")
def words(ctx, record: dict) -> list:
    return record["title"].split()

@pipe.stage(after=words)
def shout(ctx, word: str) -> str:
    if word == "boom":
        raise ValueError("no boom")
    return word.upper()

@pipe.stage(after=shout, kind="gather", on_child_failure="skip")
def joined(ctx, shouted: list) -> str:
    return " ".join(shouted)

@pipe.stage(after=extract, kind="reduce")
def tally(ctx, key, members) -> int:
    return len(members)
"""


def _states(page: str) -> dict[str, str]:
    """Stage -> its box's state in the page's journey graph."""
    return dict(re.findall(r'class="cv-stage" data-stage="([^"]+)" data-state="([a-z]+)"', page))


def _section(page: str, stage: str, item_key: str) -> str:
    """The block of a task on an item page (the item's key as stored: an API job's is ``@tenant/`` + its id)."""
    found = re.search(rf'<section class="task" data-task="{stage}" data-item="(?:@[^/"]+/)?{re.escape(item_key)}">'
                      r"(.*?)</section>", page, re.S)
    assert found, f"no task {stage} of {item_key} on the page: {re.findall('<section[^>]*>', page)}"
    return found.group(1)


def test_the_item_page_shows_why_at_a_glance(tmp_path: Path, store_url: str) -> None:
    with served(tmp_path, store_url, write_pipeline(tmp_path, JOURNEY)) as server:
        acme, globex = server.token("acme"), server.token("globex")
        flaky = submit(server, acme, "flaky red boom")
        unsure = submit(server, acme, "unsure blue", ("awaiting_review",))
        with browser(server, acme) as b:
            page = b.get(f"/runs/{flaky}/items/{flaky}")
            assert page.status_code == 200, page.text
            html = page.text
            # the journey: the pipeline's graph, each stage coloured by this item's tasks (children, gather, group)
            assert _states(html) == {"extract": "done", "words": "done", "shout": "failed", "joined": "done",
                                     "tally": "done"}
            assert "2 / 3 done" in html  # shout: two children of three succeeded
            # provenance as a table, not a JSON blob
            extract = _section(html, "extract", flaky)
            rows = dict(re.findall(r'<tr><th scope="row">([^<]+)</th><td><code>([^<]*)</code></td></tr>', extract))
            assert rows["stage_version"] == "1" and rows["config_hash"] and len(rows["source"]) == 64
            assert "<dt>Provenance</dt>" not in extract and "&#34;stage_version&#34;" not in extract
            # each attempt with its duration, error and log lines (escaped: they are the stage's text)
            attempts = re.findall(r'<tbody data-attempt="(\d+)">(.*?)</tbody>', extract, re.S)
            assert [n for n, _ in attempts] == ["1", "2"]
            first, second = attempts[0][1], attempts[1][1]
            assert "retry" in first and "the model was busy" in first and "RuntimeError" in first
            assert "+0." in first and "INFO extracting 14 bytes" in first
            assert "WARNING the model is busy &lt;b&gt;now&lt;/b&gt;" in first and "<b>now" not in html
            assert "2 log lines" in first and "1 log line<" in second and "succeeded" in second
            # the answer before and after its repair
            repair = re.search(r"<div class=\"before-after\" data-repair>(.*?)</div>", extract, re.S)
            assert repair, "no before/after of the repair"
            before, after = re.findall(r'<pre class="output" data-(?:before|after)>(.*?)</pre>', repair.group(1), re.S)
            assert before.startswith("```json") and before.rstrip().endswith(",\n```".strip())
            assert "&#34;title&#34;: &#34;flaky red boom&#34;" in after and "```" not in after
            # a fan-out child that failed, the gather, and the group the item is a member of
            boom = _section(html, "shout", f"{flaky}\u00b6" + "2")
            assert "dead_lettered" in boom and "value_error" in boom and "no boom" in boom
            assert 'data-item="group:*"' in html and "reduce" in _section(html, "tally", "group:*")

            waiting = b.get(f"/runs/{unsure}/items/{unsure}").text
            assert _states(waiting)["extract"] == "review" and _states(waiting)["words"] == "none"
            assert "not reached" in waiting
            review = re.search(r'<div class="before-after" data-review="(\d+)">(.*?)</div>', waiting, re.S)
            assert review and "waiting for a reviewer" in review.group(2) and "low_confidence" in review.group(2)
            assert "&#34;title&#34;: &#34;unsure blue&#34;" in review.group(2)
            with server.client(acme) as api:
                edited = api.post(f"/v1/reviews/{review.group(1)}/edit",
                                  json={"fields": {"title": "sure blue"}, "why": "checked the source"})
                assert edited.status_code == 200, edited.text
            server.wait_for(acme, unsure, FINAL)
            decided = b.get(f"/runs/{unsure}/items/{unsure}").text
            block = re.search(r'<div class="before-after" data-review="\d+">(.*?)</div>', decided, re.S)
            assert block, "no before/after of the review"
            assert "&#34;unsure blue&#34;" in block.group(1) and "&#34;sure blue&#34;" in block.group(1)
            decision = block.group(1)
            assert "data-decision>edited</span> by api:acme" in decision and "checked the source" in decision
            assert _states(decided)["extract"] == "done"

        with browser(server, globex) as b:  # another tenant: the item, and its log lines, are not there
            answer = b.get(f"/runs/{flaky}/items/{flaky}")
            assert answer.status_code == 404 and "the model is busy" not in answer.text


BIG_TABLES = ("tasks", "attempts", "items", "reviews", "dead_letters", "outputs", "provenance", "group_keys")


def test_the_item_pages_reads_go_by_the_items_key(tmp_path: Path, store_url: str) -> None:
    """Every statement the item page runs reads its tables through an index (SQLite's plan has no SCAN of a
    table that grows with the store; PostgreSQL's, with sequential scans priced out, no Seq Scan), so the page
    costs the same in a store of a million items."""
    from conveyor.blobs import FilesystemBlobs
    from conveyor.service.itempage import item_page
    from tests.helpers import submit_and_work

    target = write_pipeline(tmp_path, JOURNEY)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("flaky red boom")
    (docs / "b.txt").write_text("green")
    run_id = submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id
    store = open_store(store_url)
    try:
        seen: list[tuple[str, list[Any]]] = []
        execute = store.db.execute

        def recorded(sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
            seen.append((sql, list(params)))
            return execute(sql, params)

        store.db.execute = recorded  # type: ignore[method-assign]
        page = item_page(store, FilesystemBlobs(tmp_path / "blobs"), run_id, "a.txt", None)
        store.db.execute = execute  # type: ignore[method-assign]
        assert page["journey"]["tally"] == {"succeeded": 1} and len(seen) >= 8
        sqlite = store.db.name == "sqlite"
        if not sqlite:
            execute("SET enable_seqscan = off")
        for sql, params in seen:
            plan = "\n".join(" ".join(map(str, row)) for row in execute(
                ("EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN ") + sql, params))
            # SQLite names a table by its alias in the statement (tasks t: "SCAN t"): no SCAN at all
            scanned = (re.search(r"\bSCAN (?!CONSTANT ROW)", plan) if sqlite
                       else re.search(rf"Seq Scan on ({'|'.join(BIG_TABLES)})\b", plan))
            assert not scanned, f"a table read whole by:\n{sql}\n{plan}"
    finally:
        store.close()
# --- the items page (issue 30 point 1) and the runs list's filters (point 4) ------------------------------------

def mixed_run(tmp_path: Path, server: Server) -> str:
    """A run (made from the command line: an operator's) of 6 fine documents, 3 poison ones (dead-lettered) and
    8 unsure ones (waiting for review: 4 keyed u-, 4 keyed v-), worked to its end."""
    from tests.helpers import submit_and_work

    docs = tmp_path / "mixed"
    docs.mkdir()
    for prefix, count, text in (("a-fine", 6, "a fine document"), ("p-poison", 3, "poison pill"),
                                ("u-unsure", 4, "unsure u"), ("v-unsure", 4, "unsure v")):
        for n in range(count):
            (docs / f"{prefix}-{n}.txt").write_text(f"{text} {n}")
    return submit_and_work(write_pipeline(tmp_path, PIPELINE), docs, server.store_url, server.blobs).run_id


def rows_of(html: str) -> list[tuple[str, str]]:
    """(task id, item key) of each row of an items page."""
    return re.findall(r'<tr data-task="(\d+)" data-item="([^"]+)">', html)


def items_of(b: httpx.Client, run_id: str, **query: Any) -> list[tuple[str, str]]:
    answer = b.get(f"/runs/{run_id}/items", params={"limit": 100, **query})
    assert answer.status_code == 200, answer.text
    return rows_of(answer.text)


def count_of(html: str) -> int:
    found = re.search(r'data-count="(\d+)"', html)
    assert found, html
    return int(found.group(1))


def test_the_items_page_filters_pages_and_acts_on_the_selection(tmp_path: Path, server: Server) -> None:
    run_id = mixed_run(tmp_path, server)
    with browser(server, server.token("ops", operator=True)) as b:
        assert 'data-items-link' in b.get(f"/runs/{run_id}").text
        everything = items_of(b, run_id)
        assert len(everything) == 6 * 2 + 3 + 8  # fine: extract and publish; the others stopped at extract
        keys = [key for _, key in everything]
        assert keys == sorted(keys) and all(f'href="/runs/{run_id}/items/{key}"' in b.get(
            f"/runs/{run_id}/items", params={"limit": 100}).text for key in set(keys))
        paged = walk(b, f"/runs/{run_id}/items?limit=4", r'<tr data-task="(\d+)"')  # keyset pages, no offset
        assert paged == [task for task, _ in everything] and len(set(paged)) == len(paged)
        paged = walk(b, f"/runs/{run_id}/items?limit=2&prefix=u-", r'data-item="([^"]+)"')
        assert paged == [f"u-unsure-{n}.txt" for n in range(4)]
        paged = walk(b, f"/runs/{run_id}/items?limit=3&review=open", r'data-item="([^"]+)"')  # a narrow filter's pages
        assert paged == [f"{p}-unsure-{n}.txt" for p in "uv" for n in range(4)]

        dead = items_of(b, run_id, status="dead_lettered")
        assert [key for _, key in dead] == [f"p-poison-{n}.txt" for n in range(3)]
        assert items_of(b, run_id, error_class="value_error") == dead
        assert items_of(b, run_id, text="poison") == dead == items_of(b, run_id, text="POISON document")
        assert items_of(b, run_id, text="poison unheard-of") == []
        assert items_of(b, run_id, outcome="dead_lettered") == dead
        assert len(items_of(b, run_id, outcome="published")) == 12 and len(items_of(b, run_id, stage="publish")) == 6
        assert len(items_of(b, run_id, review="open")) == 8 and items_of(b, run_id, review="approved") == []
        assert len(items_of(b, run_id, where="config_hash != nothing", stage="extract")) == 6 + 3 + 8
        assert items_of(b, run_id, status="queued") == []
        assert "u-unsure-0.txt" in b.get(f"/runs/{run_id}/items", params={"prefix": "u-"}).text
        for bad, says in (({"status": "bogus"}, "use one of"), ({"where": "parser <"}, "NAME OP VALUE"),
                          ({"stage": "nope"}, "no selected run has that stage"), ({"review": "maybe"}, "review state")):
            answer = b.get(f"/runs/{run_id}/items", params=bad)
            assert answer.status_code == 422 and says in answer.text, bad

        # Replay these: a dry run first (nothing written), then the act, through `conveyor replay`'s function.
        look = b.get(f"/runs/{run_id}/selection", params={"status": "dead_lettered", "action": "replay"})
        assert look.status_code == 200 and count_of(look.text) == 3 and "Nothing has been done yet" in look.text
        form = {"csrf": csrf(look.text), "status": "dead_lettered", "reason": "retry"}
        assert b.post(f"/runs/{run_id}/selection/replay", data={**form, "csrf": "0" * 64}).status_code == 403
        assert b.post(f"/runs/{run_id}/selection/replay", data={k: v for k, v in form.items() if k != "csrf"}
                      ).status_code == 403
        store = open_store(server.store_url)
        try:
            assert store.replays_of(run_id) == []  # neither the dry run nor the refused posts wrote anything
        finally:
            store.close()
        done = b.post(f"/runs/{run_id}/selection/replay", data=form)
        assert done.status_code == 303 and "acted=replay&count=3" in done.headers["location"]
        assert "status=dead_lettered" in done.headers["location"]
        assert "Replayed 3 tasks" in b.get(done.headers["location"]).text

        # Approve these (the u- items), reject these (the v- items) with a reason.
        look = b.get(f"/runs/{run_id}/selection", params={"prefix": "u-", "action": "approve"})
        assert count_of(look.text) == 4 and "go on to publish" in look.text
        form = {"csrf": csrf(look.text), "prefix": "u-", "expected": "4"}
        done = b.post(f"/runs/{run_id}/selection/approve", data=form)
        assert done.status_code == 303 and "acted=approve&count=4" in done.headers["location"]
        again = b.post(f"/runs/{run_id}/selection/approve", data=form)  # none left open: not what was shown
        assert again.status_code == 409 and "not the 4 shown" in again.text
        look = b.get(f"/runs/{run_id}/selection", params={"prefix": "v-", "review": "open", "action": "reject"})
        assert count_of(look.text) == 4
        form = {"csrf": csrf(look.text), "prefix": "v-", "review": "open", "expected": "4"}
        assert b.post(f"/runs/{run_id}/selection/reject", data=form).status_code == 422  # a reason is needed
        done = b.post(f"/runs/{run_id}/selection/reject", data={**form, "why": "not ours"})
        assert done.status_code == 303 and "count=4" in done.headers["location"]

        assert [k for _, k in items_of(b, run_id, prefix="v-", status="rejected")] == [
            f"v-unsure-{n}.txt" for n in range(4)]
        assert len(items_of(b, run_id, review="rejected")) == 4 and len(items_of(b, run_id, review="approved")) == 4
        deadline = time.monotonic() + 60  # the server's worker takes the approved items on, and the replayed ones
        while time.monotonic() < deadline and (len(items_of(b, run_id, prefix="u-", stage="publish")) < 4
                                               or len(items_of(b, run_id, status="dead_lettered")) < 3):
            time.sleep(0.2)
        assert len(items_of(b, run_id, prefix="u-", outcome="published")) == 8
        assert items_of(b, run_id, text="poison") == items_of(b, run_id, status="dead_lettered")
        assert len(items_of(b, run_id, text="poison")) == 3  # the error words follow the tasks, once each


def test_a_tenant_neither_sees_nor_acts_on_anothers_items(tmp_path: Path, server: Server) -> None:
    acme, globex = server.token("acme"), server.token("globex")
    unsure = submit(server, acme, "unsure of acme", ("awaiting_review",))
    operators = mixed_run(tmp_path, server)
    with browser(server, acme) as b:
        assert [key for _, key in items_of(b, unsure)] == [unsure]  # an API job's item key is its job id
        assert b.get(f"/runs/{operators}/items").status_code == 404  # a run of no job of acme's
        look = b.get(f"/runs/{unsure}/selection", params={"action": "approve"})
        assert count_of(look.text) == 1
        token = csrf(look.text)
    with browser(server, globex) as b:
        mine = csrf(b.get("/").text)
        for path, params in ((f"/runs/{unsure}/items", {}), (f"/runs/{unsure}/selection", {"action": "approve"}),
                             (f"/runs/{operators}/items", {"status": "dead_lettered"})):
            answer = b.get(path, params=params)
            assert answer.status_code == 404 and "no run" in answer.text, path
        for action in ("approve", "replay", "reject"):
            answer = b.post(f"/runs/{unsure}/selection/{action}", data={"csrf": mine, "why": "theirs"})
            assert answer.status_code == 404, action
            assert b.post(f"/runs/{unsure}/selection/{action}", data={"csrf": token}).status_code == 403
    with server.client(acme) as api:
        assert api.get(f"/v1/jobs/{unsure}").json()["status"] == "awaiting_review"  # nobody decided it


def test_the_runs_list_filters_by_pipeline_status_and_date(server: Server) -> None:
    acme = server.token("acme")
    sure = submit(server, acme, "a sure thing")
    unsure = submit(server, acme, "unsure one", ("awaiting_review",))
    poison = submit(server, acme, "poison pill")
    with browser(server, acme) as b:
        def listed(**query: Any) -> list[str]:
            answer = b.get("/", params=query)
            assert answer.status_code == 200, answer.text
            return re.findall(r'<tr data-run="([^"]+)"', answer.text)

        assert listed() == [poison, unsure, sure]
        assert listed(status="finished_failed") == [poison] and listed(status="finished_waiting") == [unsure]
        assert listed(status="finished") == [sure] and listed(status="submitted") == []
        assert listed(pipeline="ops") == [poison, unsure, sure] and listed(pipeline="other") == []
        assert listed(since="2000-01-01", until="2999-12-31") == [poison, unsure, sure]
        assert listed(until="2000-01-01") == [] and listed(since="2999-01-01") == []
        assert walk(b, "/?status=finished_waiting&limit=1", r'<tr data-run="([^"]+)"') == [unsure]
        assert walk(b, "/?pipeline=ops&limit=1", r'<tr data-run="([^"]+)"') == [poison, unsure, sure]
        bad = b.get("/", params={"status": "green"})
        assert bad.status_code == 422 and "use one of" in bad.text
        assert b.get("/", params={"since": "yesterday-ish"}).status_code == 422


def test_select_takes_the_items_pages_filters(tmp_path: Path, store_url: str) -> None:
    """`conveyor select` names what the items page shows: a key prefix, words of the error, a review state."""
    from tests.helpers import cli, cli_json, submit_and_work

    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in (("p-0", "poison a"), ("p-1", "poison b"), ("u-0", "unsure c"), ("f-0", "fine d")):
        (docs / f"{name}.txt").write_text(text)
    run_id = submit_and_work(write_pipeline(tmp_path, PIPELINE), docs, store_url, tmp_path / "blobs").run_id

    def keys(*args: str) -> list[str]:
        data = cli_json("select", "--run", run_id, "--db", store_url, *args, cwd=tmp_path)
        return sorted(t["item_key"] for t in data["items"])

    assert keys("--error-text", "poison document") == ["p-0.txt", "p-1.txt"]
    assert keys("--error-text", "POISON", "--key-prefix", "p-1") == ["p-1.txt"]
    assert keys("--error-text", "nowhere") == [] and keys("--key-prefix", "u-") == ["u-0.txt"]
    assert keys("--review", "open") == ["u-0.txt"] and keys("--review", "rejected") == []
    wrong = cli("select", "--review", "maybe", "--db", store_url, cwd=tmp_path)
    assert wrong.returncode == 2 and "review state 'maybe'" in wrong.stderr
