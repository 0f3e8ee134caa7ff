"""All SQL of conveyor: one schema on SQLite (embedded default) and PostgreSQL."""

from __future__ import annotations

import os
from pathlib import Path

from conveyor.errors import BackendUnavailable, UrlError
from conveyor.store.records import (
    AttemptRecord,
    ClaimedTask,
    DeadLetter,
    ExpiredLease,
    NewItem,
    NewOutput,
    NewTasks,
    RunRecord,
    StoredOutput,
    TaskStatus,
)
from conveyor.store.sql_store import SqlStore

DEFAULT_DB = "sqlite:///.conveyor/conveyor.db"

__all__ = [
    "DEFAULT_DB", "AttemptRecord", "ClaimedTask", "DeadLetter", "ExpiredLease", "NewItem", "NewOutput", "NewTasks",
    "RunRecord", "SqlStore", "StoredOutput", "TaskStatus", "open_store",
]


def open_store(url: str | None = None, *, migrate: bool = True) -> SqlStore:
    """Open ``sqlite:///path.db`` or ``postgresql://...``; apply migrations unless told not to."""
    url = url or os.environ.get("CONVEYOR_DB") or DEFAULT_DB
    store = SqlStore(_dialect(url), url)
    if migrate:
        store.migrate()
    return store


def _dialect(url: str):  # type: ignore[no-untyped-def]
    from conveyor.store.dialect import PostgresDialect, SqliteDialect

    if url.startswith(("postgresql://", "postgres://")):
        try:
            return PostgresDialect(url)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise BackendUnavailable(f"cannot connect to PostgreSQL at {_redact(url)}: {first}") from None
    if url.startswith("sqlite:"):
        path = url.removeprefix("sqlite:").removeprefix("//")
        if path in ("", "/"):
            raise UrlError(f"--db {url!r} names no file; use sqlite:///path/to/file.db")
        if path != ":memory:":
            path = path[1:] if path.startswith("/") and not path.startswith("//") else path
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        return SqliteDialect(path)
    raise UrlError(
        f"--db {url!r} is not a database URL; use sqlite:///path/to/file.db or postgresql://user@host/db"
    )


def _redact(url: str) -> str:
    if "@" in url and ":" in url.split("@", 1)[0].split("//", 1)[-1]:
        scheme, rest = url.split("//", 1)
        user = rest.split(":", 1)[0]
        return f"{scheme}//{user}:***@{rest.split('@', 1)[1]}"
    return url
