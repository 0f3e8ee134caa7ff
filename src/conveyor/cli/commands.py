"""The command tree: the root's options, then every command module, registered on ``app`` in the order
``--help`` lists them. A command module imports Typer and cli/common.py at most; what a command needs to do
its work (a service, the store, Rich) it imports in its body, so that building the tree stays cheap."""

import copy
import importlib
import inspect
from typing import Annotated

import typer
from typer.models import CommandInfo

from conveyor import __version__
from conveyor.cli import coercion
from conveyor.cli.common import ACCEPT_CODE, INTERRUPTED, app
from conveyor.errors import UserError

__all__ = ["INTERRUPTED", "app", "app_for", "every_stage_when_unnamed"]

coercion.install()  # plain values (strings, numbers) are coerced without loading pydantic


def every_stage_when_unnamed(argv: list[str]) -> None:
    """``--accept-code-change`` with no STAGE after it means every stage (Typer has no optional values);
    what follows it is not a STAGE when it is an option or a TARGET (``file.py:pipe``)."""
    for index in range(len(argv) - 1, 0, -1):
        following = argv[index + 1] if index + 1 < len(argv) else None
        if argv[index] == ACCEPT_CODE and (following is None or following.startswith("-") or ":" in following):
            argv.insert(index + 1, "*")


def app_for(argv: list[str]) -> typer.Typer:
    """The app to run ``argv`` with. Typer makes the Click command of every command, parameters and all, before
    it runs one (a tenth of a second for the forty here, Typer's import aside, on the 2-core machine); so a
    command line that names a command gets ``app`` holding that command only (all that its parsing, help and
    errors ever read), and the root's help gets ``_listing()``. Anything else (``--version``, an unknown command,
    a root option) gets the whole tree."""
    if argv[1:] in ([], ["--help"]):
        return _listing()
    name = argv[1]
    commands = [c for c in app.registered_commands if _name(c) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if len(commands) + len(groups) != 1:
        return app
    narrow = copy.copy(app)
    narrow.registered_commands, narrow.registered_groups = commands, groups
    return narrow


def _listing() -> typer.Typer:
    """``app`` for the root's help, which shows each command's name and the first line of its help only: every
    command keeps its name, help and flags, without its parameters (a callback that takes none), every group
    without its commands. The text is the whole tree's, byte for byte (tests/test_startup_imports.py)."""
    commands = []
    for command in app.registered_commands:
        listed = copy.copy(command)
        listed.name = _name(command)
        listed.help = inspect.getdoc(command.callback) if command.help is None else command.help
        listed.callback = _listed
        commands.append(listed)
    groups = []
    for group in app.registered_groups:
        listed_group, instance = copy.copy(group), copy.copy(group.typer_instance)
        if instance is not None:
            instance.registered_commands, instance.registered_groups = [], []
        listed_group.typer_instance = instance
        groups.append(listed_group)
    narrow = copy.copy(app)
    narrow.registered_commands, narrow.registered_groups = commands, groups
    return narrow


def _name(command: CommandInfo) -> str:
    """A command's name as Typer gives it: its own, else its function's."""
    return command.name or typer.main.get_command_name(command.callback.__name__ if command.callback else "")


def _listed() -> None:
    """What a command of ``_listing()`` would run: never run (the root's help exits first)."""


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
