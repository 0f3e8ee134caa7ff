"""Deterministic content and token counts for the provider simulator.

Token counting is an approximation, the same on every machine:

- a text costs ``ceil(len(text) / 4)`` tokens (at least 1 for a non-empty text);
- a chat prompt costs, per message, the tokens of its content plus
  ``MESSAGE_OVERHEAD`` (4), plus ``REPLY_OVERHEAD`` (3) once for the reply;
- a completion costs the tokens of the content it returns;
- an embedding input costs the sum of its texts' tokens.

Content is a pure function of the prompt and the model (never of the simulator's
seed), so the same prompt always gets the same answer.

The record prompt (a system message that asks for ``"names"`` and ``"confidence"``,
as the man-page demo's does) is answered with a JSON record, in JSON mode or not
(a model asked for JSON in its prompt answers JSON): ``names`` taken from the
user message's ``NAME: a, b - text`` line, ``summary``, ``keywords`` and
``confidence``. Per prompt, a seeded share of answers (``SKILLS``: 15% for
``sim-1`` and any other model, 12% for the stronger ``sim-2``) is less sure
than 0.7, and a smaller one (3%, 1%) adds a plausible name the page does not
hold (``lsctl`` for ``ls``): what an acceptance boundary's checks and
escalation are for.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import random
import re
import struct
from dataclasses import dataclass
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
    """The deterministic JSON answer: the record when the prompt asks for one, else title, summary and
    word count of the prompt."""
    if asks_for_record(messages):
        return record_object(model, messages)
    rng = _seeded("json", _prompt_key(model, messages))
    summary = " ".join(_sentence(rng, rng.randint(8, 16)) for _ in range(rng.randint(1, 3)))
    return {"title": _title(messages), "summary": summary, "words": len(_user_text(messages).split())}


def completion_json(model: str, messages: list[dict[str, Any]]) -> str:
    """The JSON answer as the completion content."""
    return json.dumps(completion_object(model, messages))


# --- the record prompt ------------------------------------------------------------------------------------

RECORD_FIELDS = ('"names"', '"confidence"')
LOW_CONFIDENCE = 0.7  # an answer "less sure" is below this
_NAME_LINE = re.compile(r"^NAME:[ \t]*(?P<names>.*?)(?:[ \t]+-[ \t]+(?P<text>.*?))?[ \t]*$", re.M)
_STOP_WORDS = "a an and are as at be by for from in into is it its of on or that the this to with"
_STOP = frozenset(_STOP_WORDS.split())


@dataclass(frozen=True)
class Skill:
    """How a model answers the record prompt: the share of answers less sure than ``LOW_CONFIDENCE``, the
    share that adds a name the page does not hold, and the least confidence of its sure answers."""

    low_share: float
    wrong_share: float
    sure_from: float


DEFAULT_SKILL = Skill(low_share=0.15, wrong_share=0.03, sure_from=0.72)
SKILLS = {"sim-2": Skill(low_share=0.12, wrong_share=0.01, sure_from=0.82)}


def asks_for_record(messages: list[dict[str, Any]]) -> bool:
    """Whether the system prompt asks for the record (its fields ``"names"`` and ``"confidence"``)."""
    system = " ".join(message_text(m) for m in messages if m.get("role") == "system")
    return all(name in system for name in RECORD_FIELDS)


def name_line(messages: list[dict[str, Any]]) -> tuple[list[str], str]:
    """The names and the text of the last ``NAME: a, b - text`` line of the user messages."""
    found = list(_NAME_LINE.finditer(_user_text_lines(messages)))
    if not found:
        return [], ""
    last = found[-1]
    names = [n.strip() for n in last.group("names").split(",") if n.strip()]
    return names, (last.group("text") or "").strip()


def record_object(model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The deterministic answer to the record prompt: names, summary, keywords, confidence."""
    rng = _seeded("record", _prompt_key(model, messages))
    skill = SKILLS.get(model, DEFAULT_SKILL)
    low, wrong = rng.random() < skill.low_share, rng.random() < skill.wrong_share
    names, text = name_line(messages)
    names = names or [_title(messages).split()[0].lower()]
    if wrong:
        names = [*names, _wrong_name(names[0], f"{', '.join(names)} - {text}", rng)]
    confidence = rng.uniform(0.3, LOW_CONFIDENCE - 0.01) if low else rng.uniform(skill.sure_from, 0.99)
    lead = f"{text[:1].upper()}{text[1:]}." if text else ""
    summary = " ".join(s for s in (lead, _sentence(rng, rng.randint(6, 12))) if s)
    words = [w for w in re.findall(r"[a-z][a-z0-9+-]{2,}", text.lower()) if w not in _STOP]
    keywords = list(dict.fromkeys([names[0].lower(), *words[:5], rng.choice(_VOCABULARY)]))
    return {"names": names, "summary": summary, "keywords": keywords, "confidence": round(confidence, 2)}


def _wrong_name(name: str, line: str, rng: random.Random) -> str:
    """A plausible name (same family, or a suffix) that the NAME line does not hold."""
    candidates = [f"{name}ctl", f"{name}2", f"{name}-ng", f"{name}d", f"lib{name}", f"x{name}"]
    rng.shuffle(candidates)
    held = line.casefold()
    return next((c for c in candidates if c.casefold() not in held), f"{name}-{rng.randint(100, 999)}")


def _user_text_lines(messages: list[dict[str, Any]]) -> str:
    return "\n".join(message_text(m) for m in messages if m.get("role", "user") == "user")


def truncate_json(content: str) -> str:
    """Cut a JSON text mid-way: a proper prefix of an object is never valid JSON."""
    return content[: max(1, len(content) // 2)]


def malformed_json(model: str, messages: list[dict[str, Any]]) -> str:
    """A chatty answer that is not JSON at all."""
    obj = completion_object(model, messages)
    if asks_for_record(messages):
        return (f"Sure! Here is the record you asked for:\n\nnames: {', '.join(obj['names'])}\n"
                f"summary: {obj['summary']}\n")
    return f"Sure! Here is the summary you asked for:\n\ntitle: {obj['title']}\nsummary: {obj['summary']}\n"


def fenced_json(content: str) -> str:
    """A JSON object in a ```json code fence with a trailing comma: broken only in its format, so
    the acceptance boundary's repair gives back the very object."""
    body = content.rstrip()
    if body.endswith("}"):
        body = body[:-1].rstrip() + ",\n}"
    return f"```json\n{body}\n```"


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
