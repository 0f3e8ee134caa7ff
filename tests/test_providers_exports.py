"""``conveyor.providers`` exports its public names, and importing it pulls in no SDK."""

from __future__ import annotations

import subprocess
import sys

import pytest

import conveyor.providers as providers
from tests.helpers import SRC

EXPECTED = {
    "Completion", "Embeddings", "Provider", "ProviderError", "PriceTable", "Price", "OpenAIProvider",
    "AnthropicProvider", "LocalEmbeddings", "CompositeProvider", "provider_from_env", "ERROR_CLASSES",
}
SDKS = ("openai", "anthropic", "torch", "sentence_transformers")


def test_all_lists_the_public_names() -> None:
    assert set(providers.__all__) == EXPECTED
    assert len(providers.__all__) == len(EXPECTED)


def test_every_exported_name_resolves_to_the_defining_object() -> None:
    pytest.importorskip("openai")
    pytest.importorskip("anthropic")
    from conveyor.providers import base, composite, factory, local_embeddings, openai_provider

    for name in providers.__all__:
        assert getattr(providers, name) is not None, name
    assert providers.OpenAIProvider is openai_provider.OpenAIProvider
    assert providers.LocalEmbeddings is local_embeddings.LocalEmbeddings
    assert providers.CompositeProvider is composite.CompositeProvider
    assert providers.provider_from_env is factory.provider_from_env
    assert providers.ERROR_CLASSES is base.ERROR_CLASSES and "rate_limited" in providers.ERROR_CLASSES


def test_star_import_gives_every_name() -> None:
    pytest.importorskip("openai")
    pytest.importorskip("anthropic")
    namespace: dict[str, object] = {}
    exec("from conveyor.providers import *", namespace)
    assert set(namespace) >= EXPECTED


def test_dir_lists_the_names_lazy_ones_included() -> None:
    assert set(dir(providers)) >= EXPECTED


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchProvider"):
        providers.NoSuchProvider  # noqa: B018


def _fresh(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": SRC}, capture_output=True, text=True,
                          timeout=60, check=True)
    return proc.stdout.strip()


def test_importing_the_package_imports_no_sdk() -> None:
    code = f"import sys, conveyor.providers; print(','.join(m for m in {SDKS!r} if m in sys.modules) or 'none')"
    assert _fresh(code) == "none"


def test_an_adapter_is_imported_on_first_use() -> None:
    pytest.importorskip("openai")
    code = ("import sys; from conveyor.providers import OpenAIProvider, PriceTable; "
            "print('openai' in sys.modules, 'anthropic' in sys.modules, OpenAIProvider.__module__)")
    assert _fresh(code) == "True False conveyor.providers.openai_provider"
