"""Servers the tests start (`conveyor serve`, SeaweedFS): each in a process group of its own, stopped whatever
way the test process ends. On teardown (``stop_group``); at interpreter exit, which a Ctrl-C reaches too
(``atexit``); on SIGTERM (a handler); and, on Linux, when the test process dies without a word (SIGKILL, an
xdist worker shut down hard), by the kernel: the server is sent SIGTERM when its parent dies (PR_SET_PDEATHSIG).
So an interrupted `make test` leaves no server listening."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
from typing import Any

_groups: set[int] = set()


def spawn(args: list[str], **options: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(args, **options)`` as the leader of a new process group, remembered until stopped."""
    proc = subprocess.Popen(args, start_new_session=True, preexec_fn=_die_with_parent, **options)
    _groups.add(proc.pid)
    return proc


def stop_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 20.0) -> None:
    """Send ``sig`` to the process's group, wait ``grace`` seconds for the process, then SIGKILL the group."""
    try:
        if proc.poll() is None:
            _signal_group(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        _signal_group(proc.pid, signal.SIGKILL)  # what the leader left behind in its group
        _groups.discard(proc.pid)


def stop_all() -> None:
    """SIGKILL every group still running (at exit, on SIGTERM)."""
    for group in list(_groups):
        _signal_group(group, signal.SIGKILL)
        _groups.discard(group)


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _die_with_parent() -> None:
    """In the child, before exec: be sent SIGTERM when the process that started it dies (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _on_sigterm(signum: int, frame: Any) -> None:
    stop_all()
    signal.signal(signal.SIGTERM, _previous if callable(_previous) else signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


atexit.register(stop_all)
_previous: Any = None
if threading.current_thread() is threading.main_thread():
    _previous = signal.signal(signal.SIGTERM, _on_sigterm)
