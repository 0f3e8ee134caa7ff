"""Where the store and its blobs are when the user does not say: the defaults and environment variables that the
command line (``--db``, ``--blobs``) and the Python API (``conveyor.open``) share, so the two always meet the same
store. A root module: it imports no layer (``conveyor --version`` and every command's option defaults read it)."""

from __future__ import annotations

import os
import shlex

DB_ENV = "CONVEYOR_DB"
BLOBS_ENV = "CONVEYOR_BLOBS"
DEFAULT_DB = "sqlite:///.conveyor/conveyor.db"
DEFAULT_BLOBS = ".conveyor/blobs"


def db_url(db: str | None = None) -> str:
    """``db`` when given, else ``$CONVEYOR_DB``, else the SQLite file under ``.conveyor/`` (an empty value counts
    as not given, as it does for the command line's options)."""
    return db or os.environ.get(DB_ENV) or DEFAULT_DB


def blobs_url(blobs: str | os.PathLike[str] | None = None) -> str:
    """``blobs`` when given, else ``$CONVEYOR_BLOBS``, else the folder ``.conveyor/blobs``."""
    return os.fspath(blobs) if blobs else os.environ.get(BLOBS_ENV) or DEFAULT_BLOBS


def resume_command(run_id: str, db: str, blobs: str) -> str:
    """The shell command that resumes ``run_id`` on this store (its --db and --blobs when not the defaults)."""
    parts = ["conveyor", "resume", run_id]
    if db != DEFAULT_DB:
        parts += ["--db", db]
    if blobs != DEFAULT_BLOBS:
        parts += ["--blobs", blobs]
    return " ".join(shlex.quote(p) for p in parts)
