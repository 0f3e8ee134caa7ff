"""sqlite-vec (``pip install 'conveyor[search]'``) inside Python's own sqlite3 module.

The vector index of the publication target on SQLite (store/vectors.py) is a sqlite-vec ``vec0`` table, written
in the same transaction as the records, so the store's one connection must know the extension. Python's sqlite3
loads extensions only when it was built to (``enable_load_extension``; pyenv's default build, for one, is not),
so the extension is registered with SQLite itself instead (``sqlite3_auto_extension``, through ctypes, on the
library the sqlite3 module is linked to), which gives it to every connection opened afterwards, whatever the
build. Where that fails (no sqlite-vec installed, a SQLite linked in without its symbols), or
``CONVEYOR_SQLITE_VEC=0`` says not to, vector search is an exact scan instead.
"""

from __future__ import annotations

import ctypes
import os
import threading

_lock = threading.Lock()
_state: dict[str, bool] = {}


def register() -> bool:
    """Make sqlite-vec part of every SQLite connection this process opens from now on; whether it is."""
    with _lock:
        if "loaded" not in _state:
            _state["loaded"] = os.environ.get("CONVEYOR_SQLITE_VEC", "1") != "0" and _auto_extension()
        return _state["loaded"]


def available() -> bool:
    """Whether the store's connections have sqlite-vec (register() ran before they were opened)."""
    return _state.get("loaded", False)


def _auto_extension() -> bool:
    try:
        import _sqlite3
    except ImportError:
        return False
    library = _loadable_path()
    if library is None:
        return False
    try:
        extension = ctypes.CDLL(library + _suffix())
        sqlite = ctypes.CDLL(_sqlite3.__file__)  # its symbols include the SQLite library it is linked to
        entry = ctypes.cast(extension.sqlite3_vec_init, ctypes.c_void_p)
        return int(sqlite.sqlite3_auto_extension(entry)) == 0
    except (OSError, AttributeError):  # no such library or symbol: this build keeps SQLite to itself
        return False


def _loadable_path() -> str | None:
    """The extension's library (without its suffix), found the way ``sqlite_vec.loadable_path()`` finds it, in
    the package's folder, without importing the package: its ``__init__`` imports numpy when numpy is installed
    (0.15 s of every command that opens a store, and of every worker process)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("sqlite_vec")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return os.path.normpath(os.path.join(os.path.dirname(spec.origin), "vec0"))


def _suffix() -> str:
    import sys

    return {"darwin": ".dylib", "win32": ".dll"}.get(sys.platform, ".so")
