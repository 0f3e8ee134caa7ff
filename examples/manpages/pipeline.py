"""The demo pipeline: the system's manual pages, parsed, summarised by a model, embedded and published once.

    conveyor provider-sim --tpm 200000 --rpm 1200 &              # or a real endpoint: OPENAI_BASE_URL, OPENAI_API_KEY
    OPENAI_BASE_URL=http://127.0.0.1:8765/v1 MANPAGES_MODEL=sim-1 \\
        conveyor run examples/manpages/pipeline.py:pipe --input /usr/share/man --workers 2

parse    roff source (gzip or plain) → a summary dict with the page's running text; a guarded child
         process with a timeout, so a page that hangs the parser is an ordinary failure
extract  title, command names, section, one-line description by rule (a page without a NAME line
         fails as `unparseable`, never retried, never paid for), then a JSON-mode chat call for
         {"summary", "keywords"}, checked against a schema: a wrong shape is `bad_model_output`
         (retried once, then dead-lettered), never published
publish  the manual's record into the catalogue (a SQLite file standing in for an external system),
         behind the stage's idempotency key: a second delivery changes nothing
chunk    (fan-out, after parse) the page's text in chunks of about 1,000 characters, at most 3
embed    each chunk through the local all-MiniLM-L6-v2 model on the CPU (384-d unit vectors)
index    each chunk's vector (float16) into the catalogue, behind its own idempotency key

The provider: chat from any OpenAI-compatible endpoint (OPENAI_BASE_URL / OPENAI_API_KEY; the model
is MANPAGES_MODEL, default gpt-4o-mini), embeddings from the local model, made once per worker. The
chat model's tokens per minute are a fleet-wide budget (``limits``; CONVEYOR_LIMITS overrides them).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from conveyor import Pipeline, RateLimit, Retry, TerminalError

sys.path.insert(0, str(Path(__file__).parent))
from enrich import PROMPT_VERSION, messages, model_record, pack_vector, split_text
from roff import ManPageError, decode_source, parse_manpage

CATALOGUE = Path(os.environ.get("MANPAGES_CATALOGUE", ".conveyor/manpages-catalogue.db"))
MODEL = os.environ.get("MANPAGES_MODEL", "gpt-4o-mini")
EMBED_MODEL = "all-MiniLM-L6-v2"
MAX_TOKENS = 200  # the answer is a sentence and a few keywords
CHAT_TIMEOUT = 10.0  # seconds: a hung request becomes an ordinary `timeout` and is retried
CHUNK_CHARS, MAX_CHUNKS = 1_000, 3
BODY_CHARS = CHUNK_CHARS * MAX_CHUNKS
# USD per 1M tokens; the simulator's sim-1 is priced like gpt-4o-mini so the demo shows a cost.
PRICES = {"sim-1": {"input": 0.15, "output": 0.60}, "gpt-4o-mini": {"input": 0.15, "output": 0.60},
          "gpt-4.1-mini": {"input": 0.40, "output": 1.60}, "gpt-4o": {"input": 2.50, "output": 10.00}}
# Shared by every worker through the store, a little under the provider's own limits so 429s stay rare:
# the simulator `make demo` starts allows 200,000 tokens and 1,200 requests a minute.
LIMITS = {"sim-1": RateLimit(tpm=180_000, rpm=1_080), "gpt-4o-mini": RateLimit(tpm=180_000, rpm=450)}


def provider() -> Any:
    """Chat from the OpenAI-compatible endpoint in the environment, embeddings from the local model."""
    from conveyor.providers.composite import CompositeProvider
    from conveyor.providers.local_embeddings import LocalEmbeddings
    from conveyor.providers.openai_provider import OpenAIProvider

    prices = os.environ.get("CONVEYOR_PRICES") or PRICES
    chat = OpenAIProvider(os.environ.get("OPENAI_BASE_URL") or None, os.environ.get("OPENAI_API_KEY") or None,
                          prices=prices, timeout=CHAT_TIMEOUT)
    return CompositeProvider(chat=chat, embed=LocalEmbeddings(EMBED_MODEL))


pipe = Pipeline("manuals", retry=Retry(max_attempts=3, base=0.5, cap=10), provider=provider, limits=LIMITS)


@pipe.stage(version="2", max_input_bytes=20_000_000, timeout=30, config={"body_chars": BODY_CHARS})
def parse(ctx, source: bytes) -> dict:
    try:
        return parse_manpage(decode_source(source), body_chars=BODY_CHARS)
    except ManPageError as exc:
        raise TerminalError(str(exc), error_class="not_a_manpage") from None


@pipe.stage(after=parse, version="2", config={"model": MODEL, "prompt_version": PROMPT_VERSION,
                                              "max_tokens": MAX_TOKENS},
            retry=Retry(max_attempts=6, base=0.5, cap=10,
                        max_attempts_by_class={"rate_limited": 20, "bad_model_output": 2}))
async def extract(ctx, page: dict) -> dict:
    if page.get("redirect"):
        return {"alias_of": page["redirect"]}
    if not page["names"] or not page["description"]:
        raise TerminalError("no NAME line with a description", error_class="unparseable")
    answer = await ctx.chat(messages(page), model=MODEL, max_tokens=MAX_TOKENS, json_mode=True,
                            prompt_version=PROMPT_VERSION, timeout=CHAT_TIMEOUT)
    record = model_record(answer.data)  # BadModelOutput: retried once, then dead-lettered
    return {
        "title": page["title"], "section": page["section"], "names": page["names"],
        "description": page["description"], "summary": record.summary, "keywords": record.keywords,
        "model": answer.model,
    }


_catalogue: list[sqlite3.Connection] = []
MANPAGE_COLUMNS = {"source": "TEXT", "title": "TEXT", "section": "TEXT", "names": "TEXT", "description": "TEXT",
                   "alias_of": "TEXT", "summary": "TEXT", "keywords": "TEXT", "model": "TEXT",
                   "deliveries": "INTEGER DEFAULT 1"}


def catalogue() -> sqlite3.Connection:
    """One connection per worker process to the stand-in external system."""
    if not _catalogue:
        CATALOGUE.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(CATALOGUE, timeout=60, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("BEGIN IMMEDIATE")  # workers start together: one of them creates or upgrades the tables
        try:
            columns = ", ".join(f"{name} {kind}" for name, kind in MANPAGE_COLUMNS.items())
            db.execute(f"CREATE TABLE IF NOT EXISTS manpages (idempotency_key TEXT PRIMARY KEY, {columns})")
            present = {row[1] for row in db.execute("PRAGMA table_info(manpages)")}
            for name, kind in MANPAGE_COLUMNS.items():  # a catalogue from an earlier demo gains the new columns
                if name not in present:
                    db.execute(f"ALTER TABLE manpages ADD COLUMN {name} {kind}")
            db.execute(
                "CREATE TABLE IF NOT EXISTS chunks (idempotency_key TEXT PRIMARY KEY, source TEXT, chunk INTEGER,"
                " chars INTEGER, snippet TEXT, model TEXT, vector_f16 TEXT, deliveries INTEGER DEFAULT 1)"
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.isolation_level = ""  # `with db:` below: one transaction per delivery
        _catalogue.append(db)
    return _catalogue[0]


@pipe.stage(after=extract, kind="publish", version="2")
def publish(ctx, record: dict) -> None:
    with catalogue() as db:
        # The external system honours the key: a redelivery is counted, never applied twice.
        db.execute(
            "INSERT INTO manpages (idempotency_key, source, title, section, names, description, alias_of, summary,"
            " keywords, model) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (idempotency_key) DO UPDATE SET deliveries = deliveries + 1",
            (ctx.idempotency_key, ctx.item_key, record.get("title"), record.get("section"),
             " ".join(record.get("names", [])), record.get("description"), record.get("alias_of"),
             record.get("summary"), " ".join(record.get("keywords", [])), record.get("model")),
        )


@pipe.stage(after=parse, kind="fanout", version="1", config={"chars": CHUNK_CHARS, "max_chunks": MAX_CHUNKS})
def chunk(ctx, page: dict) -> list[dict]:
    if page.get("redirect") or not page["names"] or not page["description"]:
        return []  # an alias, or a page the catalogue will not take: nothing to embed
    return [{"n": n, "text": text} for n, text in enumerate(split_text(page.get("body", ""), CHUNK_CHARS, MAX_CHUNKS))]


@pipe.stage(after=chunk, version="1", concurrency=4, config={"model": EMBED_MODEL})
async def embed(ctx, piece: dict) -> dict:
    out = await ctx.embed([piece["text"]], model=EMBED_MODEL)
    vector = out.vectors[0]
    if len(vector) != 384:
        raise TerminalError(f"expected a 384-d vector from {EMBED_MODEL}, got {len(vector)}", error_class="bad_vector")
    return {"n": piece["n"], "chars": len(piece["text"]), "snippet": " ".join(piece["text"][:160].split()),
            "model": out.model, "vector_f16": pack_vector(vector)}


@pipe.stage(after=embed, kind="publish", version="1")
def index(ctx, emb: dict) -> None:
    with catalogue() as db:
        db.execute(
            "INSERT INTO chunks (idempotency_key, source, chunk, chars, snippet, model, vector_f16)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (idempotency_key) DO UPDATE SET deliveries = deliveries + 1",
            (ctx.idempotency_key, ctx.item_key, emb["n"], emb["chars"], emb["snippet"], emb["model"],
             emb["vector_f16"]),
        )
