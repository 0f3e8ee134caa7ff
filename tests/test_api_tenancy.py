"""Tenants by construction: every route and dashboard page, called by a second tenant with the first one's ids
and keys, answers 404 (or lists nothing of it); two tenants that choose one item key keep two items, two
publications and their own records. A real `conveyor serve`, a real client, both backends."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts
from starlette.routing import Mount

from conveyor.api.app import create_app
from conveyor.api.dashboard.session import csrf_for
from conveyor.api.settings import ApiSettings
from tests.apiserver import Server, served
from tests.helpers import cli_json, write_pipeline
from tests.test_api_operations import PIPELINE, submit

FINAL = ("published", "completed", "failed", "dead_lettered", "rejected")
KEY = "contract-42"
# A route's path parameters, and what each names of tenant A's: a route with another parameter fails the test
# until it is added here (and scoped).
PARAMETERS = {"job_id": "job", "run_id": "job", "batch_id": "batch", "review_id": "review",
              "dead_letter_id": "dead_letter", "item_key": "item_key", "action": "action"}
# What a POST needs besides its id to get past validation, so that its 404 comes from the tenancy rule.
BODIES = {"approve": {}, "edit": {"fields": {"title": "x"}}, "reject": {"why": "not yours"},
          "replay": {"reason": "not yours"}}
# Routes that take ids in their body: the body naming tenant A's.
ID_BODIES = {"/v1/replays": lambda ids: {"reason": "retry", "runs": [ids["job"]]}}
# Routes with no id that create (their ids are new) or are not a tenant's (operators only, 403 for a tenant).
# /reviews/decide names its entries in a form: another tenant's are skipped and counted, never decided
# (tests/test_dashboard.py, the review queue's selection test).
UNSCOPED = {"/v1/jobs": {"POST"}, "/v1/batches": {"POST"}, "/login": {"GET", "POST"}, "/logout": {"POST"},
            "/reviews/decide": {"POST"}}


@pytest.fixture
def server(tmp_path: Path, store_url: str) -> Any:
    with served(tmp_path, store_url, write_pipeline(tmp_path, PIPELINE)) as s:
        yield s


def post_job(server: Server, token: str, text: str, key: str | None = None) -> dict[str, Any]:
    with server.client(token) as c:
        answer = c.post("/v1/jobs", json={"text": text, **({"key": key} if key else {})})
    assert answer.status_code == 202, answer.text
    body: dict[str, Any] = answer.json()
    return body


def view(server: Server, token: str, job_id: str) -> dict[str, Any]:
    with server.client(token) as c:
        answer = c.get(f"/v1/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def title(job_view: dict[str, Any]) -> str | None:
    record = job_view["record"]
    return None if record is None else str(record["fields"]["title"])


def test_two_tenants_that_choose_one_key_keep_their_own_records(server: Server, tmp_path: Path) -> None:
    acme, globex = server.token("acme"), server.token("globex")
    first = post_job(server, acme, "contract of acme", KEY)["job_id"]
    assert server.wait_for(acme, first, FINAL)["status"] == "published"
    assert title(view(server, acme, first)) == "contract of acme"

    theirs = post_job(server, globex, "contract of globex", KEY)["job_id"]
    early = view(server, globex, theirs)  # while it is queued: nothing of acme's
    assert title(early) in (None, "contract of globex")
    assert early["key"] == KEY
    done = server.wait_for(globex, theirs, FINAL)
    assert done["status"] == "published" and title(done) == "contract of globex"
    assert title(view(server, acme, first)) == "contract of acme"  # B's publication did not replace A's

    # The same document as acme's, with the same key: the memo may answer, but globex is not told so, and its
    # publication is its own (a new version of globex's item, not of acme's).
    same = post_job(server, globex, "contract of acme", KEY)["job_id"]
    same_view = server.wait_for(globex, same, FINAL)
    assert same_view["status"] == "published"
    assert [s["cached"] for s in same_view["stages"]] == [False, False]
    assert same_view["record"]["version"] == 2 and title(same_view) == "contract of acme"
    again = post_job(server, acme, "contract of acme", KEY)["job_id"]  # acme's own earlier work: cached
    again_view = server.wait_for(acme, again, FINAL)
    assert [s["cached"] for s in again_view["stages"]] == [True, True]
    assert again_view["record"]["version"] == 1 and view(server, acme, first)["record"]["version"] == 1
    with server.client(globex) as c:
        told = [e["data"] for e in _events(c, same) if e["type"] == "job.stage_done"]
        assert [d["stage"] for d in told] == ["extract", "publish"] and not any(d.get("cached") for d in told)
        assert {d["item_key"] for d in told} == {KEY}  # told as globex chose it

    db = ("--db", server.store_url)
    for tenant, job_ids, titles in (("acme", {first, again}, ["contract of acme"]),
                                    ("globex", {theirs, same}, ["contract of acme", "contract of globex"])):
        listed = cli_json("publications", f"@{tenant}/{KEY}", *db, cwd=tmp_path)
        assert {v["run_id"] for v in listed["versions"]} <= job_ids
        assert [v["fields"]["title"] for v in listed["versions"]] == titles
    hits = cli_json("search", "contract", "--limit", "10", *db, cwd=tmp_path)["results"]
    assert sorted(h["item_key"] for h in hits) == [f"@acme/{KEY}", f"@globex/{KEY}"]


def _events(c: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    events, kind = [], ""
    with c.stream("GET", f"/v1/jobs/{job_id}/events") as stream:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append({"type": kind, **json.loads(line.removeprefix("data: "))})
    return events


def test_every_route_answers_another_tenants_ids_with_404(server: Server, tmp_path: Path) -> None:
    acme, globex = server.token("acme"), server.token("globex")
    ids = tenant_work(server, acme) | {"action": "approve"}  # the items table's bulk action on a selection
    secrets = [ids["job"], ids["batch"], "@acme", "of acme"]
    routes = app_routes(server, tmp_path)
    assert {"/v1/jobs/{job_id}", "/runs/{run_id}/items/{item_key:path}", "/reviews/{review_id}"} <= {
        path for path, _ in routes}  # the API's and the dashboard's

    checked = []
    with server.client(globex, follow_redirects=True) as b, server.client(acme, follow_redirects=True) as a:
        for path, method in routes:
            names = re.findall(r"{(\w+)(?::\w+)?}", path)
            if not names:
                if method == "GET" and path == "/workers/changes":  # the workers page's stream: operators only
                    assert b.get(path).status_code == 403
                elif method == "GET" and path.endswith("/changes"):  # the runs list's change stream: not a page
                    with b.stream("GET", path) as stream:
                        assert stream.status_code == 200 and next(stream.iter_lines()) == "retry: 2000"
                elif method == "GET":
                    shown = b.get(path, params={"all": "true"})
                    assert not [v for v in secrets if v in shown.text], f"GET {path} shows acme's work"
                elif path in ID_BODIES:
                    answer = b.post(path, json=ID_BODIES[path](ids))
                    assert answer.status_code == 404, f"{method} {path} as another tenant: {answer.status_code}"
                    checked.append((method, path))
                else:
                    assert method in UNSCOPED.get(path, ()), f"{method} {path}: add it to the test (and scope it)"
                continue
            unknown = [n for n in names if n not in PARAMETERS]
            assert not unknown, f"{method} {path} takes {unknown}: name what they are in PARAMETERS"
            for run in (["job", "batch"] if "run_id" in names else ["job"]):
                given = ids | ({"job": ids["batch"], "item_key": "@acme/line-0"} if run == "batch" else {})
                url = fill(path, {n: given[PARAMETERS[n]] for n in names})
                answer = call(b, method, url, globex, given["item_key"])
                assert answer.status_code == 404, f"{method} {url} as another tenant: {answer.status_code}"
                if method == "GET":
                    own = call(a, method, url, acme, given["item_key"])
                    assert own.status_code == 200, f"GET {url} as its own tenant: {own.status_code}"
                checked.append((method, path))
    assert len({p for _, p in checked}) >= 15


def tenant_work(server: Server, token: str) -> dict[str, str]:
    """Tenant A's job (published, with a key), batch, open review entry and dead letter: their ids."""
    job = post_job(server, token, "a document of acme", KEY)["job_id"]
    unsure = submit(server, token, "unsure of acme", ("awaiting_review",))
    submit(server, token, "poison of acme")
    manifest = b"".join(json.dumps({"key": f"line-{n}", "text": f"line {n}"}).encode() + b"\n" for n in range(2))
    with server.client(token) as c:
        batch = c.post("/v1/batches", content=manifest, headers={"Content-Type": "application/x-ndjson"})
        assert batch.status_code == 202, batch.text
        assert server.wait_for(token, job, FINAL)["status"] == "published"
        batch_url = f"/v1/batches/{batch.json()['batch_id']}"
        deadline = time.monotonic() + 60
        while c.get(batch_url).json()["status"] == "submitting" and time.monotonic() < deadline:
            time.sleep(0.1)  # its items are read
        review = next(e["id"] for e in c.get("/v1/reviews").json()["reviews"] if e["run_id"] == unsure)
        (dead,) = c.get("/v1/dead-letters").json()["entries"]
    return {"job": job, "batch": batch.json()["batch_id"], "review": str(review), "dead_letter": str(dead["id"]),
            "item_key": f"@acme/{KEY}"}


def app_routes(server: Server, tmp_path: Path) -> list[tuple[str, str]]:
    """(path, method) of every route of the app the server runs (the same factory, the same settings)."""
    app = create_app(ApiSettings(server.store_url, str(server.blobs), (write_pipeline(tmp_path, PIPELINE),)))
    found = []
    for route in iter_route_contexts(app.routes):  # the included routers' routes too
        if isinstance(route.original_route, Mount):  # the dashboard's static files
            continue
        found += [(route.path, m) for m in sorted(route.methods or ()) if m != "HEAD"]
    return found


def fill(path: str, values: dict[str, str]) -> str:
    from urllib.parse import quote

    return re.sub(r"{(\w+)(?::\w+)?}", lambda m: quote(values[m.group(1)], safe=""), path)


def call(client: httpx.Client, method: str, url: str, token: str, key: str) -> httpx.Response:
    if method == "GET":
        if url.endswith(("/events", "/changes")):  # streams: their status, not their (endless) body
            with client.stream("GET", url) as answer:
                return answer
        if url.endswith("/selection"):  # the items table's dry run of an action on its filter (a replay of an
            return client.get(url, params={"action": "approve"})  # API job's first stage needs its sources)
        return client.get(url, params={"key": key})  # the dashboard's "find an item" box
    action = url.rstrip("/").rsplit("/", 1)[-1]
    if url.startswith("/v1/"):
        return client.post(url, json=BODIES[action])
    form = {"csrf": csrf_for(token.encode()), "why": "not yours", "fields": json.dumps({"title": "x"})}
    return client.post(url, data=form)
