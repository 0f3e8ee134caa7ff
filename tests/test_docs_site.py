"""The documentation site: it builds with ``mkdocs build --strict`` (a broken link, a missing page or an
anchor that is not there fails), and its reference says what the code does.

The build is the one `make docs` runs; it takes 10-20 s, so this file runs it once for every test here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "conveyor"


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("conveyor_docs_reference_test", DOCS / "_gen" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_strict_and_its_reference_says_what_the_code_does(tmp_path: Path) -> None:
    """One build (10-20 s) for every check of what it made, so that test processes do not build it each."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-6000:]
    for check in (every_page_of_the_nav_is_built, the_cli_reference_has_every_command_and_option,
                  the_http_reference_has_every_route, the_metrics_reference_has_every_family,
                  the_tables_reference_has_every_table_and_migration, the_site_fetches_nothing):
        check(tmp_path)


def _page(site: Path, uri: str) -> str:
    return (site / uri / "index.html").read_text(encoding="utf-8")


def every_page_of_the_nav_is_built(site: Path) -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = re.findall(r"(?:- |: )([\w/-]+)\.md$", nav, re.M)
    assert len(pages) >= 35
    for page in pages:
        built = site / ("index.html" if page == "index" else f"{page.removesuffix('/index')}/index.html")
        assert built.is_file(), page


def the_cli_reference_has_every_command_and_option(site: Path) -> None:
    import typer

    from conveyor.cli.commands import app

    html = _page(site, "reference/cli")
    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        assert f'id="{name}"' in html, name
        for sub in getattr(command, "commands", {}):
            assert f'id="{name}-{sub}"' in html, f"{name} {sub}"
    for option in ("--budget-usd", "--provider-batch", "--accept-code-change", "--collection", "--metrics-port"):
        assert option in html, option
    assert "--batch-create-delay-s" in html  # provider-sim's argparse flags, from its own --help


def the_http_reference_has_every_route(site: Path) -> None:
    doc = _reference().openapi_document()
    html = _page(site, "reference/http")
    assert len(doc["paths"]) > 10
    for path in doc["paths"]:
        assert f"<code>{path}</code>" in html, path


def the_metrics_reference_has_every_family(site: Path) -> None:
    html = _page(site, "reference/metrics")
    from conveyor.metrics.families import COUNTERS

    for name, _, _ in COUNTERS.values():
        assert f"{name}_total" in html, name
    for gauge in ("conveyor_tasks", "conveyor_review_backlog", "conveyor_quota_tokens_used"):
        assert gauge in html


def the_tables_reference_has_every_table_and_migration(site: Path) -> None:
    from conveyor.store.schema import MIGRATIONS

    html = _page(site, "reference/tables")
    created = {m.group(1) for _, _, sql in MIGRATIONS
               for m in re.finditer(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", sql)}
    assert {"runs", "items", "tasks", "attempts", "publications"} <= created
    for table in ("runs", "items", "tasks", "attempts", "publications", "reviews", "provenance"):
        assert f'id="table-{table}"' in html, table
    for number, what, _ in MIGRATIONS:
        assert f"<td>{number}</td>" in html, what
    assert html.count("<tr>") > len(MIGRATIONS)


def test_every_error_class_the_code_names_is_explained() -> None:
    reference = _reference()
    unexplained = sorted(set(reference.error_classes()) - set(reference.MEANINGS))
    assert not unexplained, f"add these to MEANINGS in docs/_gen/reference.py: {unexplained}"


def test_every_environment_variable_the_code_reads_is_listed() -> None:
    listed = (DOCS / "reference" / "environment.md").read_text(encoding="utf-8")
    used = {name for path in SRC.rglob("*.py")
            for name in re.findall(r"CONVEYOR_[A-Z0-9_]+", path.read_text(encoding="utf-8"))}
    assert "CONVEYOR_DB" in used
    missing = []
    for name in sorted(used):
        if name.endswith("_"):  # a prefix (CONVEYOR_PARAM_<NAME>, CONVEYOR_WEBHOOK_*): some listed name has it
            if f"`{name}" not in listed:
                missing.append(name + "*")
        elif f"`{name}`" not in listed:
            missing.append(name)
    assert not missing, f"list these in docs/reference/environment.md: {missing}"


def test_the_exit_codes_page_lists_every_code_the_code_returns() -> None:
    import ast
    import inspect

    from conveyor.cli.common import INTERRUPTED
    from conveyor.service.fleet import USER_ERROR_EXIT
    from conveyor.service.report import exit_code

    listed = {int(code) for code in re.findall(r"^\| (\d+) \|", (DOCS / "reference" / "exit-codes.md").read_text(
        encoding="utf-8"), re.M)}
    returned = {node.value for node in ast.walk(ast.parse(inspect.getsource(exit_code)))
                if isinstance(node, ast.Constant) and isinstance(node.value, int)}
    assert returned == {0, 3, 4, 5}
    assert listed == returned | {INTERRUPTED, USER_ERROR_EXIT}


def the_site_fetches_nothing(site: Path) -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^\s+font: false$", config, re.M)
    for html in (site / "index.html", site / "tutorial" / "index.html"):
        text = html.read_text(encoding="utf-8")
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text
