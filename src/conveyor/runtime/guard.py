"""Run sync stages in killable child processes (POSIX only).

A hang becomes a ``timeout`` failure, a memory hog a ``memory_limit`` failure,
and a crashed child (segfault, ``os._exit``, SIGKILL) a ``crashed`` failure;
the worker itself never goes down with the stage.
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import multiprocessing.util  # registers its atexit join first, so our hook (LIFO) runs before it
import pickle
import resource
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from conveyor.errors import PipelineError
from conveyor.pipeline import Pipeline
from conveyor.runtime.attemptlog import AttemptLog
from conveyor.runtime.classify import Failure, classify
from conveyor.runtime.context import Context, call_stage
from conveyor.runtime.target import load_target

STARTUP_TIMEOUT = 120.0  # seconds for a child to import the pipeline
EXIT_GRACE = 1.0  # seconds a dying child gets to exit before SIGKILL
KILL_WAIT = 5.0  # seconds to wait for a SIGKILLed child before leaving it to close()
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_T = TypeVar("_T")


@dataclass(frozen=True)
class GuardedResult:
    """The outcome of one guarded call.

    ``duration``: wall-clock seconds of the exchange with the child, measured in
    the parent; waiting for a free child and starting one are not counted.
    """

    ok: bool
    value: Any
    failure: Failure | None
    duration: float
    provenance: dict[str, Any] | None = None  # what the stage set in the child's ``ctx.provenance``
    logs: tuple[list[Any], int] | None = None  # (lines, dropped) the stage logged through the child's ``ctx.log``

    def kept(self) -> AttemptLog:
        """The child's log lines, as the attempt keeps them."""
        kept = AttemptLog()
        if self.logs is not None:
            kept.extend(*self.logs)
        return kept


def _child_main(conn: Connection, target: str) -> None:
    """Serve calls until the pipe closes. Runs in the spawned child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns shutdown
    try:
        pipeline = load_target(target)
    except BaseException as exc:
        _send(conn, ("error", Failure("target_error", False, _text(exc), None, traceback.format_exc())))
        return
    _send(conn, ("ready", None))
    while True:
        try:
            raw = conn.recv_bytes()
        except EOFError:
            return
        _send(conn, _serve(pipeline, raw))


def _serve(pipeline: Pipeline, raw: bytes) -> tuple[str, Any]:
    try:
        stage_name, value, ctx_fields, max_memory_bytes = pickle.loads(raw)
    except Exception as exc:
        note = f"stage input cannot be unpickled: {_text(exc)}"
        return "error", Failure("unpicklable_input", False, note, None, traceback.format_exc())
    try:
        stage = pipeline[stage_name]
    except PipelineError as exc:
        return "error", classify(exc, (PipelineError,), traceback.format_exc())
    ctx: Context | None = None
    try:
        ctx = Context(**ctx_fields)
        with _address_space_limit(max_memory_bytes):
            result = call_stage(stage, ctx, value)
        return "ok", (result, dict(ctx.provenance), ctx.kept.state())
    except BaseException as exc:  # SystemExit too: it must not end the child
        failure = classify(exc, stage.retry.terminal, traceback.format_exc())
        return ("raised", (failure, ctx.kept.state())) if ctx is not None else ("error", failure)


def _send(conn: Connection, message: tuple[str, Any]) -> None:
    try:
        data = pickle.dumps(message, _PROTOCOL)
    except Exception as exc:
        failure = Failure("unpicklable_output", False, f"stage output cannot be pickled: {_text(exc)}")
        data = pickle.dumps(("error", failure), _PROTOCOL)
    conn.send_bytes(data)


@contextmanager
def _address_space_limit(extra: int | None) -> Iterator[None]:
    """Cap RLIMIT_AS at the current virtual size plus ``extra`` bytes, then restore it."""
    if extra is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    pages = int(Path("/proc/self/statm").read_text().split()[0])  # the first field is the virtual size
    limit = pages * resource.getpagesize() + extra
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:4000]


class _Child:
    """One spawned child process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, target: str) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(child_conn, target), name="conveyor-guard")
        self.proc.start()
        child_conn.close()
        self.code: int | None = None
        self.busy = False  # the event loop or a thread is using its descriptors: do not close them yet
        self.released = False
        _LIVE.add(self)

    def kill(self) -> None:
        if self.code is None:
            self.proc.kill()

    def reap(self) -> bool:
        """Without blocking: reap the process if it has exited; True once it is reaped and released."""
        if self.code is None and self.proc.exitcode is not None:
            self.code = self.proc.exitcode
            _LIVE.discard(self)
        if self.code is not None and not self.busy and not self.released:
            self.released = True
            self.proc.close()
            self.conn.close()
        return self.released

    def exit_text(self) -> str:
        if self.code is None:
            return "exit status unknown"
        return f"killed by {signal.Signals(-self.code).name}" if self.code < 0 else f"exit code {self.code}"


_LIVE: set[_Child] = set()


@atexit.register
def _kill_leftovers() -> None:
    # multiprocessing joins non-daemon children at exit; an unclosed pool must not hang it
    for child in list(_LIVE):
        child.kill()


class GuardedPool:
    """Up to ``size`` long-lived spawn children that run stages of the pipeline ``target``.

    ``max_memory_bytes`` caps RLIMIT_AS at the child's virtual size before the
    call plus that many bytes: it counts what the stage allocates beyond the
    worker's baseline (address space, so thread stacks and malloc arenas count).
    ``timeout`` counts from sending the call; starting a child is not counted.
    """

    def __init__(self, target: str, size: int) -> None:
        if size < 1:
            raise ValueError("GuardedPool(size=...) must be at least 1")
        self._target = target
        self._ctx = multiprocessing.get_context("spawn")
        self._slots = asyncio.Semaphore(size)
        self._children: set[_Child] = set()
        self._idle: list[_Child] = []
        self._dying: list[_Child] = []
        self._closed = False

    async def call(
        self, stage_name: str, value: Any, ctx_fields: dict[str, Any], *,
        timeout: float | None, max_memory_bytes: int | None,
    ) -> GuardedResult:
        """Run ``stage.fn(Context(**ctx_fields), value)`` in a child; never raises for stage failures."""
        try:
            request = pickle.dumps((stage_name, value, ctx_fields, max_memory_bytes), _PROTOCOL)
        except Exception as exc:
            note = f"stage input cannot be pickled: {_text(exc)}"
            return GuardedResult(False, None, Failure("unpicklable_input", False, note), 0.0)
        async with self._slots:
            child = await self._acquire()
            if isinstance(child, Failure):
                return GuardedResult(False, None, child, 0.0)
            start = time.monotonic()
            status, payload = await self._converse(child, request, timeout, f"stage {stage_name}")
            duration = time.monotonic() - start
            if child in self._children:  # neither retired nor closed: reuse it
                self._idle.append(child)
            else:
                child.reap()
        if status == "ok":
            result, provenance, logs = payload
            return GuardedResult(True, result, None, duration, provenance, logs)
        if status == "raised":  # the stage raised: its failure, and what it logged first
            failure, logs = payload
            return GuardedResult(False, None, failure, duration, None, logs)
        return GuardedResult(False, None, payload, duration)

    async def close(self) -> None:
        """Stop every child: idle ones see EOF, busy ones get SIGKILL. Idempotent."""
        self._closed = True
        idle, self._idle = self._idle, []
        for child in idle:
            child.conn.close()
        for child in self._children.difference(idle):
            child.kill()
        self._dying.extend(self._children)
        self._children.clear()
        await self._drain()

    async def _acquire(self) -> _Child | Failure:
        if self._closed:
            raise RuntimeError("GuardedPool is closed")
        self._all_reaped()
        while self._idle:
            child = self._idle.pop()
            if not child.reap():
                return child
            self._children.discard(child)
        return await self._spawn()

    async def _spawn(self) -> _Child | Failure:
        child = _Child(self._ctx, self._target)
        self._children.add(child)
        status, payload = await self._converse(child, None, STARTUP_TIMEOUT, "starting a guard child")
        if status == "ready":
            return child
        if child in self._children:  # the pipeline failed to load: the child exits by itself
            await self._retire(child)
        return payload  # type: ignore[no-any-return]

    async def _converse(
        self, child: _Child, request: bytes | None, timeout: float | None, what: str,
    ) -> tuple[str, Any]:
        """Send ``request`` (None: just listen) and return the child's answer as (status, payload)."""
        try:
            if request is not None:
                await _in_thread(child, child.conn.send_bytes, request)
            message = await _answer(child, timeout)
        except TimeoutError:
            child.kill()
            await self._retire(child)
            note = f"{what} exceeded its {timeout}s timeout; the child process was killed"
            return "error", Failure("timeout", True, note)
        except OSError:
            message = None
        except asyncio.CancelledError:
            child.kill()  # its state is unknown
            self._abandon(child)
            raise
        if message is None:
            await self._retire(child)
            note = f"{what} crashed the child process ({child.exit_text()})"
            return "error", Failure("crashed", True, note)
        return message

    def _abandon(self, child: _Child) -> None:
        """Stop using ``child``; it is reaped later, by ``_all_reaped``, if not at once."""
        self._children.discard(child)
        self._dying.append(child)

    async def _retire(self, child: _Child) -> None:
        """Reap a child that exits by itself or was killed; SIGKILL it after a grace period."""
        self._abandon(child)
        if not await _poll_until(child.reap, EXIT_GRACE):
            child.kill()
            await _poll_until(child.reap, KILL_WAIT)
        self._all_reaped()

    def _all_reaped(self) -> bool:
        self._dying = [child for child in self._dying if not child.reap()]
        return not self._dying

    async def _drain(self) -> None:
        if not await _poll_until(self._all_reaped, EXIT_GRACE):
            for child in self._dying:
                child.kill()
            await _poll_until(self._all_reaped, KILL_WAIT)


async def _answer(child: _Child, timeout: float | None) -> tuple[str, Any] | None:
    """The child's next message, or None when it died first; TimeoutError after ``timeout``."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fds = (child.conn.fileno(), child.proc.sentinel)  # the sentinel: a grandchild may hold the pipe open
    child.busy = True
    for fd in fds:
        loop.add_reader(fd, _resolve, ready)
    try:
        await asyncio.wait_for(ready, timeout)
    finally:
        for fd in fds:
            loop.remove_reader(fd)
        child.busy = False
    return await _in_thread(child, _receive, child)  # a large output must not block the event loop


async def _in_thread(child: _Child, fn: Callable[..., _T], *args: Any) -> _T:
    """Run ``fn`` in a thread; ``child`` keeps its descriptors open until it returns, even on cancel."""
    child.busy = True
    return await asyncio.get_running_loop().run_in_executor(None, _then_idle, child, fn, *args)


def _then_idle(child: _Child, fn: Callable[..., _T], *args: Any) -> _T:
    try:
        return fn(*args)
    finally:
        child.busy = False


def _receive(child: _Child) -> tuple[str, Any] | None:
    try:
        if not child.conn.poll():
            return None
        data = child.conn.recv_bytes()
    except (EOFError, OSError):
        return None
    try:
        message: tuple[str, Any] = pickle.loads(data)
    except Exception as exc:
        note = f"stage output cannot be unpickled in the worker: {_text(exc)}"
        return "error", Failure("unpicklable_output", False, note)
    return message


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _poll_until(done: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True

