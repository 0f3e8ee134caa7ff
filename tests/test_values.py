"""Stage outputs: what JSON gives back as it was is stored; anything else is the stage's clear error."""

from __future__ import annotations

import collections
import dataclasses
import datetime
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pytest

from conveyor.blobs.memory import MemoryBlobs
from conveyor.errors import TerminalError
from conveyor.runtime.classify import classify
from conveyor.runtime.values import (
    PARTS,
    Ref,
    decode,
    encode,
    fanout_refs,
    load_parts,
    parts_ref,
    store_value,
)
from tests.helpers import reconciled, submit_and_work, write_pipeline


class Name(str):
    pass


class Count(int):
    pass


class Pair(NamedTuple):
    left: int
    right: int


@dataclasses.dataclass
class Point:
    x: int


@pytest.mark.parametrize(
    ("value", "kind", "back"),
    [
        ({"b": [1, 2.5, True, None], "a": "x"}, "json", {"a": "x", "b": [1, 2.5, True, None]}),
        ((1, (2, "three")), "json", [1, [2, "three"]]),
        ("text", "json", "text"),
        (0, "json", 0),
        (None, "none", None),
        (b"\x00raw", "bytes", b"\x00raw"),
        (bytearray(b"raw"), "bytes", b"raw"),
        (collections.defaultdict(int, {"a": 1}), "json", {"a": 1}),
        (collections.Counter("aab"), "json", {"a": 2, "b": 1}),
    ],
)
def test_json_like_values_are_stored_and_come_back(value: Any, kind: str, back: Any) -> None:
    stored_kind, data = encode(value)
    assert (stored_kind, decode(stored_kind, data)) == (kind, back)


def test_keys_are_sorted_so_equal_values_have_equal_bytes() -> None:
    assert encode({"b": 1, "a": 2}) == encode({"a": 2, "b": 1}) == ("json", b'{"a":2,"b":1}')


def test_a_pydantic_model_is_stored_as_its_json_dump() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Invoice(pydantic.BaseModel):
        total: int
        issued: datetime.date

    kind, data = encode({"invoice": Invoice(total=3, issued=datetime.date(2026, 1, 2))})
    assert decode(kind, data) == {"invoice": {"issued": "2026-01-02", "total": 3}}


def test_numpy_arrays_and_scalars_are_stored_as_numbers() -> None:
    numpy = pytest.importorskip("numpy")
    kind, data = encode({"vector": numpy.array([0.5, 1.5]), "n": numpy.int64(3)})
    assert decode(kind, data) == {"n": 3, "vector": [0.5, 1.5]}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"created": datetime.datetime(2026, 1, 2, 3, 4)}, "datetime at ['created']"),
        (datetime.date(2026, 1, 2), "date;"),
        ([1, {"at": datetime.time(12)}], "time at [1, 'at']"),
        ({"tags": {"a", "b"}}, "set at ['tags']"),
        (frozenset({1}), "frozenset;"),
        ({"p": Point(1)}, "Point at ['p']"),
        ({"o": object()}, "object at ['o']"),
        ({1: "a"}, "a dict key of type int (1);"),
        ({"nested": {2.5: "a"}}, "a dict key of type float (2.5) at ['nested']"),
        ({"name": Name("x")}, "Name (a subclass of str) at ['name']"),
        (Count(3), "Count (a subclass of int);"),
        ({"pair": Pair(1, 2)}, "Pair (a subclass of tuple) at ['pair']"),
        ({"raw": b"x"}, "bytes inside a value at ['raw']"),
        ({"big": 2**70}, "int beyond 64 bits at ['big']"),
        ({"z": complex(1, 2)}, "complex at ['z']"),
    ],
)
def test_what_json_would_not_give_back_is_the_stages_error(value: Any, says: str) -> None:
    with pytest.raises(TerminalError) as refused:
        encode(value)
    assert refused.value.error_class == "unserialisable_output"
    assert f"stage output is not JSON-like: {says}" in f"{refused.value};"
    assert "return str, numbers, bool, None, lists, dicts with str keys" in str(refused.value)


def test_a_cycle_is_refused_without_walking_for_ever() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(TerminalError, match="nesting deeper than"):
        encode({"loop": loop})


def test_a_fanout_element_is_refused_with_its_place_in_the_list() -> None:
    with pytest.raises(TerminalError, match=r"datetime at \[1, 'when'\]") as refused:
        fanout_refs([{"ok": 1}, {"when": datetime.datetime(2026, 1, 2)}], MemoryBlobs())
    assert refused.value.error_class == "unserialisable_output"


def test_the_refusal_fails_at_once_but_is_not_settled_by_content() -> None:
    """The code is at fault, not the input: a fix without a version bump must be able to run the item again."""
    with pytest.raises(TerminalError) as refused:
        encode({"when": datetime.datetime(2026, 1, 2)})
    failure = classify(refused.value)
    assert (failure.error_class, failure.retryable, failure.deterministic) == ("unserialisable_output", False, False)
    assert classify(TerminalError("refused", error_class="refused")).deterministic


OUTPUTS = """
    import datetime
    import os
    from conveyor import Pipeline, Retry

    pipe = Pipeline("outputs", retry=Retry(max_attempts=3, base=0.01, cap=0.02))

    def output(ctx, text):
        with open(os.environ["CALLS"], "a") as calls:
            calls.write(f"{ctx.stage} {ctx.item_key}\\n")
        where, what = text.split()
        if where != ctx.stage or os.environ.get("FIXED") == "1":
            return {"text": text}
        return {"when": datetime.datetime.now()} if what == "when" else {"tags": {"a", "b"}}

    @pipe.stage(version="1")
    def inline(ctx, source: bytes) -> dict:
        return output(ctx, source.decode())

    @pipe.stage(after=inline, version="1", timeout=60)  # a timeout: runs in a child process
    def guarded(ctx, doc: dict) -> dict:
        return output(ctx, doc["text"])

    @pipe.stage(after=guarded, kind="fanout")
    def split(ctx, doc: dict) -> list:
        return [{"part": 1}, output(ctx, doc["text"])]

    @pipe.stage(after=split)
    def part(ctx, piece: dict) -> dict:
        return piece
"""


def test_unserialisable_outputs_fail_their_items_once_and_run_again_after_a_fix(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = tmp_path / "calls.log"
    monkeypatch.setenv("CALLS", str(calls))
    target = write_pipeline(tmp_path, OUTPUTS)
    docs = tmp_path / "docs"
    docs.mkdir()
    items = {"inline-when": "inline when", "guarded-tags": "guarded tags", "split-when": "split when",
             "ok-1": "ok 1", "ok-2": "ok 2"}
    for name, text in items.items():
        (docs / name).write_text(text)

    first = reconciled(store_url, submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id)
    assert first["outcomes"] == {"completed": 2, "failed": 3} and first["unaccounted"] == 0
    failed = {e["item_key"]: e["tasks"] for e in first["not_done"]}
    assert {key: [(t["stage"], t["status"], t["attempts"], t["error_class"]) for t in tasks]
            for key, tasks in failed.items()} == {
        "inline-when": [("inline", "failed", 1, "unserialisable_output")],
        "guarded-tags": [("guarded", "failed", 1, "unserialisable_output")],
        "split-when": [("split", "failed", 1, "unserialisable_output")],
    }
    assert "datetime at ['when']" in failed["inline-when"][0]["error"]
    assert "set at ['tags']" in failed["guarded-tags"][0]["error"]
    assert "datetime at [1, 'when']" in failed["split-when"][0]["error"]

    monkeypatch.setenv("FIXED", "1")  # the code is fixed; no version is bumped
    calls.write_text("")
    second = reconciled(store_url, submit_and_work(target, docs, store_url, tmp_path / "blobs").run_id)
    assert second["outcomes"] == {"completed": 5}, "the refusal must not be memoised as the content's"
    again = set(calls.read_text().splitlines())
    assert {"inline inline-when", "guarded guarded-tags", "split split-when"} <= again


def _ref_json_dumped(parts: list[Ref], lost: list[tuple[str, str]]) -> bytes:
    """The parts bytes as dicts dumped by orjson: what parts_ref formats by hand must be these, byte for byte (the
    digest of a join's or gather's input, hence its task key, is their hash)."""
    body: dict[str, Any] = {"p": [{"k": r.kind, "d": r.digest, "n": r.size} if r.inline is None else
                                  {"k": r.kind, "d": r.digest, "n": r.size, "v": r.inline.hex()} for r in parts]}
    if lost:
        body["l"] = [list(pair) for pair in lost]
    return orjson.dumps(body)


def test_parts_bytes_are_orjsons_and_load_back() -> None:
    blobs = MemoryBlobs()
    big = store_value("bytes", b"x" * 9000, blobs)  # a blob, not inline
    parts = [store_value(*encode(b"raw \x00 \"bytes\""), blobs), store_value(*encode({"a": [1, "\u00e9"]}), blobs),
             store_value(*encode(None), blobs), big,
             Ref("fanout", "ab" * 32, 2, b"[]")]
    for lost in ([], [("doc\u00b60", "timeout"), ('we"ird\\key', "bad_input")]):
        kind, data = parts_ref(parts, lost)
        assert kind == PARTS and data == _ref_json_dumped(parts, lost)
        body = orjson.loads(data)
        assert [(r["k"], r["d"], r["n"]) for r in body["p"]] == [(r.kind, r.digest, r.size) for r in parts]
        loaded = load_parts(data, blobs)
        assert loaded.values == [b'raw \x00 "bytes"', {"a": [1, "\u00e9"]}, None, b"x" * 9000, []]
        assert loaded.lost == lost
    assert parts_ref([]) == (PARTS, b'{"p":[]}')
