"""Backups of a gateway's state as one ZIP, and reading one back with every check that needs no target.

Who uses it: ``turnout backup create`` (:mod:`turnout.cli.backup`), the admin API
(:mod:`turnout.admin.backup_api`) and restores (:mod:`turnout.state.restore`). What is where is decided by
:class:`StatePaths`, from the settings; the placement overrides come from the store that every replica
shares (the override file is each data dir's copy of them); the ZIP's layout and the manifest's rules are in
:mod:`turnout.core.backup_manifest`. The store is exported by :mod:`turnout.state.store_export` (SQLite's
online backup API, or one PostgreSQL snapshot). The ZIP is written next to its destination and renamed into
place (0600: it holds the config, and the secret key when asked for).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import orjson
from sqlalchemy import inspect
from sqlalchemy.exc import SQLAlchemyError

from turnout import __version__
from turnout.config import Settings
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
    member_allowed,
    parse_manifest,
)
from turnout.state.store_export import (
    StoreExportError,
    known_revisions,
    postgres_export,
    sqlite_export,
)
from turnout.store.db import Database, StoreError, database_url
from turnout.store.secrets import SECRET_KEY_FILE
from turnout.store.shared_state import PLACEMENT as PLACEMENT_ROW
from turnout.store.shared_state import SharedState

__all__ = [
    "MAX_BACKUP_BYTES",
    "BackupError",
    "BackupInvalid",
    "BackupRefused",
    "Created",
    "StatePaths",
    "create_backup",
    "default_backup_name",
    "key_fingerprint",
    "member_bytes",
    "open_backup",
    "read_optional",
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


def read_optional(path: Path, what: str) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BackupError(f"cannot read {what} {path}: {exc.strerror}") from None


def _placement(paths: StatePaths) -> bytes | None:
    """The placement overrides as the store holds them (every replica's truth), in the override file's format;
    the override file itself when the store has never held them."""
    document = None
    if paths.sqlite is None or paths.sqlite.exists():  # never create a store to read it
        database = Database(paths.database_url)
        try:
            if inspect(database.engine).has_table("shared_state"):  # else a store not migrated yet
                document = SharedState(database).document(PLACEMENT_ROW)
        except (StoreError, SQLAlchemyError) as exc:
            raise BackupError(f"cannot read the placement overrides from the store: {exc}") from None
        finally:
            database.close()
    if document is None:
        return read_optional(paths.placement, "the placement override file")
    return None if document.text is None else document.text.encode()


def _write_members(out: _Writer, paths: StatePaths, include_secret_key: bool, now: float) -> Manifest:
    config = read_optional(paths.config, "the config file")
    if config is None:
        raise BackupError(f"the config file {paths.config} is missing")
    out.add(CONFIG, config)
    placement = _placement(paths)
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
            if claim.name.startswith("."):
                continue  # an atomic writer's temp file
            if not member_allowed(f"claims/{claim.name}"):
                raise BackupError(f"{claim}: a claim file name a backup cannot hold; rename or remove the claim")
            data = read_optional(claim, "the claim file")
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
        doc = orjson.loads(member_bytes(archive, MANIFEST, _MANIFEST_MAX))
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


def member_bytes(archive: zipfile.ZipFile, name: str, limit: int) -> bytes:
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
