"""What a request will cost before it is sent: the estimate a quota reservation holds.

The count is the one providers use for their own rate limiting (and the
simulator uses exactly): about four characters a token, four tokens of
overhead per message and three for the reply, plus every token the answer
may use (``max_tokens``). After the answer, the reservation is settled to
the usage the provider reports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

MESSAGE_OVERHEAD = 4
REPLY_OVERHEAD = 3


def text_tokens(text: str) -> int:
    """The approximate token count of a text: ceil(len/4)."""
    return math.ceil(len(text) / 4)


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message; list content keeps its text parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def prompt_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """The approximate prompt token count of a list of chat messages."""
    return sum(text_tokens(message_text(m)) + MESSAGE_OVERHEAD for m in messages) + REPLY_OVERHEAD


def chat_tokens(messages: Sequence[Mapping[str, Any]], max_tokens: int) -> int:
    """Prompt tokens (estimated) + ``max_tokens``::

        chat_tokens([{"role": "user", "content": "x" * 400}], max_tokens=256)  # 100 + 4 + 3 + 256
    """
    return prompt_tokens(messages) + max(0, int(max_tokens))


def embed_tokens(texts: Sequence[str] | str) -> int:
    """The tokens of an embeddings request's inputs."""
    items = [texts] if isinstance(texts, str) else texts
    return sum(text_tokens(t) for t in items)
