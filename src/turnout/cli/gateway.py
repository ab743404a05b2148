"""`turnout serve` (the gateway, one process or `--workers N`) and `turnout config check|schema`.

Only what every command needs is imported at the top: the gateway's stack (aiohttp, SQLAlchemy, Alembic, the
pydantic models) is imported by the command that uses it, so `turnout --help` stays quick.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

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
from turnout.cli.demo import decide as demo_decision

if TYPE_CHECKING:
    from aiohttp import web

    from turnout.config import Settings

__all__ = ["config_app", "register", "serve"]

config_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Inspect and check configuration.")


def _resolve_config(path: Path | None, *, demo: bool = False) -> Path:
    from turnout.atomic import write_atomic
    from turnout.config import DEMO_WORKER, starter_config

    if path is not None:
        return path
    if not DEFAULT_CONFIG.exists():
        write_atomic(DEFAULT_CONFIG, (json.dumps(starter_config(demo=demo), indent=2) + "\n").encode())
        runs = (
            f" and runs the demo model (its entry {DEMO_WORKER}; turnout worker remove {DEMO_WORKER} takes it out)"
            if demo
            else ""
        )
        typer.echo(
            f"turnout: wrote a starter config to {DEFAULT_CONFIG}: it routes to the Ollama on this machine (worker "
            f"local){runs}; add yours with: turnout worker add NAME --url URL --type ollama|openai",
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


HostOption = Annotated[str | None, typer.Option(callback=valid_host, help="bind address (overrides listen.host)")]
PortOption = Annotated[int | None, typer.Option(callback=valid_port, help="port (overrides listen.port)")]
AccessLogOption = Annotated[
    bool | None,
    typer.Option(
        "--access-log/--no-access-log",
        help="one line per request: key prefix, app, api, model, worker, status, latency, tokens; never a "
        "header or a key (default: on, or logging.access_log in the config)",
        show_default=False,
    ),
]
LogFormatOption = Annotated[
    str | None,
    typer.Option(
        callback=valid_log_format,
        metavar="text|json",
        help="text, or json: one JSON object per line (default: text, or logging.format in the config)",
        show_default=False,
    ),
]
DrainTimeoutOption = Annotated[
    float,
    typer.Option(
        callback=_drain_timeout,
        help="on Ctrl-C or SIGTERM, seconds the requests in flight get to finish before they are closed",
    ),
]
WorkersOption = Annotated[
    str,
    typer.Option(
        "--workers",
        callback=_processes,
        metavar="N|auto",
        help="gateway processes sharing the port (SO_REUSEPORT), restarted when one ends; auto or 0: one per "
        "core. Limits stay exact across them (counted in the store, or Redis). Not the upstream workers.",
    ),
]
DemoOption = Annotated[
    bool | None,
    typer.Option(
        "--demo/--no-demo",
        help="the demo model (smollm2-135m on a local llama.cpp engine, CPU): --demo runs it, --no-demo does "
        "not (default: when the config has a demo entry, or on a first start that writes the starter config "
        "while nothing answers at its Ollama address)",
        show_default=False,
    ),
]
DemoNeedsOption = Annotated[
    bool,
    typer.Option(
        "--demo-needs",
        hidden=True,
        help="print what the demo model still needs here (engine, model) when this start would run it, and "
        "exit without changing anything (./scripts/serve installs it)",
    ),
]


def serve(
    config: OptionalConfigOption = None,
    host: HostOption = None,
    port: PortOption = None,
    log_level: LogLevelOption = "info",
    access_log: AccessLogOption = None,
    log_format: LogFormatOption = None,
    drain_timeout: DrainTimeoutOption = DRAIN_TIMEOUT_S,
    workers: WorkersOption = "1",
    demo: DemoOption = None,
    demo_needs: DemoNeedsOption = False,
) -> None:
    """Run the gateway (Ctrl-C or SIGTERM stops it after the requests in flight)."""
    from turnout.redaction import configure_logging

    started = time.monotonic()
    if workers in ("auto", "0"):
        from turnout.gateway.processes import cpu_count

        count = cpu_count()
    else:
        count = int(workers)
    configure_logging(log_level, log_format or "text")
    chosen = _settings_to_start(config, demo, demo_needs, count)
    if chosen is None:
        return
    settings, path = chosen
    configure_logging(log_level, log_format or settings.logging.format, pid=count > 1)
    # Alembic logs each migration step and (1.16+) each of its plugins at INFO: one line of ours says it instead.
    logging.getLogger("alembic").setLevel(logging.DEBUG if log_level == "debug" else logging.WARNING)
    if access_log is None:
        access_log = settings.logging.access_log
    opened = _open(settings, path, host or settings.listen.host, port or settings.listen.port, count)
    where = f"[{opened.host}]" if ":" in opened.host else opened.host
    serving = (
        f"turnout {__version__}: serving on http://{where}:{opened.port} ({_count(len(settings.workers), 'worker')}"
    )
    from turnout.state.running import forget_address, record_address
    from turnout.wiring import DEMO

    agent = opened.application[DEMO]
    if agent is not None and settings.demo is not None:
        serving += " + the demo model"
        _announce_demo(agent, settings, opened.host, opened.port, opened.key, started)
    logger = logging.getLogger("turnout.access") if access_log else None
    record_address(settings.data_dir, opened.host, opened.port)  # the CLI dials it (a --port the config lacks)
    try:
        drained = _run(
            opened.application,
            settings,
            opened.token,
            opened.groups,
            opened.sockets,
            count,
            drain_timeout,
            logger,
            serving,
        )
    finally:
        forget_address(settings.data_dir)
    if drained.closed:
        typer.echo(
            f"turnout: stopped; closed {_count(drained.closed, 'request')} still running after {drain_timeout:g} s"
        )
    elif drained.in_flight:
        typer.echo(f"turnout: stopped after the {_count(drained.in_flight, 'request')} in flight finished")
    else:
        typer.echo("turnout: stopped")


def _settings_to_start(
    config: Path | None, demo: bool | None, demo_needs: bool, count: int
) -> tuple[Settings, Path] | None:
    """The settings this start runs on and the config file they came from (written first when it is the starter
    config), the demo model in or out as decided; None: ``--demo-needs`` was answered (nothing written)."""
    from turnout.config import STARTER_OLLAMA_URL, ConfigError, DemoWorker, load_settings

    creating = config is None and not DEFAULT_CONFIG.exists()
    settings = None
    if not creating:
        try:
            settings = load_settings(config or DEFAULT_CONFIG)
        except ConfigError as exc:
            fail(str(exc))
    decision = demo_decision(
        flag=demo,
        configured=settings is not None and settings.demo is not None,
        creating_starter=creating,
        processes=count,
        ollama_url=STARTER_OLLAMA_URL,
    )
    if demo_needs:  # ./scripts/serve's question: nothing is written, nothing starts (and the gateway's stack is
        typer.echo(" ".join(decision.missing))  # not even imported: it is asked before every start)
        return None
    if decision.choice.refuse is not None:
        fail(decision.choice.refuse)
    if decision.choice.note is not None:
        typer.echo(f"turnout: {decision.choice.note}", err=True)
    path = _resolve_config(config, demo=decision.choice.write_entry)
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        fail(str(exc))
        raise  # (fail exits)
    if decision.choice.run and settings.demo is None:  # --demo: this start only, nothing written
        settings = settings.model_copy(update={"demo": DemoWorker(name="demo", type="demo")})
    elif not decision.choice.run and settings.demo is not None:  # --no-demo
        settings = settings.model_copy(update={"demo": None})
    return settings, path


class _Opened(NamedTuple):
    host: str
    port: int
    groups: list[list[Any]]
    sockets: list[Any]
    application: web.Application
    token: str
    key: str | None  # the starter key, when this start made it


def _open(settings: Settings, path: Path, bind_host: str, bind_port: int, count: int) -> _Opened:
    """The port bound (before anything is written: a busy port changes nothing), the data dir checked, the
    application built with its admin token and starter key; every refusal exits naming what to change."""
    from turnout.config import ConfigError, is_loopback
    from turnout.gateway import processes, server
    from turnout.state.data_dir import data_dir_problem
    from turnout.state.placement_store import PlacementFileError
    from turnout.store.db import StoreError
    from turnout.wiring import create_app

    if settings.auth.open and not is_loopback(bind_host):
        fail(f"auth.open is set but --host {bind_host} is not a loopback address; open access is loopback-only")
    problem = processes.processes_problem(settings, count)
    if problem is not None:
        fail(problem)
    try:
        groups = processes.bind_group(bind_host, bind_port, count) if count > 1 else [server.bind(bind_host, bind_port)]
    except server.BindError as exc:
        fail(str(exc))
        raise  # (fail exits)
    sockets = [sock for group in groups for sock in group]
    problem = data_dir_problem(settings.data_dir)
    if problem is not None:
        _close(sockets)
        fail(
            f"cannot use the data dir {settings.data_dir}: {problem}; point storage.data_dir in {path} at a "
            "directory this user can read and write"
        )
    try:
        token = _admin_token(settings)
        application = create_app(settings, admin_token=token)  # with --workers N: a check; each process builds its own
        key = _starter_key(application, settings)
    except PlacementFileError as exc:
        _close(sockets)
        fail(f"{exc}\nfix the file or delete it to fall back to the config baseline")
        raise
    except (StoreError, ConfigError) as exc:
        _close(sockets)
        fail(str(exc))
        raise
    except OSError as exc:
        _close(sockets)
        fail(f"cannot use {exc.filename or settings.data_dir}: {exc.strerror or exc}; check its owner and mode")
        raise
    return _Opened(bind_host, bind_port, groups, sockets, application, token, key)


def _run(
    application: web.Application,
    settings: Settings,
    token: str,
    groups: list[list[Any]],
    sockets: list[Any],
    count: int,
    drain_timeout: float,
    access_log: Any,
    serving: str,
) -> Any:
    """Serve until a signal, in this process or in ``count`` processes (:func:`_serve_processes`); what drained."""
    from turnout.gateway import server
    from turnout.gateway.keys import DATABASE

    if count > 1:
        application[DATABASE].close()  # each process opens its own
        return _serve_processes(
            settings, token, groups, count, drain_timeout, access_log, f"{serving}, {count} gateway processes)"
        )
    return server.run(
        application,
        sockets,
        drain_timeout_s=drain_timeout,
        access_log=access_log,
        on_ready=lambda: typer.echo(f"{serving})"),
        on_stopping=lambda n: typer.echo(
            f"turnout: stopping: {_count(n, 'request')} in flight, waiting up to {drain_timeout:g} s for them to finish"
            if n
            else "turnout: stopping"
        ),
    )


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
    import shutil
    import tempfile

    from turnout.gateway import process_metrics, processes, server
    from turnout.gateway.shared_limits import LimitKeeper
    from turnout.gateway.supervised import OccupancyKeeper
    from turnout.wiring import create_app

    run_dir = Path(tempfile.mkdtemp(prefix="turnout-"))  # 0700: each process's metrics socket (process_metrics)

    def serve_one(index: int, report: Any, limits: Any) -> None:
        application = create_app(settings, admin_token=token, processes=count, limits=limits)
        process_metrics.attach(application, process_metrics.ProcessGroup(run_dir, index, count))
        drained = server.run(
            application,
            groups[index],
            drain_timeout_s=drain_timeout,
            access_log=access_log,
            on_ready=lambda: report("ready"),
            on_stopping=lambda _n: None,
        )
        report(f"done {drained.in_flight} {drained.closed}")

    # limits, the requests in flight, the wait queue and the prefix indexes (unless Redis keeps them) are kept by the
    # supervisor for every process
    keeper = LimitKeeper()
    if not settings.storage.redis_url:
        keeper.occupancy = OccupancyKeeper(
            keeper.send,
            tenant_caps={name: tenant.max_concurrent for name, tenant in settings.tenants.items()},
            blocks=settings.routing.prefix_max_blocks,
            ttl_s=settings.routing.prefix_ttl_s,
        )
    supervisor = processes.Supervisor(
        count,
        groups,
        serve_one,
        keeper=keeper,
        on_ready=lambda: typer.echo(serving),
        on_stopping=lambda: typer.echo(
            f"turnout: stopping {count} gateway processes; requests in flight get up to {drain_timeout:g} s to finish"
        ),
        on_restart=lambda index, pid, how, delay: typer.echo(
            f"turnout: gateway process {index + 1} (pid {pid}) ended with {how}; starting it again in {delay:g} s",
            err=True,
        ),
    )
    try:
        code = supervisor.run()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
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


def _announce_demo(agent: Any, settings: Settings, host: str, port: int, key: str | None, started: float) -> None:
    """Say what runs now, and the curl to try once the demo model answers (the key inline when this start made
    it)."""
    from turnout.cli.demo import curl_command, ready_lines
    from turnout.core.demo import describe

    demo = settings.demo
    assert demo is not None
    sleeps = (
        f"it sleeps after {demo.sleep_after_s:g} idle s and wakes on the next request" if demo.sleep_after_s else ""
    )
    typer.echo(
        f"turnout: starting the {describe(demo.threads)} (claim on pool {demo.name}"
        + (f"; {sleeps}" if sleeps else "")
        + "); the curl to try follows once it answers",
        err=True,
    )
    curl = curl_command(host, port, key, open_auth=settings.auth.open)

    def ready() -> None:
        for line in ready_lines(demo.threads, time.monotonic() - started, curl, key is not None, settings.auth.open):
            typer.echo(line)

    agent.on_ready = ready


def _starter_key(application: web.Application, settings: Settings) -> str | None:
    """On a first start with keys required and none made yet, print one app key so curl works at once."""
    from turnout.gateway.keys import KEYS

    keys = application[KEYS]
    if settings.auth.open or keys.count() > 0:
        return None
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
    return plaintext


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
    demo = " + the demo entry" if settings.demo is not None else ""
    typer.echo(f"{path}: ok ({len(settings.workers)} workers{demo}, data dir {settings.data_dir})")
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
