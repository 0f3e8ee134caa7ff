"""The ``conveyor`` command: a thin shell over the service functions.

Exit codes: 0 every item published or completed; 2 a user error (one line on stderr); 3 items
unaccounted or not at an end yet (or a submission that did not finish); 4 items failed, dead-lettered
or rejected; 5 none of those, but items await review; 130 interrupted (the line says how to resume).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Annotated

import typer
from typer.exceptions import TyperException

from conveyor import __version__
from conveyor.cli.common import ACCEPT_CODE, INTERRUPTED, app
from conveyor.errors import ConveyorError, UserError
from conveyor.runtime import tracing


def main() -> None:
    """Entry point: user errors print one line and exit 2, never a traceback."""
    logging.basicConfig(level=os.environ.get("CONVEYOR_LOG", "WARNING").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    _every_stage_when_unnamed(sys.argv)
    try:
        tracing.configure()  # off, unless the environment asks for traces: then OpenTelemetry is loaded
        code = app(standalone_mode=False)
    except TyperException as exc:  # a usage error: Typer's own parser found it
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError":
            typer.echo(exc.format_message(), err=True)
            raise SystemExit(2) from None
        where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        _fail(f"error: {exc.format_message()}{where}", exc.exit_code)
    except typer.Abort:
        _fail("interrupted", INTERRUPTED)
    except UserError as exc:
        _fail(f"error: {exc}", 2)
    except ConveyorError as exc:
        _fail(f"error [{exc.code}]: {exc}", 1)
    raise SystemExit(code if isinstance(code, int) else 0)


def _every_stage_when_unnamed(argv: list[str]) -> None:
    """``--accept-code-change`` with no STAGE after it means every stage (Typer has no optional values);
    what follows it is not a STAGE when it is an option or a TARGET (``file.py:pipe``)."""
    for index in range(len(argv) - 1, 0, -1):
        following = argv[index + 1] if index + 1 < len(argv) else None
        if argv[index] == ACCEPT_CODE and (following is None or following.startswith("-") or ":" in following):
            argv.insert(index + 1, "*")


def _fail(line: str, code: int) -> None:
    typer.echo(" ".join(line.split("\n")), err=True)
    raise SystemExit(code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"conveyor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """Durable, idempotent batch AI pipelines."""


# The other commands live in modules of their own, each registering on ``app``, in the order `--help` lists them.
for _module in ("runs", "reports", "compare", "replay", "show", "export", "publications", "review", "dlq", "workers",
                "alerts", "serve"):
    importlib.import_module(f"conveyor.cli.{_module}")


@app.command("provider-sim", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             add_help_option=False)
def provider_sim(ctx: typer.Context) -> None:
    """A local OpenAI-compatible provider with TPM/RPM limits and seeded faults (--help for its flags)."""
    try:
        from conveyor.providers.simulator import main as simulator_main
    except ImportError as exc:
        raise UserError(
            f"the simulator needs the 'sim' extra ({exc.name} is missing): pip install 'conveyor[sim]'") from None
    raise typer.Exit(simulator_main(list(ctx.args)))
