"""A task key means one thing in every process (issue 27 points 1 and 2).

A worker claims only tasks made under its own declaration of their stage (version and config hash); a task
no live worker can take waits and ``status`` says why; ``resume`` under another declaration is refused with
the difference named; run parameters are recorded with the run and read from it by every process after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import SRC, cli, cli_json, make_docs, query, submit_run, work, write_pipeline

MULT_FROM_ENV = """
import os
from conveyor import Pipeline

pipe = Pipeline("mult")

@pipe.stage(config={"mult": int(os.environ.get("MULT", "1"))})
def double(ctx, source: bytes) -> dict:
    return {"mult_used": ctx.config["mult"]}
"""

MULT_FIXED = """
from conveyor import Pipeline

pipe = Pipeline("mult")

@pipe.stage(config={{"mult": {mult}}})
def double(ctx, source: bytes) -> dict:
    return {{"mult_used": ctx.config["mult"]}}
"""

WITH_PARAMS = """
from conveyor import Param, Pipeline

pipe = Pipeline("params", params={"mult": 2, "label": Param("plain", env="LABEL")})

@pipe.stage
def parse(ctx, source: bytes) -> dict:
    return {"n": len(source)}

@pipe.stage(after=parse, params=["mult"])
def scale(ctx, doc: dict) -> dict:
    return {"n": doc["n"] * ctx.params["mult"], "mult_used": ctx.params["mult"]}
"""


FOREIGN = "ab" * 32  # a task key no declaration here makes


def _outputs(store_url: str, run_id: str, stage: str) -> list[dict[str, object]]:
    rows = query(store_url, "SELECT o.inline FROM tasks t JOIN outputs o ON o.task_key = t.task_key "
                 "WHERE t.run_id = ? AND t.stage = ?", run_id, stage)
    return [json.loads(bytes(r[0])) for r in rows]


def test_a_worker_runs_only_tasks_made_under_its_own_declaration(store_url: str, tmp_path: Path) -> None:
    two = write_pipeline(tmp_path, MULT_FIXED.format(mult=2), "two.py")
    three = write_pipeline(tmp_path, MULT_FIXED.format(mult=3), "three.py")
    docs = make_docs(tmp_path / "docs", 6)
    run3 = submit_run(three, docs, store_url, tmp_path / "blobs")
    stats = work(two, store_url, tmp_path / "blobs")  # a worker of mult 2 beside a run made under mult 3
    assert stats.get("stage_calls", 0) == 0
    assert query(store_url, "SELECT COUNT(*) FROM tasks WHERE run_id = ? AND status = 'queued'", run3)[0][0] == 6
    assert query(store_url, "SELECT COUNT(*) FROM outputs")[0][0] == 0  # nothing stored under mult 3's keys
    work(three, store_url, tmp_path / "blobs")
    assert _outputs(store_url, run3, "double") == [{"mult_used": 3}] * 6
    # A later run under mult 2 is answered by mult 2's work, never by mult 3's memo rows.
    run2 = submit_run(two, docs, store_url, tmp_path / "blobs")
    work(two, store_url, tmp_path / "blobs")
    assert _outputs(store_url, run2, "double") == [{"mult_used": 2}] * 6


def test_a_task_key_this_declaration_would_not_make_is_never_answered_here(store_url: str, tmp_path: Path) -> None:
    three = write_pipeline(tmp_path, MULT_FIXED.format(mult=3), "three.py")
    run = submit_run(three, make_docs(tmp_path / "docs", 2), store_url, tmp_path / "blobs")
    query(store_url, "UPDATE tasks SET task_key = ? WHERE run_id = ? AND item_key = ?", FOREIGN, run, "doc0000.txt")
    work(three, store_url, tmp_path / "blobs")
    rows = query(store_url, "SELECT item_key, status, error_class FROM tasks WHERE run_id = ? ORDER BY item_key", run)
    assert rows == [("doc0000.txt", "failed", "foreign_key"), ("doc0001.txt", "succeeded", None)]
    assert query(store_url, "SELECT COUNT(*) FROM outputs WHERE task_key = ?", FOREIGN)[0][0] == 0


def _worker(target: str, cwd: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "conveyor", "worker", target, "--quiet", *args], cwd=cwd,
                            env={**os.environ, "PYTHONPATH": SRC, **env}, text=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _until(check, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError("timed out")


def test_status_names_the_waiting_stage_the_config_difference_and_the_run(tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, MULT_FROM_ENV)
    make_docs(tmp_path / "in", 4)
    old = _worker(target, tmp_path, {"MULT": "2"})  # yesterday's worker, started with another config
    try:
        _until(lambda: cli_json("workers", cwd=tmp_path)["workers"])
        run_id = cli_json("submit", target, "--input", "in", cwd=tmp_path, env={"MULT": "3"})["run_id"]
        status = _until(lambda: (s := cli_json("status", run_id, cwd=tmp_path))["waiting_for_workers"] and s)
        [waiting] = status["waiting_for_workers"]
        assert waiting["stage"] == "double" and waiting["queued"] == 4
        assert waiting["differences"] == ["stage double: config mult=3 (run) / 2 (worker)"]
        assert run_id in waiting["message"]
        text = cli("status", run_id, cwd=tmp_path).stdout
        assert "mult=3 (run) / 2 (worker)" in " ".join(text.split())
        [worker] = cli_json("workers", cwd=tmp_path)["workers"]
        assert list(worker["serves"]) == ["double"] and worker["serves"]["double"][0] == "1"
        assert cli_json("status", run_id, cwd=tmp_path)["stages"]["double"] == {"queued": 4}  # nothing taken
        done = cli("worker", target, "--until-idle", cwd=tmp_path, env={"MULT": "3"}, check=True)
        assert done.returncode == 0
        assert cli_json("status", run_id, cwd=tmp_path)["waiting_for_workers"] == []
        rows = query(f"sqlite:///{tmp_path}/.conveyor/conveyor.db",
                     "SELECT o.inline FROM tasks t JOIN outputs o ON o.task_key = t.task_key WHERE t.run_id = ?",
                     run_id)
        assert {bytes(r[0]) for r in rows} == {b'{"mult_used":3}'}
    finally:
        _stop(old)


def test_resume_under_another_declaration_is_one_line_naming_the_difference(tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, MULT_FROM_ENV)
    make_docs(tmp_path / "in", 3)
    run_id = cli_json("submit", target, "--input", "in", cwd=tmp_path, env={"MULT": "3"})["run_id"]
    refused = cli("resume", run_id, cwd=tmp_path, env={"MULT": "2"})
    assert refused.returncode == 2
    [line] = refused.stderr.strip().splitlines()
    assert f"run {run_id}'s open tasks were made under another declaration" in line
    assert "stage double: config mult=3 (run) / 2 (here)" in line
    assert cli_json("resume", run_id, cwd=tmp_path, env={"MULT": "3"})["outcomes"] == {"completed": 3}


def test_rolling_deploy_old_workers_drain_old_tasks_new_workers_take_new(store_url: str, tmp_path: Path) -> None:
    """Real processes: v1 workers drain the run made under v1 while v2 workers take the run made under v2."""
    source = """
import time
from conveyor import Pipeline

pipe = Pipeline("deploy")

@pipe.stage(version="{v}")
def work(ctx, source: bytes) -> dict:
    time.sleep(0.02)
    return {{"made_by": {v}}}
"""
    v1 = write_pipeline(tmp_path, source.format(v=1), "v1.py")
    v2 = write_pipeline(tmp_path, source.format(v=2), "v2.py")
    docs = make_docs(tmp_path / "docs", 40)
    env = {"CONVEYOR_DB": store_url, "CONVEYOR_BLOBS": str(tmp_path / "blobs")}
    old_run = cli_json("submit", v1, "--input", str(docs), cwd=tmp_path, env=env)["run_id"]
    old = [_worker(v1, tmp_path, env, "--until-idle") for _ in range(2)]
    new_run = cli_json("submit", v2, "--input", str(docs), cwd=tmp_path, env=env)["run_id"]
    new = [_worker(v2, tmp_path, env, "--until-idle") for _ in range(2)]
    for proc in (*old, *new):
        assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    assert _outputs(store_url, old_run, "work") == [{"made_by": 1}] * 40
    assert _outputs(store_url, new_run, "work") == [{"made_by": 2}] * 40
    made = query(store_url, "SELECT DISTINCT t.run_id, a.stage_version FROM attempts a JOIN tasks t "
                 "ON t.id = a.task_id WHERE a.invoked = 1")
    assert sorted((r, str(v)) for r, v in made) == sorted([(old_run, "1"), (new_run, "2")])


def test_run_parameters_are_recorded_and_read_from_the_run_never_the_environment(tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, WITH_PARAMS)
    (tmp_path / "in").mkdir()
    for i in range(3):  # three lengths: three different inputs to scale
        (tmp_path / "in" / f"d{i}.txt").write_text("x" * (i + 1))
    db = f"sqlite:///{tmp_path}/.conveyor/conveyor.db"
    run_id = cli_json("submit", target, "--input", "in", "--set", "mult=3", cwd=tmp_path)["run_id"]
    assert json.loads(query(db, "SELECT params FROM runs WHERE run_id = ?", run_id)[0][0]) == {
        "label": "plain", "mult": 3}
    # A worker started with another value in its environment uses the run's.
    cli("worker", target, "--until-idle", cwd=tmp_path, env={"CONVEYOR_PARAM_MULT": "9"}, check=True)
    assert {o["mult_used"] for o in _outputs(db, run_id, "scale")} == {3}
    again = cli_json("run", target, "--input", "in", "--set", "mult=3", cwd=tmp_path)
    assert again["stage_calls"] == 0 and again["cached"] == 6
    other = cli_json("run", target, "--input", "in", "--set", "mult=4", cwd=tmp_path)
    assert other["stage_calls"] == 3 and other["cached"] == 3  # parse is answered; only scale reads mult
    from_env = cli_json("run", target, "--input", "in", cwd=tmp_path, env={"CONVEYOR_PARAM_MULT": "4"})
    assert from_env["stage_calls"] == 0


@pytest.mark.parametrize(("args", "said"), [
    (["--set", "mult=x"], "--set mult=x: 'x' is not of type int"),
    (["--set", "nope=1"], "pipeline 'params' has no parameter 'nope' (it declares: label, mult)"),
    (["--set", "mult"], "write --set NAME=VALUE"),
])
def test_a_bad_set_is_one_line_and_creates_nothing(tmp_path: Path, args: list[str], said: str) -> None:
    target = write_pipeline(tmp_path, WITH_PARAMS)
    make_docs(tmp_path / "in", 2)
    proc = cli("run", target, "--input", "in", *args, cwd=tmp_path)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert said in line
    assert not (tmp_path / ".conveyor" / "conveyor.db").exists() or not query(
        f"sqlite:///{tmp_path}/.conveyor/conveyor.db", "SELECT run_id FROM runs")


def test_a_stage_reading_a_parameter_it_does_not_declare_fails_saying_how_to_declare_it(tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, WITH_PARAMS + """
@pipe.stage(after=scale)
def sneaky(ctx, doc: dict) -> dict:
    return {"label": ctx.params["label"]}
""")
    make_docs(tmp_path / "in", 1)
    cli("run", target, "--input", "in", cwd=tmp_path)
    [entry] = cli_json("dlq", "list", cwd=tmp_path)["entries"]
    assert entry["stage"] == "sneaky"
    assert "reads the run parameter 'label' without declaring it: add params=['label']" in entry["error"]


def test_a_parameter_a_stage_names_must_be_declared_by_the_pipeline() -> None:
    from conveyor import Pipeline
    from conveyor.errors import PipelineError

    pipe = Pipeline("p", params={"a": 1})
    with pytest.raises(PipelineError, match=r"params=\['b'\] is not a parameter of pipeline 'p'"):
        pipe.stage(params=["b"])(lambda ctx, source: source)
    with pytest.raises(PipelineError, match="not a parameter name"):
        Pipeline("q", params={"1x": 1})
