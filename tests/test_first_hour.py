"""The first hour, as a new user meets it: exit codes, defaults, progress, a missing provider, one-line
errors, --help and --version (both backends where a store is involved)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import cli, cli_json, make_docs, write_pipeline

PIPE = """
    import time
    from conveyor import Pipeline, Retry

    pipe = Pipeline("first", retry=Retry(max_attempts=2, base=0.01))

    @pipe.stage
    def parse(ctx, source: bytes) -> str:
        time.sleep(float(__import__("os").environ.get("PARSE_S", "0")))
        if source.startswith(b"poison"):
            raise ValueError("cannot parse")
        if source.startswith(b"refuse"):
            from conveyor import TerminalError
            raise TerminalError("refused", error_class="unreadable")
        return source.decode()
"""


def _args(store_url: str, tmp_path: Path) -> list[str]:
    return ["--db", store_url, "--blobs", str(tmp_path / "blobs")]


def test_exit_codes_say_how_the_run_ended(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = make_docs(tmp_path / "docs", 3)
    good = cli("run", target, "--input", str(docs), "--json", *_args(store_url, tmp_path), cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["workers"] == (os.cpu_count() or 1), "--workers defaults to the CPU cores"

    (docs / "bad.txt").write_text("refuse me")
    failed = cli("run", target, "--input", str(docs), "--json", *_args(store_url, tmp_path), cwd=tmp_path)
    assert failed.returncode == 4 and json.loads(failed.stdout)["outcomes"] == {"completed": 3, "failed": 1}
    (docs / "bad.txt").write_text("poison pill")
    dead = cli("run", target, "--input", str(docs), "--json", *_args(store_url, tmp_path), cwd=tmp_path)
    assert dead.returncode == 4 and json.loads(dead.stdout)["outcomes"] == {"completed": 3, "dead_lettered": 1}
    reconciled = cli("reconcile", json.loads(dead.stdout)["run_id"], "--db", store_url, cwd=tmp_path)
    assert reconciled.returncode == 4


def test_a_run_without_a_terminal_prints_progress_lines(tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = make_docs(tmp_path / "docs", 12)
    proc = cli("run", target, "--input", str(docs), "--workers", "1", "--db", f"sqlite:///{tmp_path}/c.db",
               cwd=tmp_path, env={"CONVEYOR_PROGRESS_S": "0.3", "PARSE_S": "0.15"})
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("progress ")]
    assert lines, proc.stderr
    assert "parse " in lines[-1] and "/12" in lines[-1] and "tasks/s; ETA" in lines[-1]


PROVIDER = """
    from conveyor import Pipeline

    pipe = Pipeline("needs-a-model")

    @pipe.stage
    async def summarise(ctx, source: bytes) -> str:
        answer = await ctx.chat([{"role": "user", "content": source.decode()}], model="gpt-4o-mini")
        return answer.text
"""
HIDDEN = """
    from conveyor import Pipeline, Retry

    pipe = Pipeline("hidden-model", retry=Retry(max_attempts=3, base=0.01))

    async def ask(ctx, text):
        return await ctx.chat([{"role": "user", "content": text}], model="gpt-4o-mini")

    @pipe.stage
    async def summarise(ctx, source: bytes) -> str:
        return (await ask(ctx, source.decode())).text
"""
NO_PROVIDER = {"OPENAI_BASE_URL": "", "OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": ""}


def test_a_missing_model_provider_stops_at_start_with_what_to_set(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PROVIDER)
    docs = make_docs(tmp_path / "docs", 3)
    for command in (["run", target, "--input", str(docs)], ["worker", target, "--until-idle"]):
        proc = cli(*command, *_args(store_url, tmp_path), cwd=tmp_path, env=NO_PROVIDER)
        assert proc.returncode == 2, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith("error: no model provider configured: set OPENAI_BASE_URL")
    assert cli_json("status", "--db", store_url, cwd=tmp_path)["runs"] == [], "nothing was submitted"


def test_a_refused_run_leaves_no_store_and_no_blobs_behind(tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, PROVIDER)
    docs = make_docs(tmp_path / "docs", 3)
    proc = cli("run", target, "--input", str(docs), cwd=tmp_path, env={**NO_PROVIDER, "CONVEYOR_DB": "",
                                                                       "CONVEYOR_BLOBS": ""})
    assert proc.returncode == 2 and "no model provider configured" in proc.stderr
    assert not (tmp_path / ".conveyor").exists()


def test_a_model_call_found_only_at_run_time_stops_the_worker_and_releases_its_tasks(
    tmp_path: Path, store_url: str,
) -> None:
    target = write_pipeline(tmp_path, HIDDEN)
    docs = make_docs(tmp_path / "docs", 3)
    submitted = cli_json("submit", target, "--input", str(docs), *_args(store_url, tmp_path), cwd=tmp_path)
    proc = cli("worker", target, "--until-idle", *_args(store_url, tmp_path), cwd=tmp_path, env=NO_PROVIDER)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: no model provider configured")
    status = cli_json("status", submitted["run_id"], "--db", store_url, cwd=tmp_path)
    assert status["stages"]["summarise"] == {"queued": 3}, "released, not failed or dead-lettered"
    assert status["retries"] == 0 and status["attempt_errors"] == {}


@pytest.mark.parametrize(("args", "message"), [
    (["run", "{pipe}", "--input", "docs", "--db", "sqlite:////proc/no-such-folder/x.db"],
     "cannot create the folder of --db"),
    (["run", "{pipe}", "--input", "docs", "--db", "sqlite:///notdb.db"], "is not a SQLite database"),
    (["run", "{pipe}", "--input", "docs", "--db", "sqlite:///docs"], "is a folder; name a file"),
    (["run", "{pipe}", "--input", "docs", "--blobs", "/proc/no-such-folder/blobs"], "cannot write to the blob store"),
    (["run", "{pipe}", "--input", "docs", "--blobs", "notdb.db"], "exists but is not a folder"),
    (["run", "{pipe}", "--input", "docs", "--workers", "many"], "Invalid value for '--workers'"),
    (["run", "{pipe}"], "Missing option '--input'"),
    (["frobnicate"], "No such command 'frobnicate'"),
    (["run", "{exits}", "--input", "docs"], "called sys.exit(3)"),
    (["requeue", "{pipe}", "--run", "r", "--stage", "parse"], "Missing option '--reason'"),
    (["reconcile", "nope"], "no run 'nope'"),
])
def test_every_user_error_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    write_pipeline(tmp_path, PIPE)
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    make_docs(tmp_path / "docs", 1)
    (tmp_path / "notdb.db").write_text("this is not a database")
    names = {"{pipe}": "pipe.py:pipe", "{exits}": "exits.py:pipe"}
    proc = cli(*[names.get(a, a) for a in args], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_status_in_an_empty_folder_creates_nothing(tmp_path: Path) -> None:
    for command in (["status"], ["status", "--json"], ["dlq", "list", "--json"], ["quota", "--json"]):
        proc = cli(*command, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    assert cli_json("status", cwd=tmp_path) == {"runs": []}
    for command in (["reconcile", "r1"], ["resume", "r1"], ["dlq", "show", "1"]):
        proc = cli(*command, cwd=tmp_path)
        assert proc.returncode == 2 and "no conveyor store at" in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_help_and_version(tmp_path: Path) -> None:
    version = cli("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("conveyor 0.")
    for command in (["run"], ["submit"], ["worker"], ["status"], ["requeue"], ["resume"], ["dlq", "list"]):
        text = cli(*command, "--help", cwd=tmp_path).stdout
        assert "<bool>" not in text and "--help" in text, text
    requeue = cli("requeue", "--help", cwd=tmp_path).stdout
    reason = requeue[requeue.index("--reason"):].split("--", 2)[1]
    assert "[required]" in reason
