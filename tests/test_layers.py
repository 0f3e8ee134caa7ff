"""The code's shape: imports go one way, SQL lives in store/, the public API is curated."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import conveyor

SRC = Path(conveyor.__file__).parent

# Which layers each layer may import (besides itself and the package root's modules, which import no layer).
ROOT_MODULES = {"errors", "lazy", "places", "retry_after"}
ALLOWED = {
    # The Python API: a shell like cli and api; it draws progress as `conveyor run` does (cli/render.py).
    "client": {"cli", "service", "runtime", "pipeline", "store", "blobs"},
    "cli": {"api", "metrics", "service", "runtime", "pipeline", "acceptance", "store", "blobs", "providers"},
    "api": {"metrics", "service", "runtime", "pipeline", "acceptance", "store", "blobs"},
    "metrics": {"service", "pipeline", "store"},
    "service": {"runtime", "pipeline", "acceptance", "store", "blobs", "providers"},
    "runtime": {"pipeline", "acceptance", "store", "blobs", "providers"},
    "providers": set(),
    "pipeline": {"acceptance"},
    "acceptance": set(),
    "store": set(),
    "blobs": set(),
}


# Imports a layer makes against the direction, each inside the one function that hands over (so importing the
# layer does not import them): Pipeline.run and Pipeline.submit start the Python API.
HANDOVERS = {"pipeline/declare.py": {"client"}}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("conveyor."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("conveyor."))
    return found


def test_imports_go_one_way() -> None:
    wrong = []
    for layer, allowed in ALLOWED.items():
        for path in (SRC / layer).rglob("*.py"):
            handed = HANDOVERS.get(str(path.relative_to(SRC)), set())
            for imported in _imports(path) - allowed - {layer} - ROOT_MODULES - handed:
                wrong.append(f"{path.relative_to(SRC)} imports conveyor.{imported}")
    assert wrong == []


def test_root_modules_import_no_layer() -> None:
    assert {name: _imports(SRC / f"{name}.py") - ROOT_MODULES for name in ROOT_MODULES} == {
        name: set() for name in ROOT_MODULES}


def test_sql_lives_in_store_only() -> None:
    statement = re.compile(r"\b(SELECT\s+\S+\s+FROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM)\b")
    outside = [
        str(path.relative_to(SRC)) for path in SRC.rglob("*.py")
        if path.parent.name != "store" and statement.search(path.read_text())
    ]
    assert outside == []


def test_public_api_is_curated() -> None:
    assert sorted(conveyor.__all__) == [
        "Alerts", "Breaker", "Collection", "ConveyorError", "InputError", "Interrupted", "Param", "Pipeline",
        "RateLimit", "Result", "Retry", "RetryLater", "Run", "Stage", "TerminalError", "UserError", "Workspace",
        "__version__", "open"]
    for name in conveyor.__all__:
        assert getattr(conveyor, name) is not None


# Store calls that change a task's state (or create tasks): made from the runtime/transitions package only.
STATE_CHANGES = ("claim", "claim_suspect", "renew_leases", "release", "mark_succeeded", "mark_retry", "mark_ended",
                 "requeue_crashed", "insert_tasks", "insert_items", "insert_outputs", "insert_dead_letters",
                 "insert_attempts", "reopen", "supersede", "correct_sources", "replay_dead_letters", "copy_settled",
                 "add_notices",
                 "note_lost_workers", "release_leases", "mark_escalated", "mark_awaiting_review", "insert_reviews",
                 "decide_review",
                 "accept_reviewed", "reject_reviewed", "escalate_reviewed", "set_item_meta", "insert_provenance",
                 "forget_provenance", "copy_provenance")


def test_one_module_owns_every_task_state_change() -> None:
    call = re.compile(r"(?<!conveyor\.)\bstore\.(" + "|".join(STATE_CHANGES) + r")\b")  # not a module path
    elsewhere = [f"{path.relative_to(SRC)}: store.{m.group(1)}" for path in SRC.rglob("*.py")
                 if path.parent.name not in ("store", "transitions")
                 for m in call.finditer(path.read_text())]
    assert elsewhere == []
