"""Restoring a backup ZIP: checked whole, staged next to the targets, then committed with undo.

Who uses it: ``turnout backup restore`` (:mod:`turnout.cli.backup`) and ``POST /admin/api/backup/restore``
(:mod:`turnout.admin.backup_api`). The ZIP is checked by :func:`turnout.state.backup.open_backup` (format,
revision, members, checksums), then every file's content (config valid for this version, overrides parse,
claims are documents, the secret key is a Fernet key, the SQLite copy passes its integrity check and is at
the manifest's revision). Only then does it commit: files by hard-linking the old version aside and renaming
the new one over it, the store last, in one transaction (:mod:`turnout.state.store_export`), the backup's override
file written into the store's placement row too (the truth every replica shares; the restore moves the store's
change version, so running replicas take the restored state within a second). If any commit
step fails, the steps already made are undone and the old state is what remains.

The restored ``config.json`` keeps the ``storage`` section of the config it replaces: storage says where
the state lives (and holds the database password), so it belongs to the machine restored onto.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
from cryptography.fernet import Fernet
from pydantic import ValidationError

from turnout.atomic import write_atomic
from turnout.config import ConfigError, Settings, endpoint_env, format_validation_error
from turnout.core.backup_manifest import CONFIG, PLACEMENT, SECRET_KEY, SQLITE_STORE, BackupInvalid, Manifest
from turnout.state.backup import (
    BackupError,
    BackupRefused,
    StatePaths,
    key_fingerprint,
    member_bytes,
    open_backup,
    read_optional,
)
from turnout.state.placement_shared import remember_written
from turnout.state.placement_store import PlacementFileError, locked, parse_overrides
from turnout.state.running import gateway_running
from turnout.state.store_export import (
    StoreExportError,
    postgres_restore,
    sqlite_prepare,
    sqlite_restore,
    sqlite_revision,
)

__all__ = ["RestoreResult", "restore_backup"]

_CHUNK = 1024 * 1024


class _Step:
    """One file to replace (``data``) or remove (``None``): staged next to the target, committed by rename."""

    def __init__(self, target: Path, data: bytes | None, *, mode: int = 0o644, label: str) -> None:
        self.target, self.data, self.mode, self.label = target, data, mode, label
        token = secrets.token_hex(4)
        self._staged = target.with_name(f".{target.name}.restore-{token}")
        self._old = target.with_name(f".{target.name}.restore-old-{token}")
        self._had_old = False
        self._created_dir: Path | None = None
        self.committed = False

    def prepare(self) -> None:
        if self.data is None:
            return
        if not self.target.parent.is_dir():
            self._created_dir = self.target.parent
        write_atomic(self._staged, self.data, mode=self.mode)

    def commit(self) -> None:
        self._had_old = self.target.exists()
        if self._had_old:
            try:
                os.link(self.target, self._old)  # the old version stays reachable until cleanup
            except OSError:  # a file system without hard links: a copy does the same
                shutil.copy2(self.target, self._old)
        if self.data is None:
            self.target.unlink()
        else:
            os.replace(self._staged, self.target)
        self.committed = True
        _fsync_dir(self.target.parent)

    def rollback(self) -> None:
        if not self.committed:
            return
        if self._had_old:
            os.replace(self._old, self.target)
        else:
            self.target.unlink(missing_ok=True)
        self.committed = False

    def cleanup(self) -> None:
        self._staged.unlink(missing_ok=True)
        self._old.unlink(missing_ok=True)
        if self._created_dir is not None and not self.committed:
            with contextlib.suppress(OSError):
                self._created_dir.rmdir()  # only when empty


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class RestoreResult:
    manifest: Manifest
    restored: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    config_changed: bool = False
    secret_key_changed: bool = False
    rows: dict[str, int] | None = None  # PostgreSQL: rows loaded per table

    def to_json(self) -> dict[str, Any]:
        return {
            "restored": self.restored,
            "removed": self.removed,
            "unchanged": self.unchanged,
            "warnings": self.warnings,
            "config_changed": self.config_changed,
            "secret_key_changed": self.secret_key_changed,
            "rows": self.rows,
            "manifest": {k: v for k, v in self.manifest.to_json().items() if k != "files"},
        }


def _target_settings(
    backup_config: bytes, config_path: Path, env: Mapping[str, str]
) -> tuple[Settings, bytes, str | None]:
    """The settings the restored state will run under, the bytes to write as config.json, and a note."""
    try:
        wanted = json.loads(backup_config)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BackupInvalid(f"config.json in the backup is not JSON: {exc}") from None
    if not isinstance(wanted, dict):
        raise BackupInvalid("config.json in the backup is not a JSON object")
    data, note = backup_config, None
    current = read_optional(config_path, "the config file")
    if current is not None:
        try:
            here = json.loads(current)
        except (json.JSONDecodeError, UnicodeDecodeError):
            here = None  # a broken config is replaced whole
        if isinstance(here, dict) and here.get("storage") != wanted.get("storage"):
            wanted = {k: v for k, v in wanted.items() if k != "storage"}
            if "storage" in here:
                wanted = {"storage": here["storage"], **wanted}
            data = (json.dumps(wanted, indent=2) + "\n").encode()
            note = f"config.json: the storage section of {config_path} was kept (it says where this state lives)"
    try:
        from_env = endpoint_env(env)
    except ConfigError as exc:
        raise BackupRefused(str(exc)) from None
    try:
        settings = Settings.model_validate(
            {**wanted, "config_path": config_path.resolve(), "admin_token": None, "endpoint_env": from_env}
        )
    except ValidationError as exc:
        raise BackupInvalid(
            f"config.json in the backup is not valid for this Turnout:\n{format_validation_error(exc)}"
        ) from None
    return settings, data, note


def _check_claim(name: str, data: bytes) -> None:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BackupInvalid(f"{name}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict):
        raise BackupInvalid(f"{name}: not a ModelClaim document")


def restore_backup(
    path: Path,
    config_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    from_running_gateway: bool = False,
) -> RestoreResult:
    """Check ``path`` whole, then replace the state named by ``config_path`` (created from the backup when
    missing). Raises BackupInvalid (nothing touched), BackupRefused (nothing touched) or BackupError (the
    commit failed and was undone)."""
    env = os.environ if env is None else env
    with open_backup(path) as (archive, manifest):
        config_entry = manifest.file(CONFIG)
        assert config_entry is not None  # parse_manifest requires it
        settings, config_data, note = _target_settings(
            member_bytes(archive, CONFIG, config_entry.size), config_path, env
        )
        paths = StatePaths.of(settings)
        if manifest.store != paths.store:
            raise BackupRefused(
                f"the backup holds a {manifest.store} store but {config_path} uses {paths.store}; "
                "restore it into the kind of store it came from"
            )
        if not from_running_gateway and gateway_running(paths.data_dir):
            raise BackupRefused(
                f"a gateway is running on {paths.data_dir}: stop it first (then start it again after the "
                "restore), or restore through the running gateway's admin API (POST /admin/api/backup/restore)"
            )
        result = RestoreResult(manifest)
        if note:
            result.warnings.append(note)
        steps, placement = _plan_files(archive, manifest, paths, config_data, result)
        text = None if placement is None else placement.decode()
        staged_db: Path | None = None
        try:
            for step in steps:
                step.prepare()
            if paths.sqlite is not None:
                staged_db = _stage_sqlite(archive, manifest, paths.sqlite, text)
            with _placement_locked(paths.placement):  # no placement write of a gateway interleaves, nor is undone
                _commit(steps, lambda: _commit_store(archive, manifest, paths, staged_db, text, result))
                remember_written(paths.placement, placement, 0)  # a gateway's copy, not a hand edit
        finally:
            for step in steps:
                step.cleanup()
            if staged_db is not None:
                staged_db.unlink(missing_ok=True)
        _key_warnings(manifest, paths, result)
        return result


def _plan_files(
    archive: zipfile.ZipFile, manifest: Manifest, paths: StatePaths, config_data: bytes, result: RestoreResult
) -> tuple[list[_Step], bytes | None]:
    """The file steps, and the backup's override file (None: it had none)."""
    steps: list[_Step] = []

    def replace(target: Path, data: bytes | None, label: str, mode: int = 0o644) -> None:
        old = read_optional(target, label)
        if old == data:
            result.unchanged.append(label)
            return
        if old is not None:
            mode = stat.S_IMODE(target.stat().st_mode)  # a file kept private stays private
        if data is None:
            result.removed.append(label)
        else:
            result.restored.append(label)
        steps.append(_Step(target, data, mode=mode, label=label))

    def member(name: str) -> bytes:
        entry = manifest.file(name)
        assert entry is not None
        return member_bytes(archive, name, entry.size)

    replace(paths.config, config_data, CONFIG, mode=0o600)  # it may hold credentials
    result.config_changed = bool(steps)
    placement = member(PLACEMENT) if manifest.file(PLACEMENT) else None
    if placement is not None:
        try:
            parse_overrides(placement, Path(PLACEMENT))
            placement.decode()
        except PlacementFileError as exc:
            raise BackupInvalid(f"the backup's {exc}") from None
        except UnicodeDecodeError:
            raise BackupInvalid(f"the backup's {PLACEMENT} is not UTF-8 text") from None
    replace(paths.placement, placement, PLACEMENT)
    if manifest.secret_key_included:
        key = member(SECRET_KEY).strip()
        try:
            Fernet(key)
        except ValueError:
            raise BackupInvalid("secret.key in the backup is not a Fernet key") from None
        before = len(steps)
        replace(paths.secret_key, key + b"\n", SECRET_KEY, mode=0o600)
        result.secret_key_changed = len(steps) > before and not paths.secret_from_env
    if manifest.claims_included and paths.claims_dir is not None:
        wanted = set()
        for name in manifest.claims:
            data = member(f"claims/{name}.json")
            _check_claim(f"claims/{name}.json", data)
            wanted.add(f"{name}.json")
            replace(paths.claims_dir / f"{name}.json", data, f"claims/{name}.json")
        if paths.claims_dir.is_dir():
            for extra in sorted(paths.claims_dir.glob("*.json")):
                if extra.name not in wanted and not extra.name.startswith("."):
                    replace(extra, None, f"claims/{extra.name}")
    return steps, placement


def _stage_sqlite(archive: zipfile.ZipFile, manifest: Manifest, live: Path, placement: str | None) -> Path:
    live.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{live.name}.restore-", dir=live.parent)
    staged = Path(name)
    try:
        with os.fdopen(fd, "wb") as out, archive.open(SQLITE_STORE) as src:
            while chunk := src.read(_CHUNK):
                out.write(chunk)
        revision = sqlite_revision(staged)
        if revision != manifest.schema_revision:
            raise BackupInvalid(
                f"{SQLITE_STORE} is at schema revision {revision}, the manifest says {manifest.schema_revision}"
            )
        sqlite_prepare(staged, live, placement=placement, now=time.time())
    except StoreExportError as exc:
        staged.unlink(missing_ok=True)
        raise BackupInvalid(f"{SQLITE_STORE}: {exc}") from None
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return staged


def _commit_store(
    archive: zipfile.ZipFile,
    manifest: Manifest,
    paths: StatePaths,
    staged: Path | None,
    placement: str | None,
    result: RestoreResult,
) -> None:
    if paths.sqlite is not None:
        assert staged is not None
        sqlite_restore(staged, paths.sqlite)
        result.restored.append(f"store ({paths.sqlite})")
        return

    @contextlib.contextmanager
    def member(name: str) -> Iterator[IO[bytes]]:
        with archive.open(name) as handle:
            yield handle

    result.rows = postgres_restore(
        paths.database_url, manifest.schema_revision, manifest.tables, member, placement=placement, now=time.time()
    )
    result.restored.append("store (PostgreSQL)")


@contextlib.contextmanager
def _placement_locked(path: Path) -> Iterator[None]:
    """The override file's lock (:func:`turnout.state.placement_store.locked`), as a BackupError if it cannot be
    had."""
    try:
        with locked(path):
            yield
    except PlacementFileError as exc:
        raise BackupError(f"not restored, nothing was changed: {exc}") from None


def _commit(steps: list[_Step], store: Callable[[], None]) -> None:
    """Files first (each undoable), the store last (one transaction); undo the files if anything fails."""
    try:
        for step in steps:
            step.commit()
        store()
    except BaseException as exc:
        undo_failed = []
        for step in reversed(steps):
            try:
                step.rollback()
            except OSError as undo:
                undo_failed.append(f"{step.target}: {undo}")
        if undo_failed:
            raise BackupError(
                f"restore failed ({exc}) and these files could not be put back: {'; '.join(undo_failed)}"
            ) from exc
        if not isinstance(exc, Exception):
            raise  # cancelled or interrupted: undone, and the interruption goes on
        raise BackupError(f"restore failed, the old state is kept: {exc}") from exc


def _key_warnings(manifest: Manifest, paths: StatePaths, result: RestoreResult) -> None:
    if manifest.secret_key_included and paths.secret_from_env:
        result.warnings.append(
            "TURNOUT_SECRET_KEY is set, so the restored secret.key is not used; stored credentials decrypt only "
            "if it is the same key"
        )
    used = key_fingerprint(paths.key_in_use())
    if manifest.secret_key_fingerprint is not None and used != manifest.secret_key_fingerprint:
        result.warnings.append(
            "endpoint credentials in this backup were encrypted with another secret key "
            f"(fingerprint {manifest.secret_key_fingerprint}, this gateway's: {used or 'none yet'}); they will not "
            "decrypt: restore a backup made with --include-secret-key, or set TURNOUT_SECRET_KEY to the old key"
        )
