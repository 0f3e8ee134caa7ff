"""Loaded by bench/graph_profile.py's `conveyor run` processes (first on their PYTHONPATH): a cProfile profiler on
every thread of the process (and a new one in each forked worker), their statistics merged and written to a file
in CONVEYOR_BENCH_PROFILE at exit (os._exit included: the forked workers end that way). Nothing without that
variable."""

from __future__ import annotations

import os
from typing import Any

OUT = os.environ.get("CONVEYOR_BENCH_PROFILE")
if OUT:
    import cProfile
    import sys
    import threading

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/, for this import only
    from exithook import on_exit
    del sys.path[0]

    profilers: list[cProfile.Profile] = []

    def _start() -> cProfile.Profile:
        profiler = cProfile.Profile()
        profilers.append(profiler)
        profiler.enable()
        return profiler

    _run = threading.Thread.run

    def _profiled_run(self: threading.Thread) -> None:
        profiler = _start()
        try:
            _run(self)
        finally:
            profiler.disable()

    threading.Thread.run = _profiled_run  # type: ignore[method-assign]
    main = [_start()]

    def _forked() -> None:  # a forked worker: its own profile, not its parent's so far
        main[0].disable()
        profilers.clear()
        main[0] = _start()

    os.register_at_fork(after_in_child=_forked)

    def _dump() -> None:
        if not profilers:
            return
        import pstats

        stats: Any = None
        for profiler in profilers:
            profiler.disable()
            profiler.create_stats()
            if stats is None:
                stats = pstats.Stats(profiler)
            else:
                stats.add(profiler)
        profilers.clear()
        stats.dump_stats(os.path.join(OUT, f"{os.getpid()}.prof"))

    on_exit(_dump)
