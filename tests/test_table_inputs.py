"""Tables and S3 prefixes as inputs: `--input data.parquet|data.csv|data.jsonl --key COL --text|--path|--value COL
[--meta COL]` and `--input s3://bucket/prefix/`, end to end on SQLite and PostgreSQL: each row an item with the
right bytes and meta, an unchanged table re-run from the memo, a resume that reads the table by its recorded
columns, odd tables refused in one line before anything is created (or, with --skip-bad-lines, bad_input items),
and an S3 listing with nested keys, a folder marker and an object too large to read."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from conveyor.blobs import FilesystemBlobs  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.runtime.target import load_target  # noqa: E402
from conveyor.service import submit as submission  # noqa: E402
from conveyor.service.inputs import check_input  # noqa: E402
from conveyor.service.tables import TableColumns, check_table, input_spec, table_input, table_items  # noqa: E402
from conveyor.store import open_store  # noqa: E402
from tests.helpers import cli, cli_json, query, reconciled, submit_and_work, write_pipeline  # noqa: E402
from tests.s3server import S3Server  # noqa: E402

PIPE = """
    from conveyor import Pipeline

    pipe = Pipeline("tables")

    @pipe.stage(version="1", max_input_bytes=100_000)
    def parse(ctx, source: bytes) -> dict:
        return {"n": len(source)}
"""
ROWS = [
    {"id": "doc-1", "body": "first text", "lang": "en", "pages": 3, "record": {"b": 1, "a": [1, 2]}},
    {"id": "doc-2", "body": "zweiter Text", "lang": "de", "pages": 7, "record": {"b": 2, "a": None}},
    {"id": "doc-3", "body": "troisième " * 2000, "lang": "fr", "pages": 1, "record": {"b": 3, "a": [5]}},
]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(folder: Path, fmt: str, rows: list[dict[str, Any]]) -> Path:
    """The rows as a table in ``fmt`` (CSV leaves out the nested column), each row's file beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "files").mkdir(exist_ok=True)
    for row in rows:
        (folder / "files" / f"{row['id']}.txt").write_text(row["body"])
    table = [{**row, "file": f"files/{row['id']}.txt"} for row in rows]
    path = folder / f"data.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(table), path)
    elif fmt == "csv":
        import pyarrow.csv

        flat = [{k: v for k, v in r.items() if k != "record"} for r in table]
        pyarrow.csv.write_csv(pa.Table.from_pylist(flat), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in table))
    return path


def _sources(store_url: str, run_id: str) -> dict[str, str]:
    return dict(query(store_url, "SELECT item_key, input_digest FROM tasks WHERE run_id = ? AND stage = 'parse'",
                      run_id))


def _metas(store_url: str, run_id: str) -> dict[str, Any]:
    return {key: None if meta is None else json.loads(meta)
            for key, meta in query(store_url, "SELECT item_key, meta FROM items WHERE run_id = ?", run_id)}


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_each_format_runs_each_source_column_and_an_unchanged_table_runs_again_from_the_memo(
        tmp_path: Path, store_url: str, fmt: str) -> None:
    target, table = write_pipeline(tmp_path, PIPE), _write(tmp_path / "in", fmt, ROWS)
    blobs = tmp_path / "blobs"
    first = cli_json("run", target, "--input", str(table), "--key", "id", "--text", "body", "--meta", "lang",
                     "--meta", "pages", "--workers", "0", "--db", store_url, "--blobs", str(blobs), cwd=tmp_path)
    assert (first["outcomes"], first["stage_calls"]) == ({"completed": 3}, 3)
    assert _sources(store_url, first["run_id"]) == {r["id"]: _digest(r["body"].encode()) for r in ROWS}
    assert _metas(store_url, first["run_id"]) == {r["id"]: {"lang": r["lang"], "pages": r["pages"]} for r in ROWS}
    [(label,)] = query(store_url, "SELECT input FROM runs WHERE run_id = ?", first["run_id"])
    assert label == table_input(table, TableColumns("id", text="body", meta=("lang", "pages")))
    assert query(store_url, "SELECT COUNT(*) FROM checked_inputs WHERE path = ?", str(table.resolve())) == [(1,)]

    # The rest in this process (the same service the command line calls), to keep the file quick.
    again = submit_and_work(target, label, store_url, blobs)
    assert (again.expected, again.cached) == (3, 3)

    # --path: the files the rows name, relative to the table's folder: the same bytes, so the memo answers.
    by_path = submit_and_work(target, table_input(table, TableColumns("id", path="file")), store_url, blobs)
    assert (by_path.expected, by_path.cached) == (3, 3)
    assert _metas(store_url, by_path.run_id) == {r["id"]: None for r in ROWS}

    if fmt != "csv":  # --value: the JSON of each row's value, keys sorted
        by_value = submit_and_work(target, table_input(table, TableColumns("id", value="record")), store_url,
                                   blobs)
        assert (by_value.expected, by_value.cached) == (3, 0)
        assert _sources(store_url, by_value.run_id) == {
            r["id"]: _digest(orjson.dumps(r["record"], option=orjson.OPT_SORT_KEYS)) for r in ROWS}
        assert reconciled(store_url, by_value.run_id)["outcomes"] == {"completed": 3}


def test_a_jsonl_file_without_key_is_still_a_manifest(tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, PIPE)
    manifest = tmp_path / "items.jsonl"
    manifest.write_text('{"key": "a", "text": "one", "meta": {"lang": "en"}}\n{"key": "b", "text": "two"}\n')
    store_url = f"sqlite:///{tmp_path}/c.db"
    done = cli_json("run", target, "--input", str(manifest), "--workers", "0", "--db", store_url, cwd=tmp_path)
    assert done["outcomes"] == {"completed": 2}
    assert _metas(store_url, done["run_id"]) == {"a": {"lang": "en"}, "b": None}
    assert query(store_url, "SELECT input FROM runs") == [(str(manifest),)]


def test_resume_reads_the_table_by_the_columns_its_run_recorded(
        tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A submission stopped after its first batch of 5,000 rows; `conveyor resume` reads the rest by the recorded
    columns (key, text and meta), none twice."""
    count = 7000
    target = write_pipeline(tmp_path, PIPE)
    table = tmp_path / "big.parquet"
    pq.write_table(pa.table({"name": [f"k{i:05d}" for i in range(count)], "body": [f"text {i}" for i in range(count)],
                             "group": [i % 3 for i in range(count)]}), table)
    label = table_input(table, TableColumns("name", text="body", meta=("group",)))
    batch, seen = submission._Ingest.batch, []

    def stopping(self: Any, items: list[Any]) -> int:
        seen.append(1)
        if len(seen) == 2:
            raise KeyboardInterrupt
        return batch(self, items)

    monkeypatch.setattr(submission._Ingest, "batch", stopping)
    store = open_store(store_url)
    try:
        with pytest.raises(KeyboardInterrupt):
            submission.submit(load_target(target), target, label, store, FilesystemBlobs(tmp_path / "blobs"))
    finally:
        store.close()
    [(run_id, status)] = query(store_url, "SELECT run_id, status FROM runs")
    assert status == "abandoned"
    assert query(store_url, "SELECT COUNT(*) FROM items WHERE run_id = ?", run_id) == [(5000,)]

    done = cli_json("resume", run_id, "--workers", "0", "--db", store_url, "--blobs", str(tmp_path / "blobs"),
                    cwd=tmp_path)
    assert (done["run_id"], done["expected"], done["outcomes"]) == (run_id, count, {"completed": count})
    assert done["stage_calls"] == count
    metas = _metas(store_url, run_id)
    assert metas["k06999"] == {"group": 6999 % 3} and len(metas) == count
    assert _sources(store_url, run_id)["k06500"] == _digest(b"text 6500")


def _odd(tmp_path: Path, case: str) -> tuple[Path, str]:
    """(an odd table, its one-line error); its columns are read as --key id --text body."""
    def parquet(**columns: list[Any]) -> Path:
        path = tmp_path / "odd.parquet"
        pq.write_table(pa.table(columns), path)
        return path

    if case == "null key":
        path = parquet(id=["a", None, "c"], body=["x", "y", "z"])
        return path, (
            f"{path} row 2: column 'id' (--key) is null; every row needs a key (or pass --skip-bad-lines)")
    if case == "null text":
        path = parquet(id=["a", "b"], body=["x", None])
        return path, (
            f"{path} row 2: column 'body' (--text) is null; every row needs one (or pass --skip-bad-lines)")
    if case == "duplicate key":
        path = tmp_path / "odd.csv"
        path.write_text("id,body\n007,x\n008,y\n007,z\n")
        return path, (
            f"{path} row 3: key '007' is also on row 1; keys must be unique within a table")
    if case == "missing column":
        path = parquet(id=["a"], text=["x"], lang=["en"])
        return path, (
            f"{path} has no column 'body' (named by --text); its columns are 'id', 'text', 'lang': name one of them")
    if case == "wrong type":
        path = parquet(id=["a"], body=[3])
        return path, (
            f"{path}: column 'body' (--text) holds int64 values; --text takes strings or bytes (--value takes any "
            "JSON value)")
    if case == "float key":
        path = parquet(id=[1.5], body=["x"])
        return path, (
            f"{path}: column 'id' (--key) holds double values; keys must be strings or integers: cast the column")
    if case == "jsonl missing column":
        path = tmp_path / "odd.jsonl"
        path.write_text('{"id": "a", "txt": "x"}\n')
        return path, (
            f"{path} has no column 'body' (named by --text); its columns are 'id', 'txt': name one of them")
    if case == "jsonl wrong type":
        path = tmp_path / "odd.jsonl"
        path.write_text('{"id": "a", "body": "x"}\n{"id": ["b"], "body": "y"}\n')
        return path, (
            f"{path} line 2: 'id' (--key) is an array; keys must be strings or integers (or pass --skip-bad-lines)")
    assert case == "folder"
    (tmp_path / "docs").mkdir()
    return tmp_path / "docs", (
        f"--key and --text read the columns of a table; --input {tmp_path / 'docs'} is a folder or prefix, whose "
        "files are the items: leave them out, or give a .parquet, .csv or .jsonl file")


ODD = ["null key", "null text", "duplicate key", "missing column", "wrong type", "float key", "jsonl missing column",
       "jsonl wrong type", "folder"]


@pytest.mark.parametrize("case", ODD)
def test_an_odd_table_is_refused_in_one_line_before_anything_is_created(tmp_path: Path, case: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    table, message = _odd(tmp_path, case)
    store = open_store(f"sqlite:///{tmp_path}/c.db")
    try:
        with pytest.raises(InputError) as refused:
            label = input_spec(str(table), "id", text="body")
            submission.submit(load_target(target), target, label, store, FilesystemBlobs(tmp_path / "b"))
        assert str(refused.value) == message
        assert store.db.execute("SELECT COUNT(*) FROM runs") == [(0,)]
    finally:
        store.close()


def test_the_command_line_says_why_a_table_is_refused_in_one_line(tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, PIPE)
    table, message = _odd(tmp_path, "missing column")
    store_url = f"sqlite:///{tmp_path}/c.db"
    proc = cli("submit", target, "--input", str(table), "--key", "id", "--text", "body", "--db", store_url,
               "--blobs", str(tmp_path / "b"), cwd=tmp_path)
    assert (proc.returncode, proc.stderr.strip().splitlines()) == (2, [f"error: {message}"])
    assert query(store_url, "SELECT COUNT(*) FROM runs") == [(0,)]
    alone = cli("submit", target, "--input", str(table), "--text", "body", "--db", store_url, cwd=tmp_path)
    assert (alone.returncode, alone.stderr.strip()) == (
        2, "error: --text reads a table's columns: name the column of item keys with --key COL too")


def test_bad_rows_become_bad_input_items_with_skip_bad_lines(tmp_path: Path, store_url: str) -> None:
    target = write_pipeline(tmp_path, PIPE)
    table = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": ["good", None, "tab\there", "", "no-text"],
                             "body": ["x", "y", "z", "w", None]}), table)
    done = cli_json("run", target, "--input", str(table), "--key", "id", "--text", "body", "--skip-bad-lines",
                    "--workers", "0", "--db", store_url, "--blobs", str(tmp_path / "blobs"), cwd=tmp_path)
    assert done["outcomes"] == {"completed": 1, "failed": 4}
    errors = {entry["item_key"]: entry["tasks"][0] for entry in done["not_done"]}
    assert sorted(errors) == ["rows.parquet:2", "rows.parquet:3", "rows.parquet:4", "rows.parquet:5"]
    assert {task["error_class"] for task in errors.values()} == {"bad_input"}
    assert errors["rows.parquet:3"]["error"] == ("rows.parquet row 3: key 'tab\\there' holds the control character "
                                                 "'\\t'; keys must be printable")
    assert errors["rows.parquet:5"]["error"] == ("rows.parquet row 5: column 'body' (--text) is null; every row "
                                                 "needs one")


def test_the_reader_takes_arrow_tables_in_memory(tmp_path: Path) -> None:
    """What the Python API passes: a pyarrow Table (a DataFrame converted) or a RecordBatchReader."""
    table = pa.table({"id": [1, 2], "v": [{"b": 1, "a": 2}, {"b": None, "a": 3}], "when": pa.array(
        [0, 86_400_000_000], pa.timestamp("us"))})
    columns = TableColumns("id", value="v", meta=("when",))
    check_table(table, columns)
    items = list(table_items(table, columns))
    assert [(i.key, i.text, i.meta) for i in items] == [
        ("1", b'{"a":2,"b":1}', {"when": "1970-01-01T00:00:00"}),
        ("2", b'{"a":3,"b":null}', {"when": "1970-01-02T00:00:00"})]
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
    assert [i.key for i in table_items(reader, columns)] == ["1", "2"]
    with pytest.raises(Exception, match="read only once"):
        check_table(pa.RecordBatchReader.from_batches(table.schema, table.to_batches()), columns)
    twice = pa.table({"id": ["a", "b", "a"], "body": ["x", "y", "z"]})
    with pytest.raises(Exception, match=r"^the table row 3: key 'a' is also on row 1; keys must be unique"):
        check_table(twice, TableColumns("id", text="body"))


S3_PIPE = """
    from conveyor import Pipeline

    pipe = Pipeline("bucket")

    @pipe.stage(version="1", max_input_bytes=50_000)
    def parse(ctx, source: bytes) -> dict:
        return {"n": len(source)}
"""


def test_an_s3_prefix_is_listed_as_items(tmp_path: Path, store_url: str, s3_env: S3Server) -> None:
    client, bucket = s3_env.client(), s3_env.bucket
    prefix = f"in-{uuid.uuid4().hex[:12]}"
    objects = {"a.txt": b"alpha", "sub/b.txt": b"beta " * 3000, "sub/deeper/c.txt": b"gamma",
               "odd\x01name.txt": b"delta", "huge.bin": b"x" * 60_000}
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=body)
    client.put_object(Bucket=bucket, Key=f"{prefix}/sub/", Body=b"")  # a console's folder marker
    client.put_object(Bucket=bucket, Key=f"{prefix}-beside/x.txt", Body=b"not below the prefix")
    target = write_pipeline(tmp_path, S3_PIPE)
    args = ["run", target, "--input", f"s3://{bucket}/{prefix}/", "--workers", "0", "--db", store_url,
            "--blobs", str(tmp_path / "blobs")]

    done = cli_json(*args, cwd=tmp_path, env=s3_env.env())
    keys = {"a.txt", "sub/b.txt", "sub/deeper/c.txt", "odd\\x01name.txt", "huge.bin"}
    assert set(_sources(store_url, done["run_id"])) == keys
    assert done["outcomes"] == {"completed": 4, "failed": 1}
    [failed] = done["not_done"]
    assert (failed["item_key"], failed["error_classes"]) == ("huge.bin", ["input_too_large"])
    sources = _sources(store_url, done["run_id"])
    for key, body in objects.items():
        if key != "huge.bin":
            assert sources[key.replace("\x01", "\\x01")] == _digest(body)

    again = submit_and_work(target, f"s3://{bucket}/{prefix}", store_url, tmp_path / "blobs")  # no final "/"
    assert (again.expected, again.cached) == (5, 5)  # the refusal of huge.bin is memoised too

    with pytest.raises(InputError, match=r"^--input s3://no-such-bucket-here/x/: the bucket 'no-such-bucket-here' "
                                         r"does not exist at http://"):
        check_input("s3://no-such-bucket-here/x/")
