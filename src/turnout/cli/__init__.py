"""The `turnout` command line (typer): this module builds the app from one module per command group.

- :mod:`.gateway`: ``serve``, ``config check|schema``
- :mod:`.workers`: ``worker add|list|remove`` (the config file's workers)
- :mod:`.endpoints`: ``endpoint ...`` (external endpoints)
- :mod:`.accounts`: ``key ...``, ``usage``, ``audit``
- :mod:`.batches`: ``batch list|show|cancel`` (the OpenAI Batch API's batches)
- :mod:`.aliases`: ``alias list|set|remove`` (model aliases)
- :mod:`.backup`: ``backup create|restore``
- :mod:`.claims`: ``claim ...``, ``controller``, ``operator``
- :mod:`.agent`: ``agent`` (the runtime agent of a pool pod)
- :mod:`.login`: ``login``, ``logout`` (a personal admin token for the commands that call the gateway)

What they share (options, failing in one line, the store path, audit entries, tables) is :mod:`.common`; the
running gateway's admin API client is :mod:`.client`. Only what every command needs is imported at start:
`turnout --help` and the commands that talk to a running gateway stay quick. A command names its group's
module (:data:`COMMANDS`): `turnout key list` imports and builds the ``key`` group alone, not every group's
module and click command (``bench/cli_startup.py``); :data:`app`, the whole command line, is built on first use.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from typing import Annotated

import typer

from turnout import __version__

__all__ = ["COMMANDS", "GROUPS", "app", "build", "main"]

# The modules that register commands, in the order `turnout --help` lists them (serve first).
GROUPS = ("gateway", "agent", "claims", "workers", "endpoints", "aliases", "accounts", "batches", "backup", "login")
# Each top-level command, and the module of GROUPS that registers it (tests/test_cli_help.py checks them).
COMMANDS = {
    "serve": "gateway",
    "config": "gateway",
    "agent": "agent",
    "controller": "claims",
    "operator": "claims",
    "claim": "claims",
    "worker": "workers",
    "endpoint": "endpoints",
    "alias": "aliases",
    "key": "accounts",
    "usage": "accounts",
    "audit": "accounts",
    "batch": "batches",
    "backup": "backup",
    "login": "login",
    "logout": "login",
}


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"turnout {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Turnout: an inference gateway for LLMs."""


def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def build(groups: Iterable[str] = GROUPS) -> typer.Typer:
    """The command line with the commands of ``groups`` (modules of :data:`GROUPS`) and ``version``."""
    built = typer.Typer(
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,  # plain help: no '<bool>' after flags, no box drawing, wraps at 80 columns
        help="Turnout: an inference gateway for LLMs.",
    )
    built.callback()(_root)
    for name in groups:
        importlib.import_module(f"turnout.cli.{name}").register(built)
    built.command()(version)
    return built


_whole: list[typer.Typer] = []  # the whole command line, once built


def __getattr__(name: str) -> typer.Typer:
    """``app``: the whole command line (every group), built on first use."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _whole:
        _whole.append(build())
    return _whole[0]


def main() -> None:
    """The ``turnout`` script: the named command's group alone, or the whole command line (help, version, a
    name that is no command: typer then says what there is)."""
    first = sys.argv[1] if len(sys.argv) > 1 else ""
    group = COMMANDS.get(first)
    cli = build([group]) if group is not None else __getattr__("app")
    try:
        cli()
    except KeyboardInterrupt:
        sys.exit(130)
