"""`conveyor export`: a run's items (or a collection's live versions) as a dataset (both backends). Every item is
a row with its reconciliation outcome and, when it did not make it, its error class; values and provenance
round-trip through Parquet, JSON lines and CSV; bad input is one line and leaves no file."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.errors import UserError
from conveyor.service.datasets import iter_rows, write_export
from conveyor.service.export import LEAD, TRAIL, Export, run_export
from conveyor.service.report import ACCEPTED
from conveyor.store import open_store
from tests.helpers import cli, cli_json, query, reconciled, submit_and_work, write_pipeline
from tests.test_graph_groups import GROUPED, _docs
from tests.test_graph_joins import GATHER
from tests.test_publications import Project
from tests.test_reconcile_report import BAD, GOOD, PIPE, UNSURE, _decide, manifest

BIG = [{"key": "h.txt", "text": "big invoice eight"}]  # its record is past the inline limit: in the blob store


@pytest.fixture
def mixed(tmp_path: Path, store_url: str) -> str:
    """A run with items published, completed, failed (two classes), dead-lettered, awaiting review and rejected."""
    target = write_pipeline(tmp_path, PIPE)
    done = submit_and_work(target, manifest(tmp_path, GOOD + BAD + UNSURE + BIG), store_url, tmp_path / "blobs")
    _decide(store_url, tmp_path / "blobs", "r.txt", "reject")
    return done.run_id


def _rows(store_url: str, blobs: Path, run_id: str, **options: Any) -> list[dict[str, Any]]:
    store = open_store(store_url)
    try:
        return list(iter_rows(run_export(store, FilesystemBlobs(blobs), run_id, **options)))
    finally:
        store.close()


def test_every_item_is_a_row_with_its_reconciled_outcome(tmp_path: Path, store_url: str, mixed: str) -> None:
    rows = _rows(store_url, tmp_path / "blobs", mixed, outcome="all")
    report = reconciled(store_url, mixed)
    assert report["unaccounted"] == 0
    assert Counter(r["outcome"] for r in rows) == Counter(report["outcomes"])
    assert [r["item_key"] for r in rows] == sorted(r["item_key"] for r in rows), "key order"
    by_key = {r["item_key"]: r for r in rows}
    not_done = {entry["item_key"]: entry["error_classes"] for entry in report["not_done"]}
    for key, classes in not_done.items():
        assert by_key[key]["error_class"] in classes, key
    assert by_key["d.txt"]["error_class"] == "unreadable" and by_key["d.txt"]["error"]
    assert by_key["f.txt"]["error_class"] == "bad_input" and by_key["e.txt"]["outcome"] == "dead_lettered"
    assert by_key["e.txt"]["error_class"]
    assert all(r["error_class"] is None for r in rows if r["outcome"] in ACCEPTED)
    # The value: the accepted record's fields as columns; the provenance of the task that made it.
    a = by_key["a.txt"]
    assert (a["value.title"], a["value.kind"], a["value.n"]) == ("alpha", "invoice", {"words": 3})
    assert (a["stage"], a["stage_version"], a["model"], a["run_id"]) == ("extract", "1", "small", mixed)
    assert a["tokens"] == 120 and a["cost"] == pytest.approx(0.00014)
    ((digest,),) = query(store_url, "SELECT source_digest FROM items WHERE run_id = ? AND item_key = 'a.txt'", mixed)
    assert a["source_digest"] == digest
    assert len(by_key["h.txt"]["value.pad"]) == 20_000, "a record in the blob store is read"
    # Nothing vanishes: the rows' usage adds up to the run's, failures and retries included.
    usage = report["usage"]
    assert sum(r["tokens"] for r in rows) == usage["prompt_tokens"] + usage["completion_tokens"]
    assert sum(r["cost"] or 0 for r in rows) == pytest.approx(usage["cost"])


def test_outcome_and_stage_filters(tmp_path: Path, store_url: str, mixed: str) -> None:
    made_it = _rows(store_url, tmp_path / "blobs", mixed)
    outcomes = reconciled(store_url, mixed)["outcomes"]
    assert len(made_it) == sum(outcomes.get(o, 0) for o in ACCEPTED) > 0
    assert {r["outcome"] for r in made_it} <= set(ACCEPTED)
    refused = _rows(store_url, tmp_path / "blobs", mixed, outcome="failed,dead_lettered")
    assert sorted(r["item_key"] for r in refused) == ["d.txt", "e.txt", "f.txt"]
    assert all("value.title" not in r for r in refused), "no record for an item whose extraction failed"


def test_a_settled_run_reads_as_reconcile_counts_it(tmp_path: Path, store_url: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Every task succeeded: the rows' outcomes come from the items and their tasks' stages, without the
    outcome SQL, and are the ones that SQL gives (published, or completed: c's fan-out made no part)."""
    target = write_pipeline(tmp_path, PIPE)
    run_id = submit_and_work(target, manifest(tmp_path, GOOD), store_url, tmp_path / "blobs").run_id
    rows = _rows(store_url, tmp_path / "blobs", run_id, outcome="all", batch=2)
    assert {r["item_key"]: r["outcome"] for r in rows} == {"a.txt": "published", "b.md": "published",
                                                          "c": "completed"}
    assert Counter(r["outcome"] for r in rows) == Counter(reconciled(store_url, run_id)["outcomes"])
    monkeypatch.setattr("conveyor.service.export.settled", lambda store, run: False)
    assert _rows(store_url, tmp_path / "blobs", run_id, outcome="all", batch=2) == rows


def _export(tmp_path: Path, store_url: str, run_id: str, fmt: str, *more: str) -> dict[str, Any]:
    out = tmp_path / f"out.{fmt}"
    return cli_json("export", run_id, "--outcome", "all", "--format", fmt, "--out", str(out), "--db", store_url,
                    "--blobs", str(tmp_path / "blobs"), *more, cwd=tmp_path)


def test_each_format_gives_the_same_rows(tmp_path: Path, store_url: str, mixed: str) -> None:
    counts = cli_json("reconcile", mixed, "--db", store_url, cwd=tmp_path)["outcomes"]
    read: dict[str, list[dict[str, Any]]] = {}
    for fmt in ("jsonl", "csv", "parquet"):
        summary = _export(tmp_path, store_url, mixed, fmt)
        assert summary["rows"] == sum(counts.values()) and summary["format"] == fmt
        assert summary["path"] == str(tmp_path / f"out.{fmt}") and summary["run_id"] == mixed
        read[fmt] = _read(tmp_path / f"out.{fmt}", fmt)
        assert Counter(r["outcome"] for r in read[fmt]) == Counter(counts), fmt
    assert not list(tmp_path.glob("*.part")), "no temporary file is left"
    columns = list(read["parquet"][0])
    assert columns[:4] == list(LEAD) and columns[-len(TRAIL):] == list(TRAIL)
    assert {c for c in columns if c.startswith("value.")} == {"value.confidence", "value.kind", "value.n",
                                                              "value.pad", "value.title"}
    jsonl = {r["item_key"]: r for r in read["jsonl"]}
    for row in read["parquet"]:  # Parquet keeps nesting as structs; JSON lines as objects
        expected = {k: v for k, v in jsonl[row["item_key"]].items() if v is not None}
        assert {k: v for k, v in row.items() if v is not None} == expected, row["item_key"]
    for row in read["csv"]:  # CSV: text, nested values as JSON text, None as empty
        expected = jsonl[row["item_key"]]
        assert set(row) == set(columns)
        for name, text in row.items():
            value = expected.get(name)
            shown = "" if value is None else json.dumps(value) if isinstance(value, (dict, list)) else str(value)
            assert text == shown, (row["item_key"], name)


def _read(path: Path, fmt: str) -> list[dict[str, Any]]:
    if fmt == "parquet":
        return list(pq.read_table(path).to_pylist())
    text = path.read_text()
    if fmt == "csv":
        return list(csv.DictReader(io.StringIO(text)))
    return [json.loads(line) for line in text.splitlines()]


def test_stdout_and_a_stage_through_the_cli(tmp_path: Path, store_url: str, mixed: str) -> None:
    proc = cli("export", mixed, "--stage", "extract", "--db", store_url, "--blobs", str(tmp_path / "blobs"),
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert {r["item_key"] for r in rows} == {"a.txt", "b.md", "c", "h.txt"}
    proc = cli("export", mixed, "--format", "csv", "--db", store_url, "--blobs", str(tmp_path / "blobs"),
               cwd=tmp_path)
    assert proc.returncode == 0 and len(list(csv.DictReader(io.StringIO(proc.stdout)))) == 4


def test_a_collection_export_gives_its_live_versions(tmp_path: Path, store_url: str) -> None:
    project = Project(tmp_path, store_url)
    assert project.run()["outcomes"] == {"published": 3}
    second = project.run(VERSION="2", GEN="2")
    cli("rollback", "doc0001.txt", "--db", store_url, cwd=tmp_path, check=True)
    summary = cli_json("export", "--collection", "docs", "--format", "parquet", "--out", str(tmp_path / "c.parquet"),
                       "--db", store_url, cwd=tmp_path)
    assert summary["rows"] == 3 and summary["collection"] == "docs"
    rows = {r["item_key"]: r for r in pq.read_table(tmp_path / "c.parquet").to_pylist()}
    assert {k: (r["version"], r["value.gen"]) for k, r in rows.items()} == {
        "doc0000.txt": (2, "2"), "doc0001.txt": (3, "1"), "doc0002.txt": (2, "2")}, "live versions only"
    row = rows["doc0000.txt"]
    assert (row["collection"], row["outcome"], row["run_id"], row["stage"]) == ("docs", "published",
                                                                                second["run_id"], "publish")
    assert row["value.title"] == "document number 0" and row["stage_version"] == "1" and row["source_digest"]


@pytest.mark.parametrize(("args", "says"), [
    (["no-such-run"], "no run 'no-such-run'"),
    (["--collection", "nope"], "no collection 'nope'"),
    (["RUN", "--stage", "nope"], "--stage 'nope'"),
    (["RUN", "--stage", "publish"], "runs on fan-out children"),
    (["RUN", "--outcome", "great"], "--outcome 'great'"),
    (["RUN", "--out", "missing/out.jsonl"], "no folder"),
    (["RUN", "--collection", "docs"], "not both"),
    ([], "name what to export"),
    (["RUN", "--format", "xml"], "--format 'xml'"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, args: list[str], says: str) -> None:
    url = f"sqlite:///{tmp_path}/conveyor.db"
    target = write_pipeline(tmp_path, PIPE)
    run_id = submit_and_work(target, manifest(tmp_path, GOOD), url, tmp_path / "blobs").run_id
    args = [run_id if a == "RUN" else a for a in args]
    out = ["--out", str(tmp_path / "out" / "x.jsonl")] if "--out" not in args else []
    (tmp_path / "out").mkdir()
    proc = cli("export", *args, *out, "--db", url, "--blobs", str(tmp_path / "blobs"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not list((tmp_path / "out").iterdir()) and proc.stdout == ""


# --- columns that a later batch widens ----------------------------------------------------------------------------

def _batches(*batches: list[dict[str, Any]]) -> Export:
    def read() -> Iterator[list[dict[str, Any]]]:
        for batch in batches:
            yield [{"item_key": r["k"], "outcome": "completed", "error_class": None, "error": None,
                    **{f"value.{n}": v for n, v in r.items() if n != "k"}, "run_id": "r", "stage": "s",
                    "stage_version": "1", "config_hash": "c", "model": None, "prompt_version": None,
                    "provenance": None, "source_digest": None, "tokens": 0, "cost": 0.0} for r in batch]
    return Export(LEAD, TRAIL, {"run_id": "r"}, read)


def test_parquet_and_csv_widen_columns_a_later_batch_needs(tmp_path: Path) -> None:
    export = _batches([{"k": "a", "n": 1, "tag": {"x": 1}}, {"k": "b", "n": 2, "tag": None}],
                      [{"k": "c", "n": 2.5, "tag": {"x": 2, "y": "new"}, "extra": "late"}],
                      [{"k": "d", "n": "not a number", "tag": {"x": 3}}])
    assert write_export(export, "parquet", str(tmp_path / "w.parquet"))["rows"] == 4
    rows = pq.read_table(tmp_path / "w.parquet").to_pylist()
    assert [r["value.n"] for r in rows] == ["1", "2", "2.5", '"not a number"'], "mixed types become JSON text"
    assert rows[2]["value.tag"] == {"x": 2, "y": "new"} and rows[0]["value.tag"] == {"x": 1, "y": None}
    assert [r["value.extra"] for r in rows] == [None, None, "late", None]
    assert write_export(export, "csv", str(tmp_path / "w.csv"))["rows"] == 4
    read = list(csv.DictReader(io.StringIO((tmp_path / "w.csv").read_text())))
    assert [r["value.extra"] for r in read] == ["", "", "late", ""] and read[3]["value.n"] == "not a number"


def test_parquet_without_pyarrow_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(UserError, match=r"pip install 'conveyor\[data\]'"):
        write_export(_batches([{"k": "a"}]), "parquet", str(tmp_path / "x.parquet"))
    assert not list(tmp_path.iterdir())


# --- graphs: a gather brings children's outputs back to the root item; group items are rows of their own -------

def test_a_gather_is_a_root_items_value_and_a_childs_stage_is_refused(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, GATHER.replace("ON_CHILD_FAILURE", '"fail"'))
    docs = _docs(tmp_path / "docs", {"a.txt": "one two", "b.txt": "three poison"})
    run_id = submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id
    rows = _rows(store_url, tmp_path / "blobs", run_id, outcome="all")
    report = reconciled(store_url, run_id)
    assert Counter(r["outcome"] for r in rows) == Counter(report["outcomes"])
    assert {r["item_key"]: r.get("value") for r in rows if r["outcome"] in ACCEPTED} == {"a.txt": 2}, "count's"
    (b,) = [r for r in rows if r["item_key"] == "b.txt"]
    (entry,) = [e for e in report["not_done"] if e["item_key"] == "b.txt"]
    assert b["error_class"] in entry["error_classes"], "a child's failure, as reconcile names it"
    gathered = {r["item_key"]: r for r in _rows(store_url, tmp_path / "blobs", run_id, stage="collect",
                                                outcome="all")}
    assert gathered["a.txt"]["value.words"] == ["ONE", "TWO"]
    with pytest.raises(UserError, match="runs on fan-out children"):
        _rows(store_url, tmp_path / "blobs", run_id, stage="shout")


def test_group_items_are_rows_with_their_groups_value(tmp_path: Path, store_url: str) -> None:
    docs = _docs(tmp_path / "docs", {"a1.txt": "apple", "a2.txt": "avocado", "b1.txt": "banana", "x.txt": "broken"})
    run_id = submit_and_work(write_pipeline(tmp_path, GROUPED), docs, store_url, tmp_path / "blobs").run_id
    rows = _rows(store_url, tmp_path / "blobs", run_id, stage="by_letter", outcome="all")
    report = reconciled(store_url, run_id)
    assert Counter(r["outcome"] for r in rows) == Counter(report["outcomes"]) and report["unaccounted"] == 0
    groups = {r["item_key"]: r for r in rows if r["item_key"].startswith("group:")}
    assert groups["group:a"]["value.members"] == ["a1.txt", "a2.txt"] and "value.key" not in groups["group:*"]
    assert "value.members" not in next(r for r in rows if r["item_key"] == "a1.txt")
