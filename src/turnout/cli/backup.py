"""`turnout backup create|restore`: one ZIP of the gateway's state, and putting it back.

Both work on the files and the store the config names, whether or not a gateway runs. ``create`` is
safe while one runs (the store is copied as one consistent snapshot). ``restore`` refuses while a gateway
runs on the same data dir (it holds ``gateway.lock``): stop it, restore, start it again, or restore
through the running gateway's admin API. Replicas on other machines sharing a PostgreSQL store cannot be
seen from here: restart them after a restore.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from turnout.cli.common import DEFAULT_CONFIG, ConfigOption, cli_actor, fail

# The backup and store modules are imported inside the commands, so that `turnout --help` does not pay
# for them.

__all__ = ["backup_app", "register"]

backup_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Back up and restore the state: config, placement overrides, store, claims.",
)


def _audit(url: str, action: str, target: str, after: Any) -> str | None:
    """Record the action in the store's audit log; a note when that was not possible."""
    from turnout.store.audit import AuditLog
    from turnout.store.db import Database, StoreError

    try:
        db = Database(url)
    except StoreError as exc:
        return f"could not audit this: {exc}"
    try:
        AuditLog(db).record(actor=cli_actor(), action=action, target=target, after=after, now=time.time())
    except StoreError as exc:
        return f"could not audit this: {exc}"
    finally:
        db.close()
    return None


@backup_app.command("create")
def backup_create(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="ZIP to write (default: ./turnout-backup-<time>.zip)")
    ] = None,
    include_secret_key: Annotated[
        bool,
        typer.Option(
            "--include-secret-key",
            help="also store the secret key that decrypts endpoint credentials (keep the ZIP safe)",
        ),
    ] = False,
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Write one ZIP: config.json, model-placement.json, a consistent store export, the claims, a manifest."""
    from turnout.config import ConfigError, load_settings
    from turnout.state.backup import BackupError, StatePaths, create_backup, default_backup_name

    now = time.time()
    try:
        settings = load_settings(config)
        dest = output or Path(default_backup_name(now))
        created = create_backup(settings, dest, include_secret_key=include_secret_key, now=now)
    except (ConfigError, BackupError) as exc:
        fail(str(exc))
        return
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}")
        return
    manifest = created.manifest
    typer.echo(
        f"wrote {created.path} ({created.size} bytes, {len(manifest.files)} files, {manifest.store} store at "
        f"schema revision {manifest.schema_revision})"
    )
    if manifest.secret_key_included:
        typer.echo("it holds the secret key: whoever has the ZIP can decrypt the endpoint credentials in it")
    elif include_secret_key:
        typer.echo("there is no secret key yet (no credential was ever stored), so none is in it")
    else:
        typer.echo(
            "the secret key is not in it: endpoint credentials stay encrypted and decrypt only with this "
            "gateway's key (--include-secret-key adds it)"
        )
    note = _audit(
        StatePaths.of(settings).database_url,
        action="backup.create",
        target=f"backup:{created.path.name}",
        after={"size": created.size, "secret_key_included": manifest.secret_key_included},
    )
    if note:
        typer.echo(f"turnout: {note}", err=True)


@backup_app.command("restore")
def backup_restore(
    file: Annotated[Path, typer.Argument(help="a ZIP written by `turnout backup create` or the admin UI")],
    config: ConfigOption = DEFAULT_CONFIG,
) -> None:
    """Check the ZIP whole, then replace the state; nothing changes when the check or the restore fails."""
    from turnout.config import ConfigError, load_settings
    from turnout.state.backup import BackupError, BackupInvalid, BackupRefused, StatePaths
    from turnout.state.restore import restore_backup

    try:
        result = restore_backup(file, config)
    except BackupInvalid as exc:
        fail(f"not restored, nothing was changed: {exc}")
        return
    except BackupRefused as exc:
        fail(f"not restored, nothing was changed: {exc}")
        return
    except BackupError as exc:
        fail(str(exc))
        return
    manifest = result.manifest
    typer.echo(f"restored the backup of {manifest.created_at} (Turnout {manifest.turnout_version})")
    for label in result.restored:
        typer.echo(f"  restored  {label}")
    for label in result.removed:
        typer.echo(f"  removed   {label}")
    for label in result.unchanged:
        typer.echo(f"  unchanged {label}")
    for warning in result.warnings:
        typer.echo(f"turnout: warning: {warning}", err=True)
    try:
        settings = load_settings(config)
    except ConfigError:
        return
    note = _audit(
        StatePaths.of(settings).database_url,
        action="backup.restore",
        target=f"backup:{manifest.created_at}",
        after=result.to_json(),
    )
    if note:
        typer.echo(f"turnout: {note}", err=True)
    typer.echo("start the gateway (again) to serve the restored state")


def register(app: typer.Typer) -> None:
    app.add_typer(backup_app, name="backup")
