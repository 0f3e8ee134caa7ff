"""Loaded by bench/graph_readiness.py's `conveyor run` processes (first on their PYTHONPATH): the thread CPU seconds
(time.thread_time, so neither waits nor the other threads count) and the calls of the functions named in
CONVEYOR_BENCH_THREAD_CPU (``module:Class.method``, comma-separated), written per process to a file in
CONVEYOR_BENCH_THREAD_CPU_OUT at exit (os._exit included: the forked workers end that way). A function called
from another one measured is counted in both. Nothing without those variables."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from typing import Any

OUT = os.environ.get("CONVEYOR_BENCH_THREAD_CPU_OUT")
NAMES = os.environ.get("CONVEYOR_BENCH_THREAD_CPU", "")
if OUT and NAMES:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/, for this import only
    from exithook import on_exit
    del sys.path[0]
    folder = OUT
    spent: dict[str, list[float]] = {}

    def _timed(name: str, inner: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                entry = spent.setdefault(name, [0, 0.0])
                entry[0] += 1
                entry[1] += time.thread_time() - started
        return timed

    for spec in NAMES.split(","):
        module, _, path = spec.partition(":")
        owner_name, _, attribute = path.rpartition(".")
        owner = getattr(importlib.import_module(module), owner_name)
        setattr(owner, attribute, _timed(path, getattr(owner, attribute)))
    os.register_at_fork(after_in_child=spent.clear)  # a forked worker counts its own calls only

    def _dump() -> None:
        if spent:
            with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as out:
                json.dump(spent, out)
            spent.clear()
    on_exit(_dump)
