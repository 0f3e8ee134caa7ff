"""The memo's index key: a task key's first 64 bits as a signed integer.

Task keys are sha256 hex digests, so consecutive memo writes land at random
places in any index over them, and an index page costs a WAL frame at commit
whatever the size of the entry. An index of 8-byte integers holds several
times more entries per page than one of 64-character strings, so a commit
touches far fewer pages (the raw-SQL floor ran ~40% faster). Two task keys
may share 64 bits: a lookup checks the full key, and the second key of such
a pair is simply not memoised.
"""

from __future__ import annotations

_SIGN = 1 << 63
_WRAP = 1 << 64


def key64(task_key: str) -> int:
    """Two's complement of the first 16 hex digits, as PostgreSQL's ``('x' || ...)::bit(64)::bigint`` reads them."""
    value = int(task_key[:16], 16)
    return value - _WRAP if value >= _SIGN else value


# The same, as SQL each backend can evaluate over a ``task_key`` column (used when migrating old stores).
SQLITE_FUNCTION = "conveyor_key64"
KEY64_SQL = {"sqlite": f"{SQLITE_FUNCTION}(task_key)", "postgres": "('x' || substr(task_key, 1, 16))::bit(64)::bigint"}


def key64_sql(backend: str, column: str) -> str:
    """``KEY64_SQL`` of ``backend`` over ``column`` (a qualified task key column, for a join with the memo)."""
    return KEY64_SQL[backend].replace("task_key", column)
