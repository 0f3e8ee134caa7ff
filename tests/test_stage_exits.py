"""Nothing a stage does wedges a worker: exits and interrupts raised by stage code, malformed Retry-After
headers and a failing lease renewal are ordinary, classified events (both backends)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conveyor.store import SqlStore
from tests.helpers import reconciled, submit_and_work, write_pipeline

EXITS = """
    import asyncio, os, sys, time
    from conveyor import Pipeline, Retry

    pipe = Pipeline("exits", retry=Retry(max_attempts=2, base=0.01, cap=0.02))

    def misbehave(key):
        if key.startswith("exit"):
            sys.exit(3)
        if key.startswith("kbd"):
            raise KeyboardInterrupt("stage code pressed Ctrl-C")
        if key.startswith("gen"):
            raise GeneratorExit()

    @pipe.stage
    def sync_stage(ctx, source: bytes) -> str:
        misbehave(ctx.item_key)
        return source.decode()

    @pipe.stage(after=sync_stage)
    async def async_stage(ctx, text: str) -> str:
        if ctx.item_key.endswith("-async"):
            await asyncio.sleep(0)
            misbehave(ctx.item_key)
        return text

    @pipe.stage(after=async_stage, timeout=30)
    def guarded_stage(ctx, text: str) -> str:
        if ctx.item_key.endswith("-guarded"):
            misbehave(ctx.item_key)
        return text

    @pipe.stage(after=guarded_stage, timeout=5)
    async def async_with_timeout(ctx, text: str) -> str:
        if ctx.item_key.endswith("-timed"):
            misbehave(ctx.item_key)
        return text
"""


def _manifest(path: Path, keys: list[str]) -> Path:
    path.write_text("".join(json.dumps({"key": key, "text": key}) + "\n" for key in keys))
    return path



@pytest.mark.timeout(180)
def test_exits_and_interrupts_raised_by_stage_code_are_failures_of_that_task(tmp_path: Path, store_url: str) -> None:
    keys = ["fine-1", "exit-sync", "kbd-sync", "gen-sync", "exit-async", "kbd-async", "gen-async",
            "exit-guarded", "kbd-guarded", "exit-timed", "kbd-timed", "gen-timed", "fine-2"]
    target = write_pipeline(tmp_path, EXITS)
    done = submit_and_work(target, _manifest(tmp_path / "m.jsonl", keys), store_url, tmp_path / "blobs")
    report = reconciled(store_url, done.run_id)

    assert report["unaccounted"] == 0
    assert report["outcomes"] == {"completed": 2, "dead_lettered": 11}
    classes = {e["item_key"]: e["error_classes"] for e in report["not_done"]}
    expected = {"exit": ["system_exit"], "kbd": ["keyboard_interrupt"], "gen": ["generator_exit"]}
    assert classes == {key: expected[key.split("-")[0]] for key in keys if not key.startswith("fine")}
    assert all(t["attempts"] == 2 for e in report["not_done"] for t in e["tasks"]), "retried per policy"


HEADERS = """
    from conveyor import Pipeline, Retry

    pipe = Pipeline("headers", retry=Retry(max_attempts=3, base=0.01, cap=0.02))

    class Answer:
        def __init__(self, headers):
            self.headers = headers

    class RateLimited(Exception):
        status_code = 429

        def __init__(self, headers):
            super().__init__("429 Too Many Requests")
            self.response = Answer(headers)

    @pipe.stage
    async def call(ctx, source: bytes) -> str:
        name, value = source.decode().split("=", 1)
        if ctx.attempt == 1:
            raise RateLimited({name: value})
        return value
"""


@pytest.mark.timeout(120)
def test_malformed_retry_after_headers_fall_back_to_backoff(tmp_path: Path, store_url: str) -> None:
    lines = [f"{name}={value}" for name in ("retry-after-ms", "retry-after")
             for value in ("soon", "-1", "1e999", "nan", "")]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"key": f"k{i}", "text": line}) + "\n" for i, line in enumerate(lines)))
    target = write_pipeline(tmp_path, HEADERS)
    done = submit_and_work(target, manifest, store_url, tmp_path / "blobs")
    report = reconciled(store_url, done.run_id)
    assert report["outcomes"] == {"completed": len(lines)}
    assert report["attempt_errors"] == {"rate_limited": len(lines)}


SLOW = """
    import asyncio
    from conveyor import Pipeline, Retry

    pipe = Pipeline("renewal", lease_seconds=1, retry=Retry(max_attempts=1))

    @pipe.stage
    async def slow(ctx, source: bytes) -> str:
        await asyncio.sleep(2.5)
        return source.decode()
"""


@pytest.mark.timeout(120)
def test_a_failed_lease_renewal_is_logged_and_renewal_goes_on(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    failures = []
    renew = SqlStore.renew_leases

    def flaky(self: SqlStore, tokens: Any, expires_at: float) -> int:
        if not failures:
            failures.append(expires_at)
            raise ConnectionError("the database went away for a moment")
        return renew(self, tokens, expires_at)

    monkeypatch.setattr(SqlStore, "renew_leases", flaky)
    target = write_pipeline(tmp_path, SLOW)
    done = submit_and_work(target, _manifest(tmp_path / "m.jsonl", ["a", "b"]), store_url, tmp_path / "blobs")
    report = reconciled(store_url, done.run_id)
    assert failures, "the renewal never failed: the test did not test anything"
    assert report["outcomes"] == {"completed": 2} and report["attempt_errors"] == {}
    assert "lease keeping failed (_renew)" in caplog.text
