"""`conveyor run ... --blobs s3://bucket/prefix` end to end against a real S3 server (SeaweedFS), on SQLite
and PostgreSQL: worker processes open the bucket themselves, outputs land in it under their digests, a blob
altered in the bucket is refused, and a wrong bucket or endpoint is one clear line."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.apiserver import free_port
from tests.helpers import cli, cli_json, query, write_pipeline
from tests.s3server import S3Proxy, S3Server

PIPE = """
    from conveyor import Pipeline, Retry

    pipe = Pipeline("s3run", retry=Retry(max_attempts=2, base=0.01, cap=0.02))

    @pipe.stage(version="1")
    def parse(ctx, source: bytes) -> dict:
        return {"text": source.decode(), "n": len(source)}

    @pipe.stage(after=parse, version="1")
    def shout(ctx, doc: dict) -> dict:
        return {"upper": doc["text"].upper(), "n": doc["n"]}
"""

DOCS = 6


def _docs(folder: Path) -> Path:
    """Documents over the 8 KiB inline limit, so inputs and outputs alike are blobs."""
    folder.mkdir()
    for i in range(DOCS):
        (folder / f"doc{i}.txt").write_text(f"document {i} " + "lorem ipsum " * 1000)
    return folder


def _stored(s3: S3Server, url: str) -> dict[str, bytes]:
    prefix = url.removeprefix(f"s3://{s3.bucket}/") + "/"
    client = s3.client()
    return {key: client.get_object(Bucket=s3.bucket, Key=key)["Body"].read() for key in s3.keys(prefix)}


def test_run_with_blobs_in_s3(s3: S3Server, store_url: str, tmp_path: Path) -> None:
    target, docs, url = write_pipeline(tmp_path, PIPE), _docs(tmp_path / "docs"), s3.new_url()
    args = ["run", target, "--input", str(docs), "--workers", "2", "--db", store_url, "--blobs", url]

    first = cli_json(*args, cwd=tmp_path, env=s3.env())
    assert first["outcomes"] == {"completed": DOCS}
    assert first["stage_calls"] == 2 * DOCS

    stored = _stored(s3, url)
    for key, data in stored.items():
        assert key.rsplit("/", 1)[1] == hashlib.sha256(data).hexdigest(), f"{key} does not hold its digest's bytes"
    texts = [data.decode() for data in stored.values()]
    for i in range(DOCS):
        assert any(t.startswith(f"document {i} ") for t in texts), f"doc{i}'s input is not in the bucket"
        assert any(f'"upper":"DOCUMENT {i} LOREM' in t for t in texts), f"doc{i}'s output is not in the bucket"

    shown = cli_json("show", first["run_id"], "doc3.txt", "--db", store_url, "--blobs", url, cwd=tmp_path,
                     env=s3.env())
    assert "DOCUMENT 3 LOREM IPSUM" in str(shown)

    again = cli_json(*args, cwd=tmp_path, env=s3.env())
    assert again["outcomes"] == {"completed": DOCS}
    assert (again["stage_calls"], again["cached"]) == (0, 2 * DOCS)


def test_blob_altered_in_the_bucket_is_refused(s3: S3Server, store_url: str, tmp_path: Path) -> None:
    target, docs, url = write_pipeline(tmp_path, PIPE), _docs(tmp_path / "docs"), s3.new_url()
    common = ["--db", store_url, "--blobs", url]
    run_id = cli_json("submit", target, "--input", str(docs), *common, cwd=tmp_path, env=s3.env())["run_id"]
    victim = (docs / "doc2.txt").read_bytes()
    key = next(k for k, data in _stored(s3, url).items() if data == victim)
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=victim.replace(b"lorem", b"LOREM", 1))

    cli("worker", target, "--until-idle", "--quiet", *common, cwd=tmp_path, env=s3.env(), check=True)
    report = cli_json("reconcile", run_id, *common, cwd=tmp_path, env=s3.env())
    assert report["outcomes"] == {"completed": DOCS - 1, "dead_lettered": 1}
    (refused,) = report["not_done"]
    assert refused["item_key"] == "doc2.txt"
    assert refused["error_classes"] == ["blob_corrupt"]


def test_s3_away_past_its_retries_is_a_task_retry(s3: S3Server, tmp_path: Path) -> None:
    """Reads refused past botocore's tries (one, with AWS_MAX_ATTEMPTS=1) fail the task as blob_unavailable, and
    conveyor's own retry finishes it: no item lost, none failed."""
    proxy = S3Proxy(s3.endpoint)
    try:
        target, docs, url = write_pipeline(tmp_path, PIPE), _docs(tmp_path / "docs"), s3.new_url()
        db = f"sqlite:///{tmp_path}/c.db"
        env = {**s3.env(), "CONVEYOR_S3_ENDPOINT": proxy.endpoint, "AWS_MAX_ATTEMPTS": "1"}
        common = ["--db", db, "--blobs", url]
        run_id = cli_json("submit", target, "--input", str(docs), *common, cwd=tmp_path, env=env)["run_id"]
        proxy.methods, proxy.refuse = {"GET"}, 3
        cli("worker", target, "--until-idle", "--quiet", *common, cwd=tmp_path, env=env, check=True)
        assert proxy.refuse == 0, "the worker met every refusal"
        assert cli_json("reconcile", run_id, *common, cwd=tmp_path, env=env)["outcomes"] == {"completed": DOCS}
        retried = query(db, "SELECT error_class FROM attempts WHERE outcome <> 'succeeded'")
        assert retried == [("blob_unavailable",)] * 3
    finally:
        proxy.close()


@pytest.mark.parametrize("problem", ["missing bucket", "unreachable endpoint", "wrong secret"])
def test_s3_trouble_is_one_line(s3: S3Server, tmp_path: Path, problem: str) -> None:
    target, docs = write_pipeline(tmp_path, PIPE), _docs(tmp_path / "docs")
    env, url, expected = s3.env(), s3.new_url(), ""
    if problem == "missing bucket":
        url, expected = "s3://no-such-bucket-here/runs", "does not exist"
    elif problem == "unreachable endpoint":
        env["CONVEYOR_S3_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"
        expected = "cannot reach the S3 endpoint"
    else:
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
        expected = "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    proc = cli("run", target, "--input", str(docs), "--db", f"sqlite:///{tmp_path}/c.db", "--blobs", url,
               cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{proc.stderr}"
    assert lines[0].startswith("error: ") and expected in lines[0]
