"""The ``conveyor`` command: a thin shell over the service functions.

Exit codes: 0 every item published or completed; 2 a user error (one line on stderr); 3 items
unaccounted or not at an end yet (or a submission that did not finish); 4 items failed, dead-lettered
or rejected; 5 none of those, but items await review; 130 interrupted (the line says how to resume).

Start-up is kept small: this module imports nothing heavy, ``conveyor --version`` answers before Typer is
loaded, and the command tree (cli/commands.py) imports each command's service only when the command runs.
People call these commands in loops and from scripts; tests/test_startup_imports.py keeps it so.
"""

from __future__ import annotations

import os
import sys

from conveyor import __version__


def main() -> None:
    """Entry point: user errors print one line and exit 2, never a traceback."""
    if sys.argv[1:] == ["--version"] and not _tracing_configured():
        sys.stdout.write(f"conveyor {__version__}\n")
        sys.stdout.flush()
        raise SystemExit(0)
    import logging

    import typer
    from typer.exceptions import TyperException

    from conveyor.cli.commands import INTERRUPTED, app_for, every_stage_when_unnamed
    from conveyor.cli.common import quick_exit
    from conveyor.errors import ConveyorError, UserError
    from conveyor.runtime import tracing

    logging.basicConfig(level=os.environ.get("CONVEYOR_LOG", "WARNING").upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    every_stage_when_unnamed(sys.argv)
    try:
        tracing.configure()  # off, unless the environment asks for traces: then OpenTelemetry is loaded
        code = app_for(sys.argv)(standalone_mode=False)
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
    code = code if isinstance(code, int) else 0
    quick_exit(code)  # a run's process ends without the interpreter's teardown (cli/common.py)
    raise SystemExit(code)


def _tracing_configured() -> bool:
    """Whether any variable that can turn tracing on (or make its set-up fail) is set: then even
    ``--version`` takes the whole path, so that it behaves as it always did (runtime/tracing.py reads them)."""
    return any(name.startswith(("OTEL_", "CONVEYOR_TRACING")) for name in os.environ)


def _fail(line: str, code: int) -> None:
    import typer

    typer.echo(" ".join(line.split("\n")), err=True)
    raise SystemExit(code)
