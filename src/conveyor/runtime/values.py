"""How stage inputs and outputs are encoded, digested and stored.

A value is stored as (kind, bytes): ``bytes`` as they are, ``json`` as
canonical JSON (sorted keys), ``none`` as nothing, and a fan-out output as a
``fanout`` list of element references. Its digest is the sha256 of those
bytes, so a blob's name and a value's digest are the same thing. Small values
live inline in the database; larger ones in the blob store.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import orjson

from conveyor.blobs import Blobs
from conveyor.errors import TerminalError

INLINE_MAX = 8 * 1024
_JSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


class Ref(NamedTuple):
    """A stored value: its kind, digest, size, and its bytes when inline (a NamedTuple: one is made
    per task of every run, and a tuple is made several times faster than a frozen dataclass)."""

    kind: str
    digest: str
    size: int
    inline: bytes | None


def encode(value: Any) -> tuple[str, bytes]:
    if value is None:
        return "none", b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes", bytes(value)
    try:
        return "json", orjson.dumps(value, default=_default, option=_JSON_OPTIONS)
    except TypeError as exc:
        raise TerminalError(
            f"stage output is not JSON-serialisable ({exc}); return dicts, lists, str, numbers or bytes",
            error_class="unserializable_output",
        ) from None


def decode(kind: str, data: bytes) -> Any:
    if kind == "bytes":
        return data
    if kind == "none":
        return None
    return orjson.loads(data)


def store_value(kind: str, data: bytes, blobs: Blobs) -> Ref:
    digest = hashlib.sha256(data).hexdigest()
    if len(data) <= INLINE_MAX:
        return Ref(kind, digest, len(data), data)
    blobs.put(data)
    return Ref(kind, digest, len(data), None)


def load_value(ref: Ref, blobs: Blobs) -> Any:
    data = ref.inline if ref.inline is not None else blobs.get(ref.digest)
    return decode(ref.kind, data)


def fanout_refs(elements: Any, blobs: Blobs) -> tuple[list[Ref], bytes]:
    """Store each element; return their refs and the encoded list of refs."""
    if not isinstance(elements, (list, tuple)):
        raise TerminalError(
            f"a fanout stage must return a list, not {type(elements).__name__}", error_class="bad_fanout_output"
        )
    refs = [store_value(*encode(e), blobs) for e in elements]
    return refs, orjson.dumps([_ref_json(r) for r in refs])


def parse_fanout(data: bytes) -> list[Ref]:
    return [Ref(r["k"], r["d"], r["n"], _inline(r)) for r in orjson.loads(data)]


def failure_memo(error_class: str, message: str) -> Ref:
    """A settled failure stored in the memo like an output, so a re-run does not pay for it again."""
    data = orjson.dumps({"error_class": error_class, "message": message})
    return Ref("failed", hashlib.sha256(data).hexdigest(), len(data), data)


def parse_failure_memo(data: bytes) -> tuple[str, str]:
    raw = orjson.loads(data)
    return raw["error_class"], raw["message"]


def _ref_json(ref: Ref) -> dict[str, Any]:
    out: dict[str, Any] = {"k": ref.kind, "d": ref.digest, "n": ref.size}
    if ref.inline is not None:
        out["v"] = ref.inline.hex()
    return out


def _inline(raw: dict[str, Any]) -> bytes | None:
    return bytes.fromhex(raw["v"]) if "v" in raw else None


def _default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")
