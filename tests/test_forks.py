"""`conveyor run`'s workers forked before it opens its store (service/forks.py): each a process of its own that
records every attempt, replaced by a new `conveyor worker` when a stage kills it; new processes when told not to
fork."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.service.forks import Forked
from tests.helpers import cli_json, make_docs, query, write_pipeline

PIPE = """
    import os
    import sys
    from pathlib import Path

    from conveyor import Pipeline, Retry

    pipe = Pipeline("forks", retry=Retry(max_attempts=3, base=0.01))
    CALLS = Path(__file__).with_name("calls.txt")

    @pipe.stage
    def note(ctx, source: bytes) -> str:
        print("noise on stdout", ctx.item_key)  # a stage's output must never reach the --json stdout
        with CALLS.open("a") as calls:  # which process: its command line's verb, its pid, its parent's pid
            calls.write(f"{ctx.item_key} {sys.argv[1]} {os.getpid()} {os.getppid()}\\n")
        marker = Path(__file__).with_name("killed-" + ctx.item_key)
        if source.startswith(b"kill") and not marker.exists():
            marker.touch()
            os._exit(9)  # the stage kills its process
        return source.decode()

    @pipe.stage(after=note)
    def shout(ctx, text: str) -> str:
        return text.upper()
"""


def _calls(tmp_path: Path) -> list[tuple[str, str, int, int]]:
    rows = [line.split() for line in (tmp_path / "calls.txt").read_text().splitlines()]
    return [(key, verb, int(pid), int(ppid)) for key, verb, pid, ppid in rows]


def _args(target: str, docs: Path, store_url: str, tmp_path: Path) -> list[str]:
    return ["run", target, "--input", str(docs), "--workers", "2", "--db", store_url, "--blobs",
            str(tmp_path / "blobs")]


def test_run_forks_its_workers_each_recording_every_attempt(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = make_docs(tmp_path / "docs", 8)
    out = cli_json(*_args(target, docs, store_url, tmp_path), cwd=tmp_path)
    assert out["outcomes"] == {"completed": 8} and out["unaccounted"] == 0 and out["stage_calls"] == 16
    calls = _calls(tmp_path)
    assert len(calls) == 8
    assert {verb for _, verb, _, _ in calls} == {"run"}, "forked from `conveyor run`, not started anew"
    parents = {ppid for _, _, _, ppid in calls}
    assert len(parents) == 1 and not parents & {pid for _, _, pid, _ in calls}, "children of the command"
    workers = {int(pid) for (pid,) in query(store_url, "SELECT pid FROM workers WHERE run_id = ?", out["run_id"])}
    assert len(workers) == 2 and {pid for _, _, pid, _ in calls} <= workers, "two processes of their own"
    attempts = query(store_url, "SELECT count(*), count(DISTINCT task_id) FROM attempts WHERE run_id = ?",
                     out["run_id"])
    assert attempts == [(16, 16)]

    again = cli_json(*_args(target, docs, store_url, tmp_path), cwd=tmp_path)
    assert again["cached"] == 16 and again["stage_calls"] == 0 and again["outcomes"] == {"completed": 8}
    assert query(store_url, "SELECT count(*) FROM workers WHERE run_id = ?", again["run_id"]) == [(0,)], \
        "the memo answered every task: the forked workers were told to exit without registering"


def test_a_stage_that_kills_a_forked_worker_does_not_stop_the_run(tmp_path: Path, store_url: str) -> None:
    # The killed worker's task waits out its lease before another worker takes it: 3 s, not the default 30 s.
    target = write_pipeline(tmp_path, PIPE.replace('Pipeline("forks", ', 'Pipeline("forks", lease_seconds=3, '))
    docs = make_docs(tmp_path / "docs", 4)
    (docs / "doc-kill.txt").write_text("kill me once")
    out = cli_json(*_args(target, docs, store_url, tmp_path), cwd=tmp_path)
    assert out["outcomes"] == {"completed": 5} and out["unaccounted"] == 0
    killed = [verb for key, verb, _, _ in _calls(tmp_path) if key == "doc-kill.txt"]
    assert len(killed) == 2 and killed[0] == "run", "killed in a forked worker, then done by the fleet's others"
    outcomes = query(store_url, "SELECT a.outcome FROM attempts a JOIN tasks t ON t.id = a.task_id"
                     " WHERE t.run_id = ? AND t.item_key = ? AND t.stage = 'note' ORDER BY a.attempt", out["run_id"],
                     "doc-kill.txt")
    assert [o for (o,) in outcomes][-1] == "succeeded"


def test_told_not_to_fork_the_run_starts_new_worker_processes(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    docs = make_docs(tmp_path / "docs", 4)
    out = cli_json(*_args(target, docs, store_url, tmp_path), cwd=tmp_path, env={"CONVEYOR_FORK_WORKERS": "0"})
    assert out["outcomes"] == {"completed": 4} and out["unaccounted"] == 0
    assert {verb for _, verb, _, _ in _calls(tmp_path)} == {"worker"}


def test_a_forked_workers_handle_answers_as_a_popen_does() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        handle = Forked(proc.pid)
        assert handle.poll() is None and handle.returncode is None
        with pytest.raises(subprocess.TimeoutExpired):
            handle.wait(timeout=0.05)
        handle.terminate()
        assert handle.wait(timeout=30) == -signal.SIGTERM and handle.poll() == -signal.SIGTERM
        handle.kill()  # gone already: nothing is sent
    finally:
        proc.kill()
