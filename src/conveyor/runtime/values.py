"""How stage inputs and outputs are encoded, digested and stored.

A value is stored as (kind, bytes): ``bytes`` as they are, ``json`` as
canonical JSON (sorted keys), ``none`` as nothing, and a fan-out output as a
``fanout`` list of element references. Its digest is the sha256 of those
bytes, so a blob's name and a value's digest are the same thing. Small values
live inline in the database; larger ones in the blob store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from conveyor.errors import TerminalError

if TYPE_CHECKING:
    from conveyor.blobs import Blobs

INLINE_MAX = 8 * 1024
# The passthrough options hand datetimes, dataclasses and subclasses of str/int/dict/list to
# `_default`, which refuses what JSON would not give back as it was. UUIDs and Enum members
# cannot be handed over (orjson always writes them, as a string and as the member's value), and
# float NaN/Infinity are written as null: catching those needs a walk of every output, which the
# success path cannot afford, so they stay silent coercions.
_JSON_OPTIONS = (orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_PASSTHROUGH_DATETIME
                 | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS)
_ALLOWED = "return str, numbers, bool, None, lists, dicts with str keys, a pydantic model, or bytes as the whole output"
_MAX_DEPTH = 254  # orjson refuses deeper nesting (and a cycle reaches it)


class Ref(NamedTuple):
    """A stored value: its kind, digest, size, and its bytes when inline (a NamedTuple: one is made
    per task of every run, and a tuple is made several times faster than a frozen dataclass)."""

    kind: str
    digest: str
    size: int
    inline: bytes | None


def encode(value: Any, at: tuple[Any, ...] = ()) -> tuple[str, bytes]:
    """(kind, bytes) of a stage output; ``at`` is where the value sits in the stage's output.

    What JSON would not give back as it was (a datetime, a set, ``{1: "a"}``, a str subclass, any
    other object) is the stage's error, ``unserialisable_output``, never a silent coercion.
    """
    if value is None:
        return "none", b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes", bytes(value)
    try:
        return "json", orjson.dumps(value, default=_default, option=_JSON_OPTIONS)
    except TypeError as exc:  # orjson.JSONEncodeError; only now is the value walked to say where
        raise TerminalError(f"stage output is not JSON-like: {_refusal(value, at, exc)}; {_ALLOWED}",
                            error_class="unserialisable_output") from None


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
    refs = [store_value(*encode(e, (i,)), blobs) for i, e in enumerate(elements)]
    return refs, orjson.dumps([_ref_json(r) for r in refs])


def parse_fanout(data: bytes) -> list[Ref]:
    return [Ref(r["k"], r["d"], r["n"], _inline(r)) for r in orjson.loads(data)]


PARTS = "parts"  # the input of a join, a gather or a group: references to several stored values


class Parts(NamedTuple):
    """A ``parts`` input, loaded: the values in order, and (a gather's skipped children) the keys left out with
    their error classes."""

    values: list[Any]
    lost: list[tuple[str, str]]


def parts_ref(parts: Sequence[Ref], lost: Sequence[tuple[str, str]] = ()) -> tuple[str, bytes]:
    """(kind, bytes) of an input made of ``parts``: its digest hashes every part's kind and digest in order (and
    the keys left out), so it is the same whichever process builds it."""
    data = parts_bytes(parts)
    if lost:
        data = data[:-1] + b',"l":' + orjson.dumps([list(pair) for pair in lost]) + b"}"
    return PARTS, data


def parts_bytes(parts: Sequence[Ref]) -> bytes:
    """The bytes of a ``parts`` input that leaves no key out: ``{"p":[...]}``, each part as ``_ref_json`` makes it
    (orjson's compact JSON of the same dict, byte for byte; tests/test_values.py holds them equal). Formatted here
    rather than built as dicts and dumped: this runs once per join and gather of every run. A kind is one of this
    module's names and a digest is hex, so neither needs escaping."""
    return ('{"p":[' + ",".join([
        f'{{"k":"{r.kind}","d":"{r.digest}","n":{r.size}}}' if r.inline is None else
        f'{{"k":"{r.kind}","d":"{r.digest}","n":{r.size},"v":"{r.inline.hex()}"}}' for r in parts]) + "]}").encode()


def load_parts(data: bytes, blobs: Blobs) -> Parts:
    body = orjson.loads(data)
    # load_value, inline (once per join and gather task): a part's value is inline or a blob
    values = []
    for r in body["p"]:
        kind, inline = r["k"], r.get("v")
        value = bytes.fromhex(inline) if inline is not None else blobs.get(r["d"])
        values.append(value if kind == "bytes" else None if kind == "none" else orjson.loads(value))
    lost = body.get("l")
    return Parts(values, [(k, c) for k, c in lost] if lost else [])


def failure_ref(data: bytes) -> Ref:
    """A settled failure stored in the memo like an output (see runtime/memo.py), always inline."""
    return Ref("failed", hashlib.sha256(data).hexdigest(), len(data), data)


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
    # A defaultdict or a Counter comes back as the dict it is; a str or int subclass is refused.
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON-like")


def _refusal(value: Any, at: tuple[Any, ...], exc: TypeError) -> str:
    """What orjson refused and where, e.g. ``datetime at ['created']``; its own words if the walk finds nothing."""
    found = _first_refused(value, list(at))
    if found is None:  # a pydantic model that would not dump, say: its error says why
        return str(exc.__cause__ or exc)
    what, path = found
    return f"{what} at {path}" if path else what


def _first_refused(value: Any, path: list[Any]) -> tuple[str, list[Any]] | None:
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return ("int beyond 64 bits", path) if kind is int and not -(2**63) <= value < 2**64 else None
    if len(path) > _MAX_DEPTH:
        return f"nesting deeper than {_MAX_DEPTH} levels (or a cycle)", []
    if isinstance(value, dict):
        return _first_refused_in_dict(value, path)
    if kind is tuple or isinstance(value, list):
        return _first_refused_in_list(value, path)
    return _first_refused_leaf(value, path)


def _first_refused_in_list(value: list[Any] | tuple[Any, ...], path: list[Any]) -> tuple[str, list[Any]] | None:
    for index, item in enumerate(value):
        found = _first_refused(item, [*path, index])
        if found is not None:
            return found
    return None


def _first_refused_in_dict(value: dict[Any, Any], path: list[Any]) -> tuple[str, list[Any]] | None:
    for key, item in value.items():
        if type(key) is not str:
            return f"a dict key of type {type(key).__name__} ({key!r})", path
        found = _first_refused(item, [*path, key])
        if found is not None:
            return found
    return None


def _first_refused_leaf(value: Any, path: list[Any]) -> tuple[str, list[Any]] | None:
    kind = type(value)
    if callable(getattr(value, "model_dump", None)):
        return None
    if kind.__module__ == "numpy":
        try:
            orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
        except TypeError as exc:
            return f"numpy {kind.__name__} ({exc})", path
        return None
    for base in (str, int, float, tuple):
        if isinstance(value, base):
            return f"{kind.__name__} (a subclass of {base.__name__})", path
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{kind.__name__} inside a value", path
    return kind.__name__, path
