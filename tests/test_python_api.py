"""conveyor from Python (issue 29 points 1 and 2), on both backends: ``Pipeline.run``/``submit`` over Python objects
and paths make the runs the command line sees; results, Arrow, Parquet and DataFrames hold one row per item with
its reconciled outcome; Ctrl-C and a stopped submission leave a run that ``resume`` finishes, each item once; a
running event loop (Jupyter) is no obstacle; bad inputs are one line and create nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import conveyor
from conveyor import InputError, Interrupted, Pipeline, UserError
from conveyor.runtime.target import load_target
from conveyor.service import submit as submission
from tests.helpers import cli_json, make_docs, query, write_pipeline

PIPE = """
    import os
    import time

    from conveyor import Pipeline, TerminalError
    from conveyor.acceptance import Record

    pipe = Pipeline("pyapi")

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> dict:
        text = source.decode()
        if text.startswith("bad"):
            raise TerminalError("refused: " + text)
        time.sleep(float(os.environ.get("PYAPI_SLOW", "0")))
        return {"text": text, "words": len(text.split())}

    @pipe.stage(after=parse, kind="publish", into="notes")
    def publish(ctx, doc: dict) -> Record:
        return Record(fields={"text": doc["text"], "words": doc["words"]}, text=doc["text"])
"""
PAIRS: list[tuple[str, Any]] = [("a", "alpha one"), ("b", b"beta two words"), ("c", {"z": 1, "y": [2, 3]}),
                                ("d", "bad input here")]


@pytest.fixture
def pipe(tmp_path: Path) -> Pipeline:
    return load_target(write_pipeline(tmp_path, PIPE))


@pytest.fixture
def ws(tmp_path: Path, store_url: str) -> conveyor.Workspace:
    return conveyor.open(store_url, tmp_path / "blobs")


def test_a_run_from_pairs_is_one_row_per_item_with_its_reconciled_outcome(
        tmp_path: Path, pipe: Pipeline, ws: conveyor.Workspace) -> None:
    run = pipe.run(PAIRS, store=ws, workers=0, progress=False)
    report = run.reconcile()
    assert report["outcomes"] == {"published": 3, "failed": 1} and report["unaccounted"] == 0
    every = list(run.results(outcome="all"))
    assert Counter(r.outcome for r in every) == Counter(report["outcomes"])
    by_key = {r.item_key: r for r in every}
    assert by_key["d"].value is None and by_key["d"].provenance["error_class"] == "terminal"
    assert by_key["d"].provenance["error"] == "TerminalError: refused: bad input here"
    assert by_key["b"].value["text"] == "beta two words", "bytes are the source as they are"
    assert by_key["c"].value["text"] == '{"y":[2,3],"z":1}', "a dict is its JSON text, keys sorted"
    assert (by_key["a"].provenance["run_id"], by_key["a"].provenance["stage"]) == (run.id, "parse")
    assert [r.item_key for r in run.results()] == ["a", "b", "c"], "accepted by default, in key order"

    table = run.to_arrow(outcome="all")
    assert table.num_rows == report["expected"] == 4
    rows = {r["item_key"]: r for r in table.to_pylist()}
    assert (rows["a"]["value.text"], rows["a"]["value.words"], rows["a"]["outcome"]) == ("alpha one", 2, "published")
    assert (rows["d"]["outcome"], rows["d"]["error_class"]) == ("failed", "terminal")
    assert run.to_pandas().shape[0] == 3 and run.to_polars(outcome="failed")["item_key"].to_list() == ["d"]
    written = run.to_parquet(tmp_path / "out.parquet", outcome="all")
    assert written["rows"] == 4 and pq.read_table(tmp_path / "out.parquet").to_pylist() == table.to_pylist()

    live = ws.collection("notes").to_arrow().to_pylist()
    assert [(r["collection"], r["item_key"], r["version"], r["value.text"]) for r in live] == [
        ("notes", "a", 1, "alpha one"), ("notes", "b", 1, "beta two words"),
        ("notes", "c", 1, by_key["c"].value["text"])]
    assert ws.collection("notes").to_polars().height == 3
    assert [r.outcome for r in ws.collection("notes").results()] == ["published"] * 3


def test_a_folder_and_manifest_dicts_run_as_the_command_line_sees_them(
        tmp_path: Path, store_url: str, pipe: Pipeline, ws: conveyor.Workspace) -> None:
    docs = make_docs(tmp_path / "docs", 3)
    run = pipe.run(docs, store=ws, workers=1, progress=False)  # a worker process, as `conveyor run` starts
    assert run.reconcile()["outcomes"] == {"published": 3}
    shell = cli_json("reconcile", run.id, "--db", store_url, "--blobs", str(tmp_path / "blobs"), cwd=tmp_path)
    assert shell["outcomes"] == {"published": 3} and shell["run_id"] == run.id
    assert run.status()["status"] == "finished"
    ((recorded,),) = query(store_url, "SELECT input FROM runs WHERE run_id = ?", run.id)
    assert recorded == str(docs.absolute())

    (tmp_path / "file.txt").write_text("from a path")
    lines = [{"key": "k1", "text": "with meta", "meta": {"lang": "en"}},
             {"key": "k2", "path": str(tmp_path / "file.txt")}]
    again = pipe.run(lines, store=ws, workers=0, progress=False)
    values = {r.item_key: r.value for r in again.results()}
    assert values == {"k1": {"text": "with meta", "words": 2}, "k2": {"text": "from a path", "words": 3}}
    ((label,),) = query(store_url, "SELECT input FROM runs WHERE run_id = ?", again.id)
    assert label == "python:list"
    assert query(store_url, "SELECT item_key, meta FROM items WHERE run_id = ? ORDER BY item_key", again.id) == [
        ("k1", '{"lang": "en"}'), ("k2", None)]


def test_submit_returns_at_once_and_wait_waits(pipe: Pipeline, ws: conveyor.Workspace) -> None:
    run = pipe.submit(iter(PAIRS), store=ws, workers=0)
    assert run.id.startswith("r") and conveyor.open(ws.db, ws.blobs).run(run.id).id == run.id
    assert run.wait() is run
    assert run.status()["status"] == "finished"
    assert run.reconcile()["outcomes"] == {"published": 3, "failed": 1}


def test_it_runs_inside_a_running_event_loop(pipe: Pipeline, ws: conveyor.Workspace) -> None:
    async def cell() -> tuple[conveyor.Run, conveyor.Run]:  # what a Jupyter cell is: code under a running loop
        here = pipe.run([("x", "in a loop")], store=ws, workers=0)
        later = pipe.submit([("y", "submitted in a loop")], store=ws, workers=0)
        return here, later.wait()

    here, later = asyncio.run(cell())
    assert here.reconcile()["outcomes"] == {"published": 1} and later.reconcile()["outcomes"] == {"published": 1}


def _interrupt_soon(after: float) -> threading.Thread:
    """Ctrl-C to this process ``after`` seconds from now (the run under way, far from its end)."""
    def press() -> None:
        time.sleep(after)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=press, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("workers", [0, 1])
def test_ctrl_c_leaves_the_run_resumable(monkeypatch: pytest.MonkeyPatch, store_url: str, pipe: Pipeline,
                                          ws: conveyor.Workspace, workers: int) -> None:
    monkeypatch.setenv("PYAPI_SLOW", "0.3")  # 12 items one at a time: 3.6 s at the least, Ctrl-C at 1 s
    pairs = [(f"k{i:02d}", f"text {i}") for i in range(12)]
    # Worked by a thread of this process (by a worker process, or in that thread): Ctrl-C is passed on to it.
    run = pipe.submit(pairs, store=ws, workers=workers)
    watcher = _interrupt_soon(1.0)
    with pytest.raises(Interrupted) as stopped:
        run.wait()
    watcher.join()
    said = str(stopped.value)
    assert stopped.value.run_id == run.id and "\n" not in said
    assert f"conveyor.open(db={ws.db!r}, blobs={ws.blobs!r}).run({run.id!r}).resume()" in said
    assert f"conveyor resume {run.id} --db" in said
    # Its worker finished or released what it had claimed; what is left, resume does.
    monkeypatch.setenv("PYAPI_SLOW", "0")
    conveyor.open(ws.db, ws.blobs).run(run.id).resume(workers=0, progress=False)
    report = run.reconcile()
    assert report["outcomes"] == {"published": 12} and report["unaccounted"] == 0
    for stage in ("parse", "publish"):
        calls = query(store_url, "SELECT item_key, count(*) FROM attempts a JOIN tasks t ON t.id = a.task_id "
                      "WHERE t.stage = ? AND a.outcome = 'succeeded' GROUP BY item_key", stage)
        assert sorted(calls) == [(key, 1) for key, _ in pairs], f"each item through {stage} once"


def test_a_stopped_submission_from_python_needs_its_inputs_again(
        monkeypatch: pytest.MonkeyPatch, pipe: Pipeline, ws: conveyor.Workspace) -> None:
    monkeypatch.setattr(submission, "BATCH", 3)
    batch = submission._Ingest.batch
    calls = {"n": 0}

    def stop_at_the_third(self: Any, items: list[Any]) -> int:  # Ctrl-C while the submission reads its input
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return batch(self, items)

    monkeypatch.setattr(submission._Ingest, "batch", stop_at_the_third)
    pairs = [(f"k{i}", f"text {i}") for i in range(10)]
    with pytest.raises(Interrupted) as stopped:
        pipe.run(pairs, store=ws, workers=0)
    monkeypatch.setattr(submission._Ingest, "batch", batch)
    found = conveyor.open(ws.db, ws.blobs).run(stopped.value.run_id)
    assert found.status()["status"] == "abandoned"
    with pytest.raises(UserError, match=r"run\.resume\(inputs=\.\.\.\)") as refused:
        found.resume(workers=0)
    assert "\n" not in str(refused.value)
    found.resume(pairs, workers=0, progress=False)
    report = found.reconcile()
    assert report["expected"] == 10 and report["outcomes"] == {"published": 10}
    assert [r.item_key for r in found.results()] == sorted(k for k, _ in pairs)


def test_a_pipeline_no_worker_can_import_runs_in_this_process(ws: conveyor.Workspace) -> None:
    cell: dict[str, Any] = {"__name__": "notebook_cell"}  # a module no other process has
    exec("from conveyor import Pipeline\npipe = Pipeline('cell')\n"
         "@pipe.stage(version='1')\ndef upper(ctx, source: bytes) -> str:\n    return source.decode().upper()\n", cell)
    pipe = cell["pipe"]
    with pytest.raises(UserError, match="workers=0"):
        pipe.run([("a", "x")], store=ws, workers=2)
    run = pipe.run([("a", "x"), ("b", "y")], store=ws)  # by default, then, in this process
    assert [(r.item_key, r.value, r.outcome) for r in run.results()] == [("a", "X", "completed"),
                                                                         ("b", "Y", "completed")]
    found = conveyor.open(ws.db, ws.blobs).run(run.id)
    with pytest.raises(UserError, match=r"run\(.*, pipeline=pipe\)\.resume\(\)"):
        found.resume()
    assert conveyor.open(ws.db, ws.blobs).run(run.id, pipeline=pipe).resume().status()["status"] == "finished"


def test_a_file_that_runs_as_it_is_imported_is_refused_in_the_worker(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # where conveyor.open()'s default store would be
    monkeypatch.delenv("CONVEYOR_DB", raising=False)
    target = write_pipeline(tmp_path, PIPE + "\n    pipe.run([('a', 'x')])\n", name="script.py")
    with pytest.raises(UserError, match=r'put pipe\.run.* under `if __name__ == "__main__":`'):
        load_target(target)  # what each worker process does first
    assert not (tmp_path / ".conveyor").exists(), "no store, no run"


BAD_INPUTS: list[tuple[Any, str]] = [
    ([("a", "x"), ("b", "y"), ("a", "z")], "inputs[2]: key 'a' is also inputs[0]"),
    ([{"key": "a", "text": "x"}, {"text": "no key"}], 'inputs[1]: missing or empty "key"'),
    ([("a¶b", "x")], "fan-out child items"),
    ([("a", 12)], "inputs[0]: a value must be bytes, str or a dict, not int"),
    ([("a", "x", "y")], "inputs[0]: a tuple is not an input"),
    ({"a": "x"}, "a dict is not an input"),
]


def test_bad_inputs_are_one_line_and_create_nothing(tmp_path: Path, store_url: str, pipe: Pipeline,
                                                    ws: conveyor.Workspace) -> None:
    for inputs, message in BAD_INPUTS:
        with pytest.raises(UserError) as refused:
            pipe.run(inputs, store=ws, workers=0)
        assert message in str(refused.value) and "\n" not in str(refused.value)
        assert isinstance(refused.value, InputError) or message.endswith("not an input")
    with pytest.raises(InputError, match="does not exist"):
        pipe.run(tmp_path / "nowhere", store=ws, workers=0)
    assert query(store_url, "SELECT count(*) FROM runs") == [(0,)]


def test_open_finds_the_store_as_the_command_line_does(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CONVEYOR_DB", raising=False)
    monkeypatch.delenv("CONVEYOR_BLOBS", raising=False)
    assert (conveyor.open().db, conveyor.open().blobs) == ("sqlite:///.conveyor/conveyor.db", ".conveyor/blobs")
    monkeypatch.setenv("CONVEYOR_DB", f"sqlite:///{tmp_path}/env.db")
    monkeypatch.setenv("CONVEYOR_BLOBS", str(tmp_path / "env-blobs"))
    assert (conveyor.open().db, conveyor.open().blobs) == (f"sqlite:///{tmp_path}/env.db", str(tmp_path / "env-blobs"))
    assert conveyor.open("sqlite:///x.db", Path("b")).db == "sqlite:///x.db"
    with pytest.raises(conveyor.ConveyorError, match="no run 'r-none'"):
        conveyor.open().run("r-none")


def test_dataframes_and_tables_run_by_their_columns(tmp_path: Path, pipe: Pipeline, ws: conveyor.Workspace) -> None:
    import pandas as pd
    import polars as pl
    import pyarrow as pa

    frame = pd.DataFrame({"id": ["p1", "p2", "p3"], "body": ["one two", "three", "bad row"],
                          "lang": ["en", "fr", "en"]})
    run = pipe.run(frame, store=ws, workers=0, progress=False, key="id", text="body", meta=["lang"])
    assert run.reconcile()["outcomes"] == {"published": 2, "failed": 1}
    rows = run.to_pandas(outcome="all").set_index("item_key")
    assert rows.loc["p1", "value.words"] == 2 and rows.loc["p3", "error_class"] == "terminal"
    # The same rows as a polars frame, a pyarrow Table and a Parquet file: the same items, answered by the memo.
    again = [pipe.run(pl.from_pandas(frame), store=ws, workers=0, progress=False, key="id", text="body"),
             pipe.run(pa.Table.from_pandas(frame), store=ws, workers=0, progress=False, key="id", text="body")]
    pq.write_table(pa.Table.from_pandas(frame), tmp_path / "rows.parquet")
    again.append(pipe.run(tmp_path / "rows.parquet", store=ws, workers=0, progress=False, key="id", text="body"))
    for other in again:
        assert other.reconcile()["outcomes"] == {"published": 2, "failed": 1}
        assert other.status()["stage_calls"] == 0, "an unchanged table costs a lookup per item"
    values = pd.DataFrame({"id": ["v1"], "doc": [{"b": 1, "a": "x"}]})
    valued = pipe.run(values, store=ws, workers=0, progress=False, key="id", value="doc")
    assert next(valued.results()).value["text"] == '{"a":"x","b":1}'

    with pytest.raises(UserError, match="name its columns, key=COLUMN"):
        pipe.run(frame, store=ws, workers=0, progress=False)
    with pytest.raises(InputError, match="key 'x' is also on row 1"):
        pipe.run(pd.DataFrame({"id": ["x", "x"], "body": ["a", "b"]}), store=ws, workers=0, progress=False,
                 key="id", text="body")
    with pytest.raises(InputError, match="nope"):
        pipe.run(frame, store=ws, workers=0, progress=False, key="nope", text="body")
    with pytest.raises(UserError, match="is not a table"):
        pipe.run(PAIRS, store=ws, workers=0, progress=False, key="id", text="body")
