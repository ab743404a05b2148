"""The `turnout` command line (typer)."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from aiohttp import web

from turnout import __version__
from turnout.admin.auth import TOKEN_FILE, ensure_admin_token
from turnout.cli_accounts import register as register_accounts
from turnout.config import (
    CONFIG_FILE_NAME,
    ConfigError,
    Settings,
    config_schema,
    is_loopback,
    load_settings,
    starter_config,
)
from turnout.state.atomic import write_atomic
from turnout.state.placement_store import PlacementFileError
from turnout.store.db import StoreError

__all__ = ["app", "main"]

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Turnout: an inference gateway for LLMs.")
config_app = typer.Typer(no_args_is_help=True, help="Inspect and check configuration.")
app.add_typer(config_app, name="config")
register_accounts(app)

DEFAULT_CONFIG = Path("turnout-data") / CONFIG_FILE_NAME
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help=f"config file (default: ./{DEFAULT_CONFIG}, created when missing)"),
]


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"turnout: {message}", err=True)
    raise typer.Exit(code)


def _resolve_config(path: Path | None) -> Path:
    if path is not None:
        return path
    if not DEFAULT_CONFIG.exists():
        write_atomic(DEFAULT_CONFIG, (json.dumps(starter_config(), indent=2) + "\n").encode())
        typer.echo(f"turnout: wrote a starter config to {DEFAULT_CONFIG}; add your workers there", err=True)
    return DEFAULT_CONFIG


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="bind address (overrides listen.host)")] = None,
    port: Annotated[int | None, typer.Option(help="port (overrides listen.port)")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
) -> None:
    """Run the gateway."""
    from turnout.gateway.app import create_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(_resolve_config(config))
    except ConfigError as exc:
        _fail(str(exc))
        return
    bind_host = host or settings.listen.host
    if settings.auth.open and not is_loopback(bind_host):
        _fail(f"auth.open is set but --host {bind_host} is not a loopback address; open access is loopback-only")
        return
    try:
        application = create_app(settings, admin_token=_admin_token(settings))
        _starter_key(application, settings)
    except PlacementFileError as exc:
        _fail(f"{exc}\nfix the file or delete it to fall back to the config baseline")
        return
    except StoreError as exc:
        _fail(str(exc))
        return
    bind_port = port or settings.listen.port
    typer.echo(f"turnout {__version__}: serving on http://{bind_host}:{bind_port} ({len(settings.workers)} workers)")
    web.run_app(application, host=bind_host, port=bind_port, print=None, handler_cancellation=True, access_log=None)


def _admin_token(settings: Settings) -> str:
    token, created = ensure_admin_token(settings.data_dir, settings.admin_token)
    if created:
        where = settings.data_dir / TOKEN_FILE
        typer.echo(f"turnout: generated the admin token (stored 0600 in {where}); it is shown only once:")
        typer.echo(f"  {token}")
    return token


def _starter_key(application: web.Application, settings: Settings) -> None:
    """On a first start with keys required and none made yet, print one app key so curl works at once."""
    from turnout.gateway.keys import KEYS

    keys = application[KEYS]
    if settings.auth.open or keys.count() > 0:
        return
    record, plaintext = keys.create(
        app="starter", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=time.time()
    )
    typer.echo(f"turnout: created a starter API key for app {record.app!r} (all models); it is shown only once:")
    typer.echo(f"  {plaintext}")
    typer.echo("  use it as 'Authorization: Bearer <key>'; manage keys with: turnout key list / create / revoke")


@app.command()
def agent(
    port: Annotated[int, typer.Option(help="agent API port")] = 8080,
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    registry: Annotated[Path, typer.Option(help="engines.json (in pods: /var/run/aibrix/engines.json)")] = Path(
        "turnout-data/engines.json"
    ),
    engine_ports: Annotated[str, typer.Option(help="port range for engines, LOW-HIGH")] = "30000-30999",
    cache_dir: Annotated[Path | None, typer.Option(help="model cache to inspect for artifact markers")] = None,
    log_level: Annotated[str, typer.Option()] = "info",
) -> None:
    """Run the runtime agent: one supervised engine process per model claim."""
    from turnout.runtime.agent import create_agent_app

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    low, _, high = engine_ports.partition("-")
    if not (low.isdigit() and high.isdigit() and 0 < int(low) <= int(high) < 65536):
        _fail(f"--engine-ports {engine_ports!r}: use LOW-HIGH, e.g. 30000-30999")
    application = create_agent_app(
        registry_path=registry,
        log_dir=registry.parent / "engine-logs",
        port_range=(int(low), int(high)),
        cache_dir=cache_dir,
    )
    web.run_app(application, host=host, port=port, print=None, access_log=None)


@config_app.command("check")
def config_check(config: ConfigOption = None) -> None:
    """Validate a config file without starting anything (exit 2 when invalid)."""
    path = config or DEFAULT_CONFIG
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        _fail(str(exc))
        return
    typer.echo(f"{path}: ok ({len(settings.workers)} workers, data dir {settings.data_dir})")


@config_app.command("schema")
def config_schema_cmd() -> None:
    """Print the JSON Schema of config.json."""
    typer.echo(json.dumps(config_schema(), indent=2))


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
