"""The `turnout` command line (typer)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnout import __version__
from turnout.cli_accounts import register as register_accounts
from turnout.cli_backup import register as register_backup
from turnout.cli_workers import worker_app
from turnout.defaults import DEFAULT_CONFIG

if TYPE_CHECKING:
    from aiohttp import web

    from turnout.config import Settings

# Only what every command needs is imported here: `turnout --help` and the store commands stay quick. The
# gateway's stack (aiohttp, SQLAlchemy, Alembic, pydantic models) is imported by the command that uses it.

__all__ = ["app", "main"]

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,  # plain help: no '<bool>' after flags, no box drawing, wraps at 80 columns
    help="Turnout: an inference gateway for LLMs.",
)
config_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Inspect and check configuration.")

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help=f"config file (default: ./{DEFAULT_CONFIG}, created when missing)"),
]


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


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")  # turnout.config.LogFormat (not imported here: the CLI starts without pydantic)
MAX_INTERVAL_S = 3600.0


def _port(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= 65535:
        raise typer.BadParameter("must be a port from 1 to 65535")
    return value


def _optional_port(value: int) -> int:
    if not 0 <= value <= 65535:
        raise typer.BadParameter("must be a port from 1 to 65535, or 0 for off")
    return value


def _interval(value: float) -> float:
    if not 0 < value <= MAX_INTERVAL_S:  # also refuses nan; inf is over the cap
        raise typer.BadParameter(f"must be a number of seconds above 0 and at most {MAX_INTERVAL_S:g}")
    return value


def _log_level(value: str) -> str:
    if value.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"must be one of {', '.join(LOG_LEVELS)}")
    return value.lower()


def _log_format(value: str | None) -> str | None:
    if value is not None and value.lower() not in LOG_FORMATS:
        raise typer.BadParameter(f"must be one of {', '.join(LOG_FORMATS)}")
    return None if value is None else value.lower()


def _host(value: str | None) -> str | None:
    if value is not None and (not value or len(value) > 253 or any(ch <= " " or ch == "\x7f" for ch in value)):
        raise typer.BadParameter("must be a host name or address (no spaces or control characters)")
    return value


LogLevelOption = Annotated[str, typer.Option(callback=_log_level, help="debug, info, warning or error")]
# The long-running commands other than serve (whose default comes from its config file): agent, controller, operator
LogFormatOption = Annotated[
    str, typer.Option(callback=_log_format, metavar="text|json", help="text, or json: one JSON object per line")
]


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"turnout: {message}", err=True)
    raise typer.Exit(code)


def _resolve_config(path: Path | None) -> Path:
    from turnout.config import starter_config
    from turnout.state.atomic import write_atomic

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


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(callback=_host, help="bind address (overrides listen.host)")] = None,
    port: Annotated[int | None, typer.Option(callback=_port, help="port (overrides listen.port)")] = None,
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
            callback=_log_format,
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
    from turnout.gateway.app import create_app
    from turnout.gateway.keys import DATABASE
    from turnout.redaction import configure_logging
    from turnout.state.data_dir import data_dir_problem
    from turnout.state.placement_store import PlacementFileError
    from turnout.store.db import StoreError

    count = processes.cpu_count() if workers in ("auto", "0") else int(workers)
    configure_logging(log_level, log_format or "text")
    path = _resolve_config(config)
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        _fail(str(exc))
        return
    configure_logging(log_level, log_format or settings.logging.format, pid=count > 1)
    # Alembic logs each migration step and (1.16+) each of its plugins at INFO: one line of ours says it instead.
    logging.getLogger("alembic").setLevel(logging.DEBUG if log_level == "debug" else logging.WARNING)
    if access_log is None:
        access_log = settings.logging.access_log
    bind_host = host or settings.listen.host
    if settings.auth.open and not is_loopback(bind_host):
        _fail(f"auth.open is set but --host {bind_host} is not a loopback address; open access is loopback-only")
        return
    bind_port = port or settings.listen.port
    problem = processes.processes_problem(settings, count)
    if problem is not None:
        _fail(problem)
        return
    try:  # before anything is written: a busy port changes nothing
        groups = processes.bind_group(bind_host, bind_port, count) if count > 1 else [server.bind(bind_host, bind_port)]
    except server.BindError as exc:
        _fail(str(exc))
        return
    sockets = [sock for group in groups for sock in group]
    problem = data_dir_problem(settings.data_dir)
    if problem is not None:
        _close(sockets)
        _fail(
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
        _fail(f"{exc}\nfix the file or delete it to fall back to the config baseline")
        return
    except (StoreError, ConfigError) as exc:
        _close(sockets)
        _fail(str(exc))
        return
    except OSError as exc:
        _close(sockets)
        _fail(f"cannot use {exc.filename or settings.data_dir}: {exc.strerror or exc}; check its owner and mode")
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
    from turnout.gateway.app import create_app
    from turnout.gateway.shared_limits import LimitKeeper

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
        keeper=None if settings.storage.redis_url else LimitKeeper(),  # with Redis, Redis counts
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
    from turnout.cli_accounts import cli_actor
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


@app.command()
def agent(
    port: Annotated[int, typer.Option(callback=_port, help="agent API port")] = 8080,
    host: Annotated[
        str,
        typer.Option(
            callback=_host,
            envvar="POD_IP",
            help="bind address of the agent and of its engines; in a pod, set POD_IP (the pod's IP) or 0.0.0.0",
        ),
    ] = "127.0.0.1",
    registry: Annotated[Path, typer.Option(help="engines.json (in pods: /var/run/aibrix/engines.json)")] = Path(
        "turnout-data/engines.json"
    ),
    engine_ports: Annotated[
        str, typer.Option(help="port range for engines, LOW-HIGH (AIBrix runtime's range by default)")
    ] = "20000-20999",
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="the node's weight cache: Hugging Face hub entries and AIBrix served markers "
            "(default: $AIBRIX_WEIGHT_CACHE_DIR, else none)"
        ),
    ] = None,
    mock: Annotated[
        bool,
        typer.Option(
            "--mock",
            help="answer the agent API without launching engines, for tests and demos "
            "(also AIBRIX_MODEL_RUNTIME_MOCK=1)",
        ),
    ] = False,
    engine_python: Annotated[
        list[str] | None,
        typer.Option(help="ENGINE=PYTHON: the interpreter that has this engine installed (repeatable)"),
    ] = None,
    boot_timeout_s: Annotated[
        float | None,
        typer.Option(
            min=1,
            help="seconds an engine may take to answer its health check after it starts or is re-adopted, then it "
            "is killed and restarted (default: the engine's own: vLLM's VLLM_ENGINE_READY_TIMEOUT_S, 600; SGLang "
            "720; llama.cpp 600)",
        ),
    ] = None,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "text",
) -> None:
    """Run the runtime agent: one supervised engine process per model claim."""
    from aiohttp import web

    from turnout.config import ConfigError, agent_env
    from turnout.core.runtime import ENGINES
    from turnout.redaction import configure_logging
    from turnout.runtime.agent import create_agent_app

    configure_logging(log_level, log_format)
    low, _, high = engine_ports.partition("-")
    if not (low.isdigit() and high.isdigit() and 0 < int(low) <= int(high) < 65536):
        _fail(f"--engine-ports {engine_ports!r}: use LOW-HIGH, e.g. 20000-20999")
    pythons = {}
    for item in engine_python or []:
        engine, sep, exe = item.partition("=")
        if not sep or engine not in ENGINES or not exe:
            _fail(f"--engine-python {item!r}: use ENGINE=PATH with ENGINE one of vllm, sglang, llamacpp")
        pythons[engine] = exe
    try:
        env = agent_env()
    except ConfigError as exc:
        _fail(str(exc))
    application = create_agent_app(
        registry_path=registry,
        log_dir=registry.parent / "engine-logs",
        port_range=(int(low), int(high)),
        cache_dir=cache_dir if cache_dir is not None else env.weight_cache_dir,
        engine_python=pythons,
        engine_host=host,
        mock=mock or env.mock,
        boot_timeout_s=boot_timeout_s,
    )
    web.run_app(application, host=host, port=port, print=None, access_log=None)


claim_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="ModelClaims for the local controller.")
DataDirOption = Annotated[
    Path | None, typer.Option("--data-dir", help="where claims and their status live (default: the config's data dir)")
]


def _claims_dir(config: Path | None, data_dir: Path | None) -> Path:
    """The data dir a gateway with this config reads its claims from (``--data-dir`` overrides it). Without
    ``--config`` and with no ./turnout-data/config.json yet, the default data dir ./turnout-data."""
    from turnout.config import ConfigError, load_settings

    if data_dir is not None:
        return data_dir
    if config is None and not DEFAULT_CONFIG.exists():
        return DEFAULT_CONFIG.parent
    try:
        return load_settings(config or DEFAULT_CONFIG).data_dir
    except ConfigError as exc:
        _fail(str(exc))
        raise  # unreachable: _fail exits


def _claims_database(config: Path | None, data_dir: Path | None) -> str | None:
    """The database URL the config names, where claim changes are audited (None: SQLite in the claims' data
    dir, as for a gateway on it)."""
    from turnout.config import ConfigError, load_settings

    if config is None and (data_dir is not None or not DEFAULT_CONFIG.exists()):
        return None
    try:
        return load_settings(config or DEFAULT_CONFIG).storage.database_url
    except ConfigError as exc:
        _fail(str(exc))
        raise  # unreachable: _fail exits


def _claim_doc(files: Any, name: str) -> Any:
    """A claim's stored document (None: there is none), for the audit entry's ``before``."""
    import orjson

    path = files.dir / f"{name}.json"
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


@claim_app.command("apply")
def claim_apply(
    file: Annotated[Path, typer.Option("-f", "--file", help="ModelClaim YAML or JSON (several documents allowed)")],
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Create or update claims; refused whole (nothing written) when any document is invalid. Audited."""
    from turnout.cli_changes import audit_log, audited_claim, record
    from turnout.controller.local import ClaimFiles, load_claim_documents
    from turnout.core.claims import InvalidClaim

    try:
        docs = load_claim_documents(file.read_text())
    except (OSError, InvalidClaim, ValueError) as exc:
        _fail(f"{file}: {exc}")
        return
    where = _claims_dir(config, data_dir)
    files = ClaimFiles(where)
    with audit_log(_claims_database(config, data_dir), where, "claims") as db:
        for doc in docs:
            before = _claim_doc(files, doc["metadata"]["name"])
            name = files.apply(doc)
            after = _claim_doc(files, name)
            record(
                db,
                str(files.dir / f"{name}.json"),
                action="claim.apply",
                target=f"claim:{name}",
                before=audited_claim(before),
                after=audited_claim(after),
            )
            typer.echo(f"modelclaim/{name} configured")


@claim_app.command("list")
def claim_list(
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Claims with their phase, pod and port, and why one is not Active."""
    from turnout.cli_tables import echo_json, render, table
    from turnout.controller.local import ClaimFiles

    where = _claims_dir(config, data_dir)
    files = ClaimFiles(where)
    statuses = files.statuses()
    rows = []
    for doc in files.all():
        name = doc["metadata"]["name"]
        st = statuses.get(name, {})
        phase = "Deleting" if doc.get("deleting") else st.get("phase", "Pending")
        rows.append(
            {
                "name": name,
                "model": st.get("model") or (doc.get("spec") or {}).get("modelName") or name,
                "phase": phase,
                "pod": st.get("pod") or None,
                "port": st.get("port", 0),
                "reason": st.get("reason") or None,
                "message": st.get("message") or None,
            }
        )
    if as_json:
        echo_json(rows)
        return
    if not rows:
        typer.echo(f"no claims in {where}; create one with: turnout claim apply -f CLAIM.yaml")
        return
    out = []
    for r in rows:
        reason = r["reason"] or ""
        if r["message"] and r["phase"] not in ("Active", "Deleting"):
            reason = f"{reason}: {r['message']}"
        out.append([r["name"], r["model"], r["phase"], r["pod"], r["port"], reason])
    render(table(["NAME", "MODEL", "PHASE", "POD", "PORT", "REASON"], out, right=(4,)))


@claim_app.command("events")
def claim_events(config: ConfigOption = None, data_dir: DataDirOption = None) -> None:
    """Recent controller events: phase changes, idle sleeps, invalid pool policies (repeats counted)."""
    from turnout.controller.local import ClaimFiles

    typer.echo(f"{'LAST SEEN':20} {'TYPE':8} {'REASON':18} {'OBJECT':28} {'COUNT':>5}  MESSAGE")
    for e in ClaimFiles(_claims_dir(config, data_dir)).events():
        typer.echo(
            f"{e['lastTimestamp']:20} {e['type']:8} {e['reason']:18} {e['object']:28} {e['count']:>5}  {e['message']}"
        )


@claim_app.command("delete")
def claim_delete(
    name: Annotated[str, typer.Argument(help="the claim's metadata.name")],
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Mark a claim deleted; the controller de-routes it, stops its engine, then forgets it. Audited."""
    from turnout.cli_changes import audit_log, audited_claim, record
    from turnout.controller.local import ClaimFiles

    where = _claims_dir(config, data_dir)
    files = ClaimFiles(where)
    if _claim_doc(files, name) is None:
        _fail(f'no claim "{name}" in {where}')
    with audit_log(_claims_database(config, data_dir), where, "claims") as db:
        before = _claim_doc(files, name)
        if not files.mark_deleted(name):
            _fail(f'no claim "{name}" in {where}')
        record(
            db,
            str(files.dir / f"{name}.json"),
            action="claim.delete",
            target=f"claim:{name}",
            before=audited_claim(before),
            after=audited_claim(_claim_doc(files, name)),
        )
    typer.echo(f"modelclaim/{name} deleting")


@app.command()
def controller(
    pools: Annotated[
        Path, typer.Option(help='JSON list of pools: [{"name","agent_url","address","gpus","labels","policy"}]')
    ],
    data_dir: Annotated[Path, typer.Option("--data-dir", help="where claims and their status live")] = Path(
        "turnout-data"
    ),
    interval: Annotated[float, typer.Option(callback=_interval, help="seconds between reconcile ticks")] = 2.0,
    metrics_port: Annotated[
        int,
        typer.Option(
            callback=_optional_port, help="serve the aibrix_modelclaim_* metrics on 127.0.0.1:PORT/metrics (0: off)"
        ),
    ] = 0,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "text",
) -> None:
    """Run the local ModelClaim controller against runtime agents."""
    import asyncio

    from turnout.controller.local import ClaimFiles, LocalController, load_pools
    from turnout.redaction import configure_logging
    from turnout.upstream.client import UpstreamClient

    configure_logging(log_level, log_format)
    try:
        pool_list = load_pools(pools)
    except (OSError, ValueError, KeyError) as exc:
        _fail(f"{pools}: {exc}")
        return

    async def main() -> None:
        from prometheus_client import start_http_server

        client = UpstreamClient(connect_timeout_s=3, total_timeout_s=30)
        ctl = LocalController(ClaimFiles(data_dir), pool_list, client)
        if metrics_port:
            start_http_server(metrics_port, addr="127.0.0.1", registry=ctl.metrics.registry)
        try:
            await ctl.run(interval)
        finally:
            await client.close()

    asyncio.run(main())


@app.command()
def operator(
    namespace: Annotated[
        list[str] | None, typer.Option("--namespace", "-n", help="watch these namespaces (repeatable)")
    ] = None,
    all_namespaces: Annotated[bool, typer.Option("--all-namespaces", help="watch the whole cluster")] = False,
    interval: Annotated[
        float, typer.Option(callback=_interval, help="seconds between reconcile passes per claim and pool")
    ] = 5.0,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="kubeconfig file (default: in-cluster service account, then ~/.kube/config)")
    ] = None,
    metrics_port: Annotated[
        int, typer.Option(callback=_optional_port, help="serve aibrix_modelclaim_* metrics on this port (0: off)")
    ] = 8080,
    liveness_port: Annotated[
        int, typer.Option(callback=_optional_port, help="kopf liveness endpoint /healthz on this port (0: off)")
    ] = 0,
    log_level: LogLevelOption = "info",
    log_format: LogFormatOption = "text",
) -> None:
    """Run the Kubernetes ModelClaim operator (CRD modelclaims.model.aibrix.ai; manifests in deploy/)."""
    try:
        import kopf
        from prometheus_client import start_http_server

        from turnout.controller.kube import OperatorConfig, build_registry
        from turnout.controller.metrics import ControllerMetrics
        from turnout.redaction import configure_logging
    except ImportError as exc:
        _fail(f"the operator needs its extra: pip install 'turnout[operator]' ({exc})")
        return
    if not namespace and not all_namespaces:
        _fail("say which namespaces to watch: --namespace NS (repeatable) or --all-namespaces")
    configure_logging(log_level, log_format)
    metrics = ControllerMetrics()
    if metrics_port:
        start_http_server(metrics_port, registry=metrics.registry)
    registry = build_registry(
        OperatorConfig(interval_s=interval, namespaces=tuple(namespace or ()), kubeconfig=kubeconfig), metrics
    )
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=all_namespaces,
        namespaces=namespace or (),
        liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
    )


@config_app.command("check")
def config_check(config: ConfigOption = None) -> None:
    """Validate a config file without starting anything (exit 2 when invalid)."""
    from turnout.config import ConfigError, load_settings

    path = config or DEFAULT_CONFIG
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        _fail(str(exc))
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


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


app.add_typer(config_app, name="config")
app.add_typer(worker_app, name="worker")
register_accounts(app)
register_backup(app)
app.add_typer(claim_app, name="claim")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
