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
`turnout --help` and the commands that talk to a running gateway stay quick.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from turnout import __version__
from turnout.cli import accounts, agent, aliases, backup, batches, claims, endpoints, gateway, login, workers

__all__ = ["app", "main"]

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain help: no '<bool>' after flags, no box drawing, wraps at 80 columns
    help="Turnout: an inference gateway for LLMs.",
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"turnout {__version__}")
        raise typer.Exit()


@app.callback()
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


for group in (
    gateway,
    agent,
    claims,
    workers,
    endpoints,
    aliases,
    accounts,
    batches,
    backup,
    login,
):  # `turnout --help` lists serve first
    group.register(app)
app.command()(version)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
