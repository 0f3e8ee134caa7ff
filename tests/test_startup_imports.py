"""What a command imports (issue 32 point 1): light commands load none of the heavy modules, and the plain
coercion of parameter values (cli/coercion.py) answers as Typer's pydantic coercion does.

Imports, not timings: bench/startup.py times the processes. Each command runs in a fresh interpreter, as a
user's does; what it imported is read twice, from ``-X importtime`` and from ``sys.modules`` at exit (a module
loaded through ``importlib.import_module``, as the lazy package names are, is missing from the former).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from typer import _coercion, core
from typer.models import ArgumentInfo, OptionInfo

from conveyor.cli import coercion
from tests.helpers import SRC, make_docs, submit_and_work, write_pipeline

# Runs the CLI as `python -m conveyor ARGS` does, then writes every module loaded to MODULES_OUT.
PROBE = """
import atexit, os, runpy, sys
atexit.register(lambda: open(os.environ["MODULES_OUT"], "w").write("\\n".join(sorted(sys.modules))))
sys.argv = ["conveyor", *sys.argv[1:]]
runpy.run_module("conveyor", run_name="__main__", alter_sys=True)
"""

# What no command that only prints may load: model SDKs, the HTTP server, columnar and ML libraries, the
# execution runtime (runtime/tracing.py is read by every command, and loads OpenTelemetry only when asked).
HEAVY = ("conveyor.providers", "openai", "anthropic", "httpx", "fastapi", "starlette", "uvicorn", "pyarrow",
         "torch", "sentence_transformers", "conveyor.api", "conveyor.metrics", "prometheus_client",
         "opentelemetry", "psycopg", "asyncio", "multiprocessing", "pydantic", "jinja2")
RUNTIME_READ_BY_EVERY_COMMAND = {"conveyor.runtime", "conveyor.runtime.tracing"}
# What a command that prints help or the version does not need either: the store, the declaration API,
# the services, Rich.
NOT_FOR_HELP = ("conveyor.store.", "conveyor.pipeline", "conveyor.acceptance", "conveyor.blobs", "rich",
                "conveyor.service.report", "conveyor.service.runs", "conveyor.cli.render", "sqlite3")


def imported(args: list[str], tmp_path: Path) -> set[str]:
    """Every module ``conveyor ARGS`` loaded (it must exit 0)."""
    out = tmp_path / "modules.txt"
    env = {**os.environ, "PYTHONPATH": SRC, "MODULES_OUT": str(out)}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", PROBE, *args], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    timed = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return (timed | set(out.read_text().split())) - {"imported package"}


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` that are one of ``names`` or inside one (``names`` ending in a dot: inside)."""
    inside = [n if n.endswith(".") else n + "." for n in names]
    return sorted(m for m in modules if m in names or m.startswith(tuple(inside)))


def runtime_modules(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith("conveyor.runtime") and m not in RUNTIME_READ_BY_EVERY_COMMAND)


def test_version_answers_before_typer_is_loaded(tmp_path: Path) -> None:
    modules = imported(["--version"], tmp_path)
    assert loaded(modules, ("typer", "click", "typing", "logging")) == []
    assert sorted(m for m in modules if m.startswith("conveyor")) == ["conveyor", "conveyor.cli", "conveyor.cli.main"]


@pytest.mark.parametrize("args", [["--help"], ["status", "--help"], ["run", "--help"], ["review", "approve", "--help"],
                                  ["show", "--help"], ["serve", "--help"], ["worker", "--help"]],
                         ids=lambda args: " ".join(args))
def test_help_loads_nothing_heavy(tmp_path: Path, args: list[str]) -> None:
    modules = imported(args, tmp_path)
    assert "typer" in modules  # the probe ran the command through Typer
    assert loaded(modules, HEAVY) == []
    assert runtime_modules(modules) == []
    assert loaded(modules, NOT_FOR_HELP) == []


def test_status_of_a_run_loads_the_store_and_the_report_only(tmp_path: Path) -> None:
    target = write_pipeline(tmp_path, """
        from conveyor import Pipeline

        pipe = Pipeline("startup")

        @pipe.stage(version="1")
        def parse(ctx, source: bytes) -> dict:
            return {"text": source.decode()}
    """)
    store_url = f"sqlite:///{tmp_path}/conveyor.db"
    done = submit_and_work(target, make_docs(tmp_path / "docs", 3), store_url, tmp_path / "blobs")
    for extra in ([], ["--json"]):
        modules = imported(["status", done.run_id, "--db", store_url, *extra], tmp_path)
        assert "conveyor.store.sql_store" in modules and "conveyor.service.report" in modules
        assert loaded(modules, HEAVY) == []
        assert loaded(modules, ("conveyor.pipeline.declare", "conveyor.acceptance", "conveyor.service.runs",
                                "conveyor.service.submit", "rich.progress")) == []
        assert [m for m in runtime_modules(modules) if m not in (
            "conveyor.runtime.lanes", "conveyor.runtime.heartbeat", "conveyor.runtime.fleet",
            "conveyor.runtime.values")] == []
        assert ("rich.table" in modules) is not bool(extra)  # the table, or JSON without Rich


# --- the plain coercion, held to Typer's own ------------------------------------------------------------------


def typers(annotation: Any, value: Any, info: Any) -> Any:
    """Typer's own (pydantic) coercion of ``value``: its result, or the message of its BadParameter."""
    descriptor = _coercion.resolve_type_descriptor(annotation, info)
    try:
        return _coercion.build_runtime_param(descriptor)._coerce_value(value, param=None, ctx=None)  # type: ignore[arg-type]
    except typer.BadParameter as exc:
        return f"error: {exc.message}"


def installed(annotation: Any, value: Any, info: Any) -> Any:
    """The coercion the commands get once cli/coercion.py is installed: same form as ``typers``."""
    coercion.install()
    descriptor = _coercion.resolve_type_descriptor(annotation, info)
    try:
        return core.build_runtime_param(descriptor)._coerce_value(value, param=None, ctx=None)  # type: ignore[arg-type]
    except typer.BadParameter as exc:
        return f"error: {exc.message}"


CASES = [
    (str, "sqlite:///x.db", OptionInfo()), (str, "", OptionInfo()), (str, " spaced ", ArgumentInfo()),
    (str, "ünïcode", OptionInfo()), (str, "-", OptionInfo()),
    (int, "12", OptionInfo()), (int, "-3", OptionInfo()), (int, "0", OptionInfo()), (int, "007", OptionInfo()),
    (int, 1000, OptionInfo(min=1)), (int, "0", OptionInfo(min=1)), (int, "1", OptionInfo(min=1)),
    (int, "65535", OptionInfo(min=0, max=65535)), (int, "65536", OptionInfo(min=0, max=65535)),
    (int, "-1", OptionInfo(min=0)), (int, " 5", OptionInfo()), (int, "+5", OptionInfo()), (int, "5_0", OptionInfo()),
    (int, "1e3", OptionInfo()), (int, "12.0", OptionInfo()), (int, "abc", OptionInfo()), (int, "", OptionInfo()),
    (int, "99999999999999999999", OptionInfo()), (int, True, OptionInfo()), (int, "5", OptionInfo(min=0, clamp=True)),
    (int, "-5", OptionInfo(min=0, clamp=True)),
    (float, "1.5", OptionInfo()), (float, "10", OptionInfo()), (float, "-0.0", OptionInfo()),
    (float, 2.5, OptionInfo()),
    (float, "1e3", OptionInfo()), (float, ".5", OptionInfo()), (float, "inf", OptionInfo()), (float, "x", OptionInfo()),
    (float, 3, OptionInfo()), (float, "0.1234567890123456789", OptionInfo()),
    (bool, "true", OptionInfo()), (bool, "", OptionInfo()), (bool, "nope", OptionInfo()),
    (list[str], ("a", "b"), OptionInfo()), (list[str], [], OptionInfo()), (list[str], "a", OptionInfo()),
    (list[int], ("1", "2"), ArgumentInfo()), (list[int], ("1", "x"), ArgumentInfo()),
    (list[int], ("1", "0"), ArgumentInfo(min=1)),
]


@pytest.mark.parametrize(("annotation", "value", "info"), CASES, ids=[f"{a}-{v!r}" for a, v, _ in CASES])
def test_plain_coercion_answers_as_typers_pydantic_coercion(annotation: Any, value: Any, info: Any) -> None:
    theirs, ours = typers(annotation, value, info), installed(annotation, value, info)
    assert (ours, type(ours)) == (theirs, type(theirs))


def test_plain_values_are_read_without_pydantic_and_the_rest_are_not() -> None:
    read = coercion.plain_value
    assert (read(str, "x"), read(int, "-12"), read(int, "5", 1, 9), read(float, "2.50")) == ("x", -12, 5, 2.5)
    assert read(list[str], ("a", "b")) == ["a", "b"] and read(list[int], ["3"]) == [3]
    for annotation, value, low, high in [(int, " 5", None, None), (int, "0", 1, None), (int, "10", None, 9),
                                         (int, True, None, None), (float, "1e3", None, None), (float, "1", 0, None),
                                         (bool, "yes", None, None), (list[str], "a", None, None),
                                         (list[int], ("1", "x"), None, None)]:
        with pytest.raises(coercion._Defer):
            read(annotation, value, low, high)


def test_a_value_pydantic_refuses_says_the_same_error_through_the_command(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run([sys.executable, "-m", "conveyor", "review", "list", "--limit", "0", "--db",
                           f"sqlite:///{tmp_path}/none.db"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == ("error: Invalid value for '--limit': Input should be greater than or equal to 1 (see "
                           "`python -m conveyor review list --help`)\n")


# --- the tree Typer builds: the command named, or the root's listing ------------------------------------------


def helped(built: typer.Typer, args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with contextlib.suppress(SystemExit):
        typer.main.get_command(built)(args, prog_name="conveyor", standalone_mode=False)
    return capsys.readouterr().out


def test_a_command_line_builds_the_command_it_names_and_helps_alike(capsys: pytest.CaptureFixture[str]) -> None:
    from conveyor.cli.commands import _name, app, app_for

    assert [_name(c) for c in app_for(["conveyor", "status", "R"]).registered_commands] == ["status"]
    assert [g.name for g in app_for(["conveyor", "review", "list"]).registered_groups] == ["review"]
    assert app_for(["conveyor", "review", "list"]).registered_commands == []
    for whole in (["conveyor", "--version"], ["conveyor", "stats"], ["conveyor", "--help", "status"]):
        assert app_for(whole) is app
    assert len(app.registered_commands) > 20 and len(app.registered_groups) == 3  # the tree itself stays whole
    for args in (["status", "--help"], ["review", "approve", "--help"], ["provider-sim", "--help"], ["dlq", "--help"]):
        assert helped(app_for(["conveyor", *args]), args, capsys) == helped(app, args, capsys)


def test_the_roots_help_from_the_listing_is_the_whole_trees(capsys: pytest.CaptureFixture[str]) -> None:
    from conveyor.cli.commands import app, app_for

    listing = app_for(["conveyor", "--help"])
    assert listing is not app and all(c.callback is not None and not inspect.signature(c.callback).parameters
                                      for c in listing.registered_commands)
    text = helped(listing, ["--help"], capsys)
    assert "  status " in text and "  review " in text and text == helped(app, ["--help"], capsys)
