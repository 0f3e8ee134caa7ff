"""``ctx.log``: a stage's log lines, kept with the attempt that wrote them.

A stage logs through ``ctx.log`` as through any logger (``ctx.log.info("page %d has no text", n)``); every record
still goes to the Python logger ``conveyor.stage`` (the CLI or the host application decides what it prints), and
is also kept, as ``[seconds since the attempt started, level name, message]``, in the attempt's own bounded
buffer. The worker writes that buffer with the attempt's row, in the same batched commit (never a round trip
per line), so `conveyor show --logs` and the item page show each attempt's lines.

The buffer is bounded, so a stage that logs in a loop cannot fill the store: at most ``MAX_LINES`` lines and
``MAX_BYTES`` bytes of text per attempt, each line cut to ``LINE_CHARS`` characters; the lines past the bound are
counted (``dropped``), not kept. The first lines are the ones kept: they say how the attempt began, and the
error that ended it is on the attempt row already.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import MutableMapping, Sequence
from typing import Any

MAX_LINES = 200
MAX_BYTES = 64 * 1024
LINE_CHARS = 4_000

_log = logging.getLogger("conveyor.stage")
LogLine = tuple[float, str, str]  # (seconds since the attempt started, level name, message)


class AttemptLog:
    """One attempt's kept lines and the count of those past the bound."""

    __slots__ = ("_started", "bytes", "dropped", "lines")

    def __init__(self, started: float | None = None) -> None:
        """``started``: the attempt's start on ``time.monotonic``'s clock (now when not given)."""
        self._started = time.monotonic() if started is None else started
        self.lines: list[LogLine] = []
        self.bytes = 0
        self.dropped = 0

    def keep(self, level: int | str, message: str, at: float | None = None) -> None:
        """Keep one line (``at``: its time since the attempt started, when it was taken elsewhere), or count it
        dropped when the buffer is full."""
        if len(message) > LINE_CHARS:
            message = message[:LINE_CHARS - 1] + "…"
        size = len(message.encode("utf-8", "surrogatepass"))
        if len(self.lines) >= MAX_LINES or self.bytes + size > MAX_BYTES:
            self.dropped += 1
            return
        self.bytes += size
        name = level if isinstance(level, str) else logging.getLevelName(level)
        self.lines.append((round(time.monotonic() - self._started if at is None else at, 3), name, message))

    def extend(self, lines: Sequence[Sequence[Any]], dropped: int) -> None:
        """Take in lines kept elsewhere (a guarded stage's child process), under this buffer's bound."""
        for at, level, message in lines:
            self.keep(str(level), str(message), float(at))
        self.dropped += dropped

    def state(self) -> tuple[list[LogLine], int]:
        """(lines, dropped), picklable: what a child process sends back with its answer."""
        return list(self.lines), self.dropped

    def encoded(self) -> str | None:
        """The lines as the attempt row keeps them (JSON), or None when the attempt logged nothing."""
        if not self.lines:
            return None
        return json.dumps(self.lines, ensure_ascii=False, separators=(",", ":"))


class StageLogger(logging.LoggerAdapter[logging.Logger]):
    """``ctx.log``: a logger whose records carry run, stage, item and attempt, each also kept in ``kept``
    (whatever the Python logger's level: the attempt's lines do not depend on how this process logs)."""

    def __init__(self, extra: dict[str, Any], kept: AttemptLog) -> None:
        super().__init__(_log, extra)
        self.kept = kept

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        self.kept.keep(level, _text(msg, args, kwargs))
        # one frame more than a plain adapter's, so a record names the stage's line, not this one
        super().log(level, msg, *args, **{**kwargs, "stacklevel": kwargs.get("stacklevel", 1) + 1})

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**dict(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def _text(msg: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The record's message as a handler would print it (``msg % args``), with its exception's traceback."""
    try:
        text = str(msg) % args if args else str(msg)
    except Exception:  # a bad format string is the stage's bug; keep what it said
        text = f"{msg} {args!r}"
    exc_info = kwargs.get("exc_info")
    if exc_info:
        if isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        elif not isinstance(exc_info, tuple):
            import sys

            exc_info = sys.exc_info()
        if exc_info[0] is not None:
            text += "\n" + "".join(traceback.format_exception(*exc_info)).rstrip()
    return text


def decode(text: str | None) -> list[dict[str, Any]]:
    """An attempt row's lines as JSON objects ``{"t", "level", "message"}`` (none when it kept none)."""
    if not text:
        return []
    return [{"t": t, "level": level, "message": message} for t, level, message in json.loads(text)]
