"""All SQL of conveyor: one schema on SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.errors import BackendUnavailable, ConveyorError, StoreError, StoreMissing, UrlError
from conveyor.lazy import lazy_names
from conveyor.places import DEFAULT_DB as DEFAULT_DB
from conveyor.places import db_url

if TYPE_CHECKING:
    from conveyor.store.records import (
        CHILD_MARK,
        UNFINISHED_RUNS,
        AttemptRecord,
        ClaimedTask,
        Crashed,
        DeadLetter,
        Ended,
        ExpiredLease,
        Lease,
        NewDeadLetter,
        NewItem,
        NewOutput,
        NewPublication,
        NewTasks,
        Notice,
        PlainAttempt,
        Retried,
        RunRecord,
        StoredOutput,
        Succeeded,
        TaskStatus,
    )
    from conveyor.store.sql_store import SqlStore
    from conveyor.store.workers import Declaration, WorkerRow


__all__ = [
    "CHILD_MARK", "DEFAULT_DB", "UNFINISHED_RUNS", "AttemptRecord", "ClaimedTask", "Crashed", "DeadLetter",
    "Declaration", "Ended", "ExpiredLease", "Lease", "NewDeadLetter", "NewItem", "NewOutput", "NewPublication",
    "NewTasks", "Notice",
    "PlainAttempt", "Retried", "RunRecord", "SqlStore", "StoredOutput", "Succeeded", "TaskStatus", "WorkerRow",
    "lost_connection", "new_store_note", "open_store", "opened_store", "sqlite_path",
]

# The records and the store, by the module that defines each: imported when first used, so that a command
# that only names DEFAULT_DB (every command's --db default) does not load the store's modules.
_LAZY = {
    **dict.fromkeys(("CHILD_MARK", "UNFINISHED_RUNS", "AttemptRecord", "ClaimedTask", "Crashed", "DeadLetter",
                     "Ended", "ExpiredLease", "Lease", "NewDeadLetter", "NewItem", "NewOutput", "NewPublication",
                     "NewTasks", "Notice", "PlainAttempt", "Retried", "RunRecord", "StoredOutput", "Succeeded",
                     "TaskStatus"), "conveyor.store.records"),
    "SqlStore": "conveyor.store.sql_store",
    **dict.fromkeys(("Declaration", "WorkerRow"), "conveyor.store.workers"),
}


__getattr__, __dir__ = lazy_names(globals(), _LAZY)


def open_store(url: str | None = None, *, migrate: bool = True, create: bool = True) -> SqlStore:
    """Open ``sqlite:///path.db`` or ``postgresql://...``; apply migrations unless told not to.

    ``create=False`` is for commands that only read: a SQLite file that does not exist yet, or a database
    with no conveyor schema, raises ``StoreMissing`` instead of being created (with its folder).
    """
    from conveyor.store.sql_store import SqlStore

    url = db_url(url)
    store = SqlStore(_dialect(url, create), url)
    if not create and not store.initialised():
        store.close()
        raise StoreMissing(f"no conveyor store at {_redact(url)} yet; `conveyor run TARGET --input PATH` creates it")
    if migrate:
        try:
            store.migrate()
        except Exception as exc:
            store.close()
            if isinstance(exc, ConveyorError):
                raise
            raise StoreError(f"cannot prepare the store at {_redact(url)}: {_first_line(exc)}") from exc
    return store


def new_store_note(store: SqlStore) -> str | None:
    """A line for the user when opening ``store`` created it (a new SQLite file, a fresh schema), else None."""
    return f"created a new store at {_redact(store.url)}" if store.created else None


def sqlite_path(url: str) -> str | None:
    """The file behind a ``sqlite:`` URL (None for other URLs and in-memory stores)."""
    if not url.startswith("sqlite:"):
        return None
    path = url.removeprefix("sqlite:").removeprefix("//")
    if path in ("", "/"):
        raise UrlError(f"--db {url!r} names no file; use sqlite:///path/to/file.db")
    path = path[1:] if path.startswith("/") and not path.startswith("//") else path
    return None if path == ":memory:" else path


def _dialect(url: str, create: bool):  # type: ignore[no-untyped-def]
    from conveyor.store.dialect import PostgresDialect, SqliteDialect

    if url.startswith(("postgresql://", "postgres://")):
        try:
            return PostgresDialect(url)
        except Exception as exc:
            raise BackendUnavailable(f"cannot connect to PostgreSQL at {_redact(url)}: {_first_line(exc)}") from None
    if url.startswith("sqlite:"):
        path = sqlite_path(url)
        return SqliteDialect(":memory:") if path is None else _sqlite(SqliteDialect, path, create)
    raise UrlError(
        f"--db {url!r} is not a database URL; use sqlite:///path/to/file.db or postgresql://user@host/db"
    )


def _sqlite(dialect: type, path: str, create: bool):  # type: ignore[no-untyped-def]
    """A SQLite store, with one-line errors for the ways a path can be wrong."""
    import sqlite3

    file = Path(path)
    if file.is_dir():
        raise UrlError(f"--db {path!r} is a folder; name a file, e.g. sqlite:///{path.rstrip('/')}/conveyor.db")
    if not file.exists():
        if not create:
            raise StoreMissing(f"no conveyor store at {path} yet; `conveyor run TARGET --input PATH` creates it")
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UrlError(f"cannot create the folder of --db {path!r}: {exc.strerror}; "
                           "choose a writable place") from None
    try:
        return dialect(os.path.realpath(path))
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc):
            raise UrlError(f"--db {path!r} is not a SQLite database ({exc}); point --db at a conveyor store "
                           "or at a new file") from None
        raise UrlError(f"cannot open the SQLite store {path!r} ({exc}); check that the file and its folder "
                       "are writable") from None
    except OSError as exc:
        raise UrlError(f"cannot open the SQLite store {path!r}: {exc.strerror}; check that the file and its "
                       "folder are writable") from None


def lost_connection(store: SqlStore, exc: BaseException,
                    then: str = "run the command again once it answers") -> BackendUnavailable | None:
    """What to tell the user when ``exc`` came of the store's connection being lost (PostgreSQL restarting,
    its backend terminated), else None: a command that meets it says so in one line, never a traceback.
    Ask before anything uses the store again (a new call opens a new connection)."""
    if not isinstance(exc, Exception) or isinstance(exc, ConveyorError) or not store.lost():
        return None
    return BackendUnavailable(f"lost the connection to the store at {_redact(store.url)} ({_first_line(exc)}); "
                              f"{then}")


@contextmanager
def opened_store(url: str | None = None, *, create: bool = True) -> Iterator[SqlStore]:
    """The store at ``url``, open for the block and closed after it (``create=False``: StoreMissing when there is
    none); a connection lost on the way is raised as ``lost_connection``'s one line, never a driver's traceback."""
    store = open_store(url, create=create)
    try:
        yield store
    except Exception as exc:
        lost = lost_connection(store, exc)
        if lost is None:
            raise
        raise lost from None
    finally:
        store.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _redact(url: str) -> str:
    if "@" in url and ":" in url.split("@", 1)[0].split("//", 1)[-1]:
        scheme, rest = url.split("//", 1)
        user = rest.split(":", 1)[0]
        return f"{scheme}//{user}:***@{rest.split('@', 1)[1]}"
    return url
