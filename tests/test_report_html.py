"""`conveyor report RUN --html FILE` (both backends): one self-contained page whose figures are the
reconciliation's, with charts that parse, and one-line errors that leave no half-written file."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.service.progress import bucket_size
from conveyor.service.report import find_run
from conveyor.service.runreport import AGE_BUCKETS, run_report
from conveyor.store import open_store
from tests.helpers import cli, cli_json, query, submit_and_work, write_pipeline
from tests.test_reconcile_report import BAD, GOOD, PIPE, UNSURE, _decide, manifest

SECTIONS = ("reconciliation", "throughput", "ages", "attempts", "cost", "stages", "not-done", "sample")
VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col", "embed", "source", "track", "wbr"}


class Page(HTMLParser):
    """The page's elements: well nested, with their attributes, the text of each data-field, and the SVGs."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.attrs: list[dict[str, str | None]] = []
        self.fields: dict[str, str] = {}
        self.ids: list[str] = []
        self.tags: set[str] = set()
        self._field: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.tags.add(tag)
        self.attrs.append(found)
        if found.get("id"):
            self.ids.append(str(found["id"]))
        if tag in VOID:
            return
        self.open.append(tag)
        self._field.append(found.get("data-field"))
        if found.get("data-field"):
            self.fields[str(found["data-field"])] = ""

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs.append(dict(attrs))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1] if self.open else None}>"
        self.open.pop()
        self._field.pop()

    def handle_data(self, data: str) -> None:
        for field in self._field:
            if field:
                self.fields[field] += data


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    assert page.open == [], f"unclosed: {page.open}"
    return page


def shown(text: str) -> float:
    """A number as the page prints it ("1,234", "$0.000840") back to a float."""
    return float(re.sub(r"[$,\s]", "", text))


def shown_precision(text: str) -> float:
    """Half a unit of the last digit shown: how far a rounded figure may be from the value."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0 ** -decimals + 1e-12


def _mixed_run(tmp_path: Path, store_url: str) -> str:
    """Published, completed, failed, dead-lettered (after a retry), awaiting review and review-rejected items,
    with priced model calls and escalations."""
    target = write_pipeline(tmp_path, PIPE)
    done = submit_and_work(target, manifest(tmp_path, GOOD + BAD + UNSURE), store_url, tmp_path / "blobs")
    _decide(store_url, tmp_path / "blobs", "r.txt", "reject")
    return done.run_id


@pytest.fixture
def mixed(tmp_path: Path, store_url: str) -> str:
    return _mixed_run(tmp_path, store_url)


def test_the_page_shows_the_reconciliation_and_is_self_contained(tmp_path: Path, store_url: str, mixed: str) -> None:
    blobs = str(tmp_path / "blobs")
    out = tmp_path / "report.html"
    proc = cli("report", mixed, "--html", str(out), "--db", store_url, "--blobs", blobs, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and f"wrote the report of run {mixed} to {out}" in proc.stderr
    html = out.read_text()
    page = parse(html)

    assert all(section in page.ids for section in SECTIONS), page.ids
    assert "script" not in page.tags and "link" not in page.tags and "img" not in page.tags
    assert not re.search(r"(?i)\b(?:src|href)\s*=|url\(|@import|https?://(?!www\.w3\.org/2000/svg)", html)

    rec = cli_json("reconcile", mixed, "--db", store_url, "--blobs", blobs, cwd=tmp_path)
    assert rec["outcomes"] == {"published": 2, "completed": 1, "failed": 2, "dead_lettered": 1,
                               "awaiting_review": 1, "rejected": 1}
    assert rec["retries"] >= 1 and rec["usage"]["cost"] > 0 and "unreadable" in rec["attempt_errors"]
    expected = {f"outcomes.{k}": v for k, v in rec["outcomes"].items()} | {
        f"attempt_errors.{k}": v for k, v in rec["attempt_errors"].items()} | {
        k: rec[k] for k in ("expected", "unaccounted", "stage_calls", "cached", "retries")} | {
        f"usage.{k}": rec["usage"][k] for k in ("provider_calls", "prompt_tokens", "completion_tokens", "cost")} | {
        f"per_accepted_item.{k}": v for k, v in rec["per_accepted_item"].items()}
    assert set(expected) <= set(page.fields), set(expected) - set(page.fields)
    for field, value in expected.items():
        text = page.fields[field]
        assert shown(text) == pytest.approx(value, rel=0, abs=shown_precision(text)), field

    svgs = re.findall(r"<svg\b.*?</svg>", html, flags=re.S)
    assert len(svgs) == 5  # outcomes, throughput, ages, errors, cost
    titles = [ET.fromstring(svg).get("aria-label") for svg in svgs]
    assert titles == ["Items by outcome", "Throughput over time", "Items by time from submission to outcome",
                      "Failed attempts by error class", "Cumulative cost"]
    # the quality sample shows accepted records, and items not done are listed with their error class
    assert "alpha" in html and "cannot parse" in html and "low_confidence" in html
    (tmp_path / "kept-report.html").write_text(html)


def test_the_gathered_data_as_json(tmp_path: Path, store_url: str, mixed: str) -> None:
    sample = ("--sample", "1", "--slice", "kind", "--seed", "s1")
    data = cli_json("report", mixed, "--db", store_url, "--blobs", str(tmp_path / "blobs"), *sample, cwd=tmp_path)
    rec = cli_json("reconcile", mixed, "--db", store_url, "--blobs", str(tmp_path / "blobs"), *sample, cwd=tmp_path)
    assert set(rec["sample"]) == {"language", "source_type", "kind"}
    assert data["run_id"] == mixed and data["status"] == rec["status"]
    for key in ("outcomes", "expected", "unaccounted", "usage", "per_accepted_item", "attempt_errors", "sample"):
        assert data["reconcile"][key] == rec[key], key
    assert data["reconcile"]["not_done_shown"] == len(rec["not_done"]) == 5

    ages = data["ages"]
    assert [b["label"] for b in ages["buckets"]][-1] == "≥ 1 day" and len(ages["buckets"]) == len(AGE_BUCKETS) + 1
    assert ages["open"] == 1  # g.txt awaits review
    assert ages["ended"] == 7 == sum(b["items"] for b in ages["buckets"])
    assert ages["buckets"][0]["items"] + ages["buckets"][1]["items"] == 7, "a small run ends in seconds"

    buckets = data["timeline"]["buckets"]
    assert sum(b["attempts"] for b in buckets) == sum(
        r[0] for r in query(store_url, "SELECT COUNT(*) FROM attempts WHERE run_id = ?", mixed))
    assert sum(b["cost_usd"] for b in buckets) == pytest.approx(rec["usage"]["cost"])
    stages = {s["stage"]: s for s in data["stages"]}
    assert list(stages) == ["extract", "split", "publish"]
    assert stages["extract"]["counts"]["dead_lettered"] == 1 and stages["publish"]["counts"] == {"succeeded": 2}


def test_an_item_still_open_is_not_aged_and_the_page_says_so(tmp_path: Path, store_url: str, mixed: str) -> None:
    query(store_url, "UPDATE tasks SET status = 'queued', finished_at = NULL WHERE run_id = ? AND root_key = ?",
          mixed, "a.txt")
    store = open_store(store_url)
    try:
        store.recount_run_totals(mixed)  # the rows were changed around the engine
        store.recount_open_task_seconds()
        data = run_report(store, find_run(store, mixed), FilesystemBlobs(tmp_path / "blobs"))
    finally:
        store.close()
    assert data["ages"]["open"] == 2 and data["ages"]["ended"] == 6
    assert data["timeline"]["bucket_s"] < 60.0, "a run of seconds so far: buckets under a minute"


def test_html_on_stdout_without_a_sample(tmp_path: Path, store_url: str, mixed: str) -> None:
    proc = cli("report", mixed, "--html", "-", "--sample", "0", "--db", store_url, "--blobs",
               str(tmp_path / "blobs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    page = parse(proc.stdout)
    assert proc.stdout.startswith("<!DOCTYPE html>") and "sample" in page.ids
    assert "No accepted record to sample" in proc.stdout


def test_errors_are_one_line_and_leave_no_file(tmp_path: Path, store_url: str, mixed: str) -> None:
    out = tmp_path / "r.html"
    for db in (store_url, f"sqlite:///{tmp_path / 'no-store.db'}"):
        missing = cli("report", "no-such-run", "--html", str(out), "--db", db, cwd=tmp_path)
        assert missing.returncode == 2 and "no run 'no-such-run'" in missing.stderr
        assert len(missing.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "no-store.db").exists()
    assert list(tmp_path.glob("*.html")) == [] and list(tmp_path.glob(".r.html.*")) == []

    for bad in (tmp_path / "no" / "such" / "dir" / "r.html", tmp_path):  # a missing folder; a directory
        proc = cli("report", mixed, "--html", str(bad), "--db", store_url, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.startswith(f"error: cannot write {bad}"), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    nowhere = cli("report", mixed, "--db", store_url, cwd=tmp_path)
    assert nowhere.returncode == 2 and "--html FILE" in nowhere.stderr
    both = cli("report", mixed, "--html", "-", "--json", "--db", store_url, cwd=tmp_path)
    assert both.returncode == 2 and "give --html a FILE" in both.stderr


def test_a_report_replaces_an_older_one_whole(tmp_path: Path, store_url: str, mixed: str) -> None:
    out = tmp_path / "r.html"
    out.write_text("old")
    proc = cli("report", mixed, "--html", str(out), "--db", store_url, "--blobs", str(tmp_path / "blobs"),
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith("<!DOCTYPE html>") and oct(out.stat().st_mode & 0o777) != "0o600"
    assert json.loads(cli("report", mixed, "--json", "--db", store_url, cwd=tmp_path).stdout)["run_id"] == mixed


@pytest.mark.parametrize(("span", "size"), [(0, 1.0), (46, 1.0), (121, 5.0), (3600, 30.0), (3601, 60.0), (7200, 60.0),
                                            (7201, 300.0), (7 * 86400, 10800.0), (400 * 86400, 4 * 86400.0)])
def test_bucket_size_keeps_the_timeline_short(span: float, size: float) -> None:
    assert bucket_size(span) == size
    assert bucket_size(span, fine=False) == max(size, 60.0), "a run with many attempts: whole minutes"


def test_the_page_escapes_user_text_and_cuts_long_samples(tmp_path: Path, store_url: str, mixed: str) -> None:
    from conveyor.cli.htmlreport import render_html

    store = open_store(store_url)
    try:
        data = run_report(store, find_run(store, mixed), FilesystemBlobs(tmp_path / "blobs"))
    finally:
        store.close()
    nasty = '<script>alert("x")</script>'
    data["pipeline"] = nasty
    data["reconcile"]["attempt_errors"][nasty] = 3
    data["reconcile"]["not_done"][0]["item_key"] = nasty
    data["stages"][0]["stage"] = nasty
    html = render_html(data)
    page = parse(html)
    assert "<script>" not in html and "script" not in page.tags
    assert page.fields[f"attempt_errors.{nasty}"] == "3"
    assert html.count("&lt;script&gt;") >= 4

    data["reconcile"]["sample"]["source_type"] = {
        f".x{i:02d}": [{"item_key": f"k{i}.x{i:02d}", "outcome": "published", "record": {"n": i}}] for i in range(20)}
    html = render_html(data)
    assert "k11.x11" in html and "k12.x12" not in html
    assert "… and 8 more values of source type" in html


def test_quiet_buckets_are_zeros_on_the_chart() -> None:
    from conveyor.cli.htmlreport import dense

    def bucket(t: float, attempts: int) -> dict[str, float]:
        return {"t": t, "attempts": attempts, "succeeded": attempts, "failed": 0, "accepted": 0, "published": 0,
                "tokens": 0, "cost_usd": 0.5}

    filled = dense([bucket(600.0, 3), bucket(780.0, 1)], 60.0)
    assert [(b["t"], b["attempts"], b["cost_usd"]) for b in filled] == [
        (600.0, 3, 0.5), (660.0, 0, 0.0), (720.0, 0, 0.0), (780.0, 1, 0.5)]
    assert dense([], 60.0) == []
    far = [bucket(0.0, 1), bucket(60.0 * 5000, 1)]
    assert dense(far, 60.0) == far


def test_a_run_answered_from_the_memo_says_so_on_its_empty_timeline(tmp_path: Path, store_url: str,
                                                                   mixed: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    again = submit_and_work(target, manifest(tmp_path, GOOD), store_url, tmp_path / "blobs")
    data = cli_json("report", again.run_id, "--db", store_url, cwd=tmp_path)
    # every task was answered from the memo when it was made: no attempt, so no time bucket
    assert data["reconcile"]["cached"] == 8 and data["reconcile"]["stage_calls"] == 0
    assert data["timeline"]["buckets"] == [] and data["ages"]["ended"] == 3
    proc = cli("report", again.run_id, "--html", "-", "--db", store_url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "no attempt ran: 8 tasks were answered from the memo" in proc.stdout


def test_item_ages_fall_in_their_buckets(tmp_path: Path, store_url: str, mixed: str) -> None:
    """From an item's first task's creation to its last task's end; a bucket holds ages below its upper limit."""
    query(store_url, "UPDATE tasks SET created_at = 1000, finished_at = CASE WHEN finished_at IS NULL THEN NULL "
          "ELSE 1000.5 END WHERE run_id = ?", mixed)
    for root, age in (("a.txt", 30.0), ("b.md", 60.0), ("c", 3 * 86400.0), ("d.txt", 7200.0)):
        query(store_url, "UPDATE tasks SET finished_at = ? WHERE run_id = ? AND root_key = ? AND stage = 'extract'",
              1000 + age, mixed, root)
    store = open_store(store_url)
    try:
        ages = run_report(store, find_run(store, mixed), None)["ages"]
    finally:
        store.close()
    assert {b["label"]: b["items"] for b in ages["buckets"] if b["items"]} == {
        "< 1 s": 3, "10 s–1 min": 1, "1–10 min": 1, "1–6 h": 1, "≥ 1 day": 1}
    assert ages["open"] == 1 and ages["ended"] == 7


def test_a_run_of_46_seconds_has_a_timeline_by_the_second(tmp_path: Path, store_url: str, mixed: str) -> None:
    from conveyor.cli.htmlreport import charts
    from conveyor.service.dashboard import run_page

    attempts = [row[0] for row in query(store_url, "SELECT id FROM attempts WHERE run_id = ? ORDER BY id", mixed)]
    (created,) = query(store_url, "SELECT created_at FROM runs WHERE run_id = ?", mixed)[0]
    for index, attempt in enumerate(attempts):  # the attempts' ends spread over 46 seconds
        query(store_url, "UPDATE attempts SET started_at = ?, duration = 0.25 WHERE id = ?",
              float(created) + 46.0 * index / (len(attempts) - 1), attempt)
    store = open_store(store_url)
    try:
        store.recount_run_totals(mixed)  # the rows were changed around the engine
        data = run_report(store, find_run(store, mixed), None)
        dashboard = run_page(store, mixed, None)["charts"]
    finally:
        store.close()
    line = data["timeline"]
    assert line["bucket_s"] < 60 and len(line["buckets"]) >= 8, line
    assert sum(b["attempts"] for b in line["buckets"]) == len(attempts)
    for svg in (str(charts(data)["throughput"]), dashboard["throughput"]):
        points = re.search(r'class="cv-line" points="([^"]*)"', svg)
        assert points is not None and len(points.group(1).split()) >= 8, "a line over the run, not one dot"


@pytest.mark.parametrize(("value", "text"), [
    (0.0000608, "$0.0000608"), (0.00084, "$0.00084"), (0.0123456, "$0.0123"), (0.5, "$0.50"), (0.0, "$0.00"),
    (12.3456, "$12.35"), (1234.5, "$1,234.50"), (-0.0012345, "-$0.00123")])
def test_money_has_significant_digits_wherever_it_is_shown(value: float, text: str) -> None:
    from conveyor.api.dashboard.render import usd as dashboard_usd
    from conveyor.cli.htmlreport import _usd as report_usd
    from conveyor.cli.render import _cost as cli_cost
    from conveyor.service.money import usd

    assert usd(value) == report_usd(value) == dashboard_usd(value) == text
    assert cli_cost({"cost": value, "provider_calls": 1, "unpriced_calls": 0}) == f"cost {text}"
    assert shown(text) == pytest.approx(value, rel=0.01), "never rounded to a wrong figure"
