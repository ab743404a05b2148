"""Backups of a gateway's state as one ZIP, and restoring them.

Who uses it: ``turnout backup create|restore`` (:mod:`turnout.cli_backup`) and the admin API
(:mod:`turnout.admin.backup_api`). What is where is decided by :class:`StatePaths`, from the settings;
the ZIP's layout and the manifest's rules are in :mod:`turnout.core.backup_manifest`.

A restore checks the whole ZIP first (a ZIP, Turnout's manifest, a known schema revision, exactly the listed
members with their sizes and SHA-256, nothing that could escape the data dir, every file parseable) and
stages every new file next to its target. Only then does it commit: files by hard-linking the old version
aside and renaming the new one over it, the store last, in one transaction (:mod:`turnout.state.store_export`).
If any commit step fails, the steps already made are undone and the old state is what remains.

The restored ``config.json`` keeps the ``storage`` section of the config it replaces: storage says where
the state lives (and holds the database password), so it belongs to the machine restored onto.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import secrets
import shutil
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

import orjson
from cryptography.fernet import Fernet
from pydantic import ValidationError

from turnout import __version__
from turnout.config import Settings, endpoint_env, format_validation_error
from turnout.core.backup_manifest import (
    CONFIG,
    MANIFEST,
    PLACEMENT,
    SECRET_KEY,
    SQLITE_STORE,
    BackupInvalid,
    Manifest,
    ManifestFile,
    Member,
    check_members,
    parse_manifest,
)
from turnout.state.atomic import write_atomic
from turnout.state.placement_store import PlacementFileError, parse_overrides
from turnout.state.running import gateway_running
from turnout.state.store_export import (
    StoreExportError,
    known_revisions,
    postgres_export,
    postgres_restore,
    sqlite_export,
    sqlite_prepare,
    sqlite_restore,
    sqlite_revision,
)
from turnout.store.db import database_url
from turnout.store.secrets import SECRET_KEY_FILE

__all__ = [
    "MAX_BACKUP_BYTES",
    "BackupError",
    "BackupInvalid",
    "BackupRefused",
    "Created",
    "RestoreResult",
    "StatePaths",
    "create_backup",
    "default_backup_name",
    "key_fingerprint",
    "open_backup",
    "restore_backup",
]

MAX_BACKUP_BYTES = 4 * 1024**3  # the most a backup may unpack to (and the most the admin API accepts)
_MANIFEST_MAX = 4 * 1024 * 1024
_CHUNK = 1024 * 1024
_READ_ERRORS = (zipfile.BadZipFile, OSError, EOFError, ValueError, zlib.error)  # CRC, deflate, truncation


class BackupError(Exception):
    """A backup could not be made, or a restore failed and was undone; the message says why."""


class BackupRefused(BackupError):
    """A valid backup that cannot go here now (a running gateway, another kind of store)."""


def key_fingerprint(key: bytes | str | None) -> str | None:
    """A short SHA-256 of a secret key: tells two keys apart without saying anything about them."""
    if not key:
        return None
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(raw.strip()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class StatePaths:
    """Where each piece of a gateway's state lives, from its settings."""

    config: Path
    data_dir: Path
    placement: Path
    database_url: str  # SQLAlchemy URL, password included: never show it
    sqlite: Path | None
    secret_key: Path
    secret_from_env: str | None
    admin_token: Path
    admin_token_from_env: bool
    claims_dir: Path | None  # the local controller's claims (pools.agents configured)
    claim_status: Path
    claim_events: Path
    agents: tuple[tuple[str, str], ...]  # (name, agent URL): each keeps its own engines.json
    kubernetes: bool
    redis_url: str | None

    @classmethod
    def of(cls, settings: Settings) -> StatePaths:
        if settings.config_path is None:
            raise BackupError("this gateway runs without a config file; backups need one")
        data = settings.data_dir
        url = database_url(settings.storage.database_url, data)
        pools = settings.pools
        return cls(
            config=settings.config_path,
            data_dir=data,
            placement=settings.placement_file,
            database_url=url,
            sqlite=Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None,
            secret_key=data / SECRET_KEY_FILE,
            secret_from_env=settings.endpoint_env.secret_key,
            admin_token=data / "admin-token",
            admin_token_from_env=bool(settings.admin_token),
            claims_dir=data / "claims" if pools is not None and pools.agents else None,
            claim_status=data / "claim-status.json",
            claim_events=data / "claim-events.json",
            agents=tuple((a.name, str(a.agent_url).rstrip("/")) for a in (pools.agents if pools else [])),
            kubernetes=pools is not None and pools.kubernetes is not None,
            redis_url=settings.storage.redis_url,
        )

    @property
    def store(self) -> str:
        return "sqlite" if self.sqlite is not None else "postgresql"

    def key_in_use(self) -> bytes | None:
        """The secret key the gateway encrypts credentials with (env first, then the file), if any."""
        if self.secret_from_env:
            return self.secret_from_env.encode()
        try:
            return self.secret_key.read_bytes().strip() or None
        except FileNotFoundError:
            return None


# -- writing a backup ------------------------------------------------------------------------------


class _Hashing(io.RawIOBase):
    def __init__(self, inner: IO[bytes]) -> None:
        self.inner = inner
        self.digest = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self.inner.write(chunk)
        self.digest.update(chunk)
        self.size += len(chunk)
        return len(chunk)


class _Writer:
    def __init__(self, archive: zipfile.ZipFile) -> None:
        self.archive = archive
        self.files: list[ManifestFile] = []

    @contextlib.contextmanager
    def member(self, name: str) -> Iterator[IO[bytes]]:
        info = zipfile.ZipInfo(name, date_time=time.gmtime()[:6])
        info.compress_type = zipfile.ZIP_DEFLATED
        info.external_attr = 0o100600 << 16  # a plain file, 0600
        with self.archive.open(info, "w", force_zip64=True) as raw:
            hashing = _Hashing(raw)
            yield cast(IO[bytes], hashing)
        self.files.append(ManifestFile(name, hashing.size, hashing.digest.hexdigest()))

    def add(self, name: str, data: bytes) -> None:
        with self.member(name) as out:
            out.write(data)

    def add_file(self, name: str, path: Path) -> None:
        with self.member(name) as out, path.open("rb") as src:
            while chunk := src.read(_CHUNK):
                out.write(chunk)


@dataclass(frozen=True, slots=True)
class Created:
    path: Path
    manifest: Manifest
    size: int


def default_backup_name(now: float) -> str:
    return time.strftime("turnout-backup-%Y%m%dT%H%M%SZ.zip", time.gmtime(now))


def create_backup(settings: Settings, dest: Path, *, include_secret_key: bool = False, now: float) -> Created:
    """Write one ZIP of the state at ``dest`` (atomically, 0600)."""
    paths = StatePaths.of(settings)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o600)
            with zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as archive:
                manifest = _write_members(_Writer(archive), paths, include_secret_key, now)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Created(dest, manifest, dest.stat().st_size)


def _read(path: Path, what: str) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BackupError(f"cannot read {what} {path}: {exc.strerror}") from None


def _write_members(out: _Writer, paths: StatePaths, include_secret_key: bool, now: float) -> Manifest:
    config = _read(paths.config, "the config file")
    if config is None:
        raise BackupError(f"the config file {paths.config} is missing")
    out.add(CONFIG, config)
    placement = _read(paths.placement, "the placement override file")
    if placement is not None:
        out.add(PLACEMENT, placement)
    key = paths.key_in_use()
    included = include_secret_key and key is not None
    if included and key is not None:
        out.add(SECRET_KEY, key + b"\n")
    try:
        if paths.sqlite is not None:
            with tempfile.TemporaryDirectory(prefix=".backup-", dir=paths.sqlite.parent) as tmp:
                copy = Path(tmp) / "turnout.db"
                revision = sqlite_export(paths.sqlite, copy)
                out.add_file(SQLITE_STORE, copy)
        else:
            revision = postgres_export(paths.database_url, out.member)
    except StoreExportError as exc:
        raise BackupError(str(exc)) from None
    if paths.claims_dir is not None and paths.claims_dir.is_dir():
        for claim in sorted(paths.claims_dir.glob("*.json")):
            if not claim.name.startswith("."):
                data = _read(claim, "the claim file")
                if data is not None:
                    out.add(f"claims/{claim.name}", data)
    manifest = Manifest(
        turnout_version=__version__,
        created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        schema_revision=revision,
        store=paths.store,
        secret_key_included=included,
        secret_key_fingerprint=key_fingerprint(key),
        claims_included=paths.claims_dir is not None,
        files=tuple(out.files),
    )
    info = zipfile.ZipInfo(MANIFEST, date_time=time.gmtime(now)[:6])
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o100600 << 16
    out.archive.writestr(info, json.dumps(manifest.to_json(), indent=2) + "\n")
    return manifest


# -- reading and checking a backup -----------------------------------------------------------------


def _is_symlink(info: zipfile.ZipInfo) -> bool:
    return (info.external_attr >> 16) & 0o170000 == 0o120000


@contextlib.contextmanager
def open_backup(path: Path) -> Iterator[tuple[zipfile.ZipFile, Manifest]]:
    """The ZIP and its manifest, after every check that needs no target: format, revision, members, checksums.
    Raises BackupInvalid."""
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise BackupInvalid(f"{path}: no such file") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as exc:
        raise BackupInvalid(f"{path}: not a ZIP file, or a truncated one ({exc})") from None
    with archive:
        manifest = _check_archive(archive, path)
        yield archive, manifest


def _check_archive(archive: zipfile.ZipFile, path: Path) -> Manifest:
    infos = archive.infolist()
    if MANIFEST not in {i.filename for i in infos}:
        raise BackupInvalid(f"{path}: no manifest.json: not a Turnout backup")
    if archive.getinfo(MANIFEST).file_size > _MANIFEST_MAX:
        raise BackupInvalid(f"{path}: manifest.json is too large to be a Turnout manifest")
    try:
        doc = orjson.loads(_member_bytes(archive, MANIFEST, _MANIFEST_MAX))
    except orjson.JSONDecodeError as exc:
        raise BackupInvalid(f"{path}: manifest.json is not JSON ({exc})") from None
    manifest = parse_manifest(doc, known_revisions())
    members = [Member(i.filename, i.file_size, i.is_dir(), _is_symlink(i)) for i in infos]
    check_members(manifest, members)
    if sum(f.size for f in manifest.files) > MAX_BACKUP_BYTES:
        raise BackupInvalid(f"{path}: the backup unpacks to more than {MAX_BACKUP_BYTES} bytes")
    for entry in manifest.files:
        _verify(archive, entry)
    return manifest


def _member_bytes(archive: zipfile.ZipFile, name: str, limit: int) -> bytes:
    try:
        with archive.open(name) as handle:
            data = handle.read(limit + 1)
    except _READ_ERRORS as exc:
        raise BackupInvalid(f"{name}: cannot be read from the ZIP ({exc}): the backup is damaged") from None
    if len(data) > limit:
        raise BackupInvalid(f"{name}: larger than its manifest entry says")
    return data


def _verify(archive: zipfile.ZipFile, entry: ManifestFile) -> None:
    digest, size = hashlib.sha256(), 0
    try:
        with archive.open(entry.path) as handle:
            while chunk := handle.read(_CHUNK):
                size += len(chunk)
                if size > entry.size:
                    break
                digest.update(chunk)
    except _READ_ERRORS as exc:
        raise BackupInvalid(f"{entry.path}: cannot be read from the ZIP ({exc}): the backup is damaged") from None
    if size != entry.size or digest.hexdigest() != entry.sha256:
        raise BackupInvalid(f"{entry.path}: its SHA-256 or size does not match the manifest: the backup is damaged")


# -- restoring -------------------------------------------------------------------------------------


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
    current = _read(config_path, "the config file")
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
        settings = Settings.model_validate(
            {**wanted, "config_path": config_path.resolve(), "admin_token": None, "endpoint_env": endpoint_env(env)}
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
            _member_bytes(archive, CONFIG, config_entry.size), config_path, env
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
        steps = _plan_files(archive, manifest, paths, config_data, result)
        staged_db: Path | None = None
        try:
            for step in steps:
                step.prepare()
            if paths.sqlite is not None:
                staged_db = _stage_sqlite(archive, manifest, paths.sqlite)
            _commit(steps, lambda: _commit_store(archive, manifest, paths, staged_db, result))
        finally:
            for step in steps:
                step.cleanup()
            if staged_db is not None:
                staged_db.unlink(missing_ok=True)
        _key_warnings(manifest, paths, result)
        return result


def _plan_files(
    archive: zipfile.ZipFile, manifest: Manifest, paths: StatePaths, config_data: bytes, result: RestoreResult
) -> list[_Step]:
    steps: list[_Step] = []

    def replace(target: Path, data: bytes | None, label: str, mode: int = 0o644) -> None:
        old = _read(target, label)
        if old == data:
            result.unchanged.append(label)
            return
        if data is None:
            result.removed.append(label)
        else:
            result.restored.append(label)
        steps.append(_Step(target, data, mode=mode, label=label))

    def member(name: str) -> bytes:
        entry = manifest.file(name)
        assert entry is not None
        return _member_bytes(archive, name, entry.size)

    replace(paths.config, config_data, CONFIG)
    result.config_changed = bool(steps)
    placement = member(PLACEMENT) if manifest.file(PLACEMENT) else None
    if placement is not None:
        try:
            parse_overrides(placement, Path(PLACEMENT))
        except PlacementFileError as exc:
            raise BackupInvalid(f"the backup's {exc}") from None
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
    return steps


def _stage_sqlite(archive: zipfile.ZipFile, manifest: Manifest, live: Path) -> Path:
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
        sqlite_prepare(staged, live)
    except StoreExportError as exc:
        staged.unlink(missing_ok=True)
        raise BackupInvalid(f"{SQLITE_STORE}: {exc}") from None
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return staged


def _commit_store(
    archive: zipfile.ZipFile, manifest: Manifest, paths: StatePaths, staged: Path | None, result: RestoreResult
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

    result.rows = postgres_restore(paths.database_url, manifest.schema_revision, manifest.tables, member)
    result.restored.append("store (PostgreSQL)")


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
