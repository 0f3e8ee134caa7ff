"""The demo pipeline: the system's manual pages, parsed, extracted and published once.

    conveyor run examples/manpages/pipeline.py:pipe --input /usr/share/man --workers 2

parse    roff source (gzip or plain) → a summary dict; a guarded child process
         with a timeout, so a page that hangs the parser is an ordinary failure
extract  title, command names, section, one-line description; validated:
         a page without a NAME line fails as `unparseable`, never retried
publish  into the catalogue (a SQLite file standing in for an external system),
         behind the stage's idempotency key: a second delivery changes nothing
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

from conveyor import Pipeline, Retry, TerminalError

sys.path.insert(0, str(Path(__file__).parent))
from roff import ManPageError, decode_source, parse_manpage

CATALOGUE = Path(os.environ.get("MANPAGES_CATALOGUE", ".conveyor/manpages-catalogue.db"))

pipe = Pipeline("manuals", retry=Retry(max_attempts=3, base=0.5, cap=10))


@pipe.stage(version="1", max_input_bytes=20_000_000, timeout=30)
def parse(ctx, source: bytes) -> dict:
    try:
        return parse_manpage(decode_source(source))
    except ManPageError as exc:
        raise TerminalError(str(exc), error_class="not_a_manpage") from None


@pipe.stage(after=parse, version="1")
async def extract(ctx, page: dict) -> dict:
    if page.get("redirect"):
        return {"alias_of": page["redirect"]}
    if not page["names"] or not page["description"]:
        raise TerminalError("no NAME line with a description", error_class="unparseable")
    return {
        "title": page["title"], "section": page["section"], "names": page["names"],
        "description": page["description"],
    }


_catalogue: list[sqlite3.Connection] = []


def catalogue() -> sqlite3.Connection:
    """One connection per worker process to the stand-in external system."""
    if not _catalogue:
        CATALOGUE.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(CATALOGUE, timeout=60, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS manpages (idempotency_key TEXT PRIMARY KEY, source TEXT, title TEXT,"
            " section TEXT, names TEXT, description TEXT, alias_of TEXT, deliveries INTEGER DEFAULT 1)"
        )
        _catalogue.append(db)
    return _catalogue[0]


@pipe.stage(after=extract, kind="publish", version="1")
def publish(ctx, record: dict) -> None:
    with catalogue() as db:
        # The external system honours the key: a redelivery is counted, never applied twice.
        db.execute(
            "INSERT INTO manpages (idempotency_key, source, title, section, names, description, alias_of)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (idempotency_key) DO UPDATE SET deliveries = deliveries + 1",
            (ctx.idempotency_key, ctx.item_key, record.get("title"), record.get("section"),
             " ".join(record.get("names", [])), record.get("description"), record.get("alias_of")),
        )
