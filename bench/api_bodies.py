"""Refuse before reading (issue 27 point 6): what large unwanted bodies cost `conveyor serve` in memory.

    .venv/bin/python bench/api_bodies.py [--src DIR]

Starts `conveyor serve --workers 0` on 127.0.0.1 with a fresh SQLite store, warms it with a few small requests,
then sends, one at a time, bodies made by a generator as they go out (the client never holds one whole):

- 200 MiB of JSON to POST /v1/replays with no token, chunked (no Content-Length to refuse it by), and the same
  with its Content-Length declared;
- 300 MiB of multipart form fields (1 KiB each) to POST /v1/jobs with no token, and with a valid token;
- 300 MiB of urlencoded form to a dashboard form (POST /reviews/1/reject) with a valid token;
- 200 MiB of JSON to POST /v1/replays with a valid token, chunked.

For each: the answer's status, the time until it came, and the server's resident memory (VmRSS of
/proc/PID/status) before, after, and at its peak (sampled every 20 ms), against the target of staying within
64 MB of where it started. ``--src`` runs another source tree (the code before the change, to compare).
Prints a table; figures go into bench/RESULTS.md by hand. Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
TARGET = 64 * 1000 * 1000  # "within 64 MB of where it started"

PIPELINE = """
from conveyor import Pipeline

pipe = Pipeline("bodies")

@pipe.stage()
def parse(ctx, source: bytes) -> dict:
    return {"n": len(source)}
"""


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    content_type: str
    size: int
    token: bool
    declared: bool = False
    kind: str = "json"  # json | fields | urlencoded


CASES = [
    Case("200 MiB JSON, no token, chunked", "/v1/replays", "application/json", 200 * MiB, token=False),
    Case("200 MiB JSON, no token, Content-Length", "/v1/replays", "application/json", 200 * MiB, token=False,
         declared=True),
    Case("300 MiB multipart fields, no token", "/v1/jobs", "multipart/form-data; boundary=b", 300 * MiB,
         token=False, kind="fields"),
    Case("300 MiB multipart fields, token", "/v1/jobs", "multipart/form-data; boundary=b", 300 * MiB, token=True,
         kind="fields"),
    Case("300 MiB dashboard form, token", "/reviews/1/reject", "application/x-www-form-urlencoded", 300 * MiB,
         token=True, kind="urlencoded"),
    Case("200 MiB JSON, token, chunked", "/v1/replays", "application/json", 200 * MiB, token=True),
]


def body(case: Case) -> Iterator[bytes]:
    """``case.size`` bytes of its kind, made 1 MiB at a time."""
    if case.kind == "fields":
        yield from _fields(case.size)
        return
    head = b'{"reason": "retry", "note": "' if case.kind == "json" else b"why="
    yield head
    sent, block = len(head), (b"x" * MiB)
    while sent < case.size:
        part = block[: case.size - sent]
        sent += len(part)
        yield part


def _fields(size: int) -> Iterator[bytes]:
    value = b"v" * 1000
    sent, i, batch = 0, 0, []
    while sent < size:
        part = b'--b\r\nContent-Disposition: form-data; name="f%d"\r\n\r\n' % i + value + b"\r\n"
        batch.append(part)
        sent += len(part)
        i += 1
        if len(batch) == 1000:
            yield b"".join(batch)
            batch = []
    yield b"".join(batch) + b"--b--\r\n"


def length_of(case: Case) -> int:
    return sum(len(chunk) for chunk in body(case))


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class Peak:
    """The highest RSS of ``pid`` while the block runs, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid, self.most = pid, rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            self.most = max(self.most, rss(self.pid))

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.most = max(self.most, rss(self.pid))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(work: Path, src: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """`conveyor serve` on a fresh SQLite store; (its process, its URL, an operator token)."""
    sys.path.insert(0, str(src))
    from conveyor.service.tokens import create_token
    from conveyor.store import open_store

    db = f"sqlite:///{work}/conveyor.db"
    store = open_store(db)
    try:
        token = create_token(store, "acme", operator=True)["token"]
    finally:
        store.close()
    (work / "pipe.py").write_text(PIPELINE)
    port = free_port()
    cmd = [sys.executable, "-m", "conveyor", "serve", "-p", f"{work}/pipe.py:pipe", "--port", str(port), "--db", db,
           "--blobs", str(work / "blobs"), "--workers", "0", "--no-relay"]
    env = {**os.environ, "PYTHONPATH": str(src)}
    with (work / "serve.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url, token
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"conveyor serve did not start:\n{(work / 'serve.log').read_text()}")


def warm(url: str, token: str) -> None:
    """Touch every path the cases take, so lazy imports and first allocations are in the baseline."""
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=30) as c:
        for _ in range(3):
            c.post("/v1/replays", json={"reason": "retry", "runs": ["r-none"], "dry_run": True}, headers=auth)
            c.post("/v1/jobs", files={"file": ("a.txt", b"warm")}, data={"lane": "bulk"}, headers=auth)
            c.post("/v1/jobs", content=b"x" * 1000, headers={"Content-Type": "application/json"})
            c.post("/reviews/1/reject", data={"why": "warm"}, headers=auth)
            c.get("/healthz")


def send(url: str, token: str, case: Case) -> tuple[int, float]:
    headers = {"Content-Type": case.content_type}
    if case.token:
        headers["Authorization"] = f"Bearer {token}"
    if case.declared:
        headers["Content-Length"] = str(length_of(case))
    began = time.monotonic()
    try:
        with httpx.Client(base_url=url, timeout=300) as c:
            status = c.post(case.path, content=body(case), headers=headers).status_code
    except httpx.HTTPError as exc:  # the server may close the connection on a refused body
        print(f"  ({case.name}: {type(exc).__name__}: {exc})")
        return -1, time.monotonic() - began
    return status, time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the source tree to serve (default: this one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conveyor-bodies-") as tmp:
        proc, url, token = start(Path(tmp), args.src.resolve())
        try:
            warm(url, token)
            print(f"conveyor serve (pid {proc.pid}) from {args.src}; RSS after warm-up {rss(proc.pid) / 1e6:.0f} MB")
            print("| case | status | s | RSS before MB | after MB | peak MB | peak growth MB | growth / 64 MB |")
            print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            for case in CASES:
                before = rss(proc.pid)
                with Peak(proc.pid) as peak:
                    status, took = send(url, token, case)
                time.sleep(0.5)
                after = rss(proc.pid)
                grew = peak.most - before
                print(f"| {case.name} | {status} | {took:.1f} | {before / 1e6:.0f} | {after / 1e6:.0f} | "
                      f"{peak.most / 1e6:.0f} | {grew / 1e6:+.0f} | {grew / TARGET:.2f} |", flush=True)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)


if __name__ == "__main__":
    main()
