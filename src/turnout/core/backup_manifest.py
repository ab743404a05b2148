"""The backup ZIP's manifest and member rules: what a Turnout backup must look like before anything is restored.

Pure checks (no I/O): :func:`parse_manifest` turns ``manifest.json``'s decoded JSON into a :class:`Manifest`,
:func:`check_members` compares it with the ZIP's member list (names, sizes, kinds), :func:`member_problem`
judges one member name. Every refusal is a :class:`BackupInvalid` whose message says what is wrong.
Used by :mod:`turnout.state.backup`, which reads the ZIP and computes the checksums.

Layout of a backup (every member listed in the manifest with size and SHA-256, the manifest itself aside)::

    manifest.json
    config.json
    model-placement.json          when overrides existed
    secret.key                    only when asked for
    store/turnout.db              SQLite store (an online-backup copy), or
    store/<table>.jsonl           PostgreSQL store: one JSON object per row, per table
    claims/<claim>.json           the local controller's claims, when pools.agents is configured
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONFIG",
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "PLACEMENT",
    "SECRET_KEY",
    "SQLITE_STORE",
    "BackupInvalid",
    "Manifest",
    "ManifestFile",
    "Member",
    "check_members",
    "member_allowed",
    "member_problem",
    "parse_manifest",
    "store_table",
]

FORMAT = "turnout-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CONFIG = "config.json"
PLACEMENT = "model-placement.json"
SECRET_KEY = "secret.key"
SQLITE_STORE = "store/turnout.db"
STORE_KINDS = ("sqlite", "postgresql")

_SAFE_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
_CLAIM = re.compile(r"^claims/([A-Za-z0-9][A-Za-z0-9._-]{0,250})\.json$")
_TABLE = re.compile(r"^store/([A-Za-z_][A-Za-z0-9_]{0,62})\.jsonl$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REVISION = re.compile(r"^[A-Za-z0-9_]{1,64}$")


class BackupInvalid(ValueError):
    """The ZIP is not a Turnout backup this version can restore; the message says why."""


@dataclass(frozen=True, slots=True)
class ManifestFile:
    path: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class Manifest:
    turnout_version: str
    created_at: str
    schema_revision: str
    store: str  # "sqlite" or "postgresql"
    secret_key_included: bool
    secret_key_fingerprint: str | None  # first 16 hex of the key's SHA-256, to tell keys apart; never the key
    claims_included: bool
    files: tuple[ManifestFile, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "turnout_version": self.turnout_version,
            "created_at": self.created_at,
            "schema_revision": self.schema_revision,
            "store": self.store,
            "secret_key_included": self.secret_key_included,
            "secret_key_fingerprint": self.secret_key_fingerprint,
            "claims_included": self.claims_included,
            "files": [f.to_json() for f in self.files],
        }

    def file(self, path: str) -> ManifestFile | None:
        return next((f for f in self.files if f.path == path), None)

    @property
    def claims(self) -> list[str]:
        """Claim names held, sorted."""
        return sorted(m.group(1) for f in self.files if (m := _CLAIM.match(f.path)))

    @property
    def tables(self) -> list[str]:
        """PostgreSQL tables exported, in the manifest's order (parents before children)."""
        return [t for f in self.files if (t := store_table(f.path)) is not None]


@dataclass(frozen=True, slots=True)
class Member:
    """One entry of the ZIP's central directory, as the adapter read it."""

    name: str
    size: int
    is_dir: bool = False
    is_symlink: bool = False


def store_table(path: str) -> str | None:
    match = _TABLE.match(path)
    return match.group(1) if match else None


def member_problem(name: str) -> str | None:
    """Why ``name`` can never be a member of a backup (absolute, ``..``, odd characters), or None if it may."""
    if not name:
        return "an empty member name"
    if "\\" in name or "\x00" in name or any(ch < " " for ch in name):
        return f"member {name!r} has a backslash or control character in its name"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return f"member {name!r} has an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return f"member {name!r} escapes the data dir ('..')"
    if any(p in ("", ".") for p in parts):
        return f"member {name!r} has an empty or '.' path part"
    if not all(_SAFE_PART.match(p) for p in parts):
        return f"member {name!r} has a name part Turnout never writes"
    return None


def _known_member(name: str) -> bool:
    return name in (CONFIG, PLACEMENT, SECRET_KEY, SQLITE_STORE) or bool(_CLAIM.match(name) or _TABLE.match(name))


def member_allowed(name: str) -> bool:
    """Whether a restore accepts a member of this name (a backup writes no other)."""
    return member_problem(name) is None and _known_member(name)


def _need(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BackupInvalid(f"manifest.json: {key!r} must be {what}")
    return value


def parse_manifest(doc: object, known_revisions: Collection[str]) -> Manifest:
    """Check the manifest's own content: Turnout's format, a known schema revision, well-formed file entries."""
    if not isinstance(doc, dict):
        raise BackupInvalid("manifest.json: not a JSON object")
    if doc.get("format") != FORMAT:
        raise BackupInvalid(f"manifest.json: not a Turnout backup (format is {doc.get('format')!r}, not {FORMAT!r})")
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise BackupInvalid(
            f"manifest.json: backup format version {version!r} is not one this Turnout reads ({FORMAT_VERSION})"
        )
    turnout_version = _need(doc, "turnout_version", str, "a string")
    created_at = _need(doc, "created_at", str, "a time stamp (string)")
    revision = _need(doc, "schema_revision", str, "the store's Alembic revision (string)")
    if not _REVISION.match(revision) or revision not in known_revisions:
        raise BackupInvalid(
            f"manifest.json: the store's schema revision {revision!r} (Turnout {turnout_version}) is unknown to "
            f"this Turnout (it knows {', '.join(sorted(known_revisions))}); restore with the version that made it "
            "or a newer one"
        )
    store = doc.get("store")
    if store not in STORE_KINDS:
        raise BackupInvalid(f"manifest.json: 'store' must be one of {', '.join(STORE_KINDS)}, not {store!r}")
    secret_included = _need(doc, "secret_key_included", bool, "true or false")
    fingerprint = doc.get("secret_key_fingerprint")
    if fingerprint is not None and not (isinstance(fingerprint, str) and re.match(r"^[0-9a-f]{16}$", fingerprint)):
        raise BackupInvalid("manifest.json: 'secret_key_fingerprint' must be 16 hex digits or null")
    claims_included = _need(doc, "claims_included", bool, "true or false")
    raw_files = _need(doc, "files", list, "a list of {path, size, sha256}")
    files: list[ManifestFile] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw_files):
        if not isinstance(entry, dict) or set(entry) != {"path", "size", "sha256"}:
            raise BackupInvalid(f"manifest.json: files[{index}] must be an object with path, size and sha256")
        path, size, digest = entry["path"], entry["size"], entry["sha256"]
        if not isinstance(path, str):
            raise BackupInvalid(f"manifest.json: files[{index}].path must be a string")
        problem = member_problem(path)
        if problem is not None:
            raise BackupInvalid(f"manifest.json: files[{index}]: {problem}")
        if path == MANIFEST or not _known_member(path):
            raise BackupInvalid(f"manifest.json: files[{index}]: {path!r} is not a file a Turnout backup holds")
        if path in seen:
            raise BackupInvalid(f"manifest.json: {path!r} is listed twice")
        seen.add(path)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BackupInvalid(f"manifest.json: files[{index}].size must be a byte count")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise BackupInvalid(f"manifest.json: files[{index}].sha256 must be 64 lowercase hex digits")
        files.append(ManifestFile(path, size, digest))
    manifest = Manifest(
        turnout_version, created_at, revision, store, secret_included, fingerprint, claims_included, tuple(files)
    )
    _check_consistent(manifest)
    return manifest


def _check_consistent(manifest: Manifest) -> None:
    names = {f.path for f in manifest.files}
    if CONFIG not in names:
        raise BackupInvalid("manifest.json: the backup has no config.json")
    if manifest.secret_key_included != (SECRET_KEY in names):
        raise BackupInvalid("manifest.json: 'secret_key_included' does not match whether secret.key is listed")
    if not manifest.claims_included and manifest.claims:
        raise BackupInvalid("manifest.json: claims are listed but 'claims_included' is false")
    if manifest.store == "sqlite":
        if SQLITE_STORE not in names or manifest.tables:
            raise BackupInvalid(f"manifest.json: a SQLite backup holds {SQLITE_STORE} and no table exports")
    elif SQLITE_STORE in names or not manifest.tables:
        raise BackupInvalid("manifest.json: a PostgreSQL backup holds store/<table>.jsonl files and no SQLite file")


def check_members(manifest: Manifest, members: Iterable[Member]) -> None:
    """The ZIP holds exactly the manifest's files (plus the manifest), each of its listed size, plain files only."""
    listed = {f.path: f for f in manifest.files}
    seen: set[str] = set()
    for member in members:
        if member.name in seen:
            raise BackupInvalid(f"the ZIP holds {member.name!r} twice")
        seen.add(member.name)
        problem = member_problem(member.name.rstrip("/") if member.is_dir else member.name)
        if problem is not None:
            raise BackupInvalid(problem)
        if member.is_symlink:
            raise BackupInvalid(f"member {member.name!r} is a symbolic link; a backup holds plain files only")
        if member.is_dir:
            raise BackupInvalid(f"member {member.name!r} is a directory entry Turnout never writes")
        if member.name == MANIFEST:
            continue
        entry = listed.get(member.name)
        if entry is None:
            raise BackupInvalid(f"member {member.name!r} is not listed in the manifest")
        if member.size != entry.size:
            raise BackupInvalid(
                f"member {member.name!r} is {member.size} bytes, the manifest says {entry.size}: the backup is damaged"
            )
    missing = sorted(set(listed) - seen)
    if missing:
        raise BackupInvalid(f"the ZIP lacks files its manifest lists: {', '.join(missing)} (truncated or edited?)")
