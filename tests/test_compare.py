"""`conveyor compare RUN_A RUN_B`: what an accepted item cost in each run, its rates, and how often the items
both runs accepted agree, field by field (both backends)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conveyor.blobs import FilesystemBlobs
from conveyor.service import review
from conveyor.service.compare import compare_runs, compared_fields
from conveyor.service.diff import field_changes
from conveyor.store import open_store
from tests.helpers import cli, query, reconciled, submit_and_work, write_pipeline
from tests.test_reconcile_report import manifest

# One extraction behind an acceptance boundary, through an in-process provider; MODEL picks who answers.
# "strong" (priced 10/20 per million tokens) answers every item well. "cheap" (1/2) agrees on alpha,
# calls beta a memo, counts gamma's words wrong, garbles delta (not JSON: retried once, then failed), is
# unsure of epsilon (review) and adds a field of its own to eta; any other model answers as cheap does,
# unpriced. Both are unsure of zeta; nobody is asked about "refuse" (a terminal error).
PIPE = """
    import json, os
    from pydantic import BaseModel, ConfigDict
    from conveyor import Pipeline, Retry, TerminalError
    from conveyor.acceptance import Accept, Review
    from conveyor.providers import Completion, PriceTable

    PRICES = PriceTable.from_dict({"strong": [10.0, 20.0], "cheap": [1.0, 2.0]})

    class Found(BaseModel):
        model_config = ConfigDict(extra="allow")
        title: str
        kind: str | None = None
        n: dict | None = None
        confidence: float

    def answer(text, model):
        title, kind = text.split()[:2]
        record = {"title": title, "kind": kind, "n": {"words": len(text.split()), "pages": 1}, "confidence": 0.95}
        if title == "zeta":
            record["confidence"] = 0.5
        if model == "strong":
            return json.dumps(record)
        if title == "beta":
            record["kind"] = "memo"
        if title == "gamma":
            record["n"]["words"] += 1
        if title == "delta":
            return "Sure! " + title
        if title == "epsilon":
            record["confidence"] = 0.5
        if title == "eta":
            record["extra"] = "x"
        return json.dumps(record)

    class FakeProvider:
        name = "fake"

        async def chat(self, messages, *, model, prompt_version=None, **options):
            cost, priced = PRICES.cost_for(model, model, 100, 20)
            return Completion(text=answer(messages[0]["content"], model), data=None, model=model,
                              prompt_tokens=100, completion_tokens=20, cost=cost, request_id=None,
                              prompt_version=prompt_version, latency=0.0, priced=priced)

    pipe = Pipeline(os.environ.get("PIPE_NAME", "extraction"), provider=FakeProvider,
                    retry=Retry(max_attempts=2, base=0.01, cap=0.01))

    @pipe.stage(config={"model": os.environ.get("MODEL", "strong")},
                accept=Accept(schema=Found, confidence="confidence", threshold=0.8, review=Review(deadline="1h")))
    async def extract(ctx, source: bytes) -> str:
        text = source.decode()
        if text.startswith("refuse"):
            raise TerminalError("refused", error_class="unreadable")
        return (await ctx.chat([{"role": "user", "content": text}], model=ctx.config["model"])).text
"""

ITEMS = {key: {"key": key, "text": text} for key, text in [
    ("i1", "alpha invoice one"), ("i2", "beta letter two"), ("i3", "gamma invoice three"),
    ("i4", "delta invoice four"), ("i5", "epsilon letter five"), ("i6", "zeta letter six"),
    ("i7", "eta invoice seven"), ("i8", "theta letter eight"), ("i9", "refuse letter nine")]}
STRONG_COST = (100 * 10.0 + 20 * 20.0) / 1e6  # one call
CHEAP_COST = (100 * 1.0 + 20 * 2.0) / 1e6


def _run(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch, name: str, keys: str,
         **env: str) -> str:
    """A run of PIPE over the items ``keys`` (digits), its module loaded under ``env``."""
    for variable in ("MODEL", "PIPE_NAME"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    target = write_pipeline(tmp_path, PIPE, f"{name}.py")
    lines = [ITEMS[f"i{digit}"] for digit in keys]
    return submit_and_work(target, manifest(tmp_path, lines, f"{name}.jsonl"), store_url, tmp_path / "blobs").run_id


def _reject(store_url: str, run_id: str, item: str) -> None:
    store = open_store(store_url)
    try:
        (entry,) = [e for e in review.review_list(store, run_id=run_id)["reviews"] if e["item_key"] == item]
        review.reject(store, [entry["id"]], why="not ours", by="ann")
    finally:
        store.close()


def _compare(store_url: str, blobs: Path, run_a: str, run_b: str, **options: Any) -> dict[str, Any]:
    store = open_store(store_url)
    try:
        return compare_runs(store, FilesystemBlobs(blobs), run_a, run_b, **options)
    finally:
        store.close()


@pytest.fixture
def runs(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Run A on the strong model (items 1-8; zeta waits for review); run B on the cheap one (items 1-7 and 9;
    zeta rejected in review)."""
    strong = _run(tmp_path, store_url, monkeypatch, "strong", "12345678", MODEL="strong")
    cheap = _run(tmp_path, store_url, monkeypatch, "cheap", "12345679", MODEL="cheap")
    _reject(store_url, cheap, "i6")
    return strong, cheap


def _wall(store_url: str, run_id: str) -> float:
    ((created, finished),) = query(store_url, "SELECT r.created_at, (SELECT MAX(finished_at) FROM tasks t WHERE "
                                   "t.run_id = r.run_id) FROM runs r WHERE r.run_id = ?", run_id)
    return float(finished) - float(created)


def test_two_models_side_by_side(tmp_path: Path, store_url: str, runs: tuple[str, str]) -> None:
    strong, cheap = runs
    report = _compare(store_url, tmp_path / "blobs", strong, cheap)
    assert (report["run_a"], report["run_b"]) == (strong, cheap)
    a, b = report["runs"]
    assert a["run_id"] == strong and b["run_id"] == cheap and a["pipeline"] == b["pipeline"] == "extraction"
    assert a["status"] == b["status"] == "finished" and a["items"] == b["items"] == 8
    assert a["outcomes"] == {"awaiting_review": 1, "completed": 7}
    assert b["outcomes"] == {"awaiting_review": 1, "completed": 4, "failed": 2, "rejected": 1}
    assert (a["accepted"], b["accepted"]) == (7, 4)
    assert {k: a[k] for k in RATES} == {"acceptance_rate": 7 / 8, "review_rate": 1 / 8, "rejection_rate": 0.0,
                                        "failure_rate": 0.0}
    # the cheap model sends epsilon and zeta to review, rejected zeta there, failed delta and refuse
    assert {k: b[k] for k in RATES} == {"acceptance_rate": 4 / 8, "review_rate": 2 / 8, "rejection_rate": 1 / 8,
                                        "failure_rate": 2 / 8}
    assert (a["models"], b["models"]) == (["strong"], ["cheap"])

    # Eight calls each: A one per item; B none for refuse, two for delta (retried once). Attempts are stage
    # calls: A one per item; B one per item and delta's retry (zeta's rejection is a decision, not a call).
    assert a["per_accepted_item"] == {"tokens": 8 * 120 / 7, "cost": pytest.approx(8 * STRONG_COST / 7),
                                      "seconds": pytest.approx(reconciled(store_url, strong)["per_accepted_item"]
                                                               ["seconds"]), "attempts": 8 / 7}
    assert b["per_accepted_item"] == {"tokens": 8 * 120 / 4, "cost": pytest.approx(8 * CHEAP_COST / 4),
                                      "seconds": pytest.approx(reconciled(store_url, cheap)["per_accepted_item"]
                                                               ["seconds"]), "attempts": 9 / 4}
    assert b["per_accepted_item"]["tokens"] > a["per_accepted_item"]["tokens"], "cheaper per call, not per item"
    for run in (a, b):
        assert run["usage"] == reconciled(store_url, run["run_id"])["usage"]
        assert run["wall_seconds"] == pytest.approx(_wall(store_url, run["run_id"])) and run["wall_seconds"] >= 0
    assert b["usage"]["provider_calls"] == 8 and b["usage"]["unpriced_calls"] == 0

    # Items both accepted: alpha (the same record), beta (kind), gamma (n.words), eta (B's extra field).
    digests = dict(query(store_url, "SELECT run_id, output_digest FROM tasks WHERE item_key = 'i1'"))
    assert digests[strong] == digests[cheap], "alpha's records are equal by digest: one of them is read"
    assert report["agreement"] == {"items": 4, "identical": 1, "rate": 1 / 4, "fields": {
        "confidence": {"compared": 4, "agree": 4, "rate": 1.0},
        "extra": {"compared": 1, "agree": 0, "rate": 0.0},
        "kind": {"compared": 4, "agree": 3, "rate": 3 / 4},
        "n.pages": {"compared": 4, "agree": 4, "rate": 1.0},
        "n.words": {"compared": 4, "agree": 3, "rate": 3 / 4},
        "title": {"compared": 4, "agree": 4, "rate": 1.0}}}
    assert _compare(store_url, tmp_path / "blobs", strong, cheap, chunk=2) == report, "chunks of two merge the same"
    reverse = _compare(store_url, tmp_path / "blobs", cheap, strong)
    assert reverse["runs"] == report["runs"][::-1] and reverse["agreement"] == report["agreement"]
    itself = _compare(store_url, tmp_path / "blobs", strong, strong)["agreement"]
    assert (itself["items"], itself["identical"], itself["rate"]) == (7, 7, 1.0)
    assert itself["fields"]["title"] == {"compared": 7, "agree": 7, "rate": 1.0}


RATES = ("acceptance_rate", "review_rate", "rejection_rate", "failure_rate")


def test_other_pipelines_unpriced_models_and_nothing_accepted(tmp_path: Path, store_url: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Items match by key across pipelines; a model without a price has no cost per item (unknown, not
    free); a run that accepted nothing has no figure per accepted item."""
    strong = _run(tmp_path, store_url, monkeypatch, "strong", "1234", MODEL="strong")
    mystery = _run(tmp_path, store_url, monkeypatch, "mystery", "124", MODEL="mystery", PIPE_NAME="other")
    report = _compare(store_url, tmp_path / "blobs", strong, mystery)
    a, b = report["runs"]
    assert (a["pipeline"], b["pipeline"]) == ("extraction", "other")
    assert b["outcomes"] == {"completed": 2, "failed": 1} and b["models"] == ["mystery"]
    assert b["per_accepted_item"] == {"tokens": 4 * 120 / 2, "cost": None, "seconds": pytest.approx(
        reconciled(store_url, mystery)["per_accepted_item"]["seconds"]), "attempts": 4 / 2}
    assert b["usage"]["unpriced_calls"] == 4
    agreement = report["agreement"]
    assert (agreement["items"], agreement["identical"]) == (2, 1)
    assert agreement["fields"]["kind"] == {"compared": 2, "agree": 1, "rate": 0.5}

    refused = _run(tmp_path, store_url, monkeypatch, "refused", "9", MODEL="strong")
    nothing = _compare(store_url, tmp_path / "blobs", refused, strong)
    c = nothing["runs"][0]
    assert c["accepted"] == 0 and c["acceptance_rate"] == 0.0 and c["failure_rate"] == 1.0 and c["models"] == []
    assert c["per_accepted_item"] == {"tokens": None, "cost": None, "seconds": None, "attempts": None}
    assert nothing["agreement"] == {"items": 0, "identical": 0, "rate": None, "fields": {}}


def test_compare_through_the_cli(tmp_path: Path, store_url: str, runs: tuple[str, str]) -> None:
    args = ("--db", store_url, "--blobs", str(tmp_path / "blobs"))
    proc = cli("compare", *runs, *args, "--json", cwd=tmp_path, check=True)
    data = json.loads(proc.stdout)
    assert set(data) == {"run_a", "run_b", "runs", "agreement"} and [r["run_id"] for r in data["runs"]] == list(runs)
    assert set(data["runs"][0]) == {
        "run_id", "pipeline", "status", "items", "outcomes", "accepted", "acceptance_rate", "review_rate",
        "rejection_rate", "failure_rate", "wall_seconds", "usage", "per_accepted_item", "models"}
    assert set(data["runs"][1]["per_accepted_item"]) == {"tokens", "cost", "seconds", "attempts"}
    assert set(data["agreement"]) == {"items", "identical", "rate", "fields"}
    assert data["agreement"]["fields"]["n.words"] == {"compared": 4, "agree": 3, "rate": 0.75}
    human = cli("compare", *runs, *args, cwd=tmp_path, check=True).stdout
    assert runs[0] in human and runs[1] in human and "acceptance rate" in human and "87.5%" in human
    assert "agreement on 4 item(s) both accepted: 1 identical (25.0%)" in human
    assert "extra: 0/1 agree (0.0%)" in human and "kind: 3/4 agree (75.0%)" in human
    assert "title:" not in human, "only the fields that disagree are listed"


def test_an_unknown_run_is_one_line(tmp_path: Path, store_url: str, runs: tuple[str, str]) -> None:
    proc = cli("compare", runs[0], "r-nope", "--db", store_url, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no run 'r-nope'" in proc.stderr
    assert proc.stdout == ""


def test_a_missing_store_is_one_line(tmp_path: Path) -> None:
    proc = cli("compare", "r-a", "r-b", "--db", f"sqlite:///{tmp_path}/none.db", "--json", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no run 'r-a'" in proc.stderr
    assert not (tmp_path / "none.db").exists(), "compare only reads"


@pytest.mark.parametrize(("a", "b"), [
    ({"title": "x", "n": {"words": 3, "pages": 1}, "tags": [1, 2], "flag": 1, "gone": "y"},
     {"title": "x", "n": {"words": 4, "pages": 1}, "tags": [1, 2, 3], "flag": True, "added": None}),
    ({"n": {"a": 1}}, {"n": [1]}),
    ({"n": {"a": 1}}, {}),
    ("old", "new"),
    ("same", "same"),
    ({"a": {"b": {"c": 1}}}, {"a": {"b": {"c": 1, "d": 2}}}),
])
def test_the_fields_compared_are_the_fields_diff_walks(a: Any, b: Any) -> None:
    fields = list(compared_fields(a, b))
    assert [name for name, same in fields if not same] == [f["field"] for f in field_changes(a, b)]
    assert len({name for name, _ in fields}) == len(fields)
    assert all(same for _, same in compared_fields(a, a))


def test_wall_time_reads_as_a_clock_past_a_minute() -> None:
    from conveyor.cli.compare import _wall

    assert (_wall(None), _wall(1.234), _wall(3725.4), _wall(86_400)) == ("-", "1.23 s", "1:02:05", "24:00:00")
