"""`turnout login` / `turnout logout`: keep a personal admin token for the command line.

``login`` reads a personal token (made on the admin UI's Account page; shown once), checks it against the running
gateway (``GET /admin/api/me``: who it acts as, and with which role) and stores it 0600 in the user's config dir
(``$XDG_CONFIG_HOME/turnout/admin-token``, else ``~/.config/turnout/admin-token``). The commands that call the
gateway's admin API then use it (``TURNOUT_ADMIN_TOKEN`` still wins; the data dir's admin token is the last
resort, :mod:`turnout.cli.client`), and the audit log names the person. ``logout`` removes the file.
"""

from __future__ import annotations

import getpass
import sys
from typing import Annotated

import typer

from turnout.cli.client import AdminClient, GatewayError, gateway_address, user_token_path
from turnout.cli.common import DEFAULT_CONFIG, ConfigOption, fail, load_config

__all__ = ["register"]

PREFIX = "tpat_"  # turnout.store.people.TOKEN_PREFIX (not imported: the CLI starts without the store stack)


def login(
    token_stdin: Annotated[bool, typer.Option("--token-stdin", help="read the token from standard input")] = False,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Store a personal admin token (from the UI's Account page) for the commands that call the gateway."""
    settings = load_config(config)
    if token_stdin:
        token = sys.stdin.readline().strip()
    else:
        token = getpass.getpass("personal admin token (from the admin UI's Account page): ").strip()
    if not token.startswith(PREFIX):
        fail(f"a personal admin token starts with {PREFIX}: make one on the admin UI's Account page")
    host, port = gateway_address(settings)
    client = AdminClient(host, port, token, settings.health.timeout_s + 30)
    try:
        me = client.call("GET", "/admin/api/me")
    except GatewayError as exc:
        fail(f"the gateway at {client.url} refused the token: {exc.message}")
        raise  # unreachable
    from turnout.atomic import write_atomic

    path = user_token_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, (token + "\n").encode(), mode=0o600)
    typer.echo(f"signed in as {me['label']} ({me['role_label']}); token stored in {path}")


def logout() -> None:
    """Remove the stored personal admin token (it stays valid until it expires or is revoked in the UI)."""
    path = user_token_path()
    try:
        path.unlink()
    except FileNotFoundError:
        typer.echo(f"no token stored at {path}")
        return
    typer.echo(f"removed {path}; revoke the token on the admin UI's Account page if it may have leaked")


def register(app: typer.Typer) -> None:
    app.command("login")(login)
    app.command("logout")(logout)
