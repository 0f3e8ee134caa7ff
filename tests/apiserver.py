"""A real `conveyor serve` for the API tests: uvicorn on a free port in its own process, workers beside it,
an httpx client, and tokens made the way `conveyor token create` makes them."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from conveyor.service.tokens import create_token
from conveyor.store import open_store
from tests.children import spawn, stop_group
from tests.helpers import SRC

SMALL_PIPELINE = """
import time

from conveyor import Pipeline, Retry

pipe = Pipeline("api", retry=Retry(max_attempts=2, base=0.05, cap=0.1))

@pipe.stage()
def parse(ctx, source: bytes) -> dict:
    if source.startswith(b"poison"):
        raise ValueError("poison document")
    if source.startswith(b"slow"):
        time.sleep(1.0)
    return {"text": source.decode(errors="replace"), "n": len(source)}

@pipe.stage(after=parse)
def shout(ctx, doc: dict) -> dict:
    return {"upper": doc["text"][:200].upper(), "n": doc["n"]}
"""


def free_port() -> int:
    """A port nothing listens on, below Linux's ephemeral range (32768-60999), so that no client connection of a
    test running beside this one takes it between this check and the server's bind."""
    for _ in range(200):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port between 20000 and 32000")


def make_token(store_url: str, tenant: str = "acme", operator: bool = False) -> dict[str, Any]:
    store = open_store(store_url)
    try:
        return create_token(store, tenant, operator)
    finally:
        store.close()


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    store_url: str
    blobs: Path
    log: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def client(self, token: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kwargs.pop("timeout", 30), **kwargs)

    def token(self, tenant: str = "acme", operator: bool = False) -> str:
        if tenant not in self.tokens:
            self.tokens[tenant] = make_token(self.store_url, tenant, operator)["token"]
        return self.tokens[tenant]

    def wait_for(self, token: str, job_id: str, statuses: tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
        """Poll the job until its status is one of ``statuses``; its last view."""
        deadline = time.monotonic() + timeout
        with self.client(token) as c:
            while True:
                view: dict[str, Any] = c.get(f"/v1/jobs/{job_id}").json()
                if view.get("status") in statuses or time.monotonic() > deadline:
                    return view
                time.sleep(0.1)


@contextmanager
def served(tmp_path: Path, store_url: str, target: str, *args: str, workers: int = 1,
           env: dict[str, str] | None = None, port: int | None = None) -> Iterator[Server]:
    """`conveyor serve -p TARGET` on a free port until the block ends (SIGTERM, then SIGKILL). A port another
    test took first (the server says so and exits 2) is exchanged for another."""
    for attempt in range(5):
        server = _start(tmp_path, store_url, target, args, workers, env, port or free_port())
        try:
            _wait_ready(server)
        except _PortTaken:
            if port is not None or attempt == 4:
                raise
            continue
        except BaseException:
            stop(server.proc)
            raise
        try:
            yield server
        finally:
            stop(server.proc)
        return


class _PortTaken(AssertionError):
    pass


def _start(tmp_path: Path, store_url: str, target: str, args: tuple[str, ...], workers: int,
           env: dict[str, str] | None, port: int) -> Server:
    blobs = tmp_path / "blobs"
    log = tmp_path / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "conveyor", "serve", "-p", target, "--port", str(port), "--db", store_url,
           "--blobs", str(blobs), "--workers", str(workers), *args]
    full_env = {**os.environ, "PYTHONPATH": SRC, **(env or {})}
    with log.open("wb") as out:
        proc = spawn(cmd, cwd=tmp_path, env=full_env, stdout=out, stderr=subprocess.STDOUT)
    return Server(f"http://127.0.0.1:{port}", proc, store_url, blobs, log)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Stop the server and the workers it started (its process group)."""
    stop_group(proc, sig)


def _wait_ready(server: Server, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            said = server.log.read_text()
            if "cannot listen on" in said or "address already in use" in said.lower():
                raise _PortTaken(said)
            raise AssertionError(f"conveyor serve exited {server.proc.returncode}:\n{said}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"conveyor serve did not answer within {timeout} s:\n{server.log.read_text()}")
