"""Code changes are not silently cached: a memo answer made by other code under the same stage version is
reported once per stage (stale_code), until the version is bumped or the change accepted (both backends)."""

from __future__ import annotations

import json
from pathlib import Path

from conveyor.runtime.fingerprint import code_fingerprint
from tests.helpers import cli, make_docs, write_pipeline

PIPE = """
    from conveyor import Pipeline

    pipe = Pipeline("coded")

    @pipe.stage(version="{version}")
    def parse(ctx, source: bytes) -> dict:
        {parse_body}

    @pipe.stage(after=parse)
    def count(ctx, doc: dict) -> int:
        return len(doc["text"])
"""
ORIGINAL = 'return {"text": source.decode()}'
CHANGED = 'return {"text": source.decode().strip()}'
COMMENTED = 'return {"text": source.decode()}  # a comment changes nothing'


def _run(tmp_path: Path, store_url: str, body: str, *extra: str, version: str = "1") -> tuple[dict, list[str]]:
    target = write_pipeline(tmp_path, PIPE.replace("{version}", version).replace("{parse_body}", body))
    proc = cli("run", target, "--input", str(tmp_path / "docs"), "--workers", "1", "--json", "--db", store_url,
               "--blobs", str(tmp_path / "blobs"), *extra, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: stage")]
    return json.loads(proc.stdout), warnings


def test_stale_code_is_reported_once_per_stage_until_bumped_or_accepted(tmp_path: Path, store_url: str) -> None:
    make_docs(tmp_path / "docs", 5)
    first, warnings = _run(tmp_path, store_url, ORIGINAL)
    assert first["stale_code"] == [] and warnings == [] and first["stage_calls"] == 10

    same, warnings = _run(tmp_path, store_url, COMMENTED)
    assert same["stale_code"] == [] and warnings == [] and same["stage_calls"] == 0, "a comment is not code"

    changed, warnings = _run(tmp_path, store_url, CHANGED)
    assert [{k: s[k] for k in ("stage", "version")} for s in changed["stale_code"]] == [
        {"stage": "parse", "version": "1"}]
    assert changed["stale_code"][0]["tasks"] == 5
    assert len(warnings) == 1, "once per stage, not once per task"
    assert "stage 'parse' (version 1)" in warnings[0] and "Bump version=" in warnings[0]
    assert "--accept-code-change parse" in warnings[0]
    assert changed["stage_calls"] == 0, "the memo still answers: the run says so instead of silently"
    status = cli("status", changed["run_id"], "--json", "--db", store_url, cwd=tmp_path)
    assert json.loads(status.stdout)["stale_code"][0]["stage"] == "parse"

    accepted, warnings = _run(tmp_path, store_url, CHANGED, "--accept-code-change", "parse")
    assert accepted["stale_code"] == [] and warnings == []
    again, warnings = _run(tmp_path, store_url, CHANGED.replace(".strip()", ".rstrip()"), "--accept-code-change")
    assert again["stale_code"] == [] and warnings == [], "without a stage name it accepts every stage"
    later, warnings = _run(tmp_path, store_url, CHANGED)
    assert later["stale_code"] == [] and warnings == [], "an acceptance holds for that code from then on"

    bumped, warnings = _run(tmp_path, store_url, CHANGED, version="2")
    assert bumped["stale_code"] == [] and warnings == [] and bumped["stage_calls"] == 5


def test_an_unknown_stage_to_accept_is_a_user_error(tmp_path: Path) -> None:
    make_docs(tmp_path / "docs", 1)
    target = write_pipeline(tmp_path, PIPE.replace("{version}", "1").replace("{parse_body}", ORIGINAL))
    proc = cli("run", target, "--input", str(tmp_path / "docs"), "--accept-code-change", "nope",
               "--db", f"sqlite:///{tmp_path}/c.db", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: pipeline 'coded' has no stage 'nope'"


def test_the_fingerprint_ignores_layout_comments_docstrings_and_decorators() -> None:
    def a(ctx, x):  # type: ignore[no-untyped-def]
        return x + 1

    def b(ctx, x):  # type: ignore[no-untyped-def]
        """A docstring."""
        # a comment
        return (x
                + 1)

    def c(ctx, x):  # type: ignore[no-untyped-def]
        return x + 2

    assert code_fingerprint(a) != code_fingerprint(c)
    fingerprints = {code_fingerprint(f) for f in (a, b)}
    assert len(fingerprints) == 1
    built = eval("lambda ctx, x: x + 1")  # no source: the compiled code is fingerprinted
    assert len(code_fingerprint(built)) == 16


def test_a_worker_says_once_per_stage_when_its_commits_met_other_code(tmp_path: Path, store_url: str) -> None:
    make_docs(tmp_path / "docs", 5)
    _run(tmp_path, store_url, ORIGINAL)
    # parse runs again (version 2) and makes the same outputs; count's code changed under its version 1.
    source = (PIPE.replace("{version}", "2").replace("{parse_body}", ORIGINAL)
              .replace('return len(doc["text"])', 'return len(doc["text"]) + 0'))
    target = write_pipeline(tmp_path, source, "changed.py")
    common = ["--db", store_url, "--blobs", str(tmp_path / "blobs")]
    submitted = json.loads(cli("submit", target, "--input", str(tmp_path / "docs"), "--json", *common,
                               cwd=tmp_path).stdout)
    worker = cli("worker", target, "--until-idle", "--json", *common, cwd=tmp_path)
    assert worker.returncode == 0, worker.stderr
    assert json.loads(worker.stdout)["stale_code"] == 5
    warnings = [line for line in worker.stderr.splitlines() if "answered from outputs that other code made" in line]
    assert len(warnings) == 1 and "stage 'count' (version 1)" in warnings[0]
    status = json.loads(cli("status", submitted["run_id"], "--json", "--db", store_url, cwd=tmp_path).stdout)
    assert [s["stage"] for s in status["stale_code"]] == ["count"]
