"""HTTP service benchmark: how fast `conveyor serve` accepts jobs, and how soon an idle fleet starts one.

    .venv/bin/python bench/api.py [--seconds 10] [--clients 50] [--pace 100@0.1 --pace 20@1] [--fleet 2]
                                  [--pg URL] [--no-write]

On a fresh SQLite file and a fresh PostgreSQL database (created here, dropped afterwards), with a one-stage
pipeline whose stage returns the time it started:

1. **Acceptance.** `conveyor serve --workers 0` (nothing processes the jobs, so only acceptance is measured);
   ``--clients`` concurrent clients POST /v1/jobs with distinct JSON documents for ``--seconds``; the latency
   of each 202 (p50, p99) and the jobs accepted per second. Twice: with httpx (an AsyncClient per client), and
   with a raw HTTP/1.1 client that costs next to nothing; on a small machine httpx's own CPU is a large part
   of the first figure. The CPU the server process and the clients spent per second is printed beside it
   (100% is one core: the server is one Python process).
2. **Enqueue to first stage start.** `conveyor serve --workers FLEET`, left idle for a few seconds; then, for
   each ``--pace JOBS@SECONDS``, JOBS jobs submitted one at a time, SECONDS apart; for each, the time its stage
   started (what the stage returned) minus the job's ``created_at`` (GET /v1/jobs/{id}), p50 and p99. The
   issue's goal: p50 <= 10 ms on PostgreSQL, whose idle workers wait on LISTEN and are woken by the NOTIFY that
   the job's creating transaction sends (SQLite's idle workers watch for commits: store/dialect.py). An idle
   worker first sleeps 10, 20, 40 ms between claims and only then waits for a wake-up: jobs 100 ms apart may
   meet a worker still sleeping, jobs 1 s apart meet one that is waiting. ``created_at`` is taken in the
   request before the job's transaction, so the figure includes that transaction; the time from the 202's
   arrival to the stage's start is printed beside it (negative when the stage started first).

The clients run in this process, on the same machine as the server and the workers. Writes its section of
bench/RESULTS.md. Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from results import markers, pg_database, write_section  # noqa: E402

from conveyor.service.tokens import create_token  # noqa: E402
from conveyor.store import open_store  # noqa: E402

SCRIPT = "api"
BEGIN, END = markers(f"{SCRIPT}.py")
DEFAULT_PG = os.environ.get("CONVEYOR_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
GOAL_P50_MS = 10.0  # enqueue to first stage start, PostgreSQL
DEFAULT_PACE = ["100@0.1", "20@1"]
IDLE_S = 3.0  # the fleet settles into waiting for work before the first job
PIPELINE = """
import time
from conveyor import Pipeline

pipe = Pipeline("bench_api")

@pipe.stage
def start(ctx, source: bytes) -> dict:
    return {"started": time.time()}
"""


# --- a server -----------------------------------------------------------------------------------------------

@dataclass
class Server:
    url: str
    token: str
    proc: subprocess.Popen[bytes]


@contextmanager
def serving(work: Path, db: str, workers: int) -> Iterator[Server]:
    """`conveyor serve` on a free port, with ``workers`` worker processes beside it, until the block ends."""
    target = f"{work / 'pipe.py'}:pipe"
    store = open_store(db)
    try:
        token = create_token(store, "bench")["token"]
    finally:
        store.close()
    port = free_port()
    cmd = [sys.executable, "-m", "conveyor", "serve", "-p", target, "--port", str(port), "--db", db,
           "--blobs", str(work / "blobs"), "--workers", str(workers), "--no-relay"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with (work / f"serve-{port}.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", token, proc)
    try:
        wait_ready(server, work / f"serve-{port}.log")
        yield server
    finally:
        stop(proc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(server: Server, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"conveyor serve exited {server.proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"conveyor serve did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """The server and its workers (its process group): SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- 1. acceptance --------------------------------------------------------------------------------------------

@dataclass
class Accepted:
    latencies: list[float]  # seconds, one per 202
    seconds: float
    refused: int  # answers other than 202
    client_cpu: float  # CPU seconds the clients (this process) spent per wall second


Post = Callable[[bytes], Awaitable[int]]  # send one JSON body to POST /v1/jobs; the answer's status


@asynccontextmanager
async def httpx_client(server: Server) -> AsyncIterator[Post]:
    """An httpx.AsyncClient of one connection: one per client, since one shared pool of 50 connections costs
    the client far more (it checks every pooled connection on each request: encode/httpx#3215)."""
    headers = {"Authorization": f"Bearer {server.token}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as client:

        async def post(body: bytes) -> int:
            return (await client.post("/v1/jobs", content=body)).status_code

        yield post


@asynccontextmanager
async def raw_client(server: Server) -> AsyncIterator[Post]:
    """HTTP/1.1 by hand over one kept-alive connection: a client that costs next to nothing, so that the
    figure is the server's."""
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (f"POST /v1/jobs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {server.token}\r\n"
            "Content-Type: application/json\r\nContent-Length: ").encode()

    async def post(body: bytes) -> int:
        writer.write(head + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        return int(lines[0].split(b" ")[1])

    try:
        yield post
    finally:
        writer.close()


CLIENTS = {"httpx": httpx_client, "raw": raw_client}


async def accept_load(server: Server, clients: int, seconds: float, kind: str) -> Accepted:
    """``clients`` clients POST distinct documents back to back: 1 s to warm up, then ``seconds`` measured."""
    latencies: list[float] = []
    refused = 0

    async def one_client(n: int, warm: float, until: float) -> None:
        nonlocal refused
        async with CLIENTS[kind](server) as post:
            for i in itertools.count():
                now = time.perf_counter()
                if now >= until:
                    return
                status = await post(json.dumps({"text": f"client {n} document {i} {uuid.uuid4().hex}"}).encode())
                if now < warm:  # connections opened, the server's threads and statements warm
                    continue
                if status == 202:
                    latencies.append(time.perf_counter() - now)
                else:
                    refused += 1

    warm = time.perf_counter() + 1.0
    cpu = time.process_time()
    await asyncio.gather(*(one_client(n, warm, warm + seconds) for n in range(clients)))
    return Accepted(latencies, seconds, refused, (time.process_time() - cpu) / (seconds + 1.0))


# --- 2. enqueue to first stage start ---------------------------------------------------------------------

@dataclass
class Started:
    """Seconds per job: stage start minus created_at; stage start minus the 202's arrival (negative when the
    stage started before the answer reached the client); the POST's round trip."""

    waits: list[float]
    after_202: list[float]
    posts: list[float]


def start_latencies(server: Server, jobs: int, spacing: float) -> Started:
    """Submit ``jobs`` jobs one at a time, ``spacing`` seconds apart, to an idle fleet; when each started."""
    time.sleep(IDLE_S)
    answered: list[tuple[str, float]] = []
    posts = []
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=30) as c:
        for i in range(jobs):
            started = time.perf_counter()
            answer = c.post("/v1/jobs", json={"text": f"paced document {i} {uuid.uuid4().hex}"})
            arrived = time.time()
            posts.append(time.perf_counter() - started)
            answer.raise_for_status()
            answered.append((answer.json()["job_id"], arrived))
            time.sleep(max(0.0, spacing - (time.perf_counter() - started)))
        views = [finished(c, job_id) for job_id, _ in answered]
    starts = [float(v["output"]["started"]) for v in views]
    return Started([s - float(v["created_at"]) for s, v in zip(starts, views, strict=True)],
                   [s - arrived for s, (_, arrived) in zip(starts, answered, strict=True)], posts)


def finished(client: httpx.Client, job_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if view["status"] == "completed":
            return view
        time.sleep(0.05)
    raise RuntimeError(f"job {job_id} did not complete within {timeout} s")


# --- figures ------------------------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank), in milliseconds."""
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def bench(work: Path, db: str, backend: str, args: argparse.Namespace) -> list[str]:
    return [*acceptance_rows(work, db, backend, args), *start_rows(work, db, backend, args)]


def acceptance_rows(work: Path, db: str, backend: str, args: argparse.Namespace) -> list[str]:
    rows = []
    with serving(work, db, workers=0) as server:
        for kind in ("httpx", "raw"):
            load, serving_cpu = os.getloadavg()[0], cpu_seconds(server.proc.pid)
            done = asyncio.run(accept_load(server, args.clients, args.seconds, kind))
            server_cpu = (cpu_seconds(server.proc.pid) - serving_cpu) / (args.seconds + 1.0)
            if done.refused:
                print(f"{backend}: {done.refused} answers were not 202", flush=True)
            rows.append(f"| {backend} | POST /v1/jobs to 202, {args.clients} {kind} clients, no workers | "
                        f"{len(done.latencies):,} | {pct(done.latencies, 50):.1f} | {pct(done.latencies, 99):.1f} | "
                        f"{len(done.latencies) / done.seconds:,.0f} jobs/s; CPU: server {server_cpu:.0%}, clients "
                        f"{done.client_cpu:.0%} | | | "
                        f"{load:.1f} |")
            print(rows[-1], flush=True)
    return rows


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def start_rows(work: Path, db: str, backend: str, args: argparse.Namespace) -> list[str]:
    rows = []
    with serving(work, db, workers=args.fleet) as server:
        for jobs, gap in args.paces:
            load = os.getloadavg()[0]
            got = start_latencies(server, jobs, gap)
            waits, p50 = got.waits, pct(got.waits, 50)
            goal, verdict = ("p50 <= 10 ms", "PASS" if p50 <= GOAL_P50_MS else "FAIL") if backend == "postgres" \
                else ("", "")
            rows.append(f"| {backend} | enqueue to first stage start, idle fleet of {args.fleet}, a job every "
                        f"{1000 * gap:,.0f} ms | {len(waits):,} | {p50:.1f} | {pct(waits, 99):.1f} | "
                        f"POST p50 {pct(got.posts, 50):.1f} ms; from its 202 p50 {pct(got.after_202, 50):.1f} ms | "
                        f"{goal} | {verdict} | {load:.1f} |")
            print(rows[-1], f"(mean {1000 * statistics.mean(waits):.1f} ms, max {1000 * max(waits):.1f} ms)",
                  flush=True)
    return rows



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the clients submit (acceptance)")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (acceptance)")
    parser.add_argument("--pace", action="append", metavar="JOBS@SECONDS", help="jobs submitted one at a time, "
                        "SECONDS apart (start latency); repeatable (default: 100@0.1 and 20@1)")
    parser.add_argument("--fleet", type=int, default=2, help="idle worker processes (start latency)")
    parser.add_argument("--pg", default=DEFAULT_PG, help="an admin URL of a PostgreSQL server ('' to leave it out)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    args.paces = [(int(jobs), float(gap)) for jobs, _, gap in (p.partition("@") for p in args.pace or DEFAULT_PACE)]
    rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-api-") as folder:
        work = Path(folder)
        (work / "pipe.py").write_text(PIPELINE)
        rows += bench(work, f"sqlite:///{work}/bench.db", "sqlite", args)
        if args.pg:
            with pg_database(args.pg, "api") as url:
                rows += bench(work, url, "postgres", args)
    paces = " ".join(f"--pace {jobs}@{gap:g}" for jobs, gap in args.paces)
    command = (f"    .venv/bin/python bench/api.py --seconds {args.seconds:g} --clients {args.clients} {paces} "
               f"--fleet {args.fleet}")
    section = "\n".join([
        BEGIN, "## HTTP service (bench/api.py)", "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:", "", command, "",
        f"Machine: nproc {os.cpu_count()}; {platform.platform()}; Python {platform.python_version()}. "
        "`conveyor serve` (one uvicorn process) with a one-stage pipeline whose stage returns the time it started; "
        "the clients run in the bench's process on the same machine. Acceptance: no workers, so only "
        "POST /v1/jobs is measured, after a 1 s warm-up; httpx clients (an AsyncClient each), then raw ones (HTTP/1.1 "
        "written by hand on a kept-alive connection, nearly free), to tell the server's cost from the client's. "
        "Start latency: the stage's start time minus the job's "
        "`created_at` (taken in the request, before its transaction commits), with the fleet idle for "
        f"{IDLE_S:g} s first; \"from its 202\": the stage's start time minus the moment the client had the answer. "
        "Load: the 1-minute load average when the measure began.", "",
        "| backend | measure | jobs | p50 ms | p99 ms | rate, other figures | target | result | load |",
        "| --- | --- | ---: | ---: | ---: | --- | --- | --- | ---: |",
        *rows, "", END])
    if not args.no_write:
        write_section(f"{SCRIPT}.py", section)


if __name__ == "__main__":
    main()
