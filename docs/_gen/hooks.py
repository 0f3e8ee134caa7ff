"""MkDocs hook (``hooks:`` in mkdocs.yml): add the reference pages made from the code to the site.

They are generated files (never written into docs/), made once per build by docs/_gen/reference.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parents[1] / "src"):  # reference.py, and this checkout's conveyor
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    import reference

    for uri, make in reference.PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    results = (HERE.parents[1] / "bench" / "RESULTS.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "explanations/results.md", content=reference.results_page(results)))
    return files
