"""The demo's extraction behind its acceptance boundary: what the provider simulator answers to the record
prompt (names from the NAME line, a few wrong names, low confidence, fenced JSON), and how the extract stage's
declaration judges those answers. Pure functions and one in-process simulator; no model is loaded."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from enrich import messages, name_line, pack_vector, unpack_vector

from conveyor.acceptance import Answer, Record
from conveyor.acceptance.judge import judge
from conveyor.acceptance.repair import mend
from conveyor.providers import simcontent

PAGE = {"title": "GZIP", "section": "1", "names": ["gzip", "gunzip", "zcat"], "description": "compress or expand files",
        "body": "NAME\ngzip, gunzip, zcat - compress or expand files\n\nDESCRIPTION\nGzip reduces the size of files."}


def page(i: int) -> dict[str, Any]:
    """A distinct page per i, so the seeded shares can be counted over many prompts."""
    name = f"tool{i}"
    return {"title": name.upper(), "section": "1", "names": [name, f"un{name}"], "description": "pack or unpack data",
            "body": f"NAME\n{name} - pack or unpack data\n\nDESCRIPTION\nPage {i}."}


def answers(model: str, n: int = 2_000) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(p, simcontent.record_object(model, messages(p))) for p in map(page, range(n))]


# ------------------------------------------------------------ the simulator's record


def test_the_record_prompt_is_answered_with_the_names_of_the_name_line() -> None:
    prompt = messages(PAGE)
    assert simcontent.asks_for_record(prompt)
    assert simcontent.name_line(prompt) == (["gzip", "gunzip", "zcat"], "compress or expand files")
    record = simcontent.record_object("sim-1", prompt)
    assert set(record) == {"names", "summary", "keywords", "confidence"}
    assert record["names"][:3] == ["gzip", "gunzip", "zcat"]
    assert record == simcontent.record_object("sim-1", prompt), "a pure function of the prompt and the model"
    assert json.loads(simcontent.completion_json("sim-1", prompt)) == record
    assert not simcontent.asks_for_record([{"role": "user", "content": "names and confidence, please"}])


def test_a_few_answers_add_a_name_the_page_does_not_hold_and_some_are_unsure() -> None:
    weak, strong = answers("sim-1"), answers("sim-2")
    wrong = [(p, a) for p, a in weak if a["names"] != p["names"]]
    assert 0.015 < len(wrong) / len(weak) < 0.05
    for p, a in wrong:
        assert a["names"][:-1] == p["names"] and a["names"][-1].casefold() not in name_line(p).casefold()
    low = sum(a["confidence"] < 0.7 for _, a in weak) / len(weak)
    assert 0.11 < low < 0.19
    strong_low = sum(a["confidence"] < 0.7 for _, a in strong) / len(strong)
    strong_wrong = sum(a["names"] != p["names"] for p, a in strong) / len(strong)
    assert strong_low < low and strong_wrong < len(wrong) / len(weak)
    assert min(a["confidence"] for _, a in strong if a["confidence"] >= 0.7) >= 0.82  # surer when sure


def test_a_fenced_answer_is_repaired_into_the_same_object() -> None:
    content = simcontent.completion_json("sim-1", messages(PAGE))
    fenced = simcontent.fenced_json(content)
    assert fenced.startswith("```json\n") and fenced.endswith("\n```") and ",\n}" in fenced
    with pytest.raises(ValueError):
        json.loads(fenced)
    mended = mend(fenced)
    assert mended.repaired and json.loads(mended.text) == json.loads(content)


def test_the_simulator_serves_the_record_in_text_mode_with_its_faults_logged(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from conveyor.providers.simulator import SimConfig, run_simulator

    log = tmp_path / "sim.jsonl"
    with run_simulator(SimConfig(seed=1, fenced_rate=1.0, log_path=log)) as url:
        client = openai.OpenAI(base_url=url, api_key="sim", max_retries=0)
        fenced = client.chat.completions.create(model="sim-1", messages=messages(PAGE))
        plain = client.chat.completions.create(model="sim-1", messages=[{"role": "user", "content": "hello"}])
    text = fenced.choices[0].message.content or ""
    assert text.startswith("```json") and simcontent.name_line(messages(PAGE))[0][0] in text
    assert "```" not in (plain.choices[0].message.content or ""), "a plain text answer has no JSON to fence"
    assert [json.loads(line)["fault"] for line in log.read_text().splitlines()] == ["fenced", None]


# ------------------------------------------------------------ the extract stage's acceptance boundary


@pytest.fixture(scope="module")
def stages() -> Any:
    from pipeline import pipe

    return pipe


def verdict(pipe: Any, record: dict[str, Any] | str) -> Any:
    """The extract stage's boundary on an answer for PAGE (extract's input is the parsed page)."""
    text = record if isinstance(record, str) else json.dumps(record)
    known = {"title": "GZIP", "section": "1", "description": PAGE["description"]}
    return judge(pipe["extract"].accept, Answer(text, known=known), PAGE, {})


def test_an_answer_is_accepted_with_the_fields_known_by_rule(stages: Any) -> None:
    answer = simcontent.record_object("sim-1", messages(PAGE)) | {"confidence": 0.9, "title": "model's own"}
    v = verdict(stages, answer)
    assert v.accepted and not v.repaired
    assert v.record["title"] == "GZIP" and v.record["names"][:3] == ["gzip", "gunzip", "zcat"]


def test_a_name_not_on_the_page_is_refused_as_invalid_content(stages: Any) -> None:
    answer = {"names": ["gzip", "gzipctl"], "summary": "Compresses.", "keywords": [], "confidence": 0.95}
    v = verdict(stages, answer)
    assert v.refusal == "invalid_content" and "gzipctl" in v.message and not v.reviewable


def test_a_fenced_answer_is_accepted_and_marked_repaired(stages: Any) -> None:
    answer = {"names": ["gzip"], "summary": "Compresses.", "keywords": ["Zip"], "confidence": 0.95}
    v = verdict(stages, simcontent.fenced_json(json.dumps(answer)))
    assert v.accepted and v.repaired and v.record["keywords"] == ["zip"]


def test_cut_off_chatty_and_unsure_answers(stages: Any) -> None:
    content = json.dumps({"names": ["gzip"], "summary": "Compresses.", "keywords": [], "confidence": 0.95})
    cut = verdict(stages, simcontent.truncate_json(content))
    assert cut.refusal == "invalid_format" and "cut off" in cut.message  # refused, never completed
    assert verdict(stages, simcontent.malformed_json("sim-1", messages(PAGE))).refusal == "invalid_format"
    unsure = verdict(stages, {"names": ["gzip"], "summary": "Compresses.", "keywords": [], "confidence": 0.4})
    assert unsure.refusal == "low_confidence" and unsure.reviewable  # escalated, then reviewed


def test_the_simulators_answer_cut_anywhere_is_never_accepted_unfinished(stages: Any) -> None:
    """Every cut of a real fenced answer: refused as invalid_format, or the whole record (only the closing
    fence lost)."""
    content = json.dumps(simcontent.record_object("sim-2", messages(PAGE)) | {"confidence": 0.95}, indent=2)
    fenced = simcontent.fenced_json(content)
    whole = verdict(stages, fenced)
    assert whole.accepted and whole.repaired
    for cut in range(1, len(fenced)):
        v = verdict(stages, fenced[:cut])
        assert v.refusal == "invalid_format" or (v.record == whole.record and "}" not in fenced[cut:]), cut


def test_publish_joins_the_record_and_the_gathered_vectors_for_the_built_in_target(stages: Any) -> None:
    record = {"names": ["gzip"], "summary": "Compresses.", "keywords": ["zip"], "confidence": 0.9,
              "description": "compress or expand files"}
    packed = [pack_vector([0.5] * 384), pack_vector([0.25] * 384)]
    ctx = SimpleNamespace(params={"embed_model": "all-MiniLM-L6-v2"})  # the run's embedding model
    published = stages["publish"].fn(ctx, record, packed)  # a join: the record, then the vectors gather's list
    assert isinstance(published, Record) and "vectors" not in published.fields
    assert published.embedding_model == "all-MiniLM-L6-v2"  # what search by meaning embeds a query with
    assert published.text == "gzip compress or expand files Compresses. zip"
    assert [list(v) for v in published.vectors] == [unpack_vector(p) for p in packed]
