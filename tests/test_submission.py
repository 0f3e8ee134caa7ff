"""A killed or interrupted submission leaves no wedged run: it is abandoned, workers return, status shows
it, and resuming it (or running the same command again) finishes it without duplicating an item."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conveyor.runtime.heartbeat import ABANDON_AFTER_S, submission_alive, submitter_gone, submitter_id
from conveyor.store import RunRecord, SqlStore
from tests.helpers import SRC, cli, cli_json, query, write_pipeline

PIPE = """
    import os
    from conveyor import Pipeline

    pipe = Pipeline("resumable")

    @pipe.stage
    def parse(ctx, source: bytes) -> str:
        return source.decode()

    @pipe.stage(after=parse, kind="publish")
    def publish(ctx, text: str) -> None:
        fd = os.open(os.environ["SINK"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{ctx.item_key}\\n".encode())
        os.close(fd)
"""
BATCH = 500  # the killed submitter's batch: smaller than a submission's 5,000, for the same story at a tenth
ITEMS = 1_200  # three of its batches
# A submitter that SIGKILLs itself when it starts its second batch: the first is committed, the rest is not.
KILLED_SUBMITTER = textwrap.dedent(f"""
    import os, signal, sys
    from conveyor.service import submit as submission

    submission.BATCH = {BATCH}
    batch, seen = submission._Ingest.batch, []

    def dying(self, items):
        seen.append(1)
        if len(seen) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return batch(self, items)

    submission._Ingest.batch = dying
    from conveyor.cli.main import main
    sys.argv = ["conveyor", *sys.argv[1:]]
    main()
""")


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC, "SINK": str(tmp_path / "sink.log"), "CONVEYOR_ABANDON_AFTER_S": "6"}


def _manifest(tmp_path: Path) -> Path:
    manifest = tmp_path / "items.jsonl"
    manifest.write_text("".join(json.dumps({"key": f"item-{i:05d}", "text": f"text {i}"}) + "\n"
                                for i in range(ITEMS)))
    return manifest



@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["same command", "--resume"])
def test_a_killed_submitter_leaves_an_abandoned_run_that_resumes_without_duplicates(
    tmp_path: Path, store_url: str, how: str,
) -> None:
    target = write_pipeline(tmp_path, PIPE)
    manifest = _manifest(tmp_path)
    env = _env(tmp_path)
    common = ["--db", store_url, "--blobs", str(tmp_path / "blobs")]
    submit_args = ["submit", target, "--input", str(manifest), *common]
    killed = subprocess.run([sys.executable, "-c", KILLED_SUBMITTER, *submit_args], env=env, capture_output=True,
                            text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    [(run_id, status)] = query(store_url, "SELECT run_id, status FROM runs")
    assert status == "submitting"
    assert query(store_url, "SELECT COUNT(*) FROM items WHERE run_id = ?", run_id) == [(BATCH,)]
    # Its process is gone from this machine: status says so at once, without waiting for the heartbeat to age.
    assert cli_json("status", run_id, "--db", store_url, cwd=tmp_path, env=env)["status"] == "abandoned"

    started = time.monotonic()
    worker = cli("worker", target, "--until-idle", "--json", *common, cwd=tmp_path, env=env, timeout=120)
    assert worker.returncode == 0, worker.stderr
    assert time.monotonic() - started < 30, "a worker must not wait for a dead submitter"
    assert json.loads(worker.stdout)["succeeded"] == 2 * BATCH
    shown = cli_json("status", run_id, "--db", store_url, cwd=tmp_path, env=env)
    assert shown["status"] == "abandoned" and shown["expected"] == BATCH
    assert "no heartbeat" in shown["note"]

    again = submit_args if how == "same command" else [*submit_args, "--resume", run_id]
    resumed = cli_json(*again, cwd=tmp_path, env=env)
    assert resumed["run_id"] == run_id and resumed["resumed"] is True and resumed["expected"] == ITEMS
    assert cli("worker", target, "--until-idle", *common, cwd=tmp_path, env=env).returncode == 0

    report = cli_json("reconcile", run_id, "--db", store_url, cwd=tmp_path, env=env)
    assert report["expected"] == ITEMS and report["unaccounted"] == 0 and report["outcomes"] == {"published": ITEMS}
    assert report["stage_calls"] == 2 * ITEMS, "no item was processed twice"
    published = (tmp_path / "sink.log").read_text().split()
    assert len(published) == ITEMS == len(set(published))
    assert query(store_url, "SELECT COUNT(*) FROM runs") == [(1,)]


SLOW = """
    import os, time
    from conveyor import Pipeline

    pipe = Pipeline("interruptible")

    @pipe.stage
    def parse(ctx, source: bytes) -> str:
        time.sleep(0.1)  # 30 items: 2.7 s of work are left after the third
        fd = os.open(os.environ["SINK"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{ctx.item_key}\\n".encode())
        os.close(fd)
        return source.decode()
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_prints_the_command_that_resumes_it(tmp_path: Path, signum: int) -> None:
    target = write_pipeline(tmp_path, SLOW)
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(30):
        (docs / f"d{i:02d}.txt").write_text(f"doc {i}")
    env = _env(tmp_path)
    db = f"sqlite:///{tmp_path}/store.db"
    args = [sys.executable, "-m", "conveyor", "run", target, "--input", str(docs), "--workers", "1", "--db", db,
            "--blobs", str(tmp_path / "b")]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sink = tmp_path / "sink.log"
    deadline = time.monotonic() + 60
    while not (sink.exists() and len(sink.read_text().split()) >= 3):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    [line] = [x for x in err.splitlines() if x.startswith("interrupted:")]
    command = line.split("resume it with: ", 1)[1]
    assert command.startswith("conveyor resume r") and f"--db {db}" in command

    finished = subprocess.run([sys.executable, "-m", "conveyor", *shlex.split(command)[1:], "--json"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    summary = json.loads(finished.stdout)
    assert summary["expected"] == 30 and summary["outcomes"] == {"completed": 30} and summary["unaccounted"] == 0
    assert sorted(set(sink.read_text().split())) == [f"d{i:02d}.txt" for i in range(30)]


def test_a_submitter_on_another_machine_is_judged_by_its_heartbeat(store: SqlStore) -> None:

    now = store.clock()
    for run_id, submitter, beat in (("r-fresh", "elsewhere:4242:aa", now - 1.0),
                                    ("r-silent", "elsewhere:4243:bb", now - ABANDON_AFTER_S - 1)):
        store.create_run(RunRecord(run_id, "p", "t", "i", "submitting", 0, False, "[]", now, None, None, "bulk",
                                   submitter, beat))
    assert not submitter_gone("elsewhere:4242:aa") and not submitter_gone(submitter_id())
    assert submission_alive(store, "p", "r-fresh", now)
    assert not submission_alive(store, "p", "r-silent", now)
    assert [store.get_run(r).status for r in ("r-fresh", "r-silent")] == ["submitting", "abandoned"]
