"""``ctx.log`` lines kept per attempt: across retries, in sync, async and guarded (child process) stages, bounded
(200 lines, 64 KiB, the rest counted as dropped), written with the attempt's row, shown by `conveyor show --logs`
and in `show --json`. On both backends."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from conveyor.runtime.attemptlog import LINE_CHARS, MAX_BYTES, MAX_LINES, AttemptLog
from tests.helpers import cli, cli_json, query, submit_and_work, write_pipeline

PIPE = """
    import asyncio

    from conveyor import Pipeline, Retry

    pipe = Pipeline("logs", retry=Retry(max_attempts=2, base=0.01))

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> dict:
        text = source.decode()
        ctx.log.info("parsing %d bytes", len(source))
        if text.startswith("flaky") and ctx.attempt == 1:
            ctx.log.warning("the parser is busy")
            raise RuntimeError("the parser was busy")
        if text.startswith("chatty"):
            for i in range(10_000):
                ctx.log.debug("line %d", i)
        if text.startswith("wide"):
            for i in range(100):
                ctx.log.info("%03d", i) if i % 2 else ctx.log.info("x" * 2000)
        if text.startswith("oops"):
            try:
                {}["missing"]
            except KeyError:
                ctx.log.exception("no such field")
        return {"text": text}

    @pipe.stage(after=parse)
    async def enrich(ctx, doc: dict) -> dict:
        await asyncio.sleep(0)
        ctx.log.info("enriched %s", ctx.item_key)
        return doc

    @pipe.stage(after=enrich, timeout=30)
    def guarded(ctx, doc: dict) -> dict:
        ctx.log.error("from the child process")
        if doc["text"].startswith("flaky"):
            raise ValueError("refused in the child")
        return doc
"""


def _run(tmp_path: Path, store_url: str) -> tuple[str, list[str]]:
    target = write_pipeline(tmp_path, PIPE)
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in {"a.txt": "plain", "f.txt": "flaky one", "c.txt": "chatty", "w.txt": "wide",
                       "o.txt": "oops"}.items():
        (docs / name).write_text(text)
    run_id = submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id
    return run_id, ["--db", store_url, "--blobs", str(tmp_path / "blobs")]


def _task(shown: dict[str, Any], stage: str) -> dict[str, Any]:
    return next(t for t in shown["tasks"] if t["stage"] == stage)


def _messages(attempt: dict[str, Any]) -> list[str]:
    return [line["message"] for line in attempt["logs"]]


def test_lines_are_kept_per_attempt_across_retries_and_processes(tmp_path: Path, store_url: str) -> None:
    run_id, db = _run(tmp_path, store_url)

    flaky = cli_json("show", run_id, "f.txt", *db, cwd=tmp_path)
    first, second = _task(flaky, "parse")["history"]
    assert (first["outcome"], second["outcome"]) == ("retry", "succeeded")
    assert _messages(first) == ["parsing 9 bytes", "the parser is busy"]
    assert [line["level"] for line in first["logs"]] == ["INFO", "WARNING"]
    assert _messages(second) == ["parsing 9 bytes"] and second["logs_dropped"] == 0
    assert all(isinstance(line["t"], float) and line["t"] >= 0 for line in first["logs"])
    (enriched,) = _task(flaky, "enrich")["history"]
    assert _messages(enriched) == ["enriched f.txt"]
    # a guarded stage logs in its child process; a failed attempt keeps what it logged before it raised
    guarded = _task(flaky, "guarded")["history"]
    assert [a["outcome"] for a in guarded] == ["retry", "dead_lettered"]
    assert all(_messages(a) == ["from the child process"] for a in guarded)

    plain = cli_json("show", run_id, "a.txt", *db, cwd=tmp_path)
    (only,) = _task(plain, "parse")["history"]
    assert _messages(only) == ["parsing 5 bytes"] and only["logs_dropped"] == 0
    (guarded_ok,) = _task(plain, "guarded")["history"]
    assert guarded_ok["outcome"] == "succeeded" and _messages(guarded_ok) == ["from the child process"]

    oops = cli_json("show", run_id, "o.txt", *db, cwd=tmp_path)
    (line,) = [x for x in _task(oops, "parse")["history"][0]["logs"] if x["level"] == "ERROR"]
    assert line["message"].startswith("no such field\nTraceback") and "KeyError: 'missing'" in line["message"]


def test_a_stage_that_logs_ten_thousand_lines_stays_within_the_bound(tmp_path: Path, store_url: str) -> None:
    run_id, db = _run(tmp_path, store_url)

    chatty = cli_json("show", run_id, "c.txt", *db, cwd=tmp_path)
    (attempt,) = _task(chatty, "parse")["history"]
    assert len(attempt["logs"]) == MAX_LINES
    assert attempt["logs_dropped"] == 10_001 - MAX_LINES  # "parsing 6 bytes", then 10,000 lines
    assert _messages(attempt)[:3] == ["parsing 6 bytes", "line 0", "line 1"]
    assert [line["level"] for line in attempt["logs"][1:]] == ["DEBUG"] * (MAX_LINES - 1)

    wide = cli_json("show", run_id, "w.txt", *db, cwd=tmp_path)
    (attempt,) = _task(wide, "parse")["history"]
    kept = sum(len(m.encode()) for m in _messages(attempt))
    assert kept <= MAX_BYTES and attempt["logs_dropped"] > 0
    assert len(attempt["logs"]) + attempt["logs_dropped"] == 101
    # what the row holds is bounded too (JSON of the lines: the text plus a few bytes a line)
    (size,) = query(store_url, "SELECT MAX(LENGTH(logs)) FROM attempts")[0]
    assert size < MAX_BYTES + MAX_LINES * 40


def test_show_logs_prints_each_attempts_lines(tmp_path: Path, store_url: str) -> None:
    run_id, db = _run(tmp_path, store_url)

    text = cli("show", run_id, "f.txt", "--logs", *db, cwd=tmp_path).stdout
    lines = text.splitlines()
    retry = next(i for i, line in enumerate(lines) if line.strip().startswith("#1 retry"))
    assert "INFO parsing 9 bytes" in lines[retry + 1] and "WARNING the parser is busy" in lines[retry + 2]
    assert lines[retry + 1].strip().startswith("+")
    assert "INFO parsing 9 bytes" in lines[retry + 4]  # after "#2 succeeded"
    without = cli("show", run_id, "f.txt", *db, cwd=tmp_path).stdout
    assert "the parser is busy" not in without

    chatty = cli("show", run_id, "c.txt", "--logs", "--stage", "parse", *db, cwd=tmp_path).stdout
    assert f"{10_001 - MAX_LINES:,} more line(s) dropped" in chatty


def test_records_still_reach_the_python_logger_from_the_stage_line(tmp_path: Path, store_url: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="conveyor.stage")
    _run(tmp_path, store_url)
    busy = next(r for r in caplog.records if r.getMessage() == "the parser is busy")
    assert busy.funcName == "parse" and busy.filename == "pipe.py"
    assert (busy.stage, busy.item, busy.attempt) == ("parse", "f.txt", 1)  # type: ignore[attr-defined]


def test_the_buffer_bounds_lines_bytes_and_line_width() -> None:
    kept = AttemptLog()
    for _ in range(3):
        kept.keep(logging.INFO, "y" * (LINE_CHARS * 2))
    assert [len(m) for _, _, m in kept.lines] == [LINE_CHARS] * 3 and kept.lines[0][2].endswith("…")
    other = AttemptLog()
    other.extend([(0.5, "INFO", "a"), (0.6, "ERROR", "b")], 7)
    assert [(level, m) for _, level, m in other.lines] == [("INFO", "a"), ("ERROR", "b")] and other.dropped == 7
    assert AttemptLog().encoded() is None
