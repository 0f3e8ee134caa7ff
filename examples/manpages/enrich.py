"""The model-facing half of the demo pipeline, kept free of I/O so it can be tested alone.

- ``PROMPTS`` / ``messages``: the prompt, by version, that asks a chat model for a JSON record of one
  manual page (names, summary, keywords, confidence); ``prompt_version`` picks one (MANPAGES_PROMPT_VERSION);
- ``ManualRecord``: the record's shape, which the stage's acceptance boundary checks the answer against;
- ``name_line``: a page's NAME line (``ls, dir - list directory contents``), what the names it returns are
  checked against;
- ``split_text``: a page's running text in chunks of about ``size`` characters, at most ``limit``;
- ``pack_vector`` / ``unpack_vector``: an embedding as float16 bytes in base64 (768 bytes for MiniLM's 384).
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from conveyor import TerminalError

PROMPT_BODY_CHARS = 1_500  # of the page's text sent to the model with its NAME line
_RECORD = ('{"names": ["<the commands, functions or files the page documents, as its NAME line gives them>"], '
           '"summary": "<what it is for, in at most %d words>", "keywords": ["<up to 8 lowercase search keywords>"], '
           '"confidence": <how sure you are of this record, from 0 to 1>}')
# A bumped version is a changed prompt, so its answers change too (and its tasks are new: the version is part of
# the stage's config, hence of every task key).
PROMPTS = {
    "manpage-record@2": "You index Unix manual pages for a searchable catalogue. Answer with one JSON object and "
                        "nothing else: " + _RECORD % 40,
    "manpage-record@3": "You index Unix manual pages for a searchable catalogue read by newcomers to Unix. Answer "
                        "with one JSON object and nothing else: " + _RECORD % 25,
}
DEFAULT_PROMPT = "manpage-record@2"


def prompt_version(wanted: str | None) -> str:
    """The prompt version asked for (None or empty: the default); an unknown one is a one-line error."""
    version = wanted or DEFAULT_PROMPT
    if version not in PROMPTS:
        raise TerminalError(f"prompt_version={version!r} is not a prompt of this pipeline; use one of: "
                            f"{', '.join(PROMPTS)}", error_class="unknown_prompt")
    return version


class ManualRecord(BaseModel):
    """What the model must return (names, summary, keywords, confidence). The fields the pipeline knows by
    rule (title, section, description, the model that answered, the chunk vectors) are declared too: they are
    merged over the answer, so the model never sets them, and an edit in review keeps them."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    names: list[str] = Field(min_length=1, max_length=200)
    summary: str = Field(min_length=1, max_length=1_000)
    keywords: list[str] = Field(default_factory=list, max_length=16)
    confidence: float = Field(ge=0.0, le=1.0)
    title: str | None = None
    section: str | None = None
    description: str | None = None
    alias_of: str | None = None
    model: str | None = None
    vectors: list[str] = Field(default_factory=list)  # float16 in base64 (pack_vector), one per chunk

    @field_validator("keywords")
    @classmethod
    def _normalised(cls, keywords: list[str]) -> list[str]:
        return list(dict.fromkeys(k.strip().lower() for k in keywords if k.strip()))[:8]


def name_line(page: dict[str, Any]) -> str:
    """The page's NAME line as its parser read it: ``ls, dir - list directory contents``."""
    return f"{', '.join(page['names'])} - {page['description']}"


def messages(page: dict[str, Any], version: str = DEFAULT_PROMPT) -> list[dict[str, str]]:
    """The chat messages for one parsed page: its title, its NAME line and the start of its text."""
    head = f"Manual page {page['title']}({page['section']})\nNAME: {name_line(page)}"
    body = (page.get("body") or "")[:PROMPT_BODY_CHARS]
    return [{"role": "system", "content": PROMPTS[version]}, {"role": "user", "content": f"{head}\n\n{body}".strip()}]


def search_text(record: dict[str, Any]) -> str:
    """The record's full-text entry: names, NAME-line description, summary and keywords."""
    parts = [*record.get("names", []), record.get("description") or "", record.get("summary") or "",
             *record.get("keywords", [])]
    return " ".join(p for p in parts if p)


def split_text(text: str, size: int = 1_000, limit: int = 4) -> list[str]:
    """At most ``limit`` chunks of about ``size`` characters, cut at a paragraph, line or word
    boundary when one lies in the second half of the window; nothing is dropped before the limit."""
    if size < 1 or limit < 1:
        raise ValueError("split_text(size=..., limit=...) must be >= 1")
    chunks: list[str] = []
    rest = text.strip()
    while rest and len(chunks) < limit:
        if len(rest) <= size:
            chunks.append(rest)
            break
        window, cut = rest[:size], size
        for boundary in ("\n\n", "\n", ". ", " "):
            at = window.rfind(boundary)
            if at >= size // 2:
                cut = at + (1 if boundary == ". " else 0)
                break
        chunks.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    return [c for c in chunks if c]


def pack_vector(vector: list[float]) -> str:
    """A vector as little-endian float16 in base64 (half the size of float32, plenty for cosine search)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}e", *vector)).decode("ascii")


def unpack_vector(packed: str | bytes) -> list[float]:
    raw = base64.b64decode(packed)
    return list(struct.unpack(f"<{len(raw) // 2}e", raw))
