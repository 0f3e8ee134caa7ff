"""Worker processes: how many a run starts by default, those kept beside a long-running server
(``conveyor serve``), and stopping processes.

The workers are `conveyor worker TARGET` processes that never go idle-exit. They are started with the server,
stopped with it (its app's shutdown stops them, before uvicorn re-raises the signal it caught), and started
again only when one crashed (a stage killed it): one that exits cleanly or on SIGTERM/SIGINT was stopped on
purpose, say by a signal to the whole process group, and is left stopped. Each worker also exits when the
server's process dies, however it died (CONVEYOR_EXIT_WITH_PARENT: the worker asks Linux for SIGTERM then).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Protocol

PARENT_ENV = "CONVEYOR_EXIT_WITH_PARENT"
USER_ERROR_EXIT = 2  # a worker that exits with this printed why; starting it again would say it again
_STOPPED = {0, USER_ERROR_EXIT, -signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM, 130}


class ServingFleet:
    """``per_target`` long-running workers for each of ``targets``, against one store and blob store."""

    def __init__(self, targets: Sequence[str], per_target: int, db: str, blobs: str) -> None:
        self.commands = [[sys.executable, "-m", "conveyor", "worker", t, "--db", db, "--blobs", blobs, "--quiet"]
                         for t in targets for _ in range(per_target)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.watcher = threading.Thread(target=self._watch, name="conveyor-serve-fleet", daemon=True)

    def start(self) -> None:
        with self._lock:
            self.procs = [self._spawn(c) for c in self.commands]
        if self.procs:
            self.watcher.start()

    def _spawn(self, command: list[str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, PARENT_ENV: str(os.getpid())}
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(), env=env)

    def _watch(self) -> None:
        while not self.stopping.wait(1.0):
            with self._lock:  # stop() holds it too: no worker is started once stopping began
                if self.stopping.is_set():
                    return
                for index, proc in enumerate(self.procs):
                    if proc.poll() is not None and proc.returncode not in _STOPPED:
                        self.procs[index] = self._spawn(self.commands[index])

    def stop(self) -> None:
        with self._lock:
            self.stopping.set()
            procs = list(self.procs)
        stop_processes(procs, grace_s=15)


def default_workers() -> int:
    """One worker process per CPU core (``conveyor run``'s and ``resume``'s default, shown in their --help)."""
    return max(1, os.cpu_count() or 1)


class Process(Protocol):
    """A worker process as the fleets handle it: subprocess.Popen, or a forked one (service/forks.py)."""

    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


def stop_processes(procs: Sequence[Process], grace_s: float) -> None:
    """SIGTERM each (they finish or give back their tasks), then SIGKILL what is left after ``grace_s``."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def exit_with_parent() -> None:
    """In a worker started by a ServingFleet: be sent SIGTERM when the server's process dies (Linux), and exit
    now if it is gone already."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != parent:
        raise SystemExit(0)
