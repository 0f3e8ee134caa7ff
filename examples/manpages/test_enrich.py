"""Tests for the demo's model-facing helpers (prompt, answer validation, chunking, vectors) and its declaration."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from conveyor import TerminalError

sys.path.insert(0, str(Path(__file__).parent))
from enrich import (
    DEFAULT_PROMPT,
    PROMPTS,
    ManualRecord,
    messages,
    name_line,
    pack_vector,
    prompt_version,
    search_text,
    split_text,
    unpack_vector,
)
from roff import parse_manpage
from test_roff import LS_PAGE, MDOC_PAGE

PAGE = {"title": "LS", "section": "1", "names": ["ls", "dir"], "description": "list directory contents",
        "body": "NAME\nls - list directory contents\n\nDESCRIPTION\n" + "List information about the FILEs. " * 80}


# ------------------------------------------------------------ the prompt and the record


def test_the_prompt_asks_for_the_record_and_carries_the_name_line_and_the_start_of_the_text() -> None:
    system, user = messages(PAGE)
    assert system["role"] == "system" and "JSON" in system["content"]
    assert all(f'"{field}"' in system["content"] for field in ("names", "summary", "keywords", "confidence"))
    assert user["content"].startswith("Manual page LS(1)\nNAME: ls, dir - list directory contents\n\nNAME")
    assert len(user["content"]) < 1_700


def test_a_bumped_prompt_version_is_a_changed_prompt_and_an_unknown_one_is_refused() -> None:
    assert prompt_version(None) == prompt_version("") == DEFAULT_PROMPT
    bumped = next(v for v in PROMPTS if v != DEFAULT_PROMPT)
    assert messages(PAGE, bumped)[0] != messages(PAGE)[0] and messages(PAGE, bumped)[1] == messages(PAGE)[1]
    with pytest.raises(TerminalError, match="manpage-record@2"):
        prompt_version("manpage-record@99")


def test_the_record_normalises_keywords_and_ignores_other_keys() -> None:
    record = ManualRecord.model_validate({"names": ["ls"], "summary": "  Lists files. ", "confidence": 0.9,
                                          "keywords": ["Files", "ls", "files", " "], "colour": "blue"})
    assert record.summary == "Lists files." and record.keywords == ["files", "ls"]
    assert "colour" not in record.model_dump()


def test_the_name_line_and_the_full_text_entry() -> None:
    assert name_line(PAGE) == "ls, dir - list directory contents"
    record = {"names": ["ls", "dir"], "description": "list directory contents", "summary": "Lists.",
              "keywords": ["files"], "vectors": ["AAAA"]}
    assert search_text(record) == "ls dir list directory contents Lists. files"


# ------------------------------------------------------------ chunks and vectors


def test_chunks_are_about_the_size_asked_cut_at_boundaries_and_capped() -> None:
    chunks = split_text(PAGE["body"], 1_000, 3)  # 2,767 characters
    assert len(chunks) == 3
    assert all(500 <= len(c) <= 1_000 for c in chunks)
    assert all(c.endswith(".") for c in chunks)  # cut after a sentence, not inside a word
    assert split_text(PAGE["body"], 1_000, 100) == chunks
    assert split_text(PAGE["body"], 1_000, 2) == chunks[:2]
    assert "".join(split_text(PAGE["body"], 1_000, 100)).replace(" ", "").replace("\n", "") == \
        PAGE["body"].replace(" ", "").replace("\n", "")  # nothing lost below the cap


def test_short_empty_and_unbroken_texts() -> None:
    assert split_text("short text", 1_000, 3) == ["short text"]
    assert split_text("   ", 1_000, 3) == []
    assert split_text("x" * 2_500, 1_000, 3) == ["x" * 1_000, "x" * 1_000, "x" * 500]
    with pytest.raises(ValueError):
        split_text("text", 0, 3)


def test_a_vector_packs_to_float16_and_back() -> None:
    vector = [math.sin(i) / 10 for i in range(384)]
    packed = pack_vector(vector)
    assert len(packed) == 1_024  # 768 bytes in base64
    assert max(abs(a - b) for a, b in zip(unpack_vector(packed), vector, strict=True)) < 1e-3


def test_the_parser_gives_the_running_text_when_asked() -> None:
    assert "body" not in parse_manpage(LS_PAGE)
    body = parse_manpage(LS_PAGE, body_chars=10_000)["body"]
    assert body.startswith("NAME\nls - list directory contents\n\nSYNOPSIS\nls [OPTION]... [FILE]...")
    assert len(parse_manpage(LS_PAGE, body_chars=40)["body"]) <= 40
    assert "ssh-keysign is used by ssh(1)." in parse_manpage(MDOC_PAGE, body_chars=10_000)["body"]  # bare .Nm


# ------------------------------------------------------------ the declaration


def test_the_pipeline_is_declared_as_the_demo_describes() -> None:
    from pipeline import LIMITS, STRONG_MODEL, pipe

    shape = {s.name: (s.parents, s.kind) for s in pipe}
    assert shape == {"parse": ((), "map"), "chunk": (("parse",), "fanout"), "embed": (("chunk",), "map"),
                     "vectors": (("embed",), "gather"), "extract": (("parse",), "map"),
                     "publish": (("extract", "vectors"), "publish"), "sections": (("extract",), "group"),
                     "publish_section": (("sections",), "publish")}
    assert pipe["extract"].is_async and pipe["embed"].is_async and pipe["sections"].is_async
    assert pipe["publish"].into == "manuals" and pipe["publish_section"].into == "sections"
    # The prompt and the embedding model are run parameters: each in the task keys of the stages that read it only
    # (publish records which model made the vectors it publishes, for search by meaning).
    assert pipe["extract"].params == ("prompt_version",) and pipe.params["prompt_version"].default == DEFAULT_PROMPT
    assert {s.name: s.params for s in pipe if s.params} == {"extract": ("prompt_version",),
                                                            "embed": ("embed_model",), "publish": ("embed_model",)}
    accept = pipe["extract"].accept
    assert accept is not None and accept.repair and accept.schema is ManualRecord
    assert accept.threshold == 0.7 and accept.tiers == ({"model": STRONG_MODEL},)
    assert accept.review is not None and accept.review.deadline_s == 48 * 3600 and accept.review.on_deadline == "reject"
    assert [c.name for c in accept.checks] == ["found_in:names"]
    assert LIMITS["sim-1"].tpm is not None and LIMITS["sim-2"].tpm is not None
    assert LIMITS["sim-1"].tpm + LIMITS["sim-2"].tpm < 200_000  # under the demo simulator's limit, together
