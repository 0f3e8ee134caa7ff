"""MkDocs hook (``hooks:`` in mkdocs.yml): add the reference pages made from the code to the site.

They are generated files (never written into docs/), made once per build by docs/_gen/reference.py from
this checkout's ``src/conveyor``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _reference() -> ModuleType:
    """docs/_gen/reference.py, loaded by path (MkDocs loads a hook as a file, not from a package)."""
    if str(ROOT / "src") not in sys.path:  # this checkout's conveyor, as `PYTHONPATH=src` would
        sys.path.insert(0, str(ROOT / "src"))
    spec = importlib.util.spec_from_file_location("conveyor_docs_reference", HERE / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    reference = _reference()
    for uri, make in reference.PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    results = (ROOT / "bench" / "RESULTS.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "explanations/results.md", content=reference.results_page(results)))
    return files
