"""Shared test helpers: write pipeline files, run workers and the CLI for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from conveyor.blobs import FilesystemBlobs
from conveyor.runtime.target import load_target
from conveyor.runtime.worker import Worker, WorkerOptions
from conveyor.service.report import find_run, reconcile
from conveyor.service.submit import Submitted, submit
from conveyor.store import open_store

SRC = str(Path(__file__).resolve().parents[1] / "src")


def write_pipeline(tmp_path: Path, source: str, name: str = "pipe.py") -> str:
    """Write a pipeline module; return its TARGET."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return f"{path}:pipe"


def make_docs(folder: Path, count: int, fmt: str = "document {i}") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"doc{i:04d}.txt").write_text(fmt.format(i=i))
    return folder


def submit_and_work(target: str, inputs: Path, store_url: str, blobs_dir: Path, **opts: Any) -> Submitted:
    """Submit and process a run in this process, the way `conveyor run --workers 0` does."""
    pipeline = load_target(target)
    blobs = FilesystemBlobs(blobs_dir)
    store = open_store(store_url)
    try:
        done = submit(pipeline, target, str(inputs), store, blobs)
    finally:
        store.close()
    work(target, store_url, blobs_dir, run_id=done.run_id, **opts)
    return done


def submit_run(target: str, docs: Path, store_url: str, blobs_dir: Path) -> str:
    """Submit a run in this process (its tasks queued, nothing worked); returns its id."""
    store = open_store(store_url)
    try:
        return submit(load_target(target), target, str(docs), store, FilesystemBlobs(blobs_dir)).run_id
    finally:
        store.close()


def work(target: str, store_url: str, blobs_dir: Path, **opts: Any) -> dict[str, int]:
    options = WorkerOptions(until_idle=True, **opts)
    stats = Worker(load_target(target), target, store_url, FilesystemBlobs(blobs_dir), options).run()
    return dict(stats)


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120,
        check: bool = False) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": SRC, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "conveyor", *args], cwd=cwd, env=full_env, text=True,
                          capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"conveyor {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def cli_json(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> dict[str, Any]:
    proc = cli(*args, "--json", cwd=cwd, env=env, timeout=timeout)
    assert proc.stdout.strip(), f"no JSON on stdout (exit {proc.returncode}):\n{proc.stderr}"
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def reconciled(store_url: str, run_id: str) -> dict[str, Any]:
    """The run's reconciliation, read from the store the way `conveyor reconcile --json` reads it."""
    store = open_store(store_url)
    try:
        return reconcile(store, find_run(store, run_id))
    finally:
        store.close()


def query(store_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    store = open_store(store_url)
    try:
        return store.db.execute(sql, params)
    finally:
        store.close()


def workers_until_idle(target: str, store_url: str, blobs: Path, count: int = 2, batch_size: int = 3) -> None:
    """``count`` `conveyor worker --until-idle` processes on one store at once, small batches so their commits
    interleave; each must exit 0."""
    env = {**os.environ, "PYTHONPATH": SRC}
    procs = [subprocess.Popen([sys.executable, "-m", "conveyor", "worker", target, "--db", store_url, "--blobs",
                               str(blobs), "--until-idle", "--batch-size", str(batch_size)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(count)]
    for proc in procs:
        assert proc.wait(120) == 0, proc.stderr.read() if proc.stderr else ""
