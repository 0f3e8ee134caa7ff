"""The acceptance boundary: answers are repaired only in their format, checked for shape and meaning,
escalated, sent to review, and only accepted ones go on (the judge alone; the engine on both backends)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from conveyor import Pipeline
from conveyor.acceptance import Accept, Answer, Review, check, found_in, matches, meta_equals
from conveyor.acceptance.judge import judge
from conveyor.errors import PipelineError, UserError
from conveyor.service import review
from conveyor.store import open_store
from tests.helpers import cli, reconciled, submit_and_work, work, write_pipeline


class Found(BaseModel):
    product_id: str | None = None
    language: str | None = None
    confidence: float


STRICT = Accept(schema=Found, repair=True, checks=[found_in("product_id"), matches("product_id", r"P-\d{3}")],
                confidence="confidence", threshold=0.8)


# --- the judge ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    '```json\n{"product_id": "P-001", "confidence": 0.9,}\n```',  # a code fence and a trailing comma
    '```\n{"product_id": "P-001", "confidence": 0.9}',  # a fence whose closing backticks never came
])
def test_a_format_fault_is_repaired_and_says_so(text: str) -> None:
    verdict = judge(STRICT, text, "order P-001 shipped", {})
    assert verdict.accepted and verdict.repaired
    assert verdict.record == {"product_id": "P-001", "language": None, "confidence": 0.9}


def test_clean_json_is_not_marked_repaired() -> None:
    verdict = judge(STRICT, json.dumps({"product_id": "P-001", "confidence": 0.9}), "P-001", {})
    assert verdict.accepted and not verdict.repaired


def test_repair_never_fixes_content() -> None:
    """A plausible identifier that the document does not hold is refused, repaired format or not."""
    verdict = judge(STRICT, '```json\n{"product_id": "P-002", "confidence": 0.99,}\n```', "order P-001", {})
    assert verdict.refusal == "invalid_content" and verdict.repaired
    assert "P-002" in verdict.message and not verdict.reviewable


def test_refusal_classes() -> None:
    assert judge(STRICT, "Sure! the id is P-001", "P-001", {}).refusal == "invalid_format"
    cut = judge(STRICT, '{"product_id": "P-001", "confidence": 0.9', "P-001", {})  # 0.9 may have been 0.95
    assert cut.refusal == "invalid_format" and "cut off" in cut.message
    assert judge(STRICT, '{"confidence": "high"}', "P-001", {}).refusal == "invalid_format"
    assert judge(STRICT, '{"product_id": "P-1", "confidence": 0.9}', "P-1", {}).refusal == "invalid_content"
    low = judge(STRICT, '{"product_id": "P-001", "confidence": 0.5}', "P-001", {})
    assert low.refusal == "low_confidence" and low.reviewable and low.confidence == 0.5
    no_repair = Accept(schema=Found)
    assert judge(no_repair, '{"confidence": 0.9,}', "", {}).refusal == "invalid_format"


def test_unknown_and_absent_fields_pass_the_checks_and_never_guess() -> None:
    for answer in ('{"product_id": "unknown", "confidence": 0.9}', '{"product_id": null, "confidence": 0.9}',
                   '{"confidence": 0.9}'):
        assert judge(STRICT, answer, "nothing here", {}).accepted


def test_known_fields_are_merged_over_the_model_and_checked() -> None:
    accept = Accept(schema=Found, checks=[meta_equals("language")])
    verdict = judge(accept, Answer('{"confidence": 1, "language": "fr"}', known={"language": "de"}), "", {})
    assert verdict.accepted and verdict.record["language"] == "de"
    assert judge(accept, Answer('{"confidence": 1}', known={"language": "en"}), "", {"language": "de"}).refusal \
        == "invalid_content"


def test_own_check_and_reviewable_content() -> None:
    accept = Accept(checks=[check(lambda r, s, m: None if r["n"] > 0 else "n must be positive", reviewable=True)])
    assert judge(accept, {"n": 1}, None, {}).accepted
    verdict = judge(accept, {"n": 0}, None, {})
    assert verdict.refusal == "invalid_content" and verdict.reviewable


@pytest.mark.parametrize(("make", "says"), [
    (lambda: Accept(threshold=0.5), "confidence="),
    (lambda: Accept(review=Review(on_deadline="escalate")), "escalate"),
    (lambda: Review(deadline="soon"), "duration"),
    (lambda: Review(on_deadline="ignore"), "reject, accept, escalate"),
    (lambda: Accept(checks=["product_id"]), "not a check"),
    (lambda: Accept(escalate_on=("timeout",)), "not one of"),
    (lambda: matches("id", "(["), "regular expression"),
])
def test_declaration_mistakes_are_one_line_errors(make: Any, says: str) -> None:
    with pytest.raises(PipelineError, match=says.replace("=", "=")):
        make()


def test_accept_is_for_map_stages() -> None:
    pipe = Pipeline("p")
    with pytest.raises(PipelineError, match="map stages"):
        pipe.stage(kind="fanout", accept=Accept())(lambda ctx, s: [])


def test_acceptance_rules_are_part_of_the_stage_identity() -> None:
    pipe = Pipeline("p")
    a = pipe.stage(name="a", accept=Accept(threshold=0.5, confidence="c"))(lambda ctx, s: s)
    b = pipe.stage(name="b", accept=Accept(threshold=0.6, confidence="c"))(lambda ctx, s: s)
    c = pipe.stage(name="c")(lambda ctx, s: s)
    assert len({a.config_hash, b.config_hash}) == 2
    assert c.config_hash == Pipeline("q").stage(name="c")(lambda ctx, s: s).config_hash


# --- the engine (both backends) -------------------------------------------------------------------------

PIPE = """
    import json, os
    from pydantic import BaseModel
    from conveyor import Pipeline, Retry
    from conveyor.acceptance import Accept, Review, found_in, matches, meta_equals

    class Found(BaseModel):
        product_id: str | None = None
        language: str | None = None
        confidence: float

    pipe = Pipeline("products", retry=Retry(max_attempts=3, base=0.01, cap=0.01))

    @pipe.stage(version="1", config={"model": "small"}, accept=Accept(
        schema=Found, repair=True, confidence="confidence", threshold=0.8, escalate=[{"model": "big"}],
        checks=[found_in("product_id"), matches("product_id", r"P-\\d{3}"), meta_equals("language")],
        review=Review(deadline=os.environ.get("DEADLINE", "1h"), on_deadline=os.environ.get("ON_DEADLINE", "reject"))))
    def extract(ctx, source: bytes) -> str:
        text = source.decode()
        with open(os.environ["CALLS"], "a") as calls:
            calls.write(f"{text.split()[0]} {ctx.config['model']} {ctx.tier}\\n")
        pid = text.split()[0]
        if "garbled" in text:
            return "Sure! " + pid
        if "fence" in text:
            return "```json\\n" + json.dumps({"product_id": pid, "confidence": 0.95}) + ",\\n```"
        if "wrong" in text:
            return json.dumps({"product_id": "P-999", "confidence": 0.99})
        sure = ctx.config["model"] == "big" and "sure" in text
        return json.dumps({"product_id": pid, "confidence": 0.9 if sure else 0.5, "language": "en"})

    @pipe.stage(after=extract, kind="publish", version="1")
    def publish(ctx, record: dict) -> None:
        with open(os.environ["SINK"], "a") as sink:
            sink.write(json.dumps({"item": ctx.item_key, **record}) + "\\n")
"""

ITEMS = [
    {"key": "a", "text": "P-001 sure thing"},  # low confidence, rescued by the stronger tier
    {"key": "b", "text": "P-002 maybe"},  # low confidence at both tiers: review
    {"key": "c", "text": "P-003 fence"},  # a fenced answer: repaired, accepted
    {"key": "d", "text": "P-004 wrong"},  # a plausible identifier not in the document: never published
    {"key": "e", "text": "P-005 sure", "meta": {"language": "de"}},  # disagrees with the manifest
    {"key": "f", "text": "P-006 garbled"},  # not JSON even after repair: retried, escalated, failed
]


@pytest.fixture
def products(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("SINK", str(tmp_path / "sink.jsonl"))
    monkeypatch.setenv("CALLS", str(tmp_path / "calls.log"))
    manifest = tmp_path / "in.jsonl"
    manifest.write_text("".join(json.dumps(i) + "\n" for i in ITEMS))
    return {"target": write_pipeline(tmp_path, PIPE), "input": manifest, "blobs": tmp_path / "blobs",
            "sink": tmp_path / "sink.jsonl", "calls": tmp_path / "calls.log"}


def _published(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    if not p["sink"].exists():
        return {}
    return {r["item"]: r for r in map(json.loads, p["sink"].read_text().splitlines())}


def _tasks(store_url: str, run_id: str) -> dict[str, tuple[str, str | None, int]]:
    store = open_store(store_url)
    try:
        rows = store.db.execute("SELECT item_key, status, error_class, tier FROM tasks WHERE run_id = ? AND "
                                "stage = 'extract'", (run_id,))
    finally:
        store.close()
    return {r[0]: (r[1], r[2], int(r[3])) for r in rows}


def _attempts(store_url: str, run_id: str) -> list[tuple[str, str, int | None, int | None]]:
    store = open_store(store_url)
    try:
        rows = store.db.execute(
            "SELECT t.item_key, a.outcome, a.tier, a.repaired FROM attempts a JOIN tasks t ON t.id = a.task_id "
            "WHERE a.run_id = ? AND t.stage = 'extract' ORDER BY a.id", (run_id,))
    finally:
        store.close()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def test_only_accepted_answers_go_on(products: dict[str, Any], store_url: str) -> None:
    done = submit_and_work(products["target"], products["input"], store_url, products["blobs"])
    tasks = _tasks(store_url, done.run_id)
    assert tasks == {
        "a": ("succeeded", None, 1), "b": ("awaiting_review", "low_confidence", 1), "c": ("succeeded", None, 0),
        "d": ("failed", "invalid_content", 1), "e": ("failed", "invalid_content", 1),
        "f": ("failed", "invalid_format", 1),
    }
    published = _published(products)
    assert sorted(published) == ["a", "c"], "nothing refused or waiting is published"
    assert published["a"]["product_id"] == "P-001" and published["c"]["confidence"] == 0.95
    attempts = _attempts(store_url, done.run_id)
    assert [a for a in attempts if a[0] == "a"] == [("a", "escalated", 0, 0), ("a", "succeeded", 1, 0)]
    assert [a for a in attempts if a[0] == "c"] == [("c", "succeeded", 0, 1)]
    # the format fault is retried at its tier while its budget lasts (3), then escalated: a fresh budget at
    # the next tier, then it fails
    assert [a[1:3] for a in attempts if a[0] == "f"] == [("retry", 0), ("retry", 0), ("escalated", 0),
                                                         ("retry", 1), ("retry", 1), ("failed", 1)]
    calls = products["calls"].read_text().split("\n")
    assert "P-001 small 0" in calls and "P-001 big 1" in calls


def test_review_approve_edit_reject(products: dict[str, Any], store_url: str, tmp_path: Path) -> None:
    extra = {"key": "g", "text": "P-007 perhaps"}
    products["input"].write_text(products["input"].read_text() + json.dumps(extra) + "\n")
    done = submit_and_work(products["target"], products["input"], store_url, products["blobs"])
    store = open_store(store_url)
    blobs = products["blobs"]
    from conveyor.blobs import FilesystemBlobs

    try:
        listed = review.review_list(store)["reviews"]
        # listed in the order they were opened: whether b (escalated once first) or g comes first is the batches' doing
        assert sorted((e["item_key"], e["reason_class"], e["status"]) for e in listed) == [
            ("b", "low_confidence", "open"), ("g", "low_confidence", "open")]
        by_item = {e["item_key"]: e["id"] for e in listed}
        shown = review.review_show(store, FilesystemBlobs(blobs), by_item["b"])
        assert shown["candidate"]["product_id"] == "P-002" and shown["confidence"] == 0.5
        with pytest.raises(UserError, match="schema"):
            review.edit(store, FilesystemBlobs(blobs), by_item["b"], '{"confidence": "very"}', by="ann")
        with pytest.raises(UserError, match="JSON"):
            review.edit(store, FilesystemBlobs(blobs), by_item["b"], "{confidence", by="ann")
        edited = review.edit(store, FilesystemBlobs(blobs), by_item["b"], '{"confidence": 1.0}', by="ann",
                             why="read the invoice")
        assert edited["decided"][0]["queued"] == 1
        with pytest.raises(UserError, match="already decided"):
            review.approve(store, FilesystemBlobs(blobs), [by_item["b"]], by="bob")
        with pytest.raises(UserError, match="--why"):
            review.reject(store, [by_item["g"]], why=" ", by="bob")
        review.reject(store, [by_item["g"]], why="not our product", by="bob")
        assert review.review_list(store)["reviews"] == []
    finally:
        store.close()
    work(products["target"], store_url, blobs, run_id=done.run_id)
    published = _published(products)
    assert published["b"]["confidence"] == 1.0 and "g" not in published
    tasks = _tasks(store_url, done.run_id)
    assert tasks["b"][0] == "succeeded" and tasks["g"] == ("rejected", "rejected", 1)
    attempts = _attempts(store_url, done.run_id)
    assert ("b", "edited", 1, None) in attempts and ("g", "rejected", 1, None) in attempts

    # the reviewed answer is the memo's: the same input again makes no call and waits for nobody
    calls_before = products["calls"].read_text()
    again = submit_and_work(products["target"], products["input"], store_url, blobs)
    tasks = _tasks(store_url, again.run_id)
    assert tasks["b"] == ("succeeded", None, 0)
    # ... and so are the rejection and the refusals settled at the last tier: nobody is asked twice
    assert tasks["g"] == ("rejected", "rejected", 0) and tasks["d"] == ("failed", "invalid_content", 0)
    assert products["calls"].read_text() == calls_before, "the unchanged re-run calls no model"
    store = open_store(store_url)
    try:
        assert review.review_list(store)["reviews"] == []
    finally:
        store.close()
    assert reconciled(store_url, again.run_id)["stage_calls"] == 0


def _stages(store_url: str, run_id: str, item: str) -> dict[str, tuple[str, int]]:
    store = open_store(store_url)
    try:
        rows = store.db.execute("SELECT stage, status, tier FROM tasks WHERE run_id = ? AND item_key = ?",
                                (run_id, item))
    finally:
        store.close()
    return {r[0]: (r[1], int(r[2])) for r in rows}


@pytest.mark.parametrize(("on_deadline", "after"), [
    ("reject", {"extract": ("rejected", 1)}),
    ("accept", {"extract": ("succeeded", 1), "publish": ("queued", 0)}),
    ("escalate", {"extract": ("queued", 2)}),
])
def test_a_review_deadline_takes_its_declared_outcome(
    products: dict[str, Any], store_url: str, monkeypatch: pytest.MonkeyPatch, on_deadline: str,
    after: dict[str, tuple[str, int]],
) -> None:
    monkeypatch.setenv("ON_DEADLINE", on_deadline)
    monkeypatch.setenv("DEADLINE", "48h")
    done = submit_and_work(products["target"], products["input"], store_url, products["blobs"])
    store = open_store(store_url)
    try:
        entry = review.review_list(store)["reviews"][0]
        assert entry["deadline_at"] - entry["created_at"] == pytest.approx(48 * 3600)
        early = review.expire_deadlines(store, now=entry["deadline_at"] - 1)  # an injected clock: just before
        assert early["runs"] == [] and early["decided"] == {}
        listed = review.review_list(store, now=entry["deadline_at"] + 1)  # past it, a listing decides nothing
        assert len(listed["reviews"]) == 1 and listed["overdue"] == 1
        late = review.expire_deadlines(store, now=entry["deadline_at"] + 1)  # ... the command does
        assert sum(late["decided"].values()) == 1 and late["runs"][0]["run_id"] == done.run_id
        assert review.review_list(store)["reviews"] == []
        decided = review.review_list(store, include_decided=True)["reviews"][0]
    finally:
        store.close()
    assert decided["decided_by"] == "deadline"
    assert decided["status"] == {"reject": "rejected", "accept": "accepted", "escalate": "escalated"}[on_deadline]
    assert _stages(store_url, done.run_id, "b") == after


def test_the_deadline_escalation_is_final(products: dict[str, Any], store_url: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """One more try at the strongest tier; its refusal fails the item, with no second review."""
    monkeypatch.setenv("ON_DEADLINE", "escalate")
    done = submit_and_work(products["target"], products["input"], store_url, products["blobs"])
    store = open_store(store_url)
    try:
        store.db.execute("UPDATE reviews SET deadline_at = deadline_at - 7200")  # the hour passed
        assert review.expire_deadlines(store)["decided"] == {"escalated": 1}
    finally:
        store.close()
    work(products["target"], store_url, products["blobs"], run_id=done.run_id)
    assert _tasks(store_url, done.run_id)["b"] == ("failed", "low_confidence", 2)
    assert products["calls"].read_text().split("\n").count("P-002 big 2") == 1
    store = open_store(store_url)
    try:
        assert review.review_list(store)["reviews"] == []
    finally:
        store.close()


def test_review_commands_json_and_errors(products: dict[str, Any], store_url: str, tmp_path: Path) -> None:
    submit_and_work(products["target"], products["input"], store_url, products["blobs"])
    env = {"SINK": str(products["sink"]), "CALLS": str(products["calls"])}
    common = ("--db", store_url)
    listed = json.loads(cli("review", "list", *common, "--json", cwd=tmp_path, env=env).stdout)
    review_id = str(listed["reviews"][0]["id"])
    shown = json.loads(cli("review", "show", review_id, *common, "--blobs", str(products["blobs"]), "--json",
                           cwd=tmp_path, env=env).stdout)
    assert shown["candidate"]["product_id"] == "P-002" and shown["attempts"]
    told = cli("review", "show", review_id, *common, "--blobs", str(products["blobs"]), cwd=tmp_path, env=env).stdout
    deadline = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(shown["deadline_at"]))
    assert f"deadline {deadline} (then: " in told and "waiting since 20" in told, told
    assert f"{shown['deadline_at']:.0f}" not in told, "a date, not epoch seconds"
    wrong = cli("review", "reject", review_id, *common, cwd=tmp_path, env=env)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "--why" in wrong.stderr
    missing = cli("review", "approve", "9999", *common, "--blobs", str(products["blobs"]), cwd=tmp_path, env=env)
    assert missing.returncode == 2 and "no review 9999" in missing.stderr
    approved = json.loads(cli("review", "approve", review_id, *common, "--blobs", str(products["blobs"]),
                              "--by", "ann", "--why", "ok", "--json", cwd=tmp_path, env=env).stdout)
    assert approved["decided"][0]["decision"] == "approved" and approved["by"] == "ann"
    again = cli("review", "approve", review_id, *common, "--blobs", str(products["blobs"]), cwd=tmp_path, env=env)
    assert again.returncode == 2 and "already decided" in again.stderr


CASCADE = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.acceptance import Accept, check
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=5,
                              prices={"sim-1": [1.0, 4.0], "sim-big": [10.0, 40.0]})

    pipe = Pipeline("cascade", provider=provider, retry=Retry(max_attempts=2, base=0.01, cap=0.02))

    def strong_enough(record, source, meta):
        return None if record["model"] == "sim-big" else "the small model's answers are not trusted here"

    @pipe.stage(version="1", config={"model": "sim-1"}, accept=Accept(
        checks=[check(strong_enough)], escalate=[{"model": "sim-big"}]))
    async def extract(ctx, source: bytes) -> dict:
        answer = await ctx.chat([{"role": "user", "content": source.decode()}], model=ctx.config["model"],
                                json_mode=True)
        return {"title": answer.data["title"], "model": ctx.config["model"]}
"""


def test_each_escalation_try_is_an_attempt_with_its_own_cost(tmp_path: Path, store_url: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openai")
    from conveyor.providers.simulator import SimConfig, run_simulator
    from tests.helpers import make_docs

    target = write_pipeline(tmp_path, CASCADE)
    docs = make_docs(tmp_path / "docs", 3, "invoice number {i} total 12 EUR")
    with run_simulator(SimConfig(seed=1)) as url:
        monkeypatch.setenv("SIM_URL", url)
        done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    store = open_store(store_url)
    try:
        rows = store.db.execute("SELECT outcome, tier, model, provider_calls, cost FROM attempts WHERE run_id = ? "
                                "ORDER BY id", (done.run_id,))
    finally:
        store.close()
    by_tier = {(r[0], r[1], r[2].split("@")[0]) for r in rows}
    assert by_tier == {("escalated", 0, "sim-1"), ("succeeded", 1, "sim-big")}
    small = [float(r[4]) for r in rows if r[1] == 0]
    big = [float(r[4]) for r in rows if r[1] == 1]
    assert len(small) == len(big) == 3 and all(r[3] == 1 for r in rows)
    assert all(b > s > 0 for s, b in zip(small, big, strict=True)), "each tier's try is paid for at its own price"
    assert reconciled(store_url, done.run_id)["usage"]["cost"] == pytest.approx(sum(small) + sum(big))


FENCED = """
    import os
    from conveyor import Pipeline, Retry
    from conveyor.acceptance import Accept
    from conveyor.providers.openai_provider import OpenAIProvider

    def provider():
        return OpenAIProvider(os.environ["SIM_URL"], "sim", timeout=5, prices={"sim-1": [1.0, 4.0]})

    pipe = Pipeline("fenced", provider=provider, retry=Retry(max_attempts=1))

    @pipe.stage(version="1", accept=Accept(repair=True))
    async def extract(ctx, source: bytes):
        answer = await ctx.chat([{"role": "user", "content": source.decode()}], model="sim-1", json_mode=True)
        return answer.text
"""


def test_a_malformed_json_mode_answer_reaches_the_judge_and_is_repaired(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """JSON mode behind an acceptance boundary: a fenced answer is not a provider failure (malformed_output,
    retried and paid again) but the judge's to repair, once, and the attempt says it was repaired."""
    pytest.importorskip("openai")
    from conveyor.providers.simulator import SimConfig, run_simulator
    from tests.helpers import make_docs

    target = write_pipeline(tmp_path, FENCED)
    docs = make_docs(tmp_path / "docs", 3, "invoice number {i} total 12 EUR")
    with run_simulator(SimConfig(seed=1, fenced_rate=1.0)) as url:
        monkeypatch.setenv("SIM_URL", url)
        done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    store = open_store(store_url)
    try:
        rows = store.db.execute("SELECT outcome, error_class, repaired, provider_calls FROM attempts "
                                "WHERE run_id = ?", (done.run_id,))
    finally:
        store.close()
    assert sorted(tuple(r) for r in rows) == [("succeeded", None, 1, 1)] * 3
    assert reconciled(store_url, done.run_id)["outcomes"] == {"completed": 3}


EXTERNAL = """
    import json, os
    from conveyor import Pipeline, Retry
    from conveyor.acceptance import Accept, found_in

    class Ledger:
        '''An external system that honours idempotency keys: one line per published key.'''

        def __init__(self, path):
            self.path = path

        def published(self, key):
            return os.path.exists(self.path) and any(json.loads(l)["key"] == key for l in open(self.path))

        def publish(self, key, record):
            with open(self.path, "a") as out:
                out.write(json.dumps({"key": key, "record": record}) + "\\n")
            raise ConnectionResetError("the connection dropped before the ledger's answer came back")

    pipe = Pipeline("ledger", retry=Retry(max_attempts=3, base=0.01, cap=0.01))

    @pipe.stage(version="1", accept=Accept(checks=[found_in("word")]))
    def extract(ctx, source: bytes) -> dict:
        return {"word": source.decode().split()[-1]}

    @pipe.stage(after=extract, kind="publish", into=Ledger(os.environ["LEDGER"]))
    def publish(ctx, record: dict) -> dict:
        return record
"""


def test_an_external_target_publishes_once_per_key(tmp_path: Path, store_url: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers import make_docs

    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("LEDGER", str(ledger))
    target = write_pipeline(tmp_path, EXTERNAL)
    docs = make_docs(tmp_path / "docs", 3, "entry {i}")
    # Every first delivery publishes and then loses its answer (the effect happened, the commit did not):
    # the retry asks the ledger first and publishes nothing twice.
    done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert len(lines) == 3 and len({line["key"] for line in lines}) == 3, "asked first, published once"
    assert reconciled(store_url, done.run_id)["outcomes"] == {"published": 3}


def test_into_takes_a_collection_or_a_target() -> None:
    pipe = Pipeline("p")
    with pytest.raises(PipelineError, match="publish stages"):
        pipe.stage(into="docs")(lambda ctx, s: s)
    with pytest.raises(PipelineError, match="published"):
        pipe.stage(kind="publish", into=42)(lambda ctx, s: s)  # type: ignore[arg-type]
