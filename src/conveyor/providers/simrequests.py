"""Request parsing and response bodies of the provider simulator (chat and embeddings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.providers import estimate
from conveyor.providers import simcontent as content


@dataclass(slots=True)
class Record:
    """One line of the request log, filled in as the request is served."""

    time: float
    endpoint: str
    request_id: str
    model: str | None = None
    status: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    charged_tokens: int = 0
    retry_after: float | None = None
    fault: str | None = None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A well-formed chat completion request."""

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int
    json_mode: bool
    prompt_tokens: int
    structured: bool = False  # answered with JSON: JSON mode, or a prompt that asks for the record

    @property
    def json_answer(self) -> bool:
        return self.json_mode or self.structured


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """A well-formed embeddings request."""

    model: str
    texts: list[str]
    dim: int
    base64: bool
    prompt_tokens: int


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def parse_chat(body: dict[str, Any], default_max_tokens: int) -> ChatRequest | str:
    """The request, or the message of a 400."""
    model, messages = body.get("model"), body.get("messages")
    if not isinstance(model, str) or not model:
        return "you must provide a model parameter"
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return "'messages' must be a non-empty list of message objects"
    if body.get("stream"):
        return "streaming is not supported by the simulator"
    if body.get("n", 1) not in (1, None):
        return "only n=1 is supported by the simulator"
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
    if not _positive_int(max_tokens):
        return "'max_tokens' must be a positive integer"
    fmt = body.get("response_format") or {}
    if not isinstance(fmt, dict) or fmt.get("type", "text") not in ("text", "json_object", "json_schema"):
        return "'response_format' must be an object with type text, json_object or json_schema"
    json_mode = fmt.get("type") in ("json_object", "json_schema")
    return ChatRequest(model, messages, max_tokens, json_mode, estimate.prompt_tokens(messages),
                       content.asks_for_record(messages))


def _chat_content(chat: ChatRequest, rec: Record) -> tuple[str, str]:
    if not chat.json_answer:
        text, finish = content.completion_text(chat.model, chat.messages), "stop"
    elif rec.fault == "truncated":
        text = content.truncate_json(content.completion_json(chat.model, chat.messages))
        finish = "length"
    elif rec.fault == "malformed":
        text, finish = content.malformed_json(chat.model, chat.messages), "stop"
    elif rec.fault == "fenced":
        text, finish = content.fenced_json(content.completion_json(chat.model, chat.messages)), "stop"
    else:
        text, finish = content.completion_json(chat.model, chat.messages), "stop"
    text, cut = content.limit_tokens(text, chat.max_tokens)
    return text, "length" if cut else finish


def chat_payload(chat: ChatRequest, rec: Record, served_model: str, revision: str) -> dict[str, Any]:
    """The chat.completion body; sets rec.completion_tokens."""
    text, finish = _chat_content(chat, rec)
    rec.completion_tokens = estimate.text_tokens(text)
    return {
        "id": f"chatcmpl-{rec.request_id}",
        "object": "chat.completion",
        "created": int(rec.time),
        "model": served_model,
        "system_fingerprint": f"fp_sim_{revision}",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                     "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": rec.prompt_tokens, "completion_tokens": rec.completion_tokens,
                  "total_tokens": rec.prompt_tokens + rec.completion_tokens},
    }


def parse_embed(body: dict[str, Any], max_dim: int) -> EmbedRequest | str:
    """The request, or the message of a 400."""
    model, raw = body.get("model"), body.get("input")
    if not isinstance(model, str) or not model:
        return "you must provide a model parameter"
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        return "'input' must be a string or a non-empty list of strings (token arrays are not supported)"
    dim = body.get("dimensions") or max_dim
    if not _positive_int(dim) or dim > max_dim:
        return f"'dimensions' must be an integer between 1 and {max_dim}"
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        return "'encoding_format' must be float or base64"
    tokens = sum(estimate.text_tokens(t) for t in texts)
    return EmbedRequest(model, texts, dim, fmt == "base64", tokens)


def embed_payload(embed: EmbedRequest, rec: Record, served_model: str) -> dict[str, Any]:
    """The embeddings list body."""
    data = []
    for i, text in enumerate(embed.texts):
        vec = content.embedding(text, embed.dim)
        data.append({"object": "embedding", "index": i,
                     "embedding": content.encode_base64(vec) if embed.base64 else vec})
    return {"object": "list", "data": data, "model": served_model,
            "usage": {"prompt_tokens": rec.prompt_tokens, "total_tokens": rec.prompt_tokens}}

