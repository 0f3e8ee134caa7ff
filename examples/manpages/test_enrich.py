"""Tests for the demo's model-facing helpers (prompt, answer validation, chunking, vectors) and its declaration."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from enrich import BadModelOutput, messages, model_record, pack_vector, split_text, unpack_vector
from roff import parse_manpage
from test_roff import LS_PAGE, MDOC_PAGE

PAGE = {"title": "LS", "section": "1", "names": ["ls"], "description": "list directory contents",
        "body": "NAME\nls - list directory contents\n\nDESCRIPTION\n" + "List information about the FILEs. " * 80}


# ------------------------------------------------------------ the model's answer


def test_a_well_formed_answer_is_kept_and_keywords_are_normalised() -> None:
    record = model_record({"summary": "  Lists directory contents.  ", "keywords": ["Files", "ls", "files", " "],
                           "title": "ignored"})
    assert record.summary == "Lists directory contents."
    assert record.keywords == ["files", "ls"]


def test_keywords_are_optional() -> None:  # the simulator answers {"title", "summary", "words"}
    assert model_record({"title": "Ls", "summary": "Some words.", "words": 12}).keywords == []


@pytest.mark.parametrize("answer", [
    {},                                          # no summary
    {"summary": ""},                             # empty
    {"summary": ["a", "list"]},                  # wrong type
    {"summary": "ok", "keywords": "one string"},  # keywords not a list
    {"summary": "x" * 1_001},                    # too long to be a summary
    ["summary", "ok"],                           # not an object
    None,
])
def test_a_wrong_shape_is_a_classified_retryable_failure(answer: object) -> None:
    with pytest.raises(BadModelOutput) as caught:
        model_record(answer)
    assert (caught.value.error_class, caught.value.retryable) == ("bad_model_output", True)


def test_the_prompt_asks_for_json_and_carries_the_name_line_and_the_start_of_the_text() -> None:
    system, user = messages(PAGE)
    assert system["role"] == "system" and "JSON" in system["content"]  # OpenAI's JSON mode requires the word
    assert user["content"].startswith("Manual page LS(1): ls - list directory contents")
    assert len(user["content"]) < 1_700


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
    from pipeline import LIMITS, pipe

    shape = {s.name: (s.after, s.kind) for s in pipe}
    assert shape == {"parse": (None, "map"), "extract": ("parse", "map"), "publish": ("extract", "publish"),
                     "chunk": ("parse", "fanout"), "embed": ("chunk", "map"), "index": ("embed", "publish")}
    assert pipe["extract"].is_async and pipe["embed"].is_async
    assert pipe["extract"].retry.attempts_for("bad_model_output") == 2
    assert LIMITS["sim-1"].tpm is not None and LIMITS["sim-1"].tpm < 200_000  # under the demo simulator's limit
