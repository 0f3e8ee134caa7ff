"""The model-facing half of the demo pipeline, kept free of I/O so it can be tested alone.

- ``messages``: the JSON-mode prompt that asks a chat model for a short record of one manual page;
- ``model_record``: the model's answer checked against ``ModelRecord`` (``BadModelOutput`` when its
  shape is wrong: the answer is never published);
- ``split_text``: a page's running text in chunks of about ``size`` characters, at most ``limit``;
- ``pack_vector`` / ``unpack_vector``: an embedding as float16 bytes in base64 (768 bytes for MiniLM's 384).
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

PROMPT_VERSION = "manpage-record@1"
PROMPT_BODY_CHARS = 1_500  # of the page's text sent to the model with its NAME line
SYSTEM = (
    "You index Unix manual pages for a searchable catalogue. Answer with one JSON object and nothing else: "
    '{"summary": "<what the command, function or file is for, in at most 40 words>", '
    '"keywords": ["<up to 8 lowercase search keywords>"]}'
)


class BadModelOutput(Exception):
    """The model answered valid JSON of the wrong shape; retried once (another sample), then dead-lettered."""

    error_class = "bad_model_output"
    retryable = True


class ModelRecord(BaseModel):
    """What the model must return; other keys are ignored."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    summary: str = Field(min_length=1, max_length=1_000)
    keywords: list[str] = Field(default_factory=list, max_length=16)


def messages(page: dict[str, Any]) -> list[dict[str, str]]:
    """The chat messages for one parsed page (title, section, NAME line and the start of its text)."""
    head = f"Manual page {page['title']}({page['section']}): {', '.join(page['names'])} - {page['description']}"
    body = (page.get("body") or "")[:PROMPT_BODY_CHARS]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{head}\n\n{body}".strip()}]


def model_record(data: Any) -> ModelRecord:
    """The answer as a ``ModelRecord``, or ``BadModelOutput`` saying what is wrong with it."""
    if not isinstance(data, dict):
        raise BadModelOutput(f"expected a JSON object, got {type(data).__name__}")
    try:
        record = ModelRecord.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors()[:3])
        raise BadModelOutput(f"the model's JSON has the wrong shape: {problems}") from None
    record.keywords = list(dict.fromkeys(k.strip().lower() for k in record.keywords if k.strip()))[:8]
    return record


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
