"""The engine on both backends: memo, re-runs, fan-out, retries, dead letters, guards."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conveyor.service.report import dlq_list, dlq_replay
from conveyor.store import open_store
from tests.helpers import make_docs, reconciled, submit_and_work, work, write_pipeline

BASIC = """
    import os
    from conveyor import Pipeline, Retry

    pipe = Pipeline("basic")
    SINK = os.environ.get("SINK", "sink.log")

    @pipe.stage(version=os.environ.get("PARSE_VERSION", "1"))
    def parse(ctx, source: bytes) -> dict:
        return {"text": source.decode(), "n": len(source)}

    @pipe.stage(after=parse, version=os.environ.get("EXTRACT_VERSION", "1"))
    async def extract(ctx, doc: dict) -> dict:
        return {"words": doc["text"].split()}

    @pipe.stage(after=extract, kind="fanout")
    def chunk(ctx, doc: dict) -> list[dict]:
        return [{"word": w} for w in doc["words"]]

    @pipe.stage(after=chunk)
    def upper(ctx, part: dict) -> str:
        return part["word"].upper()

    @pipe.stage(after=extract, kind="publish")
    def publish(ctx, fields: dict) -> None:
        with open(SINK, "a") as sink:
            sink.write(f"{ctx.item_key} {ctx.idempotency_key}\\n")
"""



def test_run_publishes_every_item_once_and_rerun_makes_no_calls(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = tmp_path / "sink.log"
    monkeypatch.setenv("SINK", str(sink))
    target = write_pipeline(tmp_path, BASIC)
    docs = make_docs(tmp_path / "docs", 20, "alpha beta {i}")

    first = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    report = reconciled(store_url, first.run_id)
    assert report["expected"] == 20
    assert report["outcomes"] == {"published": 20}
    assert report["unaccounted"] == 0
    # parse, extract, chunk, publish per item; upper once per distinct word:
    # "alpha" and "beta" are in every item and are paid for once.
    assert report["stage_calls"] == 20 * 4 + 2 + 20
    assert report["cached"] == 2 * 19
    assert len(sink.read_text().splitlines()) == 20

    second = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    again = reconciled(store_url, second.run_id)
    assert again["stage_calls"] == 0
    assert again["cached"] == 20 * 7
    assert again["outcomes"] == {"published": 20}
    assert len(sink.read_text().splitlines()) == 20, "a cached re-run must not publish again"


def test_version_bump_reruns_that_stage_and_downstream_only_on_changed_input(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SINK", str(tmp_path / "sink.log"))
    target = write_pipeline(tmp_path, BASIC)
    docs = make_docs(tmp_path / "docs", 5, "one two {i}")
    submit_and_work(target, docs, store_url, tmp_path / "blobs")

    # extract v2 gives the same output: only extract re-runs, everything after it is cached.
    monkeypatch.setenv("EXTRACT_VERSION", "2")
    from conveyor.runtime import target as target_module

    target_module._cache.clear()
    target2 = write_pipeline(tmp_path, BASIC, name="pipe_v2.py")
    second = submit_and_work(target2, docs, store_url, tmp_path / "blobs")
    report = reconciled(store_url, second.run_id)
    assert report["stage_calls"] == 5  # extract only
    assert report["outcomes"] == {"published": 5}

    # One document changes: its whole chain runs again, the others stay cached.
    (docs / "doc0000.txt").write_text("changed text here")
    third = submit_and_work(target2, docs, store_url, tmp_path / "blobs")
    report = reconciled(store_url, third.run_id)
    assert report["stage_calls"] == 4 + 3  # parse, extract, chunk, publish + 3 words
    assert len((tmp_path / "sink.log").read_text().splitlines()) == 6


FLAKY = """
    import os
    from pathlib import Path
    from conveyor import Pipeline, Retry, RetryLater, TerminalError

    pipe = Pipeline("flaky", retry=Retry(max_attempts=3, base=0.01, cap=0.05))
    STATE = Path(os.environ["STATE"])

    def bump(ctx) -> int:
        path = STATE / f"{ctx.stage}-{ctx.item_key}".replace("/", "_")
        count = int(path.read_text()) + 1 if path.exists() else 1
        path.write_text(str(count))
        return count

    class HttpError(Exception):
        def __init__(self, status_code, retry_after=None):
            super().__init__(f"HTTP {status_code}")
            self.status_code = status_code
            self.headers = {"retry-after": str(retry_after)} if retry_after is not None else {}

    @pipe.stage(version="1")
    def work(ctx, source: bytes) -> str:
        n = bump(ctx)
        text = source.decode()
        if text.startswith("flaky") and n < 3:
            raise ConnectionError("connection reset")
        if text.startswith("poison"):
            raise KeyError("no such field")
        if text.startswith("terminal"):
            raise TerminalError("document refused", error_class="refused")
        if text.startswith("declared"):
            raise ValueError("bad value")
        if text.startswith("badrequest"):
            raise HttpError(400)
        if text.startswith("ratelimited") and n < 2:
            raise HttpError(429, retry_after=1)
        if text.startswith("later") and n < 2:
            raise RetryLater(after=1)
        return text

    @pipe.stage(after=work, retry=Retry(max_attempts=3, base=0.01, terminal=(ValueError,)))
    def check(ctx, text: str) -> str:
        return text
"""


def test_retries_terminal_errors_and_dead_letters(tmp_path: Path, store_url: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("STATE", str(state))
    target = write_pipeline(tmp_path, FLAKY)
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("ok", "flaky", "poison", "terminal", "badrequest", "ratelimited", "later"):
        (docs / name).write_text(f"{name} text")
    started = time.monotonic()
    done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    elapsed = time.monotonic() - started
    report = reconciled(store_url, done.run_id)

    assert report["outcomes"] == {"completed": 4, "dead_lettered": 1, "failed": 2}
    assert report["unaccounted"] == 0
    calls = {p.name: int(p.read_text()) for p in state.iterdir()}
    assert calls["work-flaky"] == 3
    assert calls["work-poison"] == 3, "poison must be dead-lettered after exactly max_attempts"
    assert calls["work-terminal"] == 1 and calls["work-badrequest"] == 1, "terminal errors never retry"
    assert calls["work-ratelimited"] == 2 and calls["work-later"] == 2
    assert elapsed >= 1.0, "Retry-After / RetryLater(after=1) must be honoured"
    classes = {e["item_key"]: e["error_classes"] for e in report["not_done"]}
    assert classes == {"poison": ["key_error"], "terminal": ["refused"], "badrequest": ["http_400"]}

    store = open_store(store_url)
    try:
        entries = dlq_list(store, run_id=done.run_id)["entries"]
        assert [(e["item_key"], e["stage"], e["error_class"], e["attempts"]) for e in entries] == [
            ("poison", "work", "key_error", 3)]
        assert "KeyError" in entries[0]["error"] and "Traceback" in entries[0]["error"]
        replay = dlq_replay(store, [entries[0]["id"]], reason="parser fixed")
        assert replay["replayed"] == 1
        assert dlq_list(store, run_id=done.run_id)["entries"] == []
        assert dlq_list(store, run_id=done.run_id, include_replayed=True)["entries"][0]["replay_reason"] == \
            "parser fixed"
    finally:
        store.close()
    work(target, store_url, tmp_path / "blobs", run_id=done.run_id)
    assert int((state / "work-poison").read_text()) == 6, "a replay gets a fresh attempt budget"


def test_declared_terminal_exception_fails_at_once(tmp_path: Path, store_url: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("STATE", str(state))
    source = FLAKY.replace('raise ValueError("bad value")', 'raise ValueError("bad value")').replace(
        "return text\n\n    @pipe", "return text\n\n    @pipe")
    target = write_pipeline(tmp_path, source + """
    @pipe.stage(after=check, retry=Retry(max_attempts=5, terminal=(ValueError,)))
    def strict(ctx, text: str) -> str:
        raise ValueError("never valid")
""")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ok").write_text("ok")
    done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    report = reconciled(store_url, done.run_id)
    assert report["outcomes"] == {"failed": 1}
    task = report["not_done"][0]["tasks"][0]
    assert (task["stage"], task["status"], task["attempts"], task["error_class"]) == (
        "strict", "failed", 1, "terminal")


GUARDED = """
    import time
    from conveyor import Pipeline, Retry

    pipe = Pipeline("guarded", retry=Retry(max_attempts=1))

    @pipe.stage(version="1", timeout=1, max_input_bytes=1000)
    def parse(ctx, source: bytes) -> str:
        if source.startswith(b"hang"):
            time.sleep(3600)
        return source.decode()[:10]
"""


def test_hang_becomes_timeout_and_oversize_input_is_never_read(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, GUARDED)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "hang").write_text("hang forever")
    (docs / "small").write_text("small doc")
    with open(docs / "huge", "wb") as huge:  # 900 MB, sparse: reading it would show in time and memory
        huge.truncate(900_000_000)
    started = time.monotonic()
    done = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    elapsed = time.monotonic() - started
    report = reconciled(store_url, done.run_id)
    assert report["outcomes"] == {"completed": 1, "dead_lettered": 1, "failed": 1}
    classes = {e["item_key"]: e["error_classes"] for e in report["not_done"]}
    assert classes == {"hang": ["timeout"], "huge": ["input_too_large"]}
    assert elapsed < 1 + 2 + 5, f"the hang took {elapsed:.1f}s to become a failure"
    blob_bytes = sum(f.stat().st_size for f in (tmp_path / "blobs").rglob("*") if f.is_file())
    assert blob_bytes < 1_000_000, "the oversize input must not be copied into the blob store"


DEDUPE = """
    import os
    from conveyor import Pipeline, TerminalError

    pipe = Pipeline("dedupe")

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> str:
        with open(os.environ["CALLS"], "a") as calls:
            calls.write(ctx.item_key + "\\n")
        if source.startswith(b"refuse"):
            raise TerminalError("not a document", error_class="not_a_document")
        return source.decode().upper()

    @pipe.stage(after=parse, kind="publish")
    def publish(ctx, text: str) -> None:
        with open(os.environ["SINK"], "a") as sink:
            sink.write(f"{ctx.item_key} {text}\\n")
"""


def test_same_content_is_paid_once_but_published_per_item_and_refusals_are_memoised(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, sink = tmp_path / "calls.log", tmp_path / "sink.log"
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setenv("SINK", str(sink))
    target = write_pipeline(tmp_path, DEDUPE)
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("a", "b", "c"):
        (docs / name).write_text("same words")
    (docs / "bad").write_text("refuse me")

    first = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    report = reconciled(store_url, first.run_id)
    assert report["outcomes"] == {"published": 3, "failed": 1}
    assert len(calls.read_text().splitlines()) == 2, "identical content is parsed once"
    assert sorted(line.split()[0] for line in sink.read_text().splitlines()) == ["a", "b", "c"]

    second = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    again = reconciled(store_url, second.run_id)
    assert again["stage_calls"] == 0, "a refusal decided by the content is not paid for again"
    assert again["outcomes"] == {"published": 3, "failed": 1}
    assert again["not_done"][0]["error_classes"] == ["not_a_document"]
    assert len(sink.read_text().splitlines()) == 3


REQUEUE = """
    import os
    from conveyor import Pipeline, Retry, TerminalError

    pipe = Pipeline("requeue", retry=Retry(max_attempts=2, base=0.01, cap=0.02))
    FIXED = os.environ.get("PARSER_FIXED") == "1"

    @pipe.stage(version="2" if FIXED else "1")
    def parse(ctx, source: bytes) -> str:
        if source.startswith(b"bad") and not FIXED:
            raise TerminalError("cannot parse", error_class="unparseable")
        if source.startswith(b"flaky") and not FIXED:
            raise ConnectionError("reset")
        return source.decode().upper()

    @pipe.stage(after=parse, kind="publish")
    def publish(ctx, text: str) -> None:
        with open(os.environ["SINK"], "a") as sink:
            sink.write(ctx.item_key + "\\n")
"""


def test_requeue_a_selection_under_the_fixed_version(tmp_path: Path, store_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from conveyor.blobs import open_blobs
    from conveyor.runtime import target as target_module
    from conveyor.runtime.target import load_target
    from conveyor.service.replay import requeue

    sink = tmp_path / "sink.log"
    monkeypatch.setenv("SINK", str(sink))
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("good", "bad1", "bad2", "flaky"):
        (docs / name).write_text(f"{name} text")
    target = write_pipeline(tmp_path, REQUEUE)
    run = submit_and_work(target, docs, store_url, tmp_path / "blobs")
    assert reconciled(store_url, run.run_id)["outcomes"] == {"published": 1, "failed": 2, "dead_lettered": 1}

    # The parser is fixed and its version bumped: re-run only what failed as unparseable under version 1.
    monkeypatch.setenv("PARSER_FIXED", "1")
    target_module._cache.clear()
    fixed = write_pipeline(tmp_path, REQUEUE, name="pipe_fixed.py")
    store = open_store(store_url)
    try:
        done = requeue(load_target(fixed), store, open_blobs(str(tmp_path / "blobs")), run.run_id, "parse",
                       "parser fixed in v2", ("failed",), "unparseable", "1")
    finally:
        store.close()
    assert done["requeued"] == 2
    work(fixed, store_url, tmp_path / "blobs", run_id=run.run_id)
    report = reconciled(store_url, run.run_id)
    assert report["outcomes"] == {"published": 3, "dead_lettered": 1}, "flaky was not selected"
    assert sorted(sink.read_text().split()) == ["bad1", "bad2", "good"]

    # The fixed version's outputs are in the memo: a new run of the same input under v2 parses only what
    # v2 never saw (good, flaky); good's publish input is unchanged, so only flaky is published anew.
    again = submit_and_work(fixed, docs, store_url, tmp_path / "blobs")
    assert reconciled(store_url, again.run_id)["stage_calls"] == 2 + 1
    assert sorted(sink.read_text().split()) == ["bad1", "bad2", "flaky", "good"]


def test_a_batch_that_fills_its_stage_cap_is_followed_by_a_claim_in_its_commit(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a batch holding its stage's whole cap, a claim beside it takes nothing; the commit of that batch,
    which frees the cap, claims the next one. (It claimed nothing, and the worker went down the idle path once
    per batch: a check for open tasks, which counted every queued task, and a sleep.)"""
    from conveyor.store.reports import ReportQueries

    target = write_pipeline(tmp_path, """
        from conveyor import Pipeline

        pipe = Pipeline("capped")

        @pipe.stage
        def size(ctx, source: bytes) -> dict:
            return {"n": len(source)}
    """)
    checks: list[str] = []
    asked = ReportQueries.any_open_tasks

    def counted(self: ReportQueries, pipeline: str, run_id: str | None = None, declared: object = None) -> bool:
        checks.append(pipeline)
        return asked(self, pipeline, run_id, declared)  # type: ignore[arg-type]

    monkeypatch.setattr(ReportQueries, "any_open_tasks", counted)
    done = submit_and_work(target, make_docs(tmp_path / "docs", 200), store_url, tmp_path / "blobs",
                           batch_size=10, max_inflight=20)
    assert reconciled(store_url, done.run_id)["outcomes"] == {"completed": 200}
    assert len(checks) <= 3, f"the worker asked whether it was done {len(checks)} times for 20 batches"
