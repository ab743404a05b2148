"""`turnout key ...`, `turnout usage`, `turnout audit`: the same actions as the admin API, on the store.

They open the database named by the config directly, so they work whether or not the gateway runs.
A running gateway sees a CLI revocation within ``auth.key_cache_s`` seconds.
"""

from __future__ import annotations

import getpass
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnout.defaults import DEFAULT_CONFIG
from turnout.errors import TurnoutError, Unprocessable
from turnout.store.bounds import MAX_AUDIT_ENTRIES

if TYPE_CHECKING:
    from turnout.config import Settings
    from turnout.store.db import Database

# The store stack (SQLAlchemy, the admin input models) is imported inside the commands, so that
# `turnout --help` does not pay for it.

__all__ = [
    "DEFAULT_CONFIG",
    "ConfigOption",
    "cli_actor",
    "cli_audit",
    "cli_input",
    "fail",
    "key_app",
    "open_store",
    "register",
]

key_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Create, list, edit, revoke and rotate API keys."
)
ConfigOption = Annotated[Path, typer.Option("--config", "-c", help="config file")]


def fail(message: str) -> None:
    typer.echo(f"turnout: {message}", err=True)
    raise typer.Exit(2)


@contextmanager
def cli_input(**flags: str) -> Iterator[None]:
    """Checks by the admin API's own input models (same bounds): a bad value exits 2 naming the option
    (``--<field>``, or ``flags[field]`` where the option is named otherwise)."""
    try:
        yield
    except Unprocessable as exc:
        field = (exc.field or "").split(".")[0].split("[")[0]
        flag = flags.get(field, field.replace("_", "-"))
        fail(f"--{flag}: {exc.message}" if flag else exc.message)


@contextmanager
def open_store(config: Path) -> Iterator[tuple[Settings, Database]]:
    from turnout.config import ConfigError, load_settings
    from turnout.core.patterns import PatternError
    from turnout.store.db import Database, StoreError, database_url
    from turnout.store.secrets import SecretError

    try:
        settings = load_settings(config)
        db = Database(database_url(settings.storage.database_url, settings.data_dir))
        db.migrate()
    except (ConfigError, StoreError) as exc:
        fail(str(exc))
        raise  # unreachable: fail exits
    try:
        yield settings, db
    except (StoreError, KeyError, TurnoutError, PatternError, SecretError) as exc:
        fail(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
    finally:
        db.close()


def cli_audit(db: Database, **entry: Any) -> None:
    """Append an audit entry made from the command line (actor ``cli:<user>``)."""
    from turnout.store.audit import AuditLog

    AuditLog(db).record(actor=cli_actor(), **entry)


def cli_actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


@key_app.command("create")
def key_create(
    app: Annotated[str, typer.Option(help="application the key is for (created when new)")],
    tenant: Annotated[str | None, typer.Option(help="tenant of a new app (default: default)")] = None,
    models: Annotated[str | None, typer.Option(help="comma-separated scopes, e.g. model:qwen3:*,llama3.2")] = None,
    rpm: Annotated[int | None, typer.Option(min=1, help="requests per minute")] = None,
    daily_tokens: Annotated[int | None, typer.Option(min=1, help="tokens per UTC day")] = None,
    expires: Annotated[str | None, typer.Option(help="2026-12-31, an ISO time, or a duration such as 30d")] = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Create a key; it is printed once and only its hash is stored."""
    from turnout.admin.inputs import KeyCreate, parse_input
    from turnout.store.keys import KeyStore, parse_scopes

    now = time.time()
    with cli_input():
        spec = parse_input(
            KeyCreate,
            {
                "app": app,
                "tenant": tenant,
                "models": models.split(",") if models else None,
                "rpm": rpm,
                "daily_tokens": daily_tokens,
                "expires": expires or None,
            },
        )
        expires_at = spec.expires_at(now)
    with open_store(config) as (_, db):
        record, plaintext = KeyStore(db).create(
            app=spec.app,
            tenant=spec.tenant,
            scopes=parse_scopes(spec.models),
            rpm=spec.rpm,
            daily_tokens=spec.daily_tokens,
            expires_at=expires_at,
            now=now,
        )
        cli_audit(db, action="key.create", target=f"key:{record.prefix}", after=record.to_json(), now=now)
    typer.echo(plaintext)
    typer.echo(f"key {record.prefix} for app {record.app} (tenant {record.tenant}); shown only once", err=True)


@key_app.command("list")
def key_list(
    config: ConfigOption = DEFAULT_CONFIG,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    tenant: Annotated[str | None, typer.Option(help="only this tenant's keys")] = None,
    app: Annotated[str | None, typer.Option(help="only this app's keys")] = None,
    endpoint: Annotated[str | None, typer.Option(help="only keys whose scopes reach this endpoint's models")] = None,
    state: Annotated[str | None, typer.Option(help="active, revoked, expired or in_grace")] = None,
) -> None:
    """List keys (prefix, app, scopes, limits, state, last use)."""
    from turnout.admin.inputs import KeyListQuery, parse_input
    from turnout.store.keys import KeyStore
    from turnout.store.usage import UsageStore

    with cli_input():
        query = parse_input(KeyListQuery, {"tenant": tenant, "app": app, "endpoint": endpoint, "state": state})
    with open_store(config) as (_, db):
        records = KeyStore(db).all()
        used = UsageStore(db).last_used()
    now = time.time()
    records = [r for r in records if query.matches(r, now)]
    if as_json:
        typer.echo(json.dumps([{**r.to_json(now), "last_used": used.get(r.id)} for r in records], indent=2))
        return
    typer.echo(
        f"{'ID':>4}  {'PREFIX':10}  {'APP':16}  {'TENANT':12}  {'RPM':>6}  {'TOKENS/DAY':>10}  {'STATE':8}  "
        f"{'LAST USED':16}  MODELS"
    )
    for r in records:
        last = used.get(r.id)
        shown = "-" if last is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(last))
        typer.echo(
            f"{r.id:>4}  {r.prefix:10}  {r.app[:16]:16}  {r.tenant[:12]:12}  {r.rpm or '-':>6}  "
            f"{r.daily_tokens or '-':>10}  {r.state(now):8}  {shown:16}  {','.join(p.text for p in r.scopes)}"
        )


@key_app.command("edit")
def key_edit(
    ref: Annotated[str, typer.Argument(help="key id or prefix")],
    models: Annotated[str | None, typer.Option(help="new comma-separated scopes (replace the old ones)")] = None,
    rpm: Annotated[str | None, typer.Option(help="requests per minute; 'none' removes the limit")] = None,
    daily_tokens: Annotated[str | None, typer.Option(help="tokens per UTC day; 'none' removes the limit")] = None,
    expires: Annotated[str | None, typer.Option(help="2026-12-31, an ISO time, 30d ...; 'never' removes it")] = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Change a key's scopes and limits (PATCH /admin/api/keys/{ref}); only the options given change."""
    from turnout.admin.inputs import KeyChange, parse_input
    from turnout.store.keys import KeyStore

    body: dict[str, object] = {}
    if models is not None:
        body["models"] = [m for m in models.split(",") if m]
    for name, value in (("rpm", rpm), ("daily_tokens", daily_tokens)):
        if value is not None:
            body[name] = None if value.lower() == "none" else _count(value, name)
    if expires is not None:
        body["expires"] = None if expires.lower() == "never" else expires
    now = time.time()
    with cli_input():
        changes = parse_input(KeyChange, body).changes(now)
    with open_store(config) as (_, db):
        before, after = KeyStore(db).update(ref, now=now, **changes)
        cli_audit(
            db,
            action="key.change",
            target=f"key:{after.prefix}",
            before=before.to_json(now),
            after=after.to_json(now),
            now=now,
        )
    typer.echo(json.dumps(after.to_json(now), indent=2))


def _count(value: str, name: str) -> int | str:
    """An integer option given as text (so 'none' can remove it); left as text when it is not digits, so
    the shared input model says what is wrong."""
    return int(value) if value.isascii() and value.isdigit() else value


@key_app.command("revoke")
def key_revoke(
    ref: Annotated[str, typer.Argument(help="key id or prefix")], config: ConfigOption = DEFAULT_CONFIG
) -> None:
    """Revoke a key at once."""
    from turnout.store.keys import KeyStore

    now = time.time()
    with open_store(config) as (_, db):
        before, after = KeyStore(db).revoke(ref, now=now)
        cli_audit(
            db,
            action="key.revoke",
            target=f"key:{after.prefix}",
            before=before.to_json(),
            after=after.to_json(),
            now=now,
        )
    typer.echo(f"revoked {after.prefix}")


@key_app.command("rotate")
def key_rotate(
    ref: Annotated[str, typer.Argument(help="key id or prefix")],
    grace: Annotated[
        float | None, typer.Option(help="seconds the old key keeps working (default auth.rotate_grace_s)")
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Issue a replacement key; the old one keeps working for the grace period."""
    from turnout.admin.inputs import KeyRotate, parse_input
    from turnout.store.keys import KeyStore

    now = time.time()
    with cli_input(grace_s="grace"):
        spec = parse_input(KeyRotate, {"grace_s": grace})
    with open_store(config) as (settings, db):
        grace_s = settings.auth.rotate_grace_s if spec.grace_s is None else spec.grace_s
        old, new, plaintext = KeyStore(db).rotate(ref, grace_s=grace_s, now=now)
        cli_audit(
            db,
            action="key.rotate",
            target=f"key:{old.prefix}",
            before=old.to_json(),
            after=new.to_json(),
            now=now,
        )
    typer.echo(plaintext)
    typer.echo(f"new key {new.prefix}; {old.prefix} works for {grace_s:g} more seconds", err=True)


def usage(
    key: Annotated[str | None, typer.Option(help="key id or prefix")] = None,
    since: Annotated[str, typer.Option(help="24h, 7d, 2026-12-01 ...")] = "24h",
    until: Annotated[str | None, typer.Option(help="end of the range (default now)")] = None,
    bucket: Annotated[str, typer.Option(help="minute, hour or day")] = "hour",
    endpoint: Annotated[
        str | None, typer.Option(help="an external endpoint (served by it or fell back from it)")
    ] = None,
    worker: Annotated[str | None, typer.Option(help="the worker that served the requests")] = None,
    model: Annotated[str | None, typer.Option(help="the model asked for")] = None,
    route: Annotated[str | None, typer.Option(help="the client API route, e.g. openai:chat")] = None,
    series: Annotated[bool, typer.Option("--series", help="one point per bucket (totals, as charted)")] = False,
    output_format: Annotated[str, typer.Option("--format", help="json or csv")] = "json",
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Usage per key, endpoint and worker (or, with --series, one total per bucket)."""
    from turnout.admin.inputs import UsageQuery, parse_input
    from turnout.store.keys import KeyStore
    from turnout.store.usage import SERIES_COLUMNS, SUMMARY_COLUMNS, UsageFilter, UsageStore, to_csv

    now = time.time()
    with cli_input():
        query = parse_input(
            UsageQuery,
            {
                "key": key,
                "since": since,
                "until": until,
                "bucket": bucket,
                "endpoint": endpoint,
                "worker": worker,
                "model": model,
                "route": route,
                "format": output_format,
            },
        )
        since_ts = query.since_ts(now)
        until_ts = query.until_ts(now) if series or until is not None else None
    with open_store(config) as (_, db):
        key_id = KeyStore(db).get(query.key).id if query.key else None
        where = UsageFilter(
            key_id=key_id, endpoint=query.endpoint, worker=query.worker, model=query.model, route=query.route
        )
        store = UsageStore(db)
        try:
            if series:
                assert until_ts is not None
                rows = store.series(since=since_ts, until=until_ts, bucket=query.bucket, where=where)
            else:
                rows = store.summary(since=since_ts, bucket=query.bucket, where=where, until=until_ts)
        except ValueError as exc:
            fail(f"--bucket: {exc}")
    if query.format == "csv":
        typer.echo(to_csv(rows, SERIES_COLUMNS if series else SUMMARY_COLUMNS), nl=False)
        return
    typer.echo(json.dumps(rows, indent=2))


def audit(
    since: Annotated[str | None, typer.Option(help="24h, 7d, 2026-12-01 ...")] = None,
    until: Annotated[str | None, typer.Option(help="end of the range (default now)")] = None,
    action: Annotated[str | None, typer.Option(help="e.g. key.create, placement.toggle")] = None,
    actor: Annotated[str | None, typer.Option(help="e.g. admin-api, or a prefix such as 'cli:*'")] = None,
    target: Annotated[str | None, typer.Option(help="a target prefix, e.g. key:tk_ab or worker:a")] = None,
    limit: Annotated[int, typer.Option(help=f"at most {MAX_AUDIT_ENTRIES}")] = 100,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """The audit log, newest first."""
    from turnout.admin.inputs import AuditQuery, parse_input
    from turnout.store.audit import AuditLog

    now = time.time()
    with cli_input():
        query = parse_input(
            AuditQuery,
            {"since": since, "until": until, "action": action, "actor": actor, "target": target, "limit": limit},
        )
        since_ts, until_ts = query.since_ts(now), query.until_ts(now)
    with open_store(config) as (_, db):
        entries = AuditLog(db).entries(
            since=since_ts,
            until=until_ts,
            action=query.action,
            actor=query.actor,
            target=query.target,
            limit=query.limit,
        )
    typer.echo(json.dumps([e.to_json() for e in entries], indent=2))


def register(app: typer.Typer) -> None:
    from turnout.cli_endpoints import endpoint_app

    app.add_typer(key_app, name="key")
    app.add_typer(endpoint_app, name="endpoint")
    app.command("usage")(usage)
    app.command("audit")(audit)
