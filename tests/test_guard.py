"""GuardedPool: stages in killable spawn children survive hangs, hogs and crashes."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from conveyor.runtime.guard import GuardedPool, GuardedResult
from conveyor.runtime.target import load_target

PIPELINE = textwrap.dedent(
    """
    import ctypes
    import os
    import signal
    import time

    from conveyor.pipeline import Pipeline, Retry

    pipe = Pipeline("guarded")


    @pipe.stage(timeout=5)
    def ok(ctx, value):
        return {"doubled": value["n"] * 2, "stage": ctx.stage, "pid": os.getpid()}


    @pipe.stage(timeout=1)
    def hang(ctx, value):
        time.sleep(3600)


    @pipe.stage(max_memory_mb=200, timeout=30)
    def hog(ctx, value):
        return len(b"x" * (2 * 2**30))


    @pipe.stage(timeout=5)
    def crash(ctx, value):
        os._exit(3)


    @pipe.stage(timeout=5)
    def segv(ctx, value):
        os.kill(os.getpid(), signal.SIGKILL)


    @pipe.stage(timeout=5)
    def segfault(ctx, value):
        ctypes.string_at(0)


    @pipe.stage(timeout=5)
    def boom(ctx, value):
        return {}["missing"]


    @pipe.stage(timeout=5, retry=Retry(terminal=(ValueError,)))
    def declared(ctx, value):
        raise ValueError("bad document")


    @pipe.stage(timeout=10)
    def nap(ctx, value):
        time.sleep(value)
        return os.getpid()


    @pipe.stage(timeout=5)
    def unpicklable(ctx, value):
        return lambda: None


    def _refuse():
        raise RuntimeError("cannot rebuild this in the parent")


    class Fragile:
        def __reduce__(self):
            return (_refuse, ())


    @pipe.stage(timeout=5)
    def fragile(ctx, value):
        return Fragile()
    """
)


@pytest.fixture
def target(tmp_path: Path) -> str:
    path = tmp_path / "guarded_pipeline.py"
    path.write_text(PIPELINE)
    return f"{path}:pipe"


def fields(stage: str) -> dict[str, Any]:
    return {
        "run_id": "run-1", "item_key": "doc-1", "stage": stage, "attempt": 1,
        "idempotency_key": "idem-1", "task_key": "task-1", "pipeline": "guarded", "input_digest": "0" * 64,
    }


async def call(pool: GuardedPool, target: str, stage_name: str, value: Any = None) -> GuardedResult:
    stage = load_target(target)[stage_name]
    return await pool.call(
        stage_name, value, fields(stage_name), timeout=stage.timeout, max_memory_bytes=stage.max_memory_bytes
    )


def with_pool(target: str, size: int, body: Callable[[GuardedPool], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        pool = GuardedPool(target, size)
        try:
            return await body(pool)
        finally:
            await pool.close()

    return asyncio.run(main())


def live_children() -> list[psutil.Process]:
    """Our children, zombies included, except multiprocessing's long-lived resource tracker and the servers the
    test session started (a SeaweedFS for the S3 tests, tests/s3server.py)."""
    return [p for p in psutil.Process().children(recursive=True)
            if not _is_resource_tracker(p) and not _is_session_server(p)]


def _is_session_server(proc: psutil.Process) -> bool:
    try:
        return proc.name() == "weed"
    except psutil.Error:
        return False


def _is_resource_tracker(proc: psutil.Process) -> bool:
    try:
        return "resource_tracker" in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def gone(pid: int) -> bool:
    """Exited and reaped: a zombie still exists."""
    return not psutil.pid_exists(pid)


async def assert_pool_works(pool: GuardedPool, target: str) -> int:
    result = await call(pool, target, "ok", {"n": 21})
    assert result.ok, result.failure
    return int(result.value["pid"])


def call_forever(pool: GuardedPool, stage_name: str) -> Awaitable[GuardedResult]:
    return pool.call(stage_name, None, fields(stage_name), timeout=None, max_memory_bytes=None)


@pytest.mark.timeout(60)
def test_ok_round_trip(target: str) -> None:
    result = with_pool(target, 1, lambda pool: call(pool, target, "ok", {"n": 21}))
    assert result.ok and result.failure is None
    assert result.value["doubled"] == 42 and result.value["stage"] == "ok"
    assert result.value["pid"] != os.getpid()
    assert 0 < result.duration < 5


@pytest.mark.timeout(60)
def test_idle_child_is_reused(target: str) -> None:
    async def body(pool: GuardedPool) -> list[int]:
        return [await assert_pool_works(pool, target) for _ in range(3)]

    assert len(set(with_pool(target, 2, body))) == 1


@pytest.mark.timeout(60)
def test_hang_becomes_timeout_and_child_is_replaced(target: str) -> None:
    async def body(pool: GuardedPool) -> tuple[GuardedResult, float, int, int]:
        before = await assert_pool_works(pool, target)
        started = time.monotonic()
        result = await call(pool, target, "hang")
        elapsed = time.monotonic() - started
        return result, elapsed, before, await assert_pool_works(pool, target)

    result, elapsed, before, after = with_pool(target, 1, body)
    assert elapsed < 1 + 2
    assert not result.ok and result.failure is not None
    assert result.failure.error_class == "timeout" and result.failure.retryable
    assert result.failure.message == "stage hang exceeded its 1.0s timeout; the child process was killed"
    assert after != before and gone(before)


@pytest.mark.timeout(60)
def test_hog_is_a_memory_limit_and_child_survives(target: str) -> None:
    async def body(pool: GuardedPool) -> tuple[GuardedResult, int, int]:
        before = await assert_pool_works(pool, target)
        result = await call(pool, target, "hog")
        return result, before, await assert_pool_works(pool, target)

    result, before, after = with_pool(target, 1, body)
    assert result.failure is not None and result.failure.error_class == "memory_limit"
    assert not result.failure.retryable
    assert after == before  # the limit is lifted again after the call


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("stage", "exit_text"),
    [("crash", "exit code 3"), ("segv", "SIGKILL"), ("segfault", "SIGSEGV")],
)
def test_crash_is_a_retryable_failure(target: str, stage: str, exit_text: str) -> None:
    async def body(pool: GuardedPool) -> tuple[GuardedResult, int]:
        result = await call(pool, target, stage)
        return result, await assert_pool_works(pool, target)

    result, _ = with_pool(target, 1, body)
    assert result.failure is not None and result.failure.error_class == "crashed"
    assert result.failure.retryable and exit_text in result.failure.message


@pytest.mark.timeout(60)
def test_exception_is_classified_with_traceback(target: str) -> None:
    result = with_pool(target, 1, lambda pool: call(pool, target, "boom"))
    assert result.failure is not None and result.failure.error_class == "key_error"
    assert result.failure.retryable
    assert "Traceback" in result.failure.detail and "boom" in result.failure.detail


@pytest.mark.timeout(60)
def test_declared_terminal_error(target: str) -> None:
    result = with_pool(target, 1, lambda pool: call(pool, target, "declared"))
    assert result.failure is not None and result.failure.error_class == "terminal"
    assert not result.failure.retryable and "bad document" in result.failure.message


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", ["unpicklable", "fragile"])
def test_unpicklable_output_is_terminal(target: str, stage: str) -> None:
    async def body(pool: GuardedPool) -> GuardedResult:
        result = await call(pool, target, stage)
        await assert_pool_works(pool, target)
        return result

    result = with_pool(target, 1, body)
    assert result.failure is not None and result.failure.error_class == "unpicklable_output"
    assert not result.failure.retryable


@pytest.mark.timeout(60)
def test_unpicklable_input_and_unknown_stage(target: str) -> None:
    async def body(pool: GuardedPool) -> tuple[GuardedResult, GuardedResult]:
        bad_input = await pool.call("ok", lambda: None, fields("ok"), timeout=5, max_memory_bytes=None)
        return bad_input, await pool.call("nope", 1, fields("nope"), timeout=5, max_memory_bytes=None)

    bad_input, unknown = with_pool(target, 1, body)
    assert bad_input.failure is not None and bad_input.failure.error_class == "unpicklable_input"
    assert unknown.failure is not None and not unknown.failure.retryable
    assert "no stage 'nope'" in unknown.failure.message


@pytest.mark.timeout(60)
def test_broken_target_fails_every_call(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("raise ImportError('no such dependency')\n")

    async def body(pool: GuardedPool) -> GuardedResult:
        return await pool.call("ok", 1, fields("ok"), timeout=5, max_memory_bytes=None)

    result = with_pool(f"{path}:pipe", 1, body)
    assert result.failure is not None and result.failure.error_class == "target_error"
    assert "no such dependency" in result.failure.message
    assert live_children() == []


@pytest.mark.timeout(60)
def test_children_run_concurrently(target: str) -> None:
    async def body(pool: GuardedPool) -> tuple[float, list[GuardedResult]]:
        await asyncio.gather(assert_pool_works(pool, target), assert_pool_works(pool, target))
        started = time.monotonic()
        results = await asyncio.gather(call(pool, target, "nap", 1), call(pool, target, "nap", 1))
        return time.monotonic() - started, results

    elapsed, results = with_pool(target, 2, body)
    assert elapsed < 1.8
    assert all(r.ok for r in results) and results[0].value != results[1].value


@pytest.mark.timeout(60)
def test_size_bounds_the_children(target: str) -> None:
    async def body(pool: GuardedPool) -> tuple[list[GuardedResult], int]:
        calls = [asyncio.ensure_future(call(pool, target, "nap", 0.3)) for _ in range(4)]
        await asyncio.sleep(0.5)
        most = len(live_children())
        return list(await asyncio.gather(*calls)), most

    results, most = with_pool(target, 2, body)
    assert all(r.ok for r in results) and len({r.value for r in results}) <= 2
    assert most <= 2


@pytest.mark.timeout(60)
def test_child_ignores_sigint(target: str) -> None:
    async def body(pool: GuardedPool) -> tuple[int, GuardedResult]:
        pid = await assert_pool_works(pool, target)
        napping = asyncio.ensure_future(call(pool, target, "nap", 0.5))
        await asyncio.sleep(0.2)
        os.kill(pid, signal.SIGINT)
        return pid, await napping

    pid, result = with_pool(target, 1, body)
    assert result.ok and result.value == pid


@pytest.mark.timeout(60)
def test_cancelled_call_kills_its_child(target: str) -> None:
    async def body(pool: GuardedPool) -> tuple[int, int]:
        pid = await assert_pool_works(pool, target)
        hanging = asyncio.ensure_future(call_forever(pool, "hang"))
        await asyncio.sleep(0.3)
        hanging.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hanging
        return pid, await assert_pool_works(pool, target)

    before, after = with_pool(target, 1, body)
    assert after != before and gone(before)


@pytest.mark.timeout(60)
def test_close_kills_busy_children_and_leaves_no_processes(target: str) -> None:
    async def body() -> tuple[float, GuardedResult]:
        pool = GuardedPool(target, 3)
        await asyncio.gather(*(assert_pool_works(pool, target) for _ in range(3)))
        hanging = asyncio.ensure_future(call_forever(pool, "hang"))
        await asyncio.sleep(0.3)
        assert len(live_children()) == 3
        started = time.monotonic()
        await pool.close()
        elapsed = time.monotonic() - started
        await pool.close()
        with pytest.raises(RuntimeError):
            await assert_pool_works(pool, target)
        return elapsed, await hanging

    elapsed, hung = asyncio.run(body())
    assert elapsed < 5
    assert hung.failure is not None and hung.failure.error_class == "crashed"
    assert live_children() == []
