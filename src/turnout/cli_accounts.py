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
from typing import Annotated, Any

import typer

from turnout.admin.inputs import MAX_AUDIT_LIMIT, AuditQuery, KeyCreate, KeyRotate, UsageQuery, parse_input
from turnout.config import CONFIG_FILE_NAME, ConfigError, Settings, load_settings
from turnout.core.patterns import PatternError
from turnout.errors import TurnoutError, Unprocessable
from turnout.store.audit import AuditLog
from turnout.store.db import Database, StoreError, database_url
from turnout.store.keys import KeyStore, parse_scopes
from turnout.store.secrets import SecretError
from turnout.store.usage import UsageStore

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

key_app = typer.Typer(no_args_is_help=True, help="Create, list, revoke and rotate API keys.")
DEFAULT_CONFIG = Path("turnout-data") / CONFIG_FILE_NAME
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
def key_list(config: ConfigOption = DEFAULT_CONFIG, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List keys (prefix, app, scopes, limits, state)."""
    with open_store(config) as (_, db):
        records = KeyStore(db).all()
    if as_json:
        typer.echo(json.dumps([r.to_json() for r in records], indent=2))
        return
    now = time.time()
    typer.echo(f"{'ID':>4}  {'PREFIX':10}  {'APP':16}  {'TENANT':12}  {'RPM':>6}  {'TOKENS/DAY':>10}  STATE  MODELS")
    for r in records:
        state = r.usable(now) or "active"
        state = {"this API key was revoked": "revoked", "this API key has expired": "expired"}.get(state, state)
        typer.echo(
            f"{r.id:>4}  {r.prefix:10}  {r.app[:16]:16}  {r.tenant[:12]:12}  {r.rpm or '-':>6}  "
            f"{r.daily_tokens or '-':>10}  {state:6} {','.join(p.text for p in r.scopes)}"
        )


@key_app.command("revoke")
def key_revoke(
    ref: Annotated[str, typer.Argument(help="key id or prefix")], config: ConfigOption = DEFAULT_CONFIG
) -> None:
    """Revoke a key at once."""
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
    bucket: Annotated[str, typer.Option(help="hour or day")] = "hour",
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Usage per key, endpoint and worker."""
    now = time.time()
    with cli_input():
        query = parse_input(UsageQuery, {"key": key, "since": since, "bucket": bucket})
        since_ts = query.since_ts(now)
    with open_store(config) as (_, db):
        key_id = KeyStore(db).get(query.key).id if query.key else None
        rows = UsageStore(db).summary(since=since_ts, key_id=key_id, bucket=query.bucket)
    typer.echo(json.dumps(rows, indent=2))


def audit(
    since: Annotated[str | None, typer.Option(help="24h, 7d, 2026-12-01 ...")] = None,
    action: Annotated[str | None, typer.Option(help="e.g. key.create, placement.toggle")] = None,
    limit: Annotated[int, typer.Option(help=f"at most {MAX_AUDIT_LIMIT}")] = 100,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """The audit log, newest first."""
    now = time.time()
    with cli_input():
        query = parse_input(AuditQuery, {"since": since, "action": action, "limit": limit})
        since_ts = query.since_ts(now)
    with open_store(config) as (_, db):
        entries = AuditLog(db).entries(since=since_ts, action=query.action, limit=query.limit)
    typer.echo(json.dumps([e.to_json() for e in entries], indent=2))


def register(app: typer.Typer) -> None:
    from turnout.cli_endpoints import endpoint_app

    app.add_typer(key_app, name="key")
    app.add_typer(endpoint_app, name="endpoint")
    app.command("usage")(usage)
    app.command("audit")(audit)
