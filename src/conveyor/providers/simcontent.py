"""Deterministic content and token counts for the provider simulator.

Token counting is an approximation, the same on every machine:

- a text costs ``ceil(len(text) / 4)`` tokens (at least 1 for a non-empty text);
- a chat prompt costs, per message, the tokens of its content plus
  ``MESSAGE_OVERHEAD`` (4), plus ``REPLY_OVERHEAD`` (3) once for the reply;
- a completion costs the tokens of the content it returns;
- an embedding input costs the sum of its texts' tokens.

Content is a pure function of the prompt (never of the simulator's seed), so
the same prompt always gets the same answer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import random
import re
import struct
from typing import Any

from conveyor.providers.estimate import message_text, text_tokens

_WORDS = (
    "the pipeline stage item batch model token quota worker queue lease retry manual chunk summary "
    "document invoice record provider limit window minute request answer result output input store "
    "blob hash key version config review accept publish durable idempotent stable careful steady "
    "quick small large every each one many first last next before after while until across through"
)
_VOCABULARY = tuple(_WORDS.split())


def _seeded(*parts: str) -> random.Random:
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:16], "big"))


def _prompt_key(model: str, messages: list[dict[str, Any]]) -> str:
    return json.dumps([model, [[m.get("role", ""), message_text(m)] for m in messages]])


def _sentence(rng: random.Random, words: int) -> str:
    body = " ".join(rng.choice(_VOCABULARY) for _ in range(words))
    return body[:1].upper() + body[1:] + "."


def completion_text(model: str, messages: list[dict[str, Any]]) -> str:
    """A deterministic plain-text answer of 20 to 99 words."""
    rng = _seeded("text", _prompt_key(model, messages))
    total = rng.randint(20, 99)
    sentences = []
    while total > 0:
        n = min(total, rng.randint(6, 14))
        sentences.append(_sentence(rng, n))
        total -= n
    return " ".join(sentences)


def _user_text(messages: list[dict[str, Any]]) -> str:
    return " ".join(message_text(m) for m in messages if m.get("role", "user") == "user")


def _title(messages: list[dict[str, Any]]) -> str:
    users = [message_text(m) for m in messages if m.get("role", "user") == "user"]
    words = re.findall(r"\w+", users[-1] if users else "")[:6]
    return " ".join(words).title() or "Untitled"


def completion_object(model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The deterministic JSON-mode answer: title, summary and word count of the prompt."""
    rng = _seeded("json", _prompt_key(model, messages))
    summary = " ".join(_sentence(rng, rng.randint(8, 16)) for _ in range(rng.randint(1, 3)))
    return {"title": _title(messages), "summary": summary, "words": len(_user_text(messages).split())}


def completion_json(model: str, messages: list[dict[str, Any]]) -> str:
    """The JSON-mode answer as the completion content."""
    return json.dumps(completion_object(model, messages))


def truncate_json(content: str) -> str:
    """Cut a JSON text mid-way: a proper prefix of an object is never valid JSON."""
    return content[: max(1, len(content) // 2)]


def malformed_json(model: str, messages: list[dict[str, Any]]) -> str:
    """A chatty answer that is not JSON at all."""
    obj = completion_object(model, messages)
    return f"Sure! Here is the summary you asked for:\n\ntitle: {obj['title']}\nsummary: {obj['summary']}\n"


def limit_tokens(content: str, max_tokens: int) -> tuple[str, bool]:
    """Cut content to at most max_tokens tokens; the flag says whether it was cut."""
    if text_tokens(content) <= max_tokens:
        return content, False
    return content[: max_tokens * 4], True


def embedding(text: str, dim: int) -> list[float]:
    """A deterministic unit vector of dimension dim derived from a hash of the text."""
    rng = _seeded("embed", text)
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def encode_base64(vec: list[float]) -> str:
    """Little-endian float32 bytes in base64, as the OpenAI API sends them."""
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")
