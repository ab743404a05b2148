"""`turnout serve` (the gateway, one process or `--workers N`) and `turnout config check|schema`.

Only what every command needs is imported at the top: the gateway's stack (aiohttp, SQLAlchemy, Alembic, the
pydantic models) is imported by the command that uses it, so `turnout --help` stays quick.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnout import __version__
from turnout.cli.common import (
    DEFAULT_CONFIG,
    LogLevelOption,
    OptionalConfigOption,
    cli_actor,
    fail,
    valid_host,
    valid_log_format,
    valid_port,
)

if TYPE_CHECKING:
    from aiohttp import web

    from turnout.config import Settings

__all__ = ["config_app", "register", "serve"]

config_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Inspect and check configuration.")


def _resolve_config(path: Path | None) -> Path:
    from turnout.atomic import write_atomic
    from turnout.config import starter_config

    if path is not None:
        return path
    if not DEFAULT_CONFIG.exists():
        write_atomic(DEFAULT_CONFIG, (json.dumps(starter_config(), indent=2) + "\n").encode())
        typer.echo(
            f"turnout: wrote a starter config to {DEFAULT_CONFIG}: it routes to the Ollama on this machine (worker "
            "local); add yours with: turnout worker add NAME --url URL --type ollama|openai",
            err=True,
        )
        hint = _command_hint()
        if hint:
            typer.echo(f"turnout: {hint}", err=True)
    return DEFAULT_CONFIG


def _command_hint() -> str | None:
    """On a first start: where the `turnout` command is, when this shell cannot call it by name (a fresh
    ./scripts/serve installs it into ./.venv, which is not on PATH until activated)."""
    import shutil

    script = Path(sys.executable).parent / "turnout"
    if not script.exists():
        return None
    found = shutil.which("turnout")
    if found is not None and Path(found).resolve() == script.resolve():
        return None
    if sys.prefix != sys.base_prefix:  # a virtual environment
        activate = Path(sys.prefix) / "bin" / "activate"
        return f"the turnout command is {script}; to call it as turnout in this shell, run: source {activate}"
    return f"the turnout command is {script}; add {script.parent} to PATH to call it as turnout"


DRAIN_TIMEOUT_S = 30.0
MAX_DRAIN_TIMEOUT_S = 3600.0


def _drain_timeout(value: float) -> float:
    if not 0 <= value <= MAX_DRAIN_TIMEOUT_S:  # also refuses nan; inf is over the cap
        raise typer.BadParameter(f"must be a number of seconds from 0 to {MAX_DRAIN_TIMEOUT_S:g}")
    return value


MAX_PROCESSES = 256


def _processes(value: str) -> str:
    text = value.strip().lower()
    if text != "auto" and not (text.isdigit() and int(text) <= MAX_PROCESSES):
        raise typer.BadParameter(f"must be a number of processes from 1 to {MAX_PROCESSES}, or auto (or 0)")
    return text


def serve(
    config: OptionalConfigOption = None,
    host: Annotated[str | None, typer.Option(callback=valid_host, help="bind address (overrides listen.host)")] = None,
    port: Annotated[int | None, typer.Option(callback=valid_port, help="port (overrides listen.port)")] = None,
    log_level: LogLevelOption = "info",
    access_log: Annotated[
        bool | None,
        typer.Option(
            "--access-log/--no-access-log",
            help="one line per request: key prefix, app, api, model, worker, status, latency, tokens; never a "
            "header or a key (default: on, or logging.access_log in the config)",
            show_default=False,
        ),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            callback=valid_log_format,
            metavar="text|json",
            help="text, or json: one JSON object per line (default: text, or logging.format in the config)",
            show_default=False,
        ),
    ] = None,
    drain_timeout: Annotated[
        float,
        typer.Option(
            callback=_drain_timeout,
            help="on Ctrl-C or SIGTERM, seconds the requests in flight get to finish before they are closed",
        ),
    ] = DRAIN_TIMEOUT_S,
    workers: Annotated[
        str,
        typer.Option(
            "--workers",
            callback=_processes,
            metavar="N|auto",
            help="gateway processes sharing the port (SO_REUSEPORT), restarted when one ends; auto or 0: one per "
            "core. Limits stay exact across them (counted in the store, or Redis). Not the upstream workers.",
        ),
    ] = "1",
) -> None:
    """Run the gateway (Ctrl-C or SIGTERM stops it after the requests in flight)."""
    import logging

    from turnout.config import ConfigError, is_loopback, load_settings
    from turnout.gateway import processes, server
    from turnout.gateway.keys import DATABASE
    from turnout.redaction import configure_logging
    from turnout.state.data_dir import data_dir_problem
    from turnout.state.placement_store import PlacementFileError
    from turnout.store.db import StoreError
    from turnout.wiring import create_app

    count = processes.cpu_count() if workers in ("auto", "0") else int(workers)
    configure_logging(log_level, log_format or "text")
    path = _resolve_config(config)
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        fail(str(exc))
        return
    configure_logging(log_level, log_format or settings.logging.format, pid=count > 1)
    # Alembic logs each migration step and (1.16+) each of its plugins at INFO: one line of ours says it instead.
    logging.getLogger("alembic").setLevel(logging.DEBUG if log_level == "debug" else logging.WARNING)
    if access_log is None:
        access_log = settings.logging.access_log
    bind_host = host or settings.listen.host
    if settings.auth.open and not is_loopback(bind_host):
        fail(f"auth.open is set but --host {bind_host} is not a loopback address; open access is loopback-only")
        return
    bind_port = port or settings.listen.port
    problem = processes.processes_problem(settings, count)
    if problem is not None:
        fail(problem)
        return
    try:  # before anything is written: a busy port changes nothing
        groups = processes.bind_group(bind_host, bind_port, count) if count > 1 else [server.bind(bind_host, bind_port)]
    except server.BindError as exc:
        fail(str(exc))
        return
    sockets = [sock for group in groups for sock in group]
    problem = data_dir_problem(settings.data_dir)
    if problem is not None:
        _close(sockets)
        fail(
            f"cannot use the data dir {settings.data_dir}: {problem}; point storage.data_dir in {path} at a "
            "directory this user can read and write"
        )
        return
    try:
        token = _admin_token(settings)
        application = create_app(settings, admin_token=token)  # with --workers N: a check; each process builds its own
        _starter_key(application, settings)
    except PlacementFileError as exc:
        _close(sockets)
        fail(f"{exc}\nfix the file or delete it to fall back to the config baseline")
        return
    except (StoreError, ConfigError) as exc:
        _close(sockets)
        fail(str(exc))
        return
    except OSError as exc:
        _close(sockets)
        fail(f"cannot use {exc.filename or settings.data_dir}: {exc.strerror or exc}; check its owner and mode")
        return
    where = f"[{bind_host}]" if ":" in bind_host else bind_host
    serving = f"turnout {__version__}: serving on http://{where}:{bind_port} ({_count(len(settings.workers), 'worker')}"
    logger = logging.getLogger("turnout.access") if access_log else None
    if count > 1:
        application[DATABASE].close()  # each process opens its own
        drained = _serve_processes(
            settings, token, groups, count, drain_timeout, logger, f"{serving}, {count} gateway processes)"
        )
    else:
        drained = server.run(
            application,
            sockets,
            drain_timeout_s=drain_timeout,
            access_log=logger,
            on_ready=lambda: typer.echo(f"{serving})"),
            on_stopping=lambda n: typer.echo(
                f"turnout: stopping: {_count(n, 'request')} in flight, waiting up to {drain_timeout:g} s for them "
                "to finish"
                if n
                else "turnout: stopping"
            ),
        )
    if drained.closed:
        typer.echo(
            f"turnout: stopped; closed {_count(drained.closed, 'request')} still running after {drain_timeout:g} s"
        )
    elif drained.in_flight:
        typer.echo(f"turnout: stopped after the {_count(drained.in_flight, 'request')} in flight finished")
    else:
        typer.echo("turnout: stopped")


def _serve_processes(
    settings: Settings,
    token: str,
    groups: list[list[Any]],
    count: int,
    drain_timeout: float,
    access_log: Any,
    serving: str,
) -> Any:
    """`serve --workers N`: the supervisor's side (turnout.gateway.processes says how it works)."""
    from turnout.gateway import processes, server
    from turnout.gateway.shared_limits import LimitKeeper
    from turnout.wiring import create_app

    def serve_one(index: int, report: Any, limits: Any) -> None:
        application = create_app(
            processes.split_caps(settings, index, count), admin_token=token, processes=count, limits=limits
        )
        drained = server.run(
            application,
            groups[index],
            drain_timeout_s=drain_timeout,
            access_log=access_log,
            on_ready=lambda: report("ready"),
            on_stopping=lambda _n: None,
        )
        report(f"done {drained.in_flight} {drained.closed}")

    supervisor = processes.Supervisor(
        count,
        groups,
        serve_one,
        # limits (unless Redis counts them) and the prefix indexes' records go through the supervisor
        keeper=LimitKeeper(),
        on_ready=lambda: typer.echo(serving),
        on_stopping=lambda: typer.echo(
            f"turnout: stopping {count} gateway processes; requests in flight get up to {drain_timeout:g} s to finish"
        ),
        on_restart=lambda index, pid, how, delay: typer.echo(
            f"turnout: gateway process {index + 1} (pid {pid}) ended with {how}; starting it again in {delay:g} s",
            err=True,
        ),
    )
    code = supervisor.run()
    if code:
        raise typer.Exit(code)
    return supervisor.drained


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _close(sockets: list[Any]) -> None:
    for sock in sockets:
        sock.close()


def _admin_token(settings: Settings) -> str:
    from turnout.admin.auth import TOKEN_FILE, ensure_admin_token

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
    from turnout.gateway.keys import AUDIT

    now = time.time()
    record, plaintext = keys.create(
        app="starter", tenant=None, scopes=["*"], rpm=None, daily_tokens=None, expires_at=None, now=now
    )
    application[AUDIT].record(
        actor=cli_actor(), action="key.create", target=f"key:{record.prefix}", after=record.to_json(now), now=now
    )
    typer.echo(f"turnout: created a starter API key for app {record.app!r} (all models); it is shown only once:")
    typer.echo(f"  {plaintext}")
    typer.echo("  use it as 'Authorization: Bearer <key>'; manage keys with: turnout key list / create / revoke")


@config_app.command("check")
def config_check(config: OptionalConfigOption = None) -> None:
    """Validate a config file without starting anything (exit 2 when invalid)."""
    from turnout.config import ConfigError, load_settings

    path = config or DEFAULT_CONFIG
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        fail(str(exc))
        return
    typer.echo(f"{path}: ok ({len(settings.workers)} workers, data dir {settings.data_dir})")
    from turnout.controller.local import policy_text
    from turnout.core.poolpolicy import PolicyError, parse_pool_policy

    for i, agent in enumerate(settings.pools.agents if settings.pools else []):
        text = policy_text(agent.policy)
        try:
            if text is not None:
                parse_pool_policy(text)
        except PolicyError as exc:
            typer.echo(f"warning: pools.agents[{i}].policy ({agent.name}): {exc}; the controller disables it", err=True)


@config_app.command("schema")
def config_schema_cmd() -> None:
    """Print the JSON Schema of config.json."""
    from turnout.config import config_schema

    typer.echo(json.dumps(config_schema(), indent=2))


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.add_typer(config_app, name="config")
