"""Engine throughput benchmark: one run, every figure, written into bench/RESULTS.md.

    .venv/bin/python bench/engine.py [--items 100000] [--memory-items 1000000] [--pg URL] [--quick]

What it measures, over the no-op three-stage pipeline in bench/noop_pipeline.py
(a → b → c, each stage returns its input) and a JSONL manifest with inline text:

1. ``conveyor run --workers 2`` end to end (submit + process), on a fresh SQLite
   file and on a fresh PostgreSQL database (created here, dropped afterwards);
2. the same work split into ``conveyor submit`` and two ``conveyor worker
   --until-idle`` processes started together ("process only");
3. a fully cached re-run of the same manifest on the same store, through the CLI
   (on SQLite three times, each on a copy of the store the cold run left: the median)
   and in this process (``submit()`` plus one ``Worker(...).run()``);
4. peak RSS of the supervisor and each worker at ``--memory-items`` items (SQLite);
5. a raw-SQL floor: the same per-item-stage transitions written by hand with
   batched SQL against the conveyor schema, single process, and the ratio
   engine time / floor time for each backend;
6. side by side at ``--side-items`` (20,000) items, process only, two processes
   each: conveyor's workers, the floor in two processes, and a peer queue on
   the same backend (pgqueuer on PostgreSQL, huey on SQLite: bench/peers.py),
   with the ratios conveyor / floor (issue 13's targets) and conveyor / peer. Each is timed twice: from
   the processes' spawn to their exit, and on the issue's clock, from the first task's start to the last
   one's end by the store's own stamps (``job_span``; the peers are timed that way too). The targets are
   on the issue's clock. Conveyor and the floor are alternated ``--side-rounds`` (3) times: this host's
   speed drifts by more than a target's margin within minutes, so each round's ratio compares runs made
   seconds apart; the rows give the medians and the notes list every round. Each round also runs the
   minimal one-table floor (bench/minifloor.py), with the ratios conveyor / minimal floor (issue 32's
   targets) and schema floor / minimal floor; ``--fleet`` runs only these rounds (no peer queue, no other
   section) and writes a section of its own.

Each figure is printed next to its target with PASS or FAIL, with the CPU seconds
that the bench's own process tree spent on it (robust to other work on a shared
machine; PostgreSQL's server processes are not included) and the 1-minute load
average when it started. Every measurement starts after an ``os.sync()`` so that
it does not pay for the previous one's dirty pages. Timings live here, never in
unit tests (../shared/DESIGN.md, "Throughput habits").
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import hashlib
import io
import json
import os
import platform
import pstats
import re
import resource
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import minifloor
import orjson
import psutil

from conveyor.store import sqlite_path
from conveyor.store.memokey import key64

ROOT = Path(__file__).resolve().parents[1]
TARGET = "bench/noop_pipeline.py:pipe"
STAGES = ("a", "b", "c")
RESULTS = ROOT / "bench" / "RESULTS.md"
BEGIN, END = "<!-- bench/engine.py:begin -->", "<!-- bench/engine.py:end -->"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"

SQLITE_TARGET = 20_000  # item-stages/s end to end
PG_TARGET = 10_000  # item-stages/s end to end
# tasks/s for a fully cached re-run, on the embedded default (SQLite). The issue names a backend for each
# item-stage target but none for this one; on PostgreSQL a cached task is still a row the server inserts
# (~8 us each here), so its figure is printed without a target.
CACHED_TARGET = 100_000
CACHED_ROUNDS = 3  # SQLite cached re-runs through the CLI, each on a copy of the same store; the median is the row
SUBMIT_TARGETS = {"sqlite": 100_000, "postgres": 50_000}  # items/s through `conveyor submit` (issue 13)
MEMORY_TARGET_MB = 300  # peak RSS of any one process at 1M items


# --- measuring ------------------------------------------------------------------


@dataclass
class Timing:
    wall: float = 0.0
    cpu: float = 0.0  # user+system seconds of this process and of its children that exited meanwhile
    load: float = 0.0  # 1-minute load average when the measurement started

    def __add__(self, other: Timing) -> Timing:
        return Timing(self.wall + other.wall, self.cpu + other.cpu, max(self.load, other.load))


@contextlib.contextmanager
def timed() -> Iterator[Timing]:
    """Measure the block's wall time and CPU time, after flushing earlier writes to disk."""
    os.sync()
    timing = Timing(load=os.getloadavg()[0])
    cpu, wall = _cpu_seconds(), time.perf_counter()
    yield timing
    timing.wall, timing.cpu = time.perf_counter() - wall, _cpu_seconds() - cpu


def _cpu_seconds() -> float:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


# --- results ------------------------------------------------------------------


@dataclass
class Row:
    backend: str
    figure: str
    timing: Timing | None
    value: float
    unit: str
    target: float | None = None
    at_most: bool = False  # the target is a ceiling (memory), not a floor (rates)

    @property
    def verdict(self) -> str:
        if self.target is None:
            return ""
        ok = self.value <= self.target if self.at_most else self.value >= self.target
        return "PASS" if ok else "FAIL"

    @property
    def target_text(self) -> str:
        if self.target is None:
            return ""
        value = f"{self.target:.2f}" if self.unit == "x" else f"{self.target:,.0f}"
        return f"{'≤' if self.at_most else '≥'} {value}"


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        print(f"  {row.backend:<8} {row.figure:<38} {_fmt_value(row)} {row.verdict}", flush=True)
        return row

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.problems.append(message)
            print(f"  CHECK FAILED: {message}", flush=True)


def _fmt_value(row: Row) -> str:
    return f"{row.value:>12.2f} {row.unit}" if row.unit == "x" else f"{row.value:>12,.0f} {row.unit}"


# --- inputs and stores ----------------------------------------------------------


def write_manifest(path: Path, count: int) -> Path:
    """A JSONL manifest of ``count`` items with small inline texts."""
    with path.open("wb") as out:
        for i in range(count):
            out.write(orjson.dumps({"key": f"item{i:08d}", "text": f"document {i}: nothing to see here"}) + b"\n")
    return path


def sqlite_url(folder: Path, name: str) -> str:
    return f"sqlite:///{folder / name}"


def _pg_url_for(admin_url: str, dbname: str) -> str:
    base, _, _ = admin_url.partition("?")[0].rpartition("/")
    return f"{base}/{dbname}"


@contextlib.contextmanager
def pg_database(admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for the duration of the block; dropped afterwards."""
    import psycopg

    name = f"conveyor_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield _pg_url_for(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# --- the CLI as a subprocess ------------------------------------------------------


def conveyor_cmd() -> list[str]:
    script = Path(sys.executable).parent / "conveyor"
    return [str(script)] if script.exists() else [sys.executable, "-m", "conveyor"]


def cli_json(*args: str) -> tuple[Timing, dict[str, Any]]:
    """Run ``conveyor ARGS --json``; return its timing and its JSON."""
    with timed() as timing:
        proc = subprocess.run([*conveyor_cmd(), *args, "--json"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"conveyor {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return timing, json.loads(proc.stdout)


def run_args(manifest: Path, db: str, blobs: Path) -> list[str]:
    return ["run", TARGET, "--input", str(manifest), "--workers", "2", "--db", db, "--blobs", str(blobs)]


def workers_until_idle(run_id: str, db: str, blobs: Path, count: int = 2,
                       peaks: list[float] | None = None) -> tuple[Timing, list[dict[str, Any]]]:
    """Start ``count`` ``conveyor worker --until-idle`` processes together; time until all have exited. With
    ``peaks``, each worker's peak RSS in MB (VmHWM, the kernel's own peak, read until the worker exits) is
    appended to it."""
    cmd = [*conveyor_cmd(), "worker", TARGET, "--until-idle", "--run", run_id, "--db", db,
           "--blobs", str(blobs), "--json"]
    with timed() as timing:
        procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(count)]
        hwm = [0.0] * count

        def watch() -> None:
            while any(p.poll() is None for p in procs):
                for i, p in enumerate(procs):
                    hwm[i] = max(hwm[i], _memory_mb(p.pid).get("VmHWM", 0.0))
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        if peaks is not None:
            watcher.start()
        outputs = [p.communicate() for p in procs]
    if peaks is not None:
        watcher.join()
        peaks += hwm
    stats = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"conveyor worker exited {proc.returncode}:\n{err[-3000:]}")
        stats.append(json.loads(out))
    return timing, stats


def submit_noop(manifest: Path, db: str, blobs: Path) -> str:
    """``conveyor submit`` of ``manifest`` through bench/noop_pipeline.py (three stages); the run's id."""
    _, out = cli_json("submit", TARGET, "--input", str(manifest), "--db", db, "--blobs", str(blobs))
    return str(out["run_id"])


def drain_noop(run_id: str, db: str, blobs: Path, tasks: int, what: str) -> Timing:
    """Two workers through a run of ``submit_noop`` until idle (``workers_until_idle``), checked to have made
    ``tasks`` stage calls."""
    timing, stats = workers_until_idle(run_id, db, blobs)
    calls = sum(s.get("stage_calls", 0) for s in stats)
    if calls != tasks:
        raise SystemExit(f"{what}: expected {tasks} stage calls, the workers made {calls}")
    return timing


# --- 1-3: engine figures on one backend --------------------------------------------


def bench_backend(report: Report, backend: str, stores: Iterator[str], manifest: Path, n: int,
                  work: Path) -> dict[str, Timing]:
    """Cold run, cached re-run (CLI and in-process) on one store; submit + workers on another."""
    target = SQLITE_TARGET if backend == "sqlite" else PG_TARGET
    cached_target = CACHED_TARGET if backend == "sqlite" else None
    blobs = work / f"blobs-{backend}"
    times: dict[str, Timing] = {}

    db = next(stores)
    timing, out = cli_json(*run_args(manifest, db, blobs))
    report.check(out["stage_calls"] == 3 * n and out["outcomes"] == {"completed": n} and out["unaccounted"] == 0,
                 f"{backend} cold run: expected {3 * n} stage calls and {n} completed items, got {_brief(out)}")
    times["run"] = timing
    report.add(Row(backend, "run (submit+process), 2 workers", timing, 3 * n / timing.wall, "item-stages/s",
                   target))

    timing = cached_cli(report, backend, manifest, db, blobs, n, work)
    report.add(Row(backend, "cached re-run, CLI (conveyor run)", timing, 3 * n / timing.wall, "tasks/s",
                   cached_target))

    timing, out = in_process_run(db, manifest, blobs)
    report.check(out["stage_calls"] == 0 and out["cached"] == 3 * n,
                 f"{backend} in-process cached re-run: expected 0 stage calls and {3 * n} cached, "
                 f"got {_brief(out)}")
    report.add(Row(backend, "cached re-run, in-process", timing, 3 * n / timing.wall, "tasks/s", cached_target))

    db = next(stores)
    timing, out = cli_json("submit", TARGET, "--input", str(manifest), "--db", db, "--blobs", str(blobs))
    times["submit"] = timing
    report.add(Row(backend, "submit only (conveyor submit)", timing, n / timing.wall, "items/s",
                   SUBMIT_TARGETS[backend]))
    timing, stats = workers_until_idle(out["run_id"], db, blobs)
    calls = sum(s.get("stage_calls", 0) for s in stats)
    report.check(calls == 3 * n, f"{backend} process only: expected {3 * n} stage calls, workers made {calls}")
    times["process"] = timing
    report.add(Row(backend, "process only, 2 x conveyor worker", timing, 3 * n / timing.wall, "item-stages/s",
                   target))
    return times


def cached_cli(report: Report, backend: str, manifest: Path, db: str, blobs: Path, n: int, work: Path) -> Timing:
    """A cached re-run through the CLI of the run just made on ``db``; on SQLite CACHED_ROUNDS of them, each
    on its own copy of the store as the cold run left it, the median's timing returned (every one is listed
    in the notes). Leaves ``db`` holding one cached re-run (the in-process one follows it)."""
    copies: list[str] = []
    if backend == "sqlite":
        path = Path(str(sqlite_path(db)))
        for index in range(CACHED_ROUNDS - 1):
            copy = work / f"cached-copy-{index}.db"
            shutil.copyfile(path, copy)
            wal = path.with_name(path.name + "-wal")
            if wal.exists():
                shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
            copies.append(sqlite_url(work, copy.name))
    timings = []
    for url in [db, *copies]:
        timing, out = cli_json(*run_args(manifest, url, blobs))
        report.check(out["stage_calls"] == 0 and out["cached"] == 3 * n and out["unaccounted"] == 0,
                     f"{backend} cached re-run: expected 0 stage calls and {3 * n} cached, got {_brief(out)}")
        timings.append(timing)
    for url in copies:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{sqlite_path(url)}{suffix}").unlink(missing_ok=True)
    if len(timings) > 1:
        report.details.append(f"{backend} cached re-run through the CLI, {len(timings)} times, each on a copy of the "
                              "store the cold run left (the row is the median): "
                              + ", ".join(f"{3 * n / t.wall:,.0f}" for t in timings) + " tasks/s")
    return sorted(timings, key=lambda t: t.wall)[len(timings) // 2]


def in_process_run(db: str, manifest: Path, blobs_dir: Path) -> tuple[Timing, dict[str, Any]]:
    """Time ``submit()`` plus one until-idle Worker in this process; return the timing and the reconciliation."""
    from conveyor.blobs import open_blobs
    from conveyor.runtime.target import load_target
    from conveyor.runtime.worker import Worker, WorkerOptions
    from conveyor.service.report import find_run, reconcile
    from conveyor.service.submit import submit
    from conveyor.store import open_store

    target = str(ROOT / TARGET)
    pipeline, blobs, store = load_target(target), open_blobs(str(blobs_dir)), open_store(db)
    try:
        with timed() as timing:
            done = submit(pipeline, target, str(manifest), store, blobs)
            Worker(pipeline, target, db, blobs, WorkerOptions(until_idle=True, run_id=done.run_id)).run()
        return timing, reconcile(store, find_run(store, done.run_id))
    finally:
        store.close()


def _brief(out: dict[str, Any]) -> str:
    return json.dumps({k: out.get(k) for k in ("outcomes", "unaccounted", "stage_calls", "cached")})


# --- 4: peak memory -------------------------------------------------------------------


@dataclass
class ProcessPeak:
    """One process's memory over a run, in MB, from /proc/PID/status."""

    role: str
    hwm: float = 0.0  # VmHWM: the kernel's peak RSS, exact up to the last poll
    anon: float = 0.0  # the largest RssAnon seen: private memory (heap), without mapped file pages
    file: float = 0.0  # the largest RssFile seen: mapped file pages (SQLite's mmap of the store, libraries)
    at: float = 0.0  # seconds into the run when the largest RSS was seen
    _rss: float = 0.0

    def update(self, mem: dict[str, float], now: float) -> None:
        self.hwm = max(self.hwm, mem["VmHWM"])
        self.anon = max(self.anon, mem["RssAnon"])
        self.file = max(self.file, mem["RssFile"])
        if mem["VmRSS"] > self._rss:
            self._rss, self.at = mem["VmRSS"], now


@dataclass
class MemoryPeak:
    timing: Timing
    output: dict[str, Any]
    processes: list[ProcessPeak]
    peak_sum: float  # MB, the largest sum of the tree's RSS seen at one poll
    phases: dict[str, float]  # seconds into the run: workers first seen, workers all gone


def run_with_memory_poll(args: Sequence[str], interval: float = 0.2) -> MemoryPeak:
    """Run ``conveyor ARGS --json`` and poll its process tree's memory every ``interval`` seconds."""
    peaks: dict[int, ProcessPeak] = {}
    peak_sum, phases = 0.0, dict[str, float]()
    with timed() as timing:
        started = time.perf_counter()
        proc = subprocess.Popen([*conveyor_cmd(), *args, "--json"], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        root, reader = psutil.Process(proc.pid), _Drain(proc)
        while proc.poll() is None:
            now, total, tree = time.perf_counter() - started, 0.0, _tree(root)
            if len(tree) > 1:
                phases.setdefault("workers started", now)
            elif "workers started" in phases:
                phases.setdefault("workers done", now)
            for p in tree:
                mem = _memory_mb(p.pid)
                if mem:
                    role = "supervisor" if p.pid == proc.pid else f"worker {len(peaks)}"
                    peaks.setdefault(p.pid, ProcessPeak(role)).update(mem, now)
                    total += mem["VmRSS"]
            peak_sum = max(peak_sum, total)
            time.sleep(interval)
    out, err = reader.result()
    if proc.returncode != 0 or not out.strip():
        raise RuntimeError(f"conveyor {' '.join(args)} exited {proc.returncode}:\n{err[-3000:]}")
    return MemoryPeak(timing, json.loads(out), list(peaks.values()), peak_sum, phases)


class _Drain:
    """Read a child's stdout and stderr in threads so that it never blocks on a full pipe."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._parts: dict[str, str] = {}
        self._threads = [threading.Thread(target=self._read, args=(name, stream), daemon=True)
                         for name, stream in (("out", proc.stdout), ("err", proc.stderr))]
        for t in self._threads:
            t.start()

    def _read(self, name: str, stream: Any) -> None:
        self._parts[name] = stream.read()

    def result(self) -> tuple[str, str]:
        for t in self._threads:
            t.join()
        return self._parts.get("out", ""), self._parts.get("err", "")


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _memory_mb(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM, RssAnon, RssFile of a process in MB; empty once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    try:
        return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}
    except (KeyError, ValueError):
        return {}


SCALE_TARGET = 0.9  # issue 13 point 0: the rate at 1,000,000 items, as a share of the rate at 100,000


def bench_memory(report: Report, items: int, work: Path, smaller: tuple[int, Timing] | None = None) -> None:
    """Peak RSS of a run at ``items`` items; with ``smaller`` (items, timing of the same run at that size), its
    rate as a share of that run's (issue 13 point 0: the rate holds as the store grows)."""
    manifest = write_manifest(work / f"manifest-{items}.jsonl", items)
    db = sqlite_url(work, "memory.db")
    peak = run_with_memory_poll(run_args(manifest, db, work / "blobs-memory"))
    out = peak.output
    report.check(out["stage_calls"] == 3 * items and out["unaccounted"] == 0,
                 f"{items:,}-item run: expected {3 * items} stage calls, got {_brief(out)}")
    size = f"at {items:,}"
    large = report.add(Row("sqlite", f"run {size} items, 2 workers", peak.timing, 3 * items / peak.timing.wall,
                           "item-stages/s", SQLITE_TARGET))
    if smaller is not None and smaller[0] < items:
        rate = 3 * smaller[0] / smaller[1].wall
        report.add(Row("sqlite", f"run {size} / run at {smaller[0]:,}, item-stages/s", None, large.value / rate, "x",
                       SCALE_TARGET))
    for p in peak.processes:
        report.add(Row("sqlite", f"peak RSS {size}: {p.role}", None, p.hwm, "MB"))
        report.details.append(f"{p.role}: peak RSS {p.hwm:,.0f} MB (largest seen {p.at:,.0f} s into the run), of "
                              f"which at most {p.anon:,.0f} MB private (RssAnon) and {p.file:,.0f} MB mapped file "
                              "pages (RssFile: shared libraries, and the store itself if SQLite maps it).")
    report.add(Row("sqlite", f"peak RSS {size}: max of one process", None, max(p.hwm for p in peak.processes),
                   "MB", MEMORY_TARGET_MB, at_most=True))
    report.add(Row("sqlite", f"peak RSS {size}: sum at peak", None, peak.peak_sum, "MB"))
    report.add(Row("sqlite", f"peak private RSS {size}: max of one process", None,
                   max(p.anon for p in peak.processes), "MB", MEMORY_TARGET_MB, at_most=True))
    phases = ", ".join(f"{k} at {v:,.0f} s" for k, v in peak.phases.items())
    report.details.append(f"The {items:,}-item run took {peak.timing.wall:,.0f} s: {phases} (submit before, "
                          "reconciliation after).")
    size_mb = sum(f.stat().st_size for f in work.glob("memory.db*")) / 2**20
    report.details.append(f"The {items:,}-item SQLite store (memory.db with its WAL) was {size_mb:,.0f} MB on disk "
                          "when the run ended.")


# --- 5: the raw-SQL floor -----------------------------------------------------------

FLOOR_BATCH = 500
FLOOR_RUN = "floor"
FLOOR_INSERT_ITEM = """INSERT INTO items (run_id, item_key, parent_key, root_key, source_digest, source_size,
    created_at) VALUES (?, ?, NULL, ?, ?, ?, ?)"""
FLOOR_INSERT_TASK = """INSERT INTO tasks (run_id, pipeline, stage, item_key, root_key, status, task_key,
    stage_version, config_hash, input_digest, input_kind, input_inline, input_size, cached, max_attempts,
    available_at, created_at)
VALUES (?, 'bench_noop', ?, ?, ?, 'queued', ?, '1', 'floor', ?, 'bytes', ?, ?, 0, 3, ?, ?)"""
FLOOR_ITEM_COLUMNS = "run_id, item_key, parent_key, root_key, source_digest, source_size, created_at"
FLOOR_TASK_COLUMNS = """run_id, pipeline, stage, item_key, root_key, status, task_key, stage_version, config_hash,
    input_digest, input_kind, input_inline, input_size, cached, max_attempts, available_at, created_at"""
FLOOR_CLAIM = """UPDATE tasks SET status = 'running', attempts = attempts + 1, lease_token = lease_token + 1,
    lease_owner = 'floor', lease_expires_at = ?, started_at = ?
WHERE id IN (SELECT id FROM tasks WHERE {runnable} AND pipeline = 'bench_noop' AND stage = ?
    AND available_at <= ? AND run_id = ? ORDER BY available_at LIMIT ? {skip_locked})
RETURNING id, item_key, root_key, task_key, input_inline, attempts, lease_token, stage"""
FLOOR_SUCCEED = """UPDATE tasks SET status = 'succeeded', output_digest = ?, output_kind = 'bytes', cached = 0,
    finished_at = ?, lease_owner = NULL, lease_expires_at = NULL WHERE id = ?"""
FLOOR_INSERT_OUTPUT = """INSERT INTO outputs (key64, task_key, stage, kind, digest, inline, size, run_id, created_at)
VALUES (?, ?, ?, 'bytes', ?, ?, ?, ?, ?) ON CONFLICT (key64) DO NOTHING"""
FLOOR_INSERT_ATTEMPT = """INSERT INTO attempts (task_id, run_id, attempt, outcome, invoked, worker, lease_token,
    stage_version, code_version, started_at, duration)
VALUES (?, ?, ?, 'succeeded', 1, 'floor', ?, '1', 'floor', ?, 0)"""


class RawSql:
    """The driver connection of a freshly migrated conveyor store, used with hand-written SQL."""

    def __init__(self, url: str) -> None:
        from conveyor.store import open_store

        self.store = open_store(url)  # creates the schema; the connection keeps conveyor's settings
        self.backend = self.store.backend
        self.conn: Any = self.store.db.conn
        self.skip_locked = "FOR UPDATE SKIP LOCKED" if self.backend == "postgres" else ""
        # store.claim filters on exactly what the partial index tasks_runnable covers; the floor must too,
        # or the planner cannot use that index. Since the schema gained a ``crashes`` column, that includes it.
        columns = {d[0] for d in self.conn.execute("SELECT * FROM tasks WHERE 1 = 0").description}
        self.runnable = "status = 'queued' AND crashes = 0" if "crashes" in columns else "status = 'queued'"

    def sql(self, text: str) -> str:
        return text.replace("?", "%s") if self.backend == "postgres" else text

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        if self.backend == "postgres":
            with self.conn.transaction():
                yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def executemany(self, text: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            cur = self.conn.cursor()
            cur.executemany(self.sql(text), rows)
            cur.close()

    def copy(self, table: str, columns: str, rows: Sequence[Sequence[Any]]) -> None:
        """PostgreSQL: ``rows`` into ``table`` by COPY."""
        with self.conn.cursor() as cur, cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    def query(self, text: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return list(self.conn.execute(self.sql(text), params).fetchall())

    def close(self) -> None:
        self.store.close()


def _key(stage: str, digest: str) -> str:
    return hashlib.sha256(f"{stage}\0floor\0bytes\0{digest}".encode()).hexdigest()


# Items per seed transaction, each backend's best (100,000 items, 2026-12-04): SQLite 500 (98k items/s; 5,000:
# 76k), PostgreSQL 5,000 as conveyor's submit (55k-57k; 500: 37k-43k, a synced commit each).
SEED_BATCH = {"sqlite": FLOOR_BATCH, "postgres": 5000}


def floor_seed(db: RawSql, manifest: Path) -> int:
    """Items and their stage-a tasks, SEED_BATCH per transaction; returns the item count."""
    count, batch, size = 0, [], SEED_BATCH[db.backend]
    with manifest.open("rb") as lines:
        for raw in lines:
            entry = orjson.loads(raw)
            batch.append((entry["key"], entry["text"].encode()))
            if len(batch) == size:
                count += _seed_batch(db, batch)
                batch = []
    return count + (_seed_batch(db, batch) if batch else 0)


def _seed_batch(db: RawSql, batch: list[tuple[str, bytes]]) -> int:
    now = time.time()
    items, tasks = [], []
    for key, data in batch:
        digest = hashlib.sha256(data).hexdigest()
        items.append((FLOOR_RUN, key, key, digest, len(data), now))
        tasks.append((FLOOR_RUN, "a", key, key, _key("a", digest), digest, data, len(data), now, now))
    with db.transaction():
        if db.backend == "postgres":  # the database's bulk rate: COPY, as conveyor's submit uses
            db.copy("items", FLOOR_ITEM_COLUMNS, [(r, k, None, *rest) for r, k, *rest in items])
            db.copy("tasks", FLOOR_TASK_COLUMNS, [(r, "bench_noop", stage, key, root, "queued", task_key, "1",
                                                   "floor", digest, "bytes", data, size, 0, 3, at, created)
                                                  for r, stage, key, root, task_key, digest, data, size, at, created
                                                  in tasks])
        else:
            db.executemany(FLOOR_INSERT_ITEM, items)
            db.executemany(FLOOR_INSERT_TASK, tasks)
    return len(batch)


def floor_claim(db: RawSql, now: float) -> list[tuple[Any, ...]]:
    """Up to FLOOR_BATCH queued tasks, later stages first, as store.claim does."""
    claimed: list[tuple[Any, ...]] = []
    with db.transaction():
        for stage in reversed(STAGES):
            want = FLOOR_BATCH - len(claimed)
            if want <= 0:
                break
            claimed += db.query(FLOOR_CLAIM.format(runnable=db.runnable, skip_locked=db.skip_locked),
                                (now + 30, now, stage, now, FLOOR_RUN, want))
    return claimed


def floor_commit(db: RawSql, claimed: list[tuple[Any, ...]], now: float) -> None:
    """Succeed a claimed batch in one transaction: outputs, attempts, and the next stage's tasks."""
    succeed, outputs, attempts, successors = [], [], [], []
    for task_id, item_key, root_key, task_key, data, attempt, token, stage in claimed:
        data = bytes(data)  # the no-op stage: output = input
        digest = hashlib.sha256(data).hexdigest()
        succeed.append((digest, now, task_id))
        outputs.append((key64(task_key), task_key, stage, digest, data, len(data), FLOOR_RUN, now))
        attempts.append((task_id, FLOOR_RUN, attempt, token, now))
        index = STAGES.index(stage)
        if index + 1 < len(STAGES):
            nxt = STAGES[index + 1]
            successors.append((FLOOR_RUN, nxt, item_key, root_key, _key(nxt, digest), digest, data, len(data),
                               now, now))
    with db.transaction():
        db.executemany(FLOOR_SUCCEED, succeed)
        db.executemany(FLOOR_INSERT_OUTPUT, outputs)
        db.executemany(FLOOR_INSERT_ATTEMPT, attempts)
        db.executemany(FLOOR_INSERT_TASK, successors)


def raw_floor(url: str, manifest: Path) -> tuple[Timing, Timing, int]:
    """Seed and process every item-stage by hand; return (seed timing, process timing, tasks succeeded)."""
    db = RawSql(url)
    try:
        with timed() as seed:
            floor_seed(db, manifest)
        with timed() as process:
            while claimed := floor_claim(db, time.time()):
                floor_commit(db, claimed, time.time())
        done = db.query("SELECT COUNT(*) FROM tasks WHERE status = 'succeeded' AND run_id = ?", (FLOOR_RUN,))
        return seed, process, int(done[0][0])
    finally:
        db.close()


def floor_worker(url: str) -> None:
    """One process of the two-process floor: claim and commit until no task of the floor run is open (a batch
    the other process holds may still make successors)."""
    db = RawSql(url)
    try:
        while True:
            if claimed := floor_claim(db, time.time()):
                floor_commit(db, claimed, time.time())
            elif db.query("SELECT COUNT(*) FROM tasks WHERE run_id = ? AND status IN ('queued', 'running')",
                          (FLOOR_RUN,))[0][0]:
                time.sleep(0.001)
            else:
                return
    finally:
        db.close()


def job_span(url: str, run_id: str) -> float:
    """Seconds from a run's first task start to its last task's end, by the store's own stamps: the issue's
    clock ("from the first job start to all done"), the same for conveyor and the floor. A process's start-up
    (imports) and its exit are outside it, as they are outside the peers' clock (bench/peers.py)."""
    db = RawSql(url)
    try:
        first, last = db.query("SELECT MIN(started_at), MAX(finished_at) FROM tasks WHERE run_id = ?", (run_id,))[0]
    finally:
        db.close()
    return float(last) - float(first)


def raw_floor_processes(url: str, manifest: Path, processes: int = 2) -> tuple[Timing, int]:
    """Seed here, then ``processes`` floor workers together: (their timing, tasks succeeded)."""
    db = RawSql(url)
    try:
        floor_seed(db, manifest)
        with timed() as process:
            procs = [subprocess.Popen([sys.executable, __file__, "--floor-worker", url], cwd=ROOT)
                     for _ in range(processes)]
            for proc in procs:
                if proc.wait() != 0:
                    raise RuntimeError(f"floor worker exited {proc.returncode}")
        done = db.query("SELECT COUNT(*) FROM tasks WHERE status = 'succeeded' AND run_id = ?", (FLOOR_RUN,))
        return process, int(done[0][0])
    finally:
        db.close()


def bench_floor(report: Report, backend: str, url: str, manifest: Path, n: int,
                engine: dict[str, Timing]) -> None:
    seed, process, done = raw_floor(url, manifest)
    report.check(done == 3 * n, f"{backend} raw-SQL floor: expected {3 * n} succeeded tasks, got {done}")
    total = seed + process
    report.add(Row(backend, "raw-SQL floor, seed+process, 1 process", total, 3 * n / total.wall, "item-stages/s"))
    report.add(Row(backend, "raw-SQL floor, process only", process, 3 * n / process.wall, "item-stages/s"))
    report.add(Row(backend, "raw-SQL floor, seed only (items/s)", seed, n / seed.wall, "items/s"))
    # Issue 13 point 2: the submit path near the database's bulk rate. The floor parses, hashes and inserts the
    # same items and first tasks in-process; conveyor submit's figure includes its process's start-up.
    report.add(Row(backend, "submit (CLI) / floor seed (in-process)", None, seed.wall / engine["submit"].wall, "x"))
    run, work = engine["run"], engine["process"]
    report.add(Row(backend, "engine/floor wall: run vs seed+process", None, run.wall / total.wall, "x"))
    report.add(Row(backend, "engine/floor wall: process only", None, work.wall / process.wall, "x"))
    report.add(Row(backend, "engine/floor CPU: run vs seed+process", None, run.cpu / total.cpu, "x"))
    report.add(Row(backend, "engine/floor CPU: process only", None, work.cpu / process.cpu, "x"))


# --- 6: side by side at the size: conveyor, the two-process floor, a peer queue -----------------

SIDE_ITEMS = 20_000
SIDE_ROUNDS = 3  # conveyor and the floor alternated this many times (--side-rounds)
WORKER_RSS_TARGET = 100  # MB, a conveyor worker's peak RSS at SIDE_ITEMS (issue 13 point 4)
SIDE_TARGETS = {"sqlite": 0.75, "postgres": 0.5}  # conveyor / floor, process only, 2 processes each (issue 13)
# conveyor / the minimal one-table floor (bench/minifloor.py), same clock (issue 32 point 2)
MINI_TARGETS = {"sqlite": 0.65, "postgres": 0.5}


def bench_side_by_side(report: Report, backend: str, stores: Iterator[str], work: Path, n: int,
                       rounds: int = SIDE_ROUNDS, peer: bool = True) -> None:
    """Process only, two processes each, N items through a → b → c: conveyor's workers and the hand-written
    floor, alternated ``rounds`` times (this host's speed drifts by more than a target's margin within minutes,
    so each round's ratio compares runs made seconds apart; the first-start rows give the medians, the
    spawn-to-exit rows the round of the median ratio), then the peer queue of
    the backend once (pgqueuer on PostgreSQL, huey on SQLite: bench/peers.py; not with ``peer`` False). Each
    round also runs the minimal one-table floor (bench/minifloor.py) right after the schema floor."""
    import peers

    manifest = write_manifest(work / f"manifest-side-{n}.jsonl", n)
    size = f"{n:,} items"
    laps = [_side_round(report, backend, stores, work, manifest, n) for _ in range(max(rounds, 1))]
    middle = sorted(laps, key=lambda lap: lap.ratio)[len(laps) // 2]  # the round of the median ratio
    report.add(Row(backend, f"{size}: conveyor, 2 workers, spawn to exit", middle.engine,
                   3 * n / middle.engine.wall, "item-stages/s"))
    mine = report.add(Row(backend, f"{size}: conveyor, 2 workers, first start to all done", None,
                          statistics.median(lap.mine for lap in laps), "item-stages/s"))
    report.add(Row(backend, f"{size}: conveyor worker peak RSS, max of 2", None,
                   max(lap.peak_rss for lap in laps), "MB", WORKER_RSS_TARGET, at_most=True))
    report.add(Row(backend, f"{size}: floor, 2 processes, spawn to exit", middle.floor_timing,
                   3 * n / middle.floor_timing.wall, "item-stages/s"))
    report.add(Row(backend, f"{size}: floor, 2 processes, first start to all done", None,
                   statistics.median(lap.floor for lap in laps), "item-stages/s"))
    report.add(Row(backend, f"{size}: conveyor / floor, spawn to exit", None, middle.spawn_ratio, "x"))
    report.add(Row(backend, f"{size}: conveyor / floor, first start to all done", None, middle.ratio, "x",
                   SIDE_TARGETS[backend]))
    report.add(Row(backend, f"{size}: minimal floor, 2 processes, spawn to exit", None,
                   statistics.median(3 * n / lap.mini_spawn for lap in laps), "item-stages/s"))
    report.add(Row(backend, f"{size}: minimal floor, 2 processes, first start to all done", None,
                   statistics.median(lap.mini for lap in laps), "item-stages/s"))
    report.add(Row(backend, f"{size}: conveyor / minimal floor, first start to all done", None,
                   statistics.median(lap.mini_ratio for lap in laps), "x", MINI_TARGETS[backend]))
    report.add(Row(backend, f"{size}: schema floor / minimal floor, first start to all done", None,
                   statistics.median(lap.floor / lap.mini for lap in laps), "x"))
    report.details.append(
        f"{backend}, {size}, conveyor / floor on the issue's clock, round by round (conveyor then the floor, "
        f"alternated; the row above is the median): "
        + ", ".join(f"{lap.ratio:.2f} ({lap.mine:,.0f} / {lap.floor:,.0f})" for lap in laps))
    report.details.append(
        f"{backend}, {size}, conveyor / minimal one-table floor on the issue's clock, round by round (conveyor, the "
        f"schema floor, then the minimal floor, alternated; the row above is the median): "
        + ", ".join(f"{lap.mini_ratio:.2f} ({lap.mine:,.0f} / {lap.mini:,.0f}, load {lap.engine.load:.1f})"
                    for lap in laps))
    if not peer:
        return
    if backend == "postgres":
        name = "pgqueuer"
        with timed() as timing:
            wall, done = peers.measure_pgqueuer(next(stores), n)
    else:
        name = "huey (SqliteHuey)"
        with timed() as timing:
            wall, done = peers.measure_huey(work / f"huey-{uuid.uuid4().hex[:8]}.db", n)
    report.check(done == n, f"{name}: expected {n} items through c, got {done}")
    timing.wall = wall  # the peer's clock: its workers' start to the last c (its enqueue is before)
    peer = report.add(Row(backend, f"{size}: {name}, 2 workers", timing, 3 * n / wall, "item-stages/s"))
    report.add(Row(backend, f"{size}: conveyor / {name.split()[0]}", None, mine.value / peer.value, "x"))


@dataclass
class SideRound:
    """One round of the side by side: conveyor's figures and the floor's, measured one after the other."""
    engine: Timing  # conveyor's two workers, spawn to exit
    mine: float  # conveyor, item-stages/s from the first job start to all done (the clock)
    peak_rss: float  # MB, the larger worker's peak
    floor_timing: Timing
    floor: float  # the floor on the clock
    mini_spawn: float  # seconds, the minimal one-table floor's two processes, spawn to exit
    mini: float  # the minimal floor on the clock

    @property
    def ratio(self) -> float:
        return self.mine / self.floor

    @property
    def mini_ratio(self) -> float:
        return self.mine / self.mini

    @property
    def spawn_ratio(self) -> float:
        return self.floor_timing.wall / self.engine.wall


def _side_round(report: Report, backend: str, stores: Iterator[str], work: Path, manifest: Path,
                n: int) -> SideRound:
    db, blobs = next(stores), work / "blobs-side"
    _, out = cli_json("submit", TARGET, "--input", str(manifest), "--db", db, "--blobs", str(blobs))
    peaks: list[float] = []
    engine, stats = workers_until_idle(out["run_id"], db, blobs, peaks=peaks)
    calls = sum(s.get("stage_calls", 0) for s in stats)
    report.check(calls == 3 * n, f"{backend} side by side: expected {3 * n} stage calls, workers made {calls}")
    floor_db = next(stores)
    floor_timing, done = raw_floor_processes(floor_db, manifest)
    report.check(done == 3 * n, f"{backend} two-process floor: expected {3 * n} succeeded tasks, got {done}")
    os.sync()
    mini_spawn, mini_span, mini_done = minifloor.measure(next(stores), minifloor_payloads(manifest))
    report.check(mini_done == n, f"{backend} minimal floor: expected {n} rows done, got {mini_done}")
    lap = SideRound(engine, 3 * n / job_span(db, out["run_id"]), max(peaks), floor_timing,
                    3 * n / job_span(floor_db, FLOOR_RUN), mini_spawn, 3 * n / mini_span)
    print(f"  {backend:<8} round: conveyor {lap.mine:,.0f}, floor {lap.floor:,.0f}, minimal floor {lap.mini:,.0f} "
          f"item-stages/s on the issue's clock, {lap.ratio:.2f} and {lap.mini_ratio:.2f}", flush=True)
    return lap


def minifloor_payloads(manifest: Path) -> list[bytes]:
    """The manifest's texts, the payloads the minimal floor seeds (conveyor's stage a gets the same bytes)."""
    with manifest.open("rb") as lines:
        return [orjson.loads(raw)["text"].encode() for raw in lines]


# --- profile (optional) ---------------------------------------------------------------


def profile_in_process(db: str, manifest: Path, blobs_dir: Path, top: int) -> str:
    """cProfile of submit() + one Worker in this process, one profile per thread; the top costs as text.

    cProfile sees only the thread that enabled it, so every thread started meanwhile (the worker's
    store thread, its stage thread) gets a profiler of its own through threading.setprofile.
    """
    profiles: dict[str, cProfile.Profile] = {}

    def per_thread(*_: Any) -> None:
        prof = profiles.setdefault(threading.current_thread().name.split("_")[0], cProfile.Profile())
        prof.enable()  # replaces this hook for the thread that called it

    main = profiles["MainThread (event loop, submit)"] = cProfile.Profile()
    threading.setprofile(per_thread)
    main.enable()
    try:
        timing, _ = in_process_run(db, manifest, blobs_dir)
    finally:
        main.disable()
        threading.setprofile(None)
    parts = [f"wall under the profiler: {timing.wall:.2f} s"]
    for name, prof in profiles.items():
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        busy = sum(tt for (_, _, fn), (_, _, tt, _, _) in stats.stats.items()  # type: ignore[attr-defined]
                   if not _is_wait(fn))
        stats.sort_stats("tottime").print_stats(top)
        listing = "Ordered by" + text.getvalue().split("Ordered by", 1)[-1]
        parts.append(f"--- thread {name}: {busy:.2f} s busy (waits excluded); by own time:\n{listing.strip()}")
    return "\n\n".join(parts)


def _is_wait(function: str) -> bool:
    """Entries where a thread sits idle: the event loop's poll, executor queues, lock waits."""
    return any(w in function for w in ("'poll' of 'select", "'get' of '_queue", "'acquire' of '_thread"))


# --- machine and RESULTS.md -----------------------------------------------------------


def machine(pg_url: str | None) -> dict[str, str]:
    info = {
        "nproc": str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()),
        "RAM": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "CPU": _cpu_model(),
        "OS": platform.platform(),
        "Python": platform.python_version(),
        "SQLite": sqlite3.sqlite_version,
    }
    if pg_url:
        import psycopg

        with psycopg.connect(pg_url, autocommit=True) as conn:
            settings = {name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                        for name in ("server_version", "fsync", "synchronous_commit", "shared_buffers")}
        info["PostgreSQL"] = (f"{settings['server_version']} (fsync={settings['fsync']}, "
                              f"synchronous_commit={settings['synchronous_commit']}, "
                              f"shared_buffers={settings['shared_buffers']})")
    from conveyor import __version__

    info["conveyor"] = __version__
    return info


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _cells(r: Row) -> tuple[str, str, str, str]:
    """seconds, CPU seconds, load, value: as text."""
    t = r.timing
    value = f"{r.value:.2f}" if r.unit == "x" else f"{r.value:,.0f}"
    if t is None:
        return "", "", "", value
    return f"{t.wall:.2f}", f"{t.cpu:.2f}", f"{t.load:.1f}", value


def print_table(report: Report) -> None:
    header = (f"{'backend':<8} {'figure':<42} {'seconds':>8} {'cpu s':>7} {'load':>5} {'value':>12} "
              f"{'unit':<14} {'target':>10} result")
    print("\n" + header + "\n" + "-" * len(header))
    for r in report.rows:
        seconds, cpu, load, value = _cells(r)
        print(f"{r.backend:<8} {r.figure:<42} {seconds:>8} {cpu:>7} {load:>5} {value:>12} {r.unit:<14} "
              f"{r.target_text:>10} {r.verdict}")
    for problem in report.problems:
        print(f"CHECK FAILED: {problem}")


def markdown(report: Report, info: dict[str, str], command: str, n: int, extra: str) -> str:
    lines = [
        BEGIN,
        "## Engine throughput (bench/engine.py)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:",
        "",
        f"    {command}",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()) + ".",
        "",
        f"Pipeline: bench/noop_pipeline.py (a → b → c, each returns its input), N = {n:,} items from a "
        f"JSONL manifest with inline text, so one run is {3 * n:,} item-stages. Wall times of CLI commands "
        "include process start-up. *cpu s* is the user+system time of the bench's own process tree "
        "(the PostgreSQL server's is not in it); *load* is the 1-minute load average when the figure's "
        "measurement started (other work on the machine shows there). The floor is hand-written batched SQL "
        "(batches of 500; its seed, items and their first tasks, in transactions of 500 on SQLite and by COPY in "
        "transactions of 5,000 on PostgreSQL, each backend's best) on the same schema in one process; a ratio is "
        "engine / floor for the same work.",
        "",
        "| backend | figure | seconds | cpu s | load | value | unit | target | result |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for r in report.rows:
        seconds, cpu, load, value = _cells(r)
        lines.append(f"| {r.backend} | {r.figure} | {seconds} | {cpu} | {load} | {value} | {r.unit} | "
                     f"{r.target_text} | {r.verdict} |")
    lines.append("")
    lines += [f"- {d}" for d in report.details]
    lines += [f"- **Check failed**: {p}" for p in report.problems]
    if extra:
        lines += ["", extra.rstrip()]
    lines += ["", END]
    return "\n".join(lines)


def write_results(section: str, path: Path = RESULTS, markers: tuple[str, str] = (BEGIN, END)) -> None:
    """Replace the section between the markers, keeping the rest of the file."""
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    begin, end = markers
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


# --- main ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=100_000, help="items for the throughput runs")
    parser.add_argument("--memory-items", type=int, default=1_000_000, help="items for the peak-memory run")
    parser.add_argument("--pg", default=os.environ.get("CONVEYOR_TEST_PG", DEFAULT_PG),
                        help="PostgreSQL URL of a server where databases may be created ('' skips PostgreSQL)")
    parser.add_argument("--quick", action="store_true", help="skip the peak-memory run")
    parser.add_argument("--side-items", type=int, default=SIDE_ITEMS,
                        help="items for the side-by-side figures (conveyor, two-process floor, pgqueuer, huey; "
                             "0 skips them)")
    parser.add_argument("--side-rounds", type=int, default=SIDE_ROUNDS,
                        help="times conveyor and the floor are alternated in the side by side (the medians are "
                             "reported, each round's ratio listed)")
    parser.add_argument("--fleet", action="store_true",
                        help="only the side by side's conveyor, schema floor and minimal one-table floor at "
                             "--side-items (no peer queue, no other section); written to a section of its own")
    parser.add_argument("--floor-worker", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--profile", type=int, default=0, metavar="TOP",
                        help="also profile in-process cold and cached runs (cProfile on SQLite, SQL time by "
                             "statement on both backends); print the TOP costs of each")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the Markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    return parser.parse_args(argv)


def sqlite_stores(work: Path, prefix: str) -> Iterator[str]:
    for i in range(1_000):
        yield sqlite_url(work, f"{prefix}-{i}.db")


@contextlib.contextmanager
def pg_stores(admin_url: str) -> Iterator[Iterator[str]]:
    """Fresh databases on demand, all dropped when the block ends."""
    with contextlib.ExitStack() as stack:
        def fresh() -> Iterator[str]:
            while True:
                yield stack.enter_context(pg_database(admin_url))

        yield fresh()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.floor_worker:
        floor_worker(args.floor_worker)
        return 0
    command = " ".join([".venv/bin/python bench/engine.py", *map(shlex.quote, sys.argv[1:])])
    info = machine(args.pg or None)
    print(f"conveyor engine benchmark: {command}", *(f"  {k}: {v}" for k, v in info.items()), sep="\n", flush=True)
    if args.fleet:
        return fleet(args, info, command)
    report, extra = Report(), ""
    work = Path(tempfile.mkdtemp(prefix="conveyor-bench-"))
    try:
        manifest = write_manifest(work / "manifest.jsonl", args.items)
        print(f"\nsqlite, N = {args.items:,}", flush=True)
        engine = bench_backend(report, "sqlite", sqlite_stores(work, "engine"), manifest, args.items, work)
        sqlite_run = (args.items, engine["run"])
        bench_floor(report, "sqlite", sqlite_url(work, "floor.db"), manifest, args.items, engine)
        if args.pg:
            print(f"\npostgres, N = {args.items:,}", flush=True)
            with pg_stores(args.pg) as stores:
                engine = bench_backend(report, "postgres", stores, manifest, args.items, work)
                bench_floor(report, "postgres", next(stores), manifest, args.items, engine)
        if args.side_items:
            print(f"\nside by side, N = {args.side_items:,}", flush=True)
            bench_side_by_side(report, "sqlite", sqlite_stores(work, "side"), work, args.side_items,
                               args.side_rounds)
            if args.pg:
                with pg_stores(args.pg) as stores:
                    bench_side_by_side(report, "postgres", stores, work, args.side_items, args.side_rounds)
        if not args.quick:
            print(f"\nsqlite, peak memory at {args.memory_items:,} items", flush=True)
            bench_memory(report, args.memory_items, work, sqlite_run)
        if args.profile:
            extra = profiles(work, manifest, args.profile, args.pg or None)
            print(extra)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(report)
    if not args.no_write:
        write_results(markdown(report, info, command, args.items, extra), args.results)
        print(f"\nwrote {args.results}")
    return 1 if report.problems else 0


def fleet(args: argparse.Namespace, info: dict[str, str], command: str) -> int:
    """``--fleet``: the side by side without its peer queue, at ``--side-items``, both backends."""
    report = Report()
    work = Path(tempfile.mkdtemp(prefix="conveyor-bench-"))
    try:
        print(f"\nside by side with the minimal floor, N = {args.side_items:,}", flush=True)
        bench_side_by_side(report, "sqlite", sqlite_stores(work, "side"), work, args.side_items, args.side_rounds,
                           peer=False)
        if args.pg:
            with pg_stores(args.pg) as stores:
                bench_side_by_side(report, "postgres", stores, work, args.side_items, args.side_rounds, peer=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(report)
    if not args.no_write:
        write_results(fleet_markdown(report, info, command, args.side_items), args.results, FLEET_MARKERS)
        print(f"\nwrote {args.results}")
    return 1 if report.problems else 0


FLEET_MARKERS = ("<!-- bench/engine.py fleet:begin -->", "<!-- bench/engine.py fleet:end -->")


def fleet_markdown(report: Report, info: dict[str, str], command: str, n: int) -> str:
    lines = [
        FLEET_MARKERS[0],
        "## The fleet path: conveyor against the schema floor and the minimal floor (bench/engine.py --fleet)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with:",
        "",
        f"    {command}",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()) + ".",
        "",
        f"N = {n:,} items through bench/noop_pipeline.py (a → b → c), process only, two processes each, alternated "
        "round by round: conveyor's workers, the schema floor (the conveyor schema by hand) and the minimal "
        "one-table floor (bench/minifloor.py: claim 500 and complete 500, nothing else). Rates are on the "
        "issue's clock, first start to all done; the rows are medians of the rounds.",
        "",
        "| backend | figure | value | unit | target | result |",
        "| --- | --- | ---: | --- | ---: | --- |",
    ]
    for r in report.rows:
        lines.append(f"| {r.backend} | {r.figure} | {_cells(r)[3]} | {r.unit} | {r.target_text} | {r.verdict} |")
    lines.append("")
    lines += [f"- {d}" for d in report.details]
    lines += [f"- **Check failed**: {p}" for p in report.problems]
    lines += ["", FLEET_MARKERS[1]]
    return "\n".join(lines)


def profiles(work: Path, manifest: Path, top: int, pg_url: str | None) -> str:
    """cProfile (SQLite) and SQL time by statement (both backends) of in-process cold and cached runs."""
    parts = ["### Where the time goes (in-process submit() + one Worker)", ""]
    db = sqlite_url(work, "profile.db")
    for phase in ("cold run", "cached re-run"):
        text = profile_in_process(db, manifest, work / "blobs-profile", top)
        parts += [f"cProfile, SQLite, {phase}, per thread:", "", "```", text.strip(), "```", ""]
    with contextlib.ExitStack() as stack:
        stores = [("sqlite", sqlite_url(work, "sql-timing.db"))]
        if pg_url:
            stores.append(("postgres", stack.enter_context(pg_database(pg_url))))
        for backend, url in stores:
            for phase in ("cold run", "cached re-run"):
                text = sql_breakdown(url, manifest, work / "blobs-profile", top)
                parts += [f"SQL time by statement, {backend}, {phase} (BEGIN/COMMIT not included):", "",
                          "```", text.strip(), "```", ""]
    return "\n".join(parts)


def sql_breakdown(url: str, manifest: Path, blobs_dir: Path, top: int) -> str:
    """Run in process with every store statement timed; the ``top`` statements by total time."""
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    with _timing_statements(spent, calls):
        timing, _ = in_process_run(url, manifest, blobs_dir)
    lines = [f"wall {timing.wall:.2f} s, CPU {timing.cpu:.2f} s, SQL {sum(spent.values()):.2f} s "
             "(the SQL total includes the reconciliation read after the timed part)"]
    ranked = sorted(spent.items(), key=lambda kv: -kv[1])[:top]
    lines += [f"{sec:8.2f} s {calls[sql]:7,d} calls  {sql}" for sql, sec in ranked]
    return "\n".join(lines)


@contextlib.contextmanager
def _timing_statements(spent: dict[str, float], calls: dict[str, int]) -> Iterator[None]:
    """Wrap the dialects' statement methods (single statements, executemany, the COPY-backed bulk writes and
    appends) for the duration of the block; a call made inside another wrapped call (insert_many's executemany)
    is counted in the outer one only."""
    from conveyor.store.dialect import PostgresDialect, SqliteDialect

    names = ("execute", "executemany", "execute_rowcount", "executemany_count", "executemany_returning",
             "insert_many", "insert_many_returning", "update_many", "append")
    saved = [(cls, name, getattr(cls, name)) for cls in (SqliteDialect, PostgresDialect) for name in names
             if name in vars(cls)]
    depth = threading.local()

    def wrap(name: str, original: Any) -> Any:
        def timed_call(self: Any, *args: Any, **kwargs: Any) -> Any:
            outer = not getattr(depth, "value", 0)
            depth.value = getattr(depth, "value", 0) + 1
            started = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                depth.value -= 1
                if outer:
                    label = f"append to {args[0]}" if name == "append" else _statement(args[0])
                    spent[label] += time.perf_counter() - started
                    calls[label] += 1
        return timed_call

    for cls, name, original in saved:
        setattr(cls, name, wrap(name, original))
    try:
        yield
    finally:
        for cls, name, original in saved:
            setattr(cls, name, original)


def _statement(sql: str) -> str:
    text = re.sub(r"\s+", " ", sql).strip()
    return re.sub(r"\(\?(, ?\?)*\)", "(?, ...)", text)[:90]


if __name__ == "__main__":
    raise SystemExit(main())
