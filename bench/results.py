"""What the bench scripts share: bench/RESULTS.md, where each script owns a section between two markers and
rewrites only that one, and scratch PostgreSQL databases."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def markers(script: str) -> tuple[str, str]:
    return f"<!-- bench/{script}:begin -->", f"<!-- bench/{script}:end -->"


def write_section(script: str, section: str, path: Path = RESULTS) -> None:
    """Replace ``script``'s section (``section`` holds its markers), or add it at the end; the rest stays."""
    begin, end = markers(script)
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
    print(f"wrote {path}")


@contextmanager
def pg_database(admin: str, label: str) -> Iterator[str]:
    """A fresh PostgreSQL database (``conveyor_bench_<label>_...``) on the server of ``admin``, for the block;
    dropped afterwards."""
    import psycopg

    name = f"conveyor_bench_{label}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield f"{admin.partition('?')[0].rpartition('/')[0]}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
