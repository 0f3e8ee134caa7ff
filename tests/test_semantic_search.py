"""Search by meaning over the built-in target, on both backends: a collection published through a real pipeline
whose embedding model is deterministic (concepts, so that "car" is near "automobile" and far from "puppy"), the
query embedded with the model the collection recorded, live versions only, hybrid fusion by reciprocal rank,
a one-line error for a collection of mixed or unnamed models, the command line and the HTTP API."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.errors import UserError
from conveyor.runtime.target import load_target
from conveyor.service.embedder import query_embedder
from conveyor.service.publications import RRF_K, rollback, search
from conveyor.store import SqlStore, open_store
from conveyor.store.sqlitevec import available
from tests.helpers import cli, cli_json, submit_and_work, write_pipeline

# MODEL names the embedding model the stages ask for, RECORDED whether the publish stage names it. The concept
# model puts each word on its concept's axis (other words on four faint hashed axes): a word's synonyms are
# near it, nothing else is. concepts-2 is another space (the axes reversed): its vectors must not meet concepts-1's.
PIPELINE = """
    import zlib
    from conveyor import Pipeline
    from conveyor.acceptance import Record
    from conveyor.providers.base import Embeddings, ProviderError

    MODEL, RECORDED = {model!r}, {recorded!r}
    CONCEPTS = {{"car": 0, "automobile": 0, "vehicle": 0, "engine": 0, "oil": 0,
                "dog": 1, "puppy": 1, "canine": 1, "kennel": 1,
                "recipe": 2, "soup": 2, "kitchen": 2, "cooking": 2, "tomato": 2,
                "garden": 3, "flowers": 3, "soil": 3}}
    DIM = 8

    def concept_vector(text, model):
        vector = [0.0] * DIM
        for word in text.lower().replace("'", " ").split():
            word = word.strip(".,:;!?")
            if word in CONCEPTS:
                vector[CONCEPTS[word]] += 1.0
            elif word:
                vector[4 + zlib.crc32(word.encode()) % 4] += 0.1
        return vector if model == "concepts-1" else vector[::-1]

    class Concepts:
        name = "concepts"

        async def embed(self, texts, *, model):
            if model not in ("concepts-1", "concepts-2"):
                raise ProviderError("not_found", f"no model {{model}}")
            return Embeddings(vectors=[concept_vector(t, model) for t in texts], model=model, prompt_tokens=0,
                              cost=0.0)

        async def chat(self, messages, **options):
            raise ProviderError("bad_request", "no chat here")

        async def aclose(self):
            pass

    pipe = Pipeline("meaning", provider=Concepts)

    @pipe.stage(version="1", config={{"model": MODEL}})
    async def embed(ctx, source: bytes) -> dict:
        text = source.decode()
        chunks = [part for part in text.split(" / ") if part]
        vectors = (await ctx.embed(chunks, model=MODEL)).vectors
        return {{"text": text, "vectors": vectors}}

    @pipe.stage(after=embed, kind="publish", into="guides", config={{"model": MODEL, "recorded": RECORDED}})
    def publish(ctx, doc: dict) -> Record:
        return Record(fields={{"text": doc["text"]}}, text=doc["text"], vectors=doc["vectors"],
                      embedding_model=MODEL if RECORDED else None)
"""
# Item key -> text; " / " separates a document's chunks (one vector each).
GUIDES = {
    "oil": "How to change the oil in your automobile",
    "puppy": "Training a young puppy to sit",
    "soup": "A tomato soup recipe for a small kitchen",
    "kennel": "Cleaning a dog kennel / A recipe for home made treats",
    "garden": "Planting flowers in spring / Turning the soil of a garden bed",
}


class Collection:
    """The guides, published into collection "guides" by runs of the pipeline (a fresh module per variant)."""

    def __init__(self, tmp_path: Path, store_url: str) -> None:
        self.tmp_path, self.url, self.runs = tmp_path, store_url, 0

    def publish(self, guides: dict[str, str], model: str = "concepts-1", recorded: bool = True) -> str:
        self.runs += 1
        target = write_pipeline(self.tmp_path, textwrap.dedent(PIPELINE).format(model=model, recorded=recorded),
                                name=f"meaning{self.runs}.py")
        docs = self.tmp_path / f"docs{self.runs}"
        docs.mkdir()
        for key, text in guides.items():
            (docs / key).write_text(text)
        return submit_and_work(target, docs, self.url, self.tmp_path / "blobs").run_id

    def search(self, query: str, mode: Any = "semantic", limit: int = 10, **options: Any) -> dict[str, Any]:
        store = open_store(self.url)
        try:
            return search(store, query, "guides", limit, mode, query_embedder(self.pipeline()), **options)
        finally:
            store.close()

    def pipeline(self) -> Any:
        return load_target(f"{self.tmp_path}/meaning1.py:pipe")

    def store(self) -> SqlStore:
        return open_store(self.url)


@pytest.fixture
def guides(tmp_path: Path, store_url: str) -> Collection:
    collection = Collection(tmp_path, store_url)
    collection.publish(GUIDES)
    return collection


@pytest.fixture
def store(guides: Collection) -> Iterator[SqlStore]:
    opened = guides.store()
    yield opened
    opened.close()


def keys(found: dict[str, Any]) -> list[str]:
    return [h["item_key"] for h in found["results"]]


def test_meaning_finds_what_the_words_do_not(guides: Collection) -> None:
    assert keys(guides.search("car", "words")) == []  # no guide has the word
    found = guides.search("car")
    assert found["mode"] == "semantic" and found["model"] == "concepts-1" and found["collection"] == "guides"
    assert found["index"] == ("sqlite-vec" if guides.url.startswith("sqlite") and available() else "exact-scan")
    assert keys(found)[0] == "oil" and found["results"][0]["similarity"] > 0.9
    assert len(keys(found)) == len(GUIDES)  # every live version with vectors is ranked
    similarities = [h["similarity"] for h in found["results"]]
    assert similarities == sorted(similarities, reverse=True) and similarities == [h["score"] for h in
                                                                                  found["results"]]
    assert keys(guides.search("canine"))[0] in ("puppy", "kennel")
    assert keys(guides.search("car", limit=2)) == keys(found)[:2]


def test_a_document_scores_by_its_best_chunk(guides: Collection) -> None:
    # "kennel"'s second chunk is a recipe: a cooking query finds it next to the soup, above the unrelated guides.
    ranked = keys(guides.search("cooking"))
    assert ranked[:2] == ["soup", "kennel"]
    # "garden" splits its meaning over two chunks; a query for one of them meets a whole chunk.
    top = guides.search("soil")["results"][0]
    assert top["item_key"] == "garden" and top["similarity"] > 0.95


def test_hybrid_fuses_the_two_rankings_by_reciprocal_rank(guides: Collection) -> None:
    query = "recipe"
    text = keys(guides.search(query, "words", limit=50))
    meaning = keys(guides.search(query, "semantic", limit=50))
    assert sorted(text) == ["kennel", "soup"] and meaning[:2] == ["soup", "kennel"]
    fused = guides.search(query, "hybrid", limit=50)
    assert fused["mode"] == "hybrid" and fused["model"] == "concepts-1"
    expected = {k: sum(1 / (RRF_K + r.index(k) + 1) for r in (text, meaning) if k in r) for k in meaning}
    got = {h["item_key"]: h["score"] for h in fused["results"]}
    assert got == pytest.approx(expected)
    # Equal scores (one hit first by words, the other by meaning) go by their rank in words, then by key.
    ties = {k: (text.index(k) if k in text else len(text), k) for k in expected}
    assert keys(fused) == sorted(expected, key=lambda k: (-expected[k], ties[k]))[:len(keys(fused))]
    first = fused["results"][0]
    assert first["text_rank"] == text.index(first["item_key"]) + 1 and first["vector_rank"] is not None
    only_meaning = [h for h in fused["results"] if h["text_rank"] is None]
    assert only_meaning and all(h["vector_rank"] > 2 for h in only_meaning)  # found by meaning alone, ranked below
    assert keys(guides.search(query, "hybrid", limit=1)) == keys(fused)[:1]


def test_rolled_back_and_retracted_versions_are_not_found(guides: Collection, store: SqlStore) -> None:
    # A second run turns the oil guide into a cooking one; the car query no longer finds it first, and never
    # finds its first version.
    second = guides.publish({"oil": "Cooking soup in a tomato kitchen", "new": "A vehicle engine manual"})
    found = guides.search("car")
    assert keys(found)[0] == "new"
    oil = next(h for h in found["results"] if h["item_key"] == "oil")
    assert oil["version"] == 2 and oil["similarity"] < 0.5
    assert len(keys(found)) == len(set(keys(found)))  # one hit per item, its live version
    # Rolled back: oil is its first content again (version 3), "new" (published by that run only) is retracted.
    rollback(store, run_id=second, by="test")
    found = guides.search("car")
    assert keys(found)[0] == "oil" and found["results"][0]["version"] == 3 and "new" not in keys(found)
    assert "new" not in keys(guides.search("engine manual", "hybrid"))


def test_a_collection_of_several_models_or_an_unnamed_one_is_a_one_line_error(guides: Collection) -> None:
    guides.publish({"oil": GUIDES["oil"] + " today"}, model="concepts-2")
    with pytest.raises(UserError, match=r"come from several models \(concepts-1: 4, concepts-2: 1\).*one model"):
        guides.search("car")
    guides.publish({"oil": GUIDES["oil"] + " again"}, recorded=False)
    with pytest.raises(UserError, match=r"1 live versions of collection 'guides' have vectors from a model nobody "
                                        r"recorded; return Record\(\.\.\., embedding_model="):
        guides.search("car")
    assert keys(guides.search("automobile", "words")) == ["oil"]  # words still work


def test_a_search_by_meaning_needs_vectors(tmp_path: Path, store_url: str) -> None:
    store = open_store(store_url)
    try:
        with pytest.raises(UserError, match="no live publication in this store has vectors"):
            search(store, "car", mode="semantic")
        with pytest.raises(UserError, match="search mode 'fuzzy'"):
            search(store, "car", mode="fuzzy")  # type: ignore[arg-type]
    finally:
        store.close()


def test_a_model_only_its_pipeline_serves_needs_the_pipeline(guides: Collection, store: SqlStore) -> None:
    with pytest.raises(UserError, match=r"made by 'concepts-1'.*pass --pipeline TARGET"):
        search(store, "car", "guides", mode="semantic")  # the default embedder is the local model


def test_the_vector_index_follows_publications_made_without_sqlite_vec(guides: Collection, tmp_path: Path,
                                                                       store_url: str) -> None:
    if not (store_url.startswith("sqlite") and available()):
        pytest.skip("the sqlite-vec index is SQLite's, with sqlite-vec loaded")
    assert keys(guides.search("car"))[0] == "oil"  # the index is made now
    # A process without sqlite-vec publishes: it marks the index stale, and the next search makes it again.
    target = write_pipeline(tmp_path, textwrap.dedent(PIPELINE).format(model="concepts-1", recorded=True),
                            name="meaning1.py")
    docs = tmp_path / "late"
    docs.mkdir()
    (docs / "bike").write_text("A vehicle with two wheels and an engine")
    (docs / "oil").write_text("Soup")
    db = ["--db", store_url, "--blobs", str(tmp_path / "blobs")]
    cli("run", target, "--input", str(docs), "--workers", "0", *db, cwd=tmp_path, env={"CONVEYOR_SQLITE_VEC": "0"},
        check=True)
    store = guides.store()
    try:
        assert store.db.execute("SELECT stale FROM publication_vector_indexes") == [(1,)]
    finally:
        store.close()
    found = guides.search("car")
    assert keys(found)[0] == "bike" and found["index"] == "sqlite-vec"
    assert next(h for h in found["results"] if h["item_key"] == "oil")["similarity"] < 0.5
    # The same ranking from the exact scan.
    scanned = cli_json("search", "car", "--semantic", "--collection", "guides", "--pipeline", target,
                       "--db", store_url, cwd=tmp_path, env={"CONVEYOR_SQLITE_VEC": "0"})
    assert scanned["index"] == "exact-scan" and sorted(keys(scanned)) == sorted(keys(found))
    assert [h["similarity"] for h in scanned["results"]] == pytest.approx([h["similarity"] for h in found["results"]])
    near = [k for k, h in zip(keys(found), found["results"], strict=True) if h["similarity"] > 0.01]
    assert keys(scanned)[:len(near)] == near == ["bike"]  # the rest are orthogonal: ties, in no promised order


def test_the_command_line_searches_by_meaning(guides: Collection, tmp_path: Path, store_url: str) -> None:
    db = ["--db", store_url]
    target = f"{tmp_path}/meaning1.py:pipe"
    plain = cli_json("search", "automobile", *db, cwd=tmp_path)
    assert set(plain) == {"query", "collection", "results"}  # as before there was a search by meaning
    assert keys(plain) == ["oil"] and set(plain["results"][0]) == {"item_key", "collection", "version", "run_id",
                                                                  "score", "snippet", "fields"}
    found = cli_json("search", "car", "--semantic", "--pipeline", target, "--limit", "2", *db, cwd=tmp_path)
    assert keys(found) == ["oil", keys(guides.search("car"))[1]] and found["model"] == "concepts-1"
    assert found["results"][0]["fields"] == {"text": GUIDES["oil"]}
    fused = cli_json("search", "recipe", "--hybrid", "--pipeline", target, *db, cwd=tmp_path)
    assert keys(fused) == keys(guides.search("recipe", "hybrid"))
    both = cli("search", "car", "--semantic", "--hybrid", *db, cwd=tmp_path)
    assert both.returncode == 2 and "give one" in both.stderr
    local = cli("search", "car", "--semantic", *db, cwd=tmp_path)
    assert local.returncode == 2 and "pass --pipeline TARGET" in local.stderr and "Traceback" not in local.stderr
    shown = cli("search", "car", "--semantic", "--pipeline", target, *db, cwd=tmp_path, check=True)
    assert shown.stdout.splitlines()[0].split()[1] == "guides/oil"


def test_the_http_api_searches_by_meaning_for_its_tenants(tmp_path: Path, store_url: str) -> None:
    from tests.apiserver import served

    target = write_pipeline(tmp_path, textwrap.dedent(PIPELINE).format(model="concepts-1", recorded=True))
    with served(tmp_path, store_url, target) as server:
        acme, globex, operator = server.token("acme"), server.token("globex"), server.token("ops", operator=True)
        for token, key, text in ((acme, "oil", GUIDES["oil"]), (globex, "car", "Washing a car"),
                                 (acme, "soup", GUIDES["soup"])):
            with server.client(token) as c:
                job = c.post("/v1/jobs", json={"text": text, "key": key})
                assert job.status_code == 202, job.text
            assert server.wait_for(token, job.json()["job_id"], ("published",))["status"] == "published"
        with server.client(acme) as c:
            found = c.get("/v1/search", params={"q": "vehicle", "mode": "semantic"})
            assert found.status_code == 200, found.text
            body = found.json()
            assert body["mode"] == "semantic" and keys(body) == ["oil", "soup"]  # acme's own, by its keys
            assert keys(c.get("/v1/search", params={"q": "vehicle"}).json()) == []
            fused = c.get("/v1/search", params={"q": "tomato", "mode": "hybrid", "limit": 1}).json()
            assert keys(fused) == ["soup"] and fused["results"][0]["text_rank"] == 1
            bad = c.get("/v1/search", params={"q": "car", "mode": "fuzzy"})
            assert bad.status_code == 422
        with server.client(operator) as c:
            every = c.get("/v1/search", params={"q": "vehicle", "mode": "semantic"}).json()
            assert sorted(keys(every)[:2]) == ["@acme/oil", "@globex/car"]


def test_python_searches_a_collection_by_words_and_by_meaning(guides: Collection, tmp_path: Path,
                                                              store_url: str) -> None:
    import conveyor

    manuals = conveyor.open(store_url, str(tmp_path / "blobs")).collection("guides")
    near = manuals.search("car", mode="semantic", pipeline=guides.pipeline())
    assert near[0]["item_key"] == "oil" and near[0]["similarity"] > 0.9
    fused = manuals.search("puppy", mode="hybrid", limit=2, pipeline=guides.pipeline())
    assert fused[0]["item_key"] == "puppy" and len(fused) == 2
    assert [h["item_key"] for h in manuals.search("puppy")] == ["puppy"]
    with pytest.raises(UserError, match="search mode 'fuzzy'"):
        manuals.search("car", mode="fuzzy")
    empty = conveyor.open(f"sqlite:///{tmp_path}/none.db", str(tmp_path / "blobs")).collection("guides")
    assert empty.search("car") == []
    with pytest.raises(UserError, match="nothing has been published"):
        empty.search("car", mode="semantic")
    assert not (tmp_path / "none.db").exists()
