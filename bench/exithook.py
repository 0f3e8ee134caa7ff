"""For the benches' sitecustomize modules (bench/*/sitecustomize.py): write what a process measured when it ends,
whichever way it ends. They import it with bench/ on ``sys.path`` for that import only (bench's module names,
``results`` or ``search``, must not shadow a library's in the measured process)."""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable


def on_exit(dump: Callable[[], None]) -> None:
    """Call ``dump`` when this process ends: at exit, and on ``os._exit`` (the forked workers of service/forks.py end
    that way, skipping atexit). ``dump`` may run twice: it writes once and forgets what it wrote."""
    atexit.register(dump)
    exit_now = os._exit

    def dump_and_exit(code: int) -> None:
        try:
            dump()
        finally:
            exit_now(code)

    os._exit = dump_and_exit  # type: ignore[assignment]

