"""The dashboard in a real browser: Debian's headless Chromium (/usr/bin/chromium) driven by Playwright, against
a real `conveyor serve` on SQLite. Log in, watch a run's progress move without reloading, replay a dead letter
by clicking (its item then succeeds), approve a review entry by clicking. Screenshots go to test-artifacts/ at
the repository's root. Without /usr/bin/chromium the tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.target import load_target
from conveyor.service.submit import submit as submit_run
from conveyor.store import open_store
from tests.apiserver import Server, served
from tests.helpers import make_docs, write_pipeline
from tests.test_api_operations import FINAL, submit

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
WAIT_MS = 20_000

PIPELINE = """
import json
import time
from pathlib import Path

from pydantic import BaseModel

from conveyor import Pipeline, Retry
from conveyor.acceptance import Accept, Record, Review

HERE = Path(__file__).parent

class Title(BaseModel):
    title: str
    confidence: float

pipe = Pipeline("browse", retry=Retry(max_attempts=1))

@pipe.stage(accept=Accept(schema=Title, confidence="confidence", threshold=0.8, review=Review(deadline="1h")))
def extract(ctx, source: bytes) -> str:
    text = source.decode()
    if text.startswith("gated"):
        while not (HERE / "gate").exists():  # the test opens the gate once it has seen the run waiting
            time.sleep(0.05)
        time.sleep(0.2)
    if text.startswith("broken") and (HERE / "broken").exists():  # broken until the test "fixes" it
        raise ValueError("broken until fixed")
    return json.dumps({"title": text, "confidence": 0.5 if "unsure" in text else 0.9})

@pipe.stage(after=extract, kind="publish", into="titles")
def publish(ctx, record: dict) -> Record:
    return Record(fields={"title": record["title"]})
"""


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One browser for the module's tests (a launch is seconds of CPU); each page opens in a context of its own
    (``Browser.new_page``), so no cookie or session passes from one test to the next."""
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("the browser tests need Debian's chromium at /usr/bin/chromium (scripts/ensure-tools.sh)")
        pytest.skip("no /usr/bin/chromium: `apt-get install chromium` (scripts/ensure-tools.sh) to run these")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with served(tmp_path, f"sqlite:///{tmp_path}/conveyor.db", write_pipeline(tmp_path, PIPELINE)) as s:
        yield s


def logged_in(chromium: Any, server: Server, token: str) -> Any:
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(WAIT_MS)
    page.goto(f"{server.url}/")
    assert "/login" in page.url  # no session: to the login form
    page.fill("#token", token)
    page.click("form.login button[type=submit]")
    page.wait_for_url(f"{server.url}/")
    return page


def submitted(server: Server, tmp_path: Path, docs: Path) -> str:
    """The id of a run of PIPELINE over ``docs``, submitted into the server's store (its workers take it)."""
    target = write_pipeline(tmp_path, PIPELINE)
    store = open_store(server.store_url)
    try:
        return submit_run(load_target(target), target, str(docs), store, FilesystemBlobs(server.blobs)).run_id
    finally:
        store.close()


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)


def test_a_runs_progress_moves_on_the_page(chromium: Any, server: Server, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    docs = make_docs(tmp_path / "docs", 6, "gated document {i}")
    run_id = submitted(server, tmp_path, docs)
    page = logged_in(chromium, server, server.token("ops", operator=True))
    row = page.locator(f'tr[data-run="{run_id}"]')
    expect(row.locator("[data-accepted]")).to_have_text("0")
    shot(page, "runs-waiting")

    page.click(f'a[href="/runs/{run_id}"]')
    done = page.locator('tr[data-stage="extract"] [data-done]')
    expect(done).to_have_text("0")
    expect(page.locator("[data-status]")).to_have_text("submitted")
    page.evaluate("window.notReloaded = true")
    shot(page, "run-waiting")

    (tmp_path / "gate").touch()
    expect(done).to_have_text("6")  # the page refreshes itself every 2 s
    expect(page.locator('tr[data-stage="publish"] [data-done]')).to_have_text("6")
    expect(page.locator("[data-status]")).to_have_text("finished")
    assert page.evaluate("window.notReloaded") is True
    assert "6 / 6 published" in page.locator(".progress.wide").inner_text()
    shot(page, "run-finished")

    page.goto(f"{server.url}/")
    expect(row.locator("[data-published]")).to_have_text("6")


def test_replay_a_dead_letter_and_approve_a_review_by_clicking(chromium: Any, server: Server,
                                                               tmp_path: Path) -> None:
    from playwright.sync_api import expect

    acme = server.token("acme")
    (tmp_path / "broken").touch()
    broken = submit(server, acme, "broken document")
    unsure = submit(server, acme, "unsure document", ("awaiting_review",))
    page = logged_in(chromium, server, acme)

    page.goto(f"{server.url}/runs/{broken}/dead-letters")
    entry = page.locator("tr[data-dead-letter]")
    expect(entry).to_have_count(1)
    expect(entry).to_contain_text("value_error")
    shot(page, "dead-letters")
    (tmp_path / "broken").unlink()  # the fix is in: a replay now succeeds
    entry.get_by_role("button", name="Replay").click()
    expect(page.locator("[data-notice]")).to_contain_text("Replayed 1 dead letter")
    expect(page.locator("tr[data-dead-letter]")).to_have_count(0)
    assert server.wait_for(acme, broken, FINAL)["status"] == "published"
    page.goto(f"{server.url}/runs/{broken}/items/{broken}")
    expect(page.locator("[data-outcome]")).to_have_text("published")
    expect(page.locator("body")).to_contain_text("replayed from the dashboard by dashboard:acme")
    shot(page, "item-after-replay")

    page.click("text=Review queue")
    review = page.locator(f'article[data-review]:has(a[href="/runs/{unsure}"])')
    expect(review).to_contain_text("unsure document")
    shot(page, "reviews")
    review.get_by_role("button", name="Approve").click()
    expect(page.locator("[data-notice]")).to_contain_text("approved: its item goes on")
    expect(page.locator("article[data-review]")).to_have_count(0)
    assert server.wait_for(acme, unsure, FINAL)["status"] == "published"
    page.goto(f"{server.url}/runs/{unsure}")
    expect(page.locator('[data-outcome="published"]')).to_have_text("1")
    shot(page, "run-after-approve")


def test_the_review_queue_by_keyboard_and_by_selection(chromium: Any, server: Server) -> None:
    from playwright.sync_api import expect

    acme = server.token("acme")
    jobs = [submit(server, acme, f"unsure page {n}", ("awaiting_review",)) for n in range(4)]
    page = logged_in(chromium, server, acme)
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{server.url}/reviews")
    entries = page.locator("article[data-review]")
    expect(entries).to_have_count(4)
    expect(page.locator("[data-deadline]").first).to_contain_text("due in 59m")  # a countdown from the 1 h deadline
    expect(page.locator(".reasons")).to_contain_text("low_confidence (4)")
    shot(page, "reviews-compact")

    page.keyboard.press("j")  # the first entry
    expect(entries.first).to_have_class("review compact current")
    page.keyboard.press("o")
    expect(entries.first.locator("pre.candidate")).to_be_visible()
    page.keyboard.press("a")  # approved, back to the queue
    expect(page.locator("[data-notice]")).to_contain_text("approved: its item goes on")
    expect(entries).to_have_count(3)

    page.keyboard.press("j")
    page.keyboard.press("x")
    page.keyboard.press("j")
    page.keyboard.press("x")
    expect(page.locator("[data-selected-count]")).to_have_text("2 selected")
    page.fill('form#bulk input[name="why"]', "not a manual page")
    page.get_by_role("button", name="Reject selected").click()
    expect(page.locator("[data-notice]")).to_contain_text("2 review(s) rejected")
    expect(entries).to_have_count(1)

    page.keyboard.press("j")
    page.keyboard.press("r")  # opens the entry and puts the cursor in its reason box
    expect(entries.first.locator("[data-why]")).to_be_focused()
    page.keyboard.type("unsure of it")
    page.keyboard.press("Enter")
    expect(page.locator("[data-notice]")).to_contain_text("rejected")
    expect(entries).to_have_count(0)
    assert [server.wait_for(acme, job, FINAL)["status"] for job in jobs].count("rejected") == 3
    assert not errors, errors
def test_the_item_page_renders_its_journey_and_logs_without_a_console_error(chromium: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from tests.test_dashboard import JOURNEY

    with served(tmp_path, f"sqlite:///{tmp_path}/conveyor.db", write_pipeline(tmp_path, JOURNEY)) as server:
        acme = server.token("acme")
        flaky = submit(server, acme, "flaky red boom")
        page = logged_in(chromium, server, acme)
        errors: list[str] = []
        page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
        page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)

        page.goto(f"{server.url}/runs/{flaky}/items/{flaky}")
        graph = page.locator("[data-graph] svg")
        expect(graph).to_be_visible()
        expect(graph.locator('[data-stage="shout"]')).to_have_attribute("data-state", "failed")
        expect(graph.locator('[data-stage="tally"]')).to_have_attribute("data-state", "done")
        extract = page.locator('section[data-task="extract"]')
        expect(extract.locator("table[data-provenance]")).to_be_visible()
        expect(extract.locator("[data-repair] [data-before]")).to_contain_text("```json")
        first = extract.locator('tbody[data-attempt="1"] pre.logs')
        expect(first).to_be_visible()  # a failed attempt's lines are open
        expect(first).to_contain_text("WARNING the model is busy <b>now</b>")  # text, not markup
        second = extract.locator('tbody[data-attempt="2"] details[data-logs]')
        expect(second.locator("pre.logs")).to_be_hidden()  # a successful attempt's are one click away
        second.locator("summary").click()
        expect(second.locator("pre.logs")).to_contain_text("INFO extracting 14 bytes")
        shot(page, "item-journey")
        page.wait_for_load_state("networkidle")
        assert errors == [], errors
def test_filter_the_items_and_act_on_them_by_clicking(chromium: Any, server: Server, tmp_path: Path) -> None:
    """The items page (issue 30 point 1): filter through the form (the filter lands in the URL), approve the
    waiting ones and replay the broken ones from their dry runs, with no console error on any page."""
    from playwright.sync_api import expect

    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in [*((f"a-fine-{n}", f"fine {n}") for n in range(2)),
                       *((f"b-broken-{n}", f"broken {n}") for n in range(2)),
                       *((f"u-unsure-{n}", f"unsure {n}") for n in range(3))]:
        (docs / f"{name}.txt").write_text(text)
    (tmp_path / "broken").touch()
    run_id = submitted(server, tmp_path, docs)
    page = logged_in(chromium, server, server.token("ops", operator=True))
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    page.goto(f"{server.url}/runs/{run_id}")
    expect(page.locator("[data-badge]")).to_have_text("finished with failures")  # the server's worker ran it
    page.click("a[data-items-link]")
    rows = page.locator("tr[data-task]")
    expect(rows).to_have_count(2 * 2 + 2 + 3)  # fine: extract and publish; broken and unsure: extract
    shot(page, "items")

    page.select_option("form[data-items-filter] select[name=review]", "open")
    page.click("form[data-items-filter] button[type=submit]")
    expect(rows).to_have_count(3)
    assert "review=open" in page.url
    page.click("text=Approve these…")
    expect(page.locator("[data-count]")).to_have_attribute("data-count", "3")
    expect(page.locator("[data-forecast]")).to_contain_text("go on to publish")
    shot(page, "items-approve-dry-run")
    page.get_by_role("button", name="Approve 3").click()
    expect(page.locator("[data-notice]")).to_contain_text("Approved 3 review entries")

    page.goto(f"{server.url}/runs/{run_id}/items")
    page.fill("form[data-items-filter] input[name=text]", "broken until fixed")
    page.click("form[data-items-filter] button[type=submit]")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("dead_lettered")
    page.click("text=Replay these…")
    expect(page.locator("[data-count]")).to_have_attribute("data-count", "2")
    (tmp_path / "broken").unlink()  # the fix is in: the replayed ones now succeed
    page.fill("form[data-act] input[name=why]", "fixed the parser")
    page.get_by_role("button", name="Replay 2").click()
    expect(page.locator("[data-notice]")).to_contain_text("Replayed 2 tasks")
    shot(page, "items-replayed")

    page.goto(f"{server.url}/runs/{run_id}/items?outcome=published&stage=publish")
    for _ in range(100):  # the server's worker publishes the approved and the replayed items
        if page.locator("tr[data-task]").count() == 2 + 3 + 2:
            break
        page.wait_for_timeout(200)
        page.reload()
    expect(rows).to_have_count(2 + 3 + 2)
    rows.first.locator("a").first.click()  # each row links to its item's page
    expect(page).to_have_url(f"{server.url}/runs/{run_id}/items/a-fine-0.txt")
    page.goto(f"{server.url}/?status=finished")
    expect(page.locator(f'tr[data-run="{run_id}"] [data-badge]')).to_have_text("finished")
    assert errors == []
