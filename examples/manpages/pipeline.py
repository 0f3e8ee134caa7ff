"""The demo pipeline: the system's manual pages, parsed, embedded, described by a model behind an acceptance
boundary, and published by version into conveyor's built-in target.

    conveyor provider-sim --tpm 200000 --rpm 1200 --fenced-rate 0.02 &   # or a real endpoint: OPENAI_BASE_URL
    OPENAI_BASE_URL=http://127.0.0.1:8765/v1 MANPAGES_MODEL=sim-1 MANPAGES_STRONG_MODEL=sim-2 \\
        conveyor run examples/manpages/pipeline.py:pipe --input /usr/share/man --workers 2

parse    roff source (gzip or plain) → title, section, NAME line, running text; a guarded child process with a
         timeout, so a page that hangs the parser is an ordinary failure. A page that is not a manual fails as
         `not_a_manpage`, one without a NAME line with a description as `unparseable`: never embedded, never
         sent to a model, never paid for
chunk    the page's text in chunks of about 1,000 characters (at most 3): a fan-out, each chunk an item
embed    one chunk through the local all-MiniLM-L6-v2 model on the CPU (a 384-d unit vector, carried as float16)
vectors  a gather: the page's chunk vectors back in chunk order
extract  (after parse, beside the chunks) a chat call asking for a JSON record {"names", "summary", "keywords",
         "confidence"}, behind the acceptance boundary: a format fault (a code fence, a trailing comma) is repaired
         and the attempt says so; a wrong shape (a cut-off or chatty answer) is `invalid_format`, retried; names the
         page's NAME line does not hold are `invalid_content`; confidence under 0.7 is `low_confidence`. Refused
         answers are tried once more with the stronger model (MANPAGES_STRONG_MODEL); low-confidence answers still
         refused there wait for review (48 h, then rejected); others fail with their class
publish  a join of extract and vectors: the accepted record, its full-text entry and its chunk vectors (with the
         name of the model that made them) into the built-in target's collection "manuals", in one transaction,
         as a new version of the page's publication: `conveyor search --semantic "QUERY"` finds pages by meaning
sections a group: once per manual section, after every page of the run settled at extract, an overview of the
         section from its pages' summaries (one chat call), published into the collection "sections"

The call uses the provider's JSON mode: behind an acceptance boundary, an answer that is not strict JSON (fenced,
chatty, cut off) is handed to the boundary as it is (``ctx.chat`` returns it with ``data`` None), which repairs
what is broken only in its format and records that it did, or refuses it as `invalid_format`.

The prompt is a run parameter, `prompt_version` (enrich.PROMPTS; `--set prompt_version=manpage-record@3`, or
MANPAGES_PROMPT_VERSION at submission): recorded with the run, so its workers, resumes and replays use the run's
value, and part of the extract stage's task key, so a bump makes new tasks, new answers and, once accepted, new
versions of the publications, while parse and the embeddings are answered from the memo.

The provider: chat from any OpenAI-compatible endpoint (OPENAI_BASE_URL / OPENAI_API_KEY; MANPAGES_MODEL,
default gpt-4o-mini, escalating to MANPAGES_STRONG_MODEL, default gpt-4o), embeddings from the local model,
made once per worker. The chat models' tokens per minute are fleet-wide budgets (``LIMITS``; CONVEYOR_LIMITS
overrides them).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from conveyor import Param, Pipeline, RateLimit, Retry, TerminalError
from conveyor.acceptance import Accept, Answer, Record, Review, found_in

sys.path.insert(0, str(Path(__file__).parent))
from enrich import (
    DEFAULT_PROMPT,
    ManualRecord,
    messages,
    name_line,
    pack_vector,
    prompt_version,
    search_text,
    split_text,
    unpack_vector,
)
from roff import ManPageError, decode_source, parse_manpage

MODEL = os.environ.get("MANPAGES_MODEL", "gpt-4o-mini")
STRONG_MODEL = os.environ.get("MANPAGES_STRONG_MODEL", "gpt-4o")
EMBED_MODEL = "all-MiniLM-L6-v2"
MAX_TOKENS = 300  # the record is a sentence or two, a few names and keywords
CHAT_TIMEOUT = 10.0  # seconds: a hung request becomes an ordinary `timeout` and is retried
THRESHOLD = 0.7  # the least confidence accepted without review
CHUNK_CHARS, MAX_CHUNKS = 1_000, 3
BODY_CHARS = CHUNK_CHARS * MAX_CHUNKS
# USD per 1M tokens; the simulator's sim-1 is priced like gpt-4o-mini and sim-2 like gpt-4o, so the demo shows
# what escalation costs.
PRICES = {"sim-1": {"input": 0.15, "output": 0.60}, "sim-2": {"input": 2.50, "output": 10.00},
          "gpt-4o-mini": {"input": 0.15, "output": 0.60}, "gpt-4.1-mini": {"input": 0.40, "output": 1.60},
          "gpt-4o": {"input": 2.50, "output": 10.00}, "sim-embed": {"input": 0.02, "output": 0.0}}
# Shared by every worker through the store, a little under the provider's own limits so 429s stay rare: the
# simulator `make demo` starts allows 200,000 tokens and 1,200 requests a minute for both models together; the
# escalations (about one answer in six) get a share large enough that they do not trail the run.
LIMITS = {"sim-1": RateLimit(tpm=160_000, rpm=960), "sim-2": RateLimit(tpm=38_000, rpm=220),
          "gpt-4o-mini": RateLimit(tpm=180_000, rpm=450), "gpt-4o": RateLimit(tpm=27_000, rpm=45)}


class EmbedRouter:
    """Embeddings from the local model (EMBED_MODEL), or, for any other model, from the chat endpoint (the
    simulator's embeddings are 384-d too): how a pipeline switches its embedding model."""

    name = "embed-router"

    def __init__(self, local: Any, remote: Any) -> None:
        self.local, self.remote = local, remote

    async def embed(self, texts: list[str], *, model: str = EMBED_MODEL, **options: Any) -> Any:
        provider = self.local if model == EMBED_MODEL else self.remote
        return await provider.embed(texts, model=model, **options)

    async def aclose(self) -> None:
        await self.local.aclose()


def provider() -> Any:
    """Chat from the OpenAI-compatible endpoint in the environment, embeddings from the local model (or the
    endpoint's, when the run's ``embed_model`` names another)."""
    from conveyor.providers.composite import CompositeProvider
    from conveyor.providers.local_embeddings import LocalEmbeddings
    from conveyor.providers.openai_provider import OpenAIProvider

    prices = os.environ.get("CONVEYOR_PRICES") or PRICES
    chat = OpenAIProvider(os.environ.get("OPENAI_BASE_URL") or None, os.environ.get("OPENAI_API_KEY") or None,
                          prices=prices, timeout=CHAT_TIMEOUT)
    return CompositeProvider(chat=chat, embed=EmbedRouter(LocalEmbeddings(EMBED_MODEL), chat))


pipe = Pipeline("manuals", retry=Retry(max_attempts=3, base=0.5, cap=10), provider=provider, limits=LIMITS,
                params={"prompt_version": Param(DEFAULT_PROMPT, env="MANPAGES_PROMPT_VERSION",
                                                help="the extract prompt (enrich.PROMPTS)"),
                        "embed_model": Param(EMBED_MODEL, help="the embedding model (the local one, or one of the "
                                                               "chat endpoint's, such as the simulator's sim-embed)")})


@pipe.stage(version="3", max_input_bytes=20_000_000, timeout=30, config={"body_chars": BODY_CHARS})
def parse(ctx, source: bytes) -> dict:
    try:
        page = parse_manpage(decode_source(source), body_chars=BODY_CHARS)
    except ManPageError as exc:
        raise TerminalError(str(exc), error_class="not_a_manpage") from None
    if not page.get("redirect") and not page["description"]:
        raise TerminalError("no NAME line with a description", error_class="unparseable")
    return page


@pipe.stage(after=parse, kind="fanout", version="1", config={"chars": CHUNK_CHARS, "max_chunks": MAX_CHUNKS})
def chunk(ctx, page: dict) -> list[str]:
    return split_text(page.get("body", ""), CHUNK_CHARS, MAX_CHUNKS)


@pipe.stage(after=chunk, version="3", concurrency=4, params=["embed_model"])
async def embed(ctx, text: str) -> str:
    model = ctx.params["embed_model"]  # the run's: a new model makes new embed tasks, and no chat call
    vectors = (await ctx.embed([text], model=model)).vectors
    if len(vectors) != 1 or len(vectors[0]) != 384:
        raise TerminalError(f"expected one 384-d vector from {model}", error_class="bad_vector")
    return pack_vector(vectors[0])


@pipe.stage(after=embed, kind="gather", version="1")
def vectors(ctx, packed: list[str]) -> list[str]:
    return packed


def the_name_line(page: dict) -> str:
    """What the names in an answer must appear in: the page's NAME line (an alias: the page it points to)."""
    return page["redirect"] if page.get("redirect") else name_line(page)


@pipe.stage(after=parse, version="4", params=["prompt_version"],
            config={"model": MODEL, "max_tokens": MAX_TOKENS},
            retry=Retry(max_attempts=6, base=0.5, cap=10,
                        max_attempts_by_class={"rate_limited": 20, "invalid_format": 3}),
            accept=Accept(schema=ManualRecord, repair=True, checks=[found_in("names", the_name_line)],
                          confidence="confidence", threshold=THRESHOLD, escalate=[{"model": STRONG_MODEL}],
                          review=Review(deadline="48h", on_deadline="reject")))
async def extract(ctx, page: dict) -> Answer:
    known = {"title": page["title"], "section": page["section"], "description": page["description"]}
    if page.get("redirect"):  # an alias page (`.so man1/gzip.1`): a record by rule, no model call
        target = page["redirect"]
        name = Path(target).name.split(".")[0]
        text = ManualRecord(names=[name], summary=f"An alias of {target}.", confidence=1.0).model_dump_json()
        return Answer(text, known={**known, "alias_of": target})
    version = prompt_version(ctx.params["prompt_version"])  # the run's, as it recorded it
    answer = await ctx.chat(messages(page, version), model=ctx.config["model"], max_tokens=MAX_TOKENS,
                            json_mode=True, prompt_version=version, timeout=CHAT_TIMEOUT)
    return Answer(answer.text, known={**known, "model": answer.model})


@pipe.stage(after=[extract, vectors], kind="publish", into="manuals", version="5", params=["embed_model"])
def publish(ctx, record: dict, packed: list[str]) -> Record:
    """A join: the accepted record and the page's chunk vectors, each made by its own branch (a new embedding
    model runs embed and publish again, and no chat call). The record names the model that made its vectors, so
    `conveyor search --semantic` embeds a query with the same one."""
    return Record(fields=record, text=search_text(record), vectors=[unpack_vector(v) for v in packed],
                  embedding_model=ctx.params["embed_model"])


SECTION_PROMPT = ("Write a two-sentence overview of one section of the Unix manual for someone new to it, from the "
                  "one-line summaries of its pages below.")
SECTION_PAGES = 200  # summaries in a section's prompt (the first, by key: a section's prompt stays small)


def section_of(record: dict) -> str:
    """A page's manual section (1, 5, 8, ...): the group its record belongs to."""
    return str(record["section"])


@pipe.stage(after=extract, kind="group", by=section_of, version="1",
            config={"model": MODEL, "max_tokens": 200, "pages": SECTION_PAGES})
async def sections(ctx, section: str, pages) -> dict:
    """A group: once per manual section of the run, after every page settled at extract, an overview of the
    section from its pages' summaries. Its key hashes the (page, record) pairs of its members, so a run in which
    one page changed asks again for that page's section only."""
    lines, names = [], []
    for _, record in pages:
        names.append(record["names"][0])
        if len(lines) < SECTION_PAGES:
            lines.append(f"{record['names'][0]}: {record['summary']}")
    answer = await ctx.chat([{"role": "system", "content": SECTION_PROMPT},
                             {"role": "user", "content": f"Section {section}:\n" + "\n".join(lines)}],
                            model=ctx.config["model"], max_tokens=ctx.config["max_tokens"], timeout=CHAT_TIMEOUT)
    return {"section": section, "pages": len(names), "names": sorted(names), "overview": answer.text.strip()}


@pipe.stage(after=sections, kind="publish", into="sections", version="1")
def publish_section(ctx, overview: dict) -> Record:
    return Record(fields=overview, text=f"section {overview['section']} {overview['overview']}")
