"""Worker processes forked from ``conveyor run`` before it opens its store, so a small run does not wait for them.

A ``conveyor worker`` process started as a new interpreter spends half a second or more before it claims a task
(the interpreter, the imports, the pipeline's module), which is most of a small run's time. ``conveyor run``
has all of that loaded once it has read its target, so right then, before it opens the store or starts a thread,
it forks its workers: each child waits on a pipe until the run exists and then works it as ``conveyor worker
TARGET --run RUN --until-idle --quiet`` would (its own store connection, stage output on stderr, exit 2 on a
user error after one line saying why, SIGTERM and Ctrl-C draining), or exits at once when told there is nothing
to do (a run the memo answered whole). A child is a process of its own, so a stage that kills its process kills
only that worker, which the run replaces with a new ``conveyor worker`` process as before.

Forking is safe only in a process with one thread (Linux's count, which includes threads libraries start) and
no open database connection (SQLite's locks are
per process; a PostgreSQL connection's socket would be shared), so it is done only there, on Linux, without
tracing (its exporter's thread would not be in the child); elsewhere, and with ``CONVEYOR_FORK_WORKERS=0``,
workers are started as new processes. Every worker is still a process that registers itself, heartbeats and
records every attempt: what the store holds is the same either way.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from conveyor.pipeline import Pipeline

ENV_FORK = "CONVEYOR_FORK_WORKERS"


@dataclass(frozen=True)
class WorkOrder:
    """What a waiting child is told: the run to work, and where its store and blobs are."""

    run_id: str
    db: str
    blobs: str
    provider_batch: bool = False


class Forked:
    """A forked worker as the fleet handles its processes: ``poll``, ``wait``, ``terminate``, ``kill`` and
    ``returncode`` as subprocess.Popen has them (a negative code: the signal that ended it)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its code is lost, so it counts as a crash
                self.returncode = 1
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"conveyor worker (pid {self.pid})", timeout or 0.0)
            time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 0.025)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WorkerForks:
    """Children forked from this process, each waiting for a WorkOrder; ``take`` sends one its order."""

    def __init__(self, pipeline: Pipeline, target: str, count: int) -> None:
        self.waiting: list[tuple[Forked, int]] = []  # (child, the write end of its pipe)
        sys.stdout.flush()  # what this process has buffered must not be written again by a child
        sys.stderr.flush()
        # What is loaded now (the modules, the pipeline) is left out of the garbage collector's walks from here on,
        # as Python's documentation advises before a fork: a walk writes to every object it visits, which would
        # copy the shared pages into each child, and the submission's full collections need not visit them.
        gc.freeze()
        for _ in range(count):
            read, write = os.pipe()
            try:
                pid = os.fork()
            except OSError:  # no more processes or memory now: the fleet starts the rest as new processes
                os.close(read)
                os.close(write)
                break
            if pid == 0:  # the child: never returns
                os.close(write)
                for _, other in self.waiting:
                    os.close(other)
                _child(read, pipeline, target)
            os.close(read)
            self.waiting.append((Forked(pid), write))

    def take(self, order: WorkOrder) -> Forked | None:
        """A waiting child, now working ``order``; None when none is left (or the one taken is gone)."""
        while self.waiting:
            child, write = self.waiting.pop()
            try:
                os.write(write, json.dumps(order.__dict__).encode() + b"\n")
            except OSError:  # it died waiting (a signal to the process group): reap it, try the next
                child.wait()
                continue
            finally:
                os.close(write)
            return child
        return None

    def close(self) -> None:
        """Tell every child still waiting that there is nothing to do; they exit at once (reaped here)."""
        waiting, self.waiting = self.waiting, []
        for _, write in waiting:
            os.close(write)
        for child, _ in waiting:
            child.wait()


def can_fork() -> bool:
    """Whether this process may fork its workers now: Linux, one thread, no tracing, not turned off."""
    from conveyor.runtime import tracing

    return (sys.platform.startswith("linux") and hasattr(os, "fork") and os.environ.get(ENV_FORK, "1") != "0"
            and threading.current_thread() is threading.main_thread() and threading.active_count() == 1
            and _threads_of_this_process() == 1 and tracing.active() is None)


def _threads_of_this_process() -> int:
    """The process's threads as Linux counts them, those a library started outside Python's ``threading`` too
    (a thread pool of a model runtime the pipeline's module loaded: a lock one of them holds would never be
    released in a child)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


@contextmanager
def forked_workers(pipeline: Pipeline, target: str, count: int) -> Iterator[WorkerForks | None]:
    """``count`` waiting children for the block when this process may fork (can_fork), else None; the children
    not taken are told to exit as the block ends. Enter it before opening the store."""
    forks = WorkerForks(pipeline, target, count) if count > 0 and can_fork() else None
    try:
        yield forks
    finally:
        if forks is not None:
            forks.close()


def _child(read: int, pipeline: Pipeline, target: str) -> None:
    """A forked child: wait for a WorkOrder, work it as ``conveyor worker --until-idle --quiet`` does, exit."""
    code = 1
    try:
        # Until told what to do, a signal ends it quietly, as it would have ended a process not yet started.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)  # whatever stage code prints goes to stderr: stdout carries only the run's summary
        order = _read_order(read)
        if order is None:
            code = 0
        else:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            code = _work(order, pipeline, target)
    except BaseException:  # the child must reach os._exit whatever happens
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _read_order(read: int) -> WorkOrder | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(read, 4096)
        if not chunk:
            return None  # closed: nothing to do
        data += chunk
    os.close(read)
    fields: dict[str, Any] = json.loads(data)
    return WorkOrder(**fields)


def _work(order: WorkOrder, pipeline: Pipeline, target: str) -> int:
    """What ``conveyor worker TARGET --run RUN --until-idle --quiet`` does once started; its exit code."""
    from conveyor.blobs import open_blobs
    from conveyor.errors import ConveyorError, UserError
    from conveyor.runtime.worker import Worker, WorkerOptions
    from conveyor.store.dialect import ENV_SQLITE_CACHE, WORKER_SQLITE_CACHE_MB

    os.environ.setdefault(ENV_SQLITE_CACHE, str(WORKER_SQLITE_CACHE_MB))  # a worker's small page cache
    options = WorkerOptions(run_id=order.run_id, until_idle=True, warn_stale_code=False,
                            provider_batch=order.provider_batch)
    try:
        Worker(pipeline, target, order.db, open_blobs(order.blobs), options).run()
    except UserError as exc:
        print(" ".join(f"error: {exc}".split("\n")), file=sys.stderr)
        return 2
    except ConveyorError as exc:
        print(" ".join(f"error [{exc.code}]: {exc}".split("\n")), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
