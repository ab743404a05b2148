"""`turnout worker add|list|remove`: the config file's workers, without editing JSON by hand.

``add`` and ``remove`` read the file, change only its ``workers`` list, validate the whole result with the same
model that loads it (so anything ``turnout serve`` would refuse is refused here, nothing written; a pasted API
suffix such as LM Studio's ``/v1`` is dropped as for endpoints, and said), and write it
back with the atomic writer, keeping the file's mode. ``add`` also refuses a name a registered external endpoint
already has (both are routed by name). A gateway reads its config once, at start: both say whether one is
running on the config's data dir and needs a restart.

Both change routing, so both are audited (``worker.add``, ``worker.remove``; actor ``cli:<user>``) in the
store the config names (:mod:`turnout.cli.common`): the store is opened first, and a change that could not be
audited is not made.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnout.cli.common import DEFAULT_CONFIG, ConfigOption, audit_log, audited_worker, fail, record

if TYPE_CHECKING:
    from turnout.config import Settings
    from turnout.store.db import Database

__all__ = ["register", "worker_app"]

worker_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The config file's workers (the servers Turnout polls and routes to).",
)

NameArgument = Annotated[str, typer.Argument(help="the worker's name (letters, digits, '.', '_', '-')")]
_FLAGS = {"name": "NAME", "url": "--url", "type": "--type", "max_concurrent": "--max-concurrent"}


def _read(config: Path) -> tuple[dict[str, Any], Settings]:
    """The file's JSON document and its validated settings; exits 2 saying why when either cannot be had."""
    from turnout.config import ConfigError, read_config_document, settings_from_document

    if not config.exists():
        fail(f"{config}: config file not found; `turnout serve` creates it on first start, or give --config PATH")
    try:
        document = read_config_document(config)
        return document, settings_from_document(config, document)
    except ConfigError as exc:
        fail(f"{exc}\nfix the file first (turnout config check --config {config})")
        raise  # unreachable: fail exits


def _write(config: Path, document: dict[str, Any]) -> Settings:
    """Validate ``document`` as the whole config, then replace the file atomically (same mode)."""
    from turnout.atomic import write_atomic
    from turnout.config import ConfigError, settings_from_document

    try:
        settings = settings_from_document(config, document)
    except ConfigError as exc:
        fail(f"not changed: {exc}")
        raise  # unreachable: fail exits
    mode = stat.S_IMODE(config.stat().st_mode)
    write_atomic(config, (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode(), mode=mode)
    return settings


def _endpoint_named(db: Database, name: str) -> bool:
    """Whether a registered external endpoint has ``name``."""
    from turnout.store.endpoints import EndpointStore

    return EndpointStore(db).exists(name)


def _restart_note(settings: Settings) -> str:
    from turnout.state.running import gateway_running

    if gateway_running(settings.data_dir):
        return (
            f"a gateway is running on {settings.data_dir} and reads its config only at start: restart it "
            "(Ctrl-C, then turnout serve) for this to take effect"
        )
    return "no gateway is running on this data dir; the next `turnout serve` uses it"


@worker_app.command("add")
def add(
    name: NameArgument,
    url: Annotated[str, typer.Option(help="base URL, e.g. http://10.0.0.5:11434 (Ollama) or http://h:8000")],
    worker_type: Annotated[str, typer.Option("--type", help="ollama or openai (OpenAI-compatible)")] = "ollama",
    max_concurrent: Annotated[int | None, typer.Option(help="requests in flight on this worker")] = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Add a worker to the config file (validated as `turnout serve` would)."""
    from pydantic import ValidationError

    from turnout.config import Worker, format_validation_error
    from turnout.core.endpoint_rules import base_url, url_note

    document, settings = _read(config)
    note = url_note(url)  # a pasted http://host:1234/v1: Turnout appends /v1/... itself
    url = base_url(url).url
    entry: dict[str, Any] = {"name": name, "url": url, "type": worker_type}
    if max_concurrent is not None:
        entry["max_concurrent"] = max_concurrent
    try:
        Worker.model_validate(entry)
    except ValidationError as exc:
        first = exc.errors()[0]
        flag = _FLAGS.get(str(first["loc"][0]), "") if first["loc"] else ""
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["type"] == "string_pattern_mismatch":
            message = "use letters, digits, '.', '_' and '-', starting with a letter or digit"
        fail(f"{flag}: {message}" if flag else f"invalid worker:\n{format_validation_error(exc)}")
    if settings.worker(name) is not None:
        fail(f'{config} already has a worker "{name}"; remove it first (turnout worker remove {name}) or pick another')
    from turnout.store.db import StoreError

    with audit_log(settings.storage.database_url, settings.data_dir, "the workers") as db:
        try:
            clash = _endpoint_named(db, name)
        except StoreError as exc:
            fail(f"not changed: cannot check the name against the registered endpoints: {exc}")
            raise  # unreachable: fail exits
        if clash:
            fail(
                f'"{name}" is the name of a registered endpoint (turnout endpoint list); workers and endpoints are '
                "routed by name, so pick another worker name"
            )
        workers = document.get("workers")
        document["workers"] = [*(workers if isinstance(workers, list) else []), entry]
        written = _write(config, document)
        record(db, str(config), action="worker.add", target=f"worker:{name}", after=audited_worker(entry))
    typer.echo(f'added worker "{name}" ({worker_type}, {url}) to {config}' + (f"; {note}" if note else ""))
    typer.echo(_restart_note(written))


@worker_app.command("list")
def list_workers(
    config: ConfigOption = DEFAULT_CONFIG,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """The config file's workers; with a gateway running on the config, also each one's health and what its engine
    runs at once (per model, and how that was found: declared, engine, learned, assumed)."""
    _, settings = _read(config)
    rows: list[dict[str, Any]] = [
        {
            "name": w.name,
            "type": w.type.value,
            "url": w.base_url,
            "max_concurrent": w.max_concurrent,
            "placement": w.model_placement.mode.value,
        }
        for w in settings.workers
    ]
    if settings.demo is not None:  # not polled: the gateway runs it (turnout.core.demo)
        from turnout.core.demo import describe

        rows.append(
            {
                "name": settings.demo.name,
                "type": "demo",
                "url": f"({describe(settings.demo.threads)})",
                "max_concurrent": None,
                "placement": "-",
            }
        )
    live = _live(settings)
    for row in rows:
        row.update(live.get(row["name"], {}))
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    width = max([4, *(len(r["name"]) for r in rows)])
    head = f"{'NAME':{width}}  {'TYPE':6}  {'MAX':>5}  {'PLACEMENT':10}"
    typer.echo(f"{head}  {'HEALTH':7}  {'AT ONCE':24}  URL" if live else f"{head}  URL")
    for r in rows:
        most = "-" if r["max_concurrent"] is None else r["max_concurrent"]
        line = f"{r['name']:{width}}  {r['type']:6}  {most:>5}  {r['placement']:10}"
        if live:
            health = "-" if "healthy" not in r else ("up" if r["healthy"] else "down")
            line += f"  {health:7}  {_at_once(r.get('parallelism')):24}"
        typer.echo(f"{line}  {r['url']}")


def _live(settings: Settings) -> dict[str, dict[str, Any]]:
    """Each worker's health and parallelism from the running gateway's inventory; {} when none answers."""
    from turnout.cli.client import GatewayError, connect

    client = connect(settings, timeout_s=10, fallback="showing the config's workers only")
    if client is None:
        return {}
    try:
        body = client.call("GET", "/admin/api/inventory")
    except GatewayError as exc:
        typer.echo(f"turnout: the gateway's inventory: {exc.message}; showing the config's workers only", err=True)
        return {}
    workers = body.get("workers") if isinstance(body, dict) else None
    return {
        w["name"]: {"healthy": w.get("healthy"), "engine": w.get("engine"), "parallelism": w.get("parallelism")}
        for w in workers or []
        if isinstance(w, dict) and isinstance(w.get("name"), str)
    }


def _at_once(parallelism: Any) -> str:
    """``2 (engine)``; ``1 (assumed)``; per model when they differ: ``m1 2 (learned), m2 1 (assumed)``."""
    if not isinstance(parallelism, dict) or not parallelism:
        return "-"

    def one(p: dict[str, Any]) -> str:
        slots = "batching" if p.get("slots") is None else p["slots"]
        return f"{slots} ({p.get('source')})"

    shown = {model: one(p) for model, p in parallelism.items() if isinstance(p, dict)}
    if len(set(shown.values())) == 1:
        return next(iter(shown.values()))
    return ", ".join(f"{model} {text}" for model, text in shown.items())


@worker_app.command("remove")
def remove(name: NameArgument, config: ConfigOption = DEFAULT_CONFIG) -> None:
    """Remove a worker from the config file."""
    document, settings = _read(config)
    demo = settings.demo is not None and settings.demo.name == name
    if settings.worker(name) is None and not demo:
        fail(f'{config} has no worker "{name}" (turnout worker list shows them)')
    before = next(w for w in document["workers"] if isinstance(w, dict) and w.get("name") == name)
    with audit_log(settings.storage.database_url, settings.data_dir, "the workers") as db:
        document["workers"] = [w for w in document["workers"] if w is not before]
        written = _write(config, document)
        record(db, str(config), action="worker.remove", target=f"worker:{name}", before=audited_worker(before))
    typer.echo(f'removed worker "{name}" from {config}')
    typer.echo(_restart_note(written))


def register(app: typer.Typer) -> None:
    app.add_typer(worker_app, name="worker")
