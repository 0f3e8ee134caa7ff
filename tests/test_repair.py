"""Format repair never writes content: a code fence and trailing commas are removed, and an answer cut off
anywhere (inside a string, a number, a key, or after a finished value whose list or object never closed) is
refused as invalid_format, never completed into a value the model did not finish."""

from __future__ import annotations

import json
import re

import pytest
from pydantic import BaseModel

from conveyor.acceptance import Accept, found_in
from conveyor.acceptance.judge import judge

FULL = {
    "product_id": "P-100030",
    "title": 'Ultramarine "deep" pigment, caf\u00e9 grade',
    "colors": ["ultramarine", "cobalt blue", "P-100031"],
    "price": 12.5,
    "discount": -0.25,
    "stock": 120,
    "drift": -3.5e-2,
    "active": True,
    "archived": False,
    "note": None,
    "size": {"w": 10, "h": -2.5, "tags": ["matte", "fine"]},
    "confidence": 0.95,
}
COMPACT = json.dumps(FULL)  # ensure_ascii: the é is the escape \u00e9 in the text, the quotes \"
PRETTY = json.dumps(FULL, indent=2)
FENCED = f"```json\n{PRETTY}\n```"
# a trailing comma before every closing bracket: JSON strings hold no raw newline, so this only touches format
COMMAS = re.sub(r"(\S)(\n\s*[}\]])", r"\1,\2", PRETTY)
LOOSE = Accept(repair=True)


class Product(BaseModel):
    product_id: str | None = None
    confidence: float
    color: str | None = None


STRICT = Accept(schema=Product, repair=True, checks=[found_in("product_id")], confidence="confidence",
                threshold=0.8)


def test_the_realistic_answer_holds_what_a_cut_can_land_in() -> None:
    assert '\\"deep\\"' in COMPACT and "\\u00e9" in COMPACT and "-0.25" in COMPACT and "-0.035" in COMPACT
    assert ",\n}" in COMMAS and ",\n  ]" in COMMAS
    for text in (COMPACT, PRETTY):
        verdict = judge(LOOSE, text, None, {})
        assert verdict.accepted and not verdict.repaired and verdict.record == FULL


@pytest.mark.parametrize("text", [FENCED, COMMAS, f"```json\n{COMMAS}\n```", f"```\n{COMMAS}", f"```json\n{PRETTY}"])
def test_a_fence_and_trailing_commas_are_repaired_into_the_very_answer(text: str) -> None:
    verdict = judge(LOOSE, text, None, {})
    assert verdict.accepted and verdict.repaired and verdict.record == FULL


@pytest.mark.parametrize("text", [COMPACT, PRETTY, FENCED, COMMAS, f"```json\n{COMMAS}\n```"],
                         ids=["compact", "pretty", "fenced", "trailing-commas", "fenced-trailing-commas"])
def test_an_answer_cut_at_any_position_is_refused_or_is_the_whole_answer(text: str) -> None:
    """Cut after every character: an accepted cut is the full record, and only closing fence or whitespace
    was lost; every other cut is invalid_format (nothing is completed, no list or record is shortened)."""
    accepted = []
    for cut in range(1, len(text)):
        verdict = judge(LOOSE, text[:cut], None, {})
        if verdict.accepted:
            assert verdict.record == FULL, f"cut at {cut}: {text[:cut][-30:]!r} accepted as {verdict.record}"
            assert text[cut:].strip().strip("`") == "", f"cut at {cut} lost {text[cut:]!r}"
            accepted.append(cut)
        else:
            assert verdict.refusal == "invalid_format", (cut, verdict)
            assert "\n" not in verdict.message
    # a fenced answer may lose its closing fence (whole: a cut inside the backticks is refused); nothing else
    end = text.rindex("}") + 1
    assert accepted == ([c for c in range(end, len(text)) if text[end:c].isspace() or c == end]
                        if text.startswith("```") and text.endswith("```") else [])


def test_cut_off_inside_an_identifier_is_refused_not_completed() -> None:
    text = '{"product_id": "P-100030", "confidence": 0.9, "color": "ultramar'
    verdict = judge(STRICT, text, "P-100030 in ultramarine", {})
    assert verdict.refusal == "invalid_format" and not verdict.accepted
    assert verdict.message == ("the answer is cut off inside a string that starts at character 56, with 1 "
                               "bracket left open; it is refused, not completed")


@pytest.mark.parametrize(("text", "says"), [
    ('{"product_id": "P-100030", "confidence": 0.9', "after 0.9 at character 44 (it may go on)"),
    ('{"product_id": "P-100030", "confidence": 0.9 ', "after the value 0.9 at character 44 (more may follow"),
    ('{"product_id": "P-100030", "active": tru', "after tru at character 40 (it may go on)"),
    ('{"product_id": "P-100030", "confidence": 0.9,', "after a comma"),
    ('{"confidence": 0.9, "product_id"', 'after the key "product_id"'),
    ('{"confidence": 0.9, "product_id":', "after a colon"),
    ('{"confidence": 0.9, "produ', "inside a key that starts at character 21"),
    ('```json\n{"confidence": 0.9, "product_id": "P-100030"', 'after the value "P-100030" at character 52'),
])
def test_every_kind_of_cut_is_refused_with_where_it_ends(text: str, says: str) -> None:
    verdict = judge(STRICT, text, "P-100030", {})
    assert verdict.refusal == "invalid_format" and says in verdict.message, verdict.message


def test_only_format_is_repaired_never_anything_else() -> None:
    # a comma inside a string is content; a comma after a colon or another comma is not a trailing one
    assert judge(LOOSE, '{"note": "a,}", "n": [1, 2,],}', None, {}).record == {"note": "a,}", "n": [1, 2]}
    for text in ('{"n": [1,,]}', '{"n": ,}', "Sure! Here it is: {\"n\": 1}", '{"n": 1}} ', "```json\n{\"n\": 1}\n``"):
        verdict = judge(LOOSE, text, None, {})
        assert verdict.refusal == "invalid_format" and "not JSON" in verdict.message, (text, verdict)


def test_a_comma_after_the_whole_value_is_repaired_but_not_one_that_ends_it_early() -> None:
    assert judge(LOOSE, '```json\n{"n": [1, 2]},\n```', None, {}).record == {"n": [1, 2]}
    assert judge(LOOSE, '[{"n": 1},', None, {}).refusal == "invalid_format"  # a list that may go on
