"""The CLI as a user meets it: JSON contracts, one-line errors, submit + worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.errors import StoreMissing
from conveyor.store import open_store
from tests.conftest import drop_later, fresh_pg_url
from tests.helpers import SRC, cli, cli_json, make_docs, write_pipeline

PIPE = """
    from conveyor import Pipeline, Retry

    pipe = Pipeline("cli", retry=Retry(max_attempts=2, base=0.01))

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> dict:
        print("parsing", ctx.item_key)  # stage output must never reach the --json stdout
        if source.startswith(b"poison"):
            raise RuntimeError("cannot parse this one")
        return {"text": source.decode()}

    @pipe.stage(after=parse, kind="publish")
    def publish(ctx, doc: dict) -> None:
        return None
"""


def _db_args(store_url: str, tmp_path: Path) -> list[str]:
    return ["--db", store_url, "--blobs", str(tmp_path / "blobs")]


def test_run_json_contract_and_rerun_is_free(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = make_docs(tmp_path / "docs", 6)
    (docs / "bad.txt").write_text("poison pill")
    args = ["run", target, "--input", str(docs), "--workers", "2", *_db_args(store_url, tmp_path)]

    first = cli_json(*args, cwd=tmp_path)
    assert first["outcomes"] == {"published": 6, "dead_lettered": 1}
    assert first["unaccounted"] == 0
    assert first["stage_calls"] == 6 * 2 + 2
    assert first["cached"] == 0
    assert first["not_done"][0]["item_key"] == "bad.txt"
    assert first["not_done"][0]["error_classes"] == ["runtime_error"]

    second = cli_json(*args, cwd=tmp_path)
    assert second["run_id"] != first["run_id"]
    assert second["stage_calls"] == 2, "only the dead-lettered item is tried again"
    assert second["cached"] == 12

    listing = cli_json("dlq", "list", "--run", first["run_id"], *_db_args(store_url, tmp_path)[:2], cwd=tmp_path)
    (entry,) = listing["entries"]
    assert {k: entry[k] for k in ("item_key", "stage", "error_class", "attempts")} == {
        "item_key": "bad.txt", "stage": "parse", "error_class": "runtime_error", "attempts": 2}
    assert "cannot parse this one" in entry["error"]

    shown = cli_json("dlq", "show", str(entry["id"]), "--db", store_url, cwd=tmp_path)
    assert [a["outcome"] for a in shown["attempt_history"]] == ["retry", "dead_lettered"]

    reconciled = cli_json("reconcile", first["run_id"], "--db", store_url, cwd=tmp_path)
    assert reconciled["expected"] == 7 and reconciled["unaccounted"] == 0


def test_submit_then_workers_then_status_and_replay(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    manifest = tmp_path / "items.jsonl"
    lines = [{"key": f"t{i}", "text": f"text {i}"} for i in range(5)] + [{"key": "p", "text": "poison"}]
    (make_docs(tmp_path / "files", 2) / "x").write_text("file item")
    lines.append({"key": "f", "path": "files/x"})
    manifest.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    db = _db_args(store_url, tmp_path)

    submitted = cli_json("submit", target, "--input", str(manifest), *db, cwd=tmp_path)
    run_id = submitted["run_id"]
    assert submitted["expected"] == 7
    status = cli_json("status", run_id, "--db", store_url, cwd=tmp_path)
    assert status["stages"]["parse"] == {"queued": 7}

    cli("worker", target, "--until-idle", *db, cwd=tmp_path, check=True)
    status = cli_json("status", run_id, "--db", store_url, cwd=tmp_path)
    assert status["status"] == "finished"
    assert status["stages"]["publish"] == {"succeeded": 6}
    assert status["outcomes"] == {"dead_lettered": 1, "published": 6}
    assert set(status["usage"]) >= {"tokens_per_accepted_item", "cost_per_accepted_item"}
    assert status["attempt_errors"]

    replayed = cli_json("dlq", "replay", "--run", run_id, "--reason", "fixed the parser", "--db", store_url,
                        cwd=tmp_path)
    assert replayed["replayed"] == 1
    listing = cli_json("dlq", "list", "--all", "--db", store_url, cwd=tmp_path)
    assert listing["entries"][0]["replay_reason"] == "fixed the parser"
    assert cli_json("status", "--db", store_url, cwd=tmp_path)["runs"][0]["run_id"] == run_id


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "nosuchmodule:pipe", "--input", "."], "cannot import module 'nosuchmodule'"),
        (["run", "missing.py:pipe", "--input", "."], "does not exist"),
        (["run", "{pipe}", "--input", "nowhere"], "--input 'nowhere' does not exist"),
        (["run", "{pipe}", "--input", ".", "--db", "mysql://x"], "is not a database URL"),
        (["run", "{pipe}", "--input", ".", "--db", "postgresql://postgres@127.0.0.1:1/x"],
         "cannot connect to PostgreSQL"),
        (["run", "{broken}", "--input", "."], "comes after 'nothing', which is not declared"),
        (["run", "{crashing}", "--input", "."], "importing crashing.py failed: ZeroDivisionError"),
        (["run", "{pipe}", "--input", "bad.jsonl"], "bad.jsonl:2: not valid JSON"),
        (["status", "no-such-run"], "no run 'no-such-run'"),
        (["dlq", "replay", "1"], "needs --reason"),
        (["run", "{pipe}", "--input", ".", "--blobs", "s3://No_Bucket"], "names no valid S3 bucket"),
    ],
)
def test_user_errors_are_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    write_pipeline(tmp_path, PIPE)
    (tmp_path / "broken.py").write_text(
        "from conveyor import Pipeline\npipe = Pipeline('b')\n@pipe.stage(after='nothing')\ndef a(ctx, s):\n"
        "    return s\n")
    (tmp_path / "crashing.py").write_text("x = 1 / 0\n")
    (tmp_path / "bad.jsonl").write_text('{"key": "a", "text": "x"}\nnot json\n')
    names = {"{pipe}": "pipe.py:pipe", "{broken}": "broken.py:pipe", "{crashing}": "crashing.py:pipe"}
    full = [names.get(a, a) for a in args]
    if "--db" not in full:
        full += ["--db", f"sqlite:///{tmp_path}/c.db"]
    proc = cli(*full, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{proc.stderr}"
    assert lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("value", ["lots", "0", "-5"])
def test_a_bad_sqlite_cache_setting_is_one_line_and_creates_nothing(tmp_path: Path, value: str) -> None:
    write_pipeline(tmp_path, PIPE)
    (tmp_path / "m.jsonl").write_text('{"key": "a", "text": "x"}\n')
    proc = cli("run", "pipe.py:pipe", "--input", "m.jsonl", "--db", f"sqlite:///{tmp_path}/c.db", cwd=tmp_path,
               env={"CONVEYOR_SQLITE_CACHE_MB": value})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: CONVEYOR_SQLITE_CACHE_MB={value!r}: expected MiB of SQLite page cache per connection, a number > 0 "
        "(default 64, 16 in a worker)"]
    assert not (tmp_path / "c.db").exists()
    done = cli_json("run", "pipe.py:pipe", "--input", "m.jsonl", "--db", f"sqlite:///{tmp_path}/c.db",
                    cwd=tmp_path, env={"CONVEYOR_SQLITE_CACHE_MB": "2.5"})
    assert done["outcomes"] == {"published": 1}


def test_a_missing_source_is_a_bad_input_item_not_a_refused_submission(tmp_path: Path) -> None:
    write_pipeline(tmp_path, PIPE)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"key": "a", "text": "x"}\n{"key": "b", "path": "missing.txt"}\n')
    db = f"sqlite:///{tmp_path}/c.db"
    submitted = cli_json("submit", "pipe.py:pipe", "--input", str(manifest), "--db", db, cwd=tmp_path)
    assert submitted["expected"] == 2
    status = cli_json("status", submitted["run_id"], "--db", db, cwd=tmp_path)
    assert status["stages"]["parse"] == {"queued": 1, "failed": 1}


def test_module_target_and_single_file_input(tmp_path: Path) -> None:
    package = tmp_path / "mypipes"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "manuals.py").write_text(
        "from conveyor import Pipeline\n\npipe = Pipeline('manuals')\n\n\n@pipe.stage\n"
        "def shout(ctx, source: bytes) -> str:\n    return source.decode().upper()\n")
    (tmp_path / "one.txt").write_text("hello")
    env = {"PYTHONPATH": f"{tmp_path}:{SRC}"}
    summary = cli_json("run", "mypipes.manuals:pipe", "--input", "one.txt", "--db", f"sqlite:///{tmp_path}/c.db",
                       cwd=tmp_path, env=env)
    assert summary["outcomes"] == {"completed": 1} and summary["stage_calls"] == 1


@pytest.fixture(params=["sqlite", "postgres"])
def no_store_yet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where no store is yet: a SQLite file not made, a PostgreSQL schema with no tables."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/new/conveyor.db"
        return
    import psycopg

    url = fresh_pg_url()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA blank")
    try:
        yield url + "?options=-csearch_path%3Dblank"
    finally:
        drop_later(url)


def test_reads_create_no_store_and_the_command_that_creates_one_says_so(tmp_path: Path, no_store_yet: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = make_docs(tmp_path / "docs", 2)
    db = ["--db", no_store_yet]
    listing = cli("status", "--json", *db, cwd=tmp_path)
    assert listing.returncode == 0 and json.loads(listing.stdout) == {"runs": []} and not listing.stderr
    for command in (["reconcile", "r1"], ["status", "r1", "--json"], ["show", "r1", "a.txt"]):
        proc = cli(*command, *db, cwd=tmp_path)
        assert proc.returncode == 2 and "no conveyor store at" in proc.stderr and not proc.stdout, proc.stderr
    with pytest.raises(StoreMissing):
        open_store(no_store_yet, create=False)

    args = ["run", target, "--input", str(docs), "--workers", "0", "--json", *db, "--blobs", str(tmp_path / "b")]
    first = cli(*args, cwd=tmp_path)
    assert first.returncode == 0 and json.loads(first.stdout)["outcomes"] == {"published": 2}, first.stderr
    assert [line for line in first.stderr.splitlines() if "new store" in line] == [
        f"conveyor: created a new store at {no_store_yet}"], first.stderr
    again = cli(*args, cwd=tmp_path)
    assert again.returncode == 0 and "new store" not in again.stderr, again.stderr
