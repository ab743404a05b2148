"""The placement override file (`model-placement.json`): UI rules that beat the config baseline.

File format::

    {"version": 1, "workers": {"node-1": {"mode": "whitelist", "allowed_models": [...], "denied_models": [...]}}}

The file is loaded whole or not at all. If it is unreadable or invalid at start, loading raises
:class:`PlacementFileError` (the gateway refuses to start and says which file and why). If it breaks
while running (edited by hand), the last good overrides stay in force, the error is shown by the admin
API, and writes are refused until the file is fixed or deleted, so a hand edit is never overwritten.

Several processes write the file (the processes of `turnout serve --workers N`, replicas on one data dir,
a restore): every write is a read-modify-write under an exclusive ``flock`` on ``<file>.lock`` beside it
(:meth:`PlacementStore.transaction`), which re-reads the file first, so a write never puts back what
another process's write replaced, and the file itself is replaced atomically (:mod:`turnout.atomic`).
Other processes pick the change up at their next refresh (each admin request announces its change on the
gateway's change counter, :mod:`turnout.state.changes`).

This class keeps the overrides in the file alone. A gateway uses
:class:`~turnout.state.placement_shared.SharedPlacementStore`, which keeps them in the SQL store every replica
shares and this file as the data dir's copy; the file's format, parsing and lock are this module's.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from turnout.atomic import write_atomic
from turnout.core.patterns import PatternError
from turnout.core.placement import PlacementRules

__all__ = [
    "FILE_VERSION",
    "PlacementFileError",
    "PlacementStore",
    "lock_path",
    "locked",
    "parse_overrides",
    "render_overrides",
]

FILE_VERSION = 1
_RULE_KEYS = {"mode", "allowed_models", "denied_models"}


class PlacementFileError(Exception):
    """The override file cannot be used; the message names the file and the problem."""


def lock_path(path: Path) -> Path:
    """The lock file every writer of the override file ``path`` holds while it reads, changes and replaces it."""
    return path.with_name(path.name + ".lock")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the override file's lock (exclusive ``flock``, waits for the holder; dropped by the kernel however
    the holder ends). Raises PlacementFileError when the lock file cannot be opened."""
    lock = lock_path(path)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise PlacementFileError(f"{lock}: cannot open the lock file: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


@dataclass(frozen=True, slots=True)
class _Stamp:
    mtime_ns: int
    size: int
    inode: int


class PlacementStore:
    """Holds the overrides in memory and keeps the file in step with them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._overrides: dict[str, PlacementRules] = {}
        self._stamp: _Stamp | None = None
        self.error: str | None = None
        self._writing = False  # inside transaction(): the lock is held and the file was just re-read

    # -- reading ---------------------------------------------------------------------------------
    def load(self) -> None:
        """Load at start; raises PlacementFileError instead of starting with a broken file."""
        self._overrides, self._stamp = self._read()
        self.error = None

    def refresh(self, *, force: bool = False) -> None:
        """Pick up a change made by hand or by another process. A broken file keeps the last good overrides
        and records the error. Without ``force`` an unchanged stamp (mtime, size, inode) skips the read; a
        writer, and a process told of a change, read anyway (a replaced file can have the stamp of one it
        replaced: an inode is reused, and a write within one clock tick keeps the mtime)."""
        try:
            stamp = self._current_stamp()
        except OSError as exc:
            self.error = f"{self.path}: cannot stat: {exc.strerror}"
            return
        if stamp == self._stamp and not force:
            return
        try:
            self._overrides, self._stamp = self._read()
            self.error = None
        except PlacementFileError as exc:
            self.error = f"{exc} (the last valid overrides stay in force; fix or delete the file)"

    def get(self, worker: str) -> PlacementRules | None:
        return self._overrides.get(worker)

    def all(self) -> Mapping[str, PlacementRules]:
        return dict(self._overrides)

    # -- writing ---------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Hold the file's lock, with the overrides re-read from the file as it is now: a change decided
        inside (from :meth:`get`, by a caller that does not await) and written with :meth:`put` or
        :meth:`delete` starts from every other process's last write. Raises PlacementFileError when the file
        is broken (a hand edit is never overwritten). Re-entrant: an inner one joins the outer one."""
        if self._writing:
            yield
            return
        with locked(self.path):
            self.refresh(force=True)
            if self.error is not None:
                raise PlacementFileError(f"refusing to overwrite a broken override file: {self.error}")
            self._writing = True
            try:
                yield
            finally:
                self._writing = False

    def put(self, worker: str, rules: PlacementRules) -> None:
        with self.transaction():
            self._write({**self._overrides, worker: rules})

    def delete(self, worker: str) -> bool:
        with self.transaction():
            if worker not in self._overrides:
                return False
            self._write({k: v for k, v in self._overrides.items() if k != worker})
            return True

    async def pull(self) -> None:
        """Take the overrides as they are now where they are kept (here: the file, re-read)."""
        self.refresh(force=True)

    def _write(self, overrides: dict[str, PlacementRules]) -> None:
        write_atomic(self.path, render_overrides(overrides))
        self._overrides = overrides
        self._stamp = self._current_stamp()

    # -- internals -------------------------------------------------------------------------------
    def _current_stamp(self) -> _Stamp | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return _Stamp(st.st_mtime_ns, st.st_size, st.st_ino)

    def _read(self) -> tuple[dict[str, PlacementRules], _Stamp | None]:
        try:
            with self.path.open("rb") as handle:  # the stamp of the very file read, even if it is replaced now
                st = os.fstat(handle.fileno())
                raw = handle.read()
            stamp = _Stamp(st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            return {}, None
        except OSError as exc:
            raise PlacementFileError(f"{self.path}: cannot read: {exc.strerror}") from None
        return parse_overrides(raw, self.path), stamp


def render_overrides(overrides: Mapping[str, PlacementRules]) -> bytes:
    """The override file's content for ``overrides`` (workers by name)."""
    document = {
        "version": FILE_VERSION,
        "workers": {name: rules.to_json() for name, rules in sorted(overrides.items())},
    }
    return (json.dumps(document, indent=2) + "\n").encode()


def parse_overrides(raw: bytes, path: Path) -> dict[str, PlacementRules]:
    try:
        document = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlacementFileError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(document, dict) or set(document) - {"version", "workers"}:
        raise PlacementFileError(f'{path}: expected an object with "version" and "workers"')
    if document.get("version", FILE_VERSION) != FILE_VERSION:
        raise PlacementFileError(f"{path}: unsupported version {document.get('version')!r}, expected 1")
    workers = document.get("workers", {})
    if not isinstance(workers, dict):
        raise PlacementFileError(f'{path}: "workers" must be an object keyed by worker name')
    result: dict[str, PlacementRules] = {}
    for name, body in workers.items():
        try:
            result[name] = parse_rules_body(body)
        except ValueError as exc:
            raise PlacementFileError(f"{path}: workers.{name}: {exc}") from None
    return result


def parse_rules_body(body: object) -> PlacementRules:
    """Validate a ``{mode, allowed_models, denied_models}`` object (file entry or API body)."""
    if not isinstance(body, dict):
        raise ValueError("expected an object with mode, allowed_models and denied_models")
    unknown = set(body) - _RULE_KEYS
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}; allowed: mode, allowed_models, denied_models")
    mode = body.get("mode", "allow_all")
    if mode not in ("allow_all", "whitelist"):
        raise ValueError(f"mode must be 'allow_all' or 'whitelist', got {mode!r}")
    lists: dict[str, list[str]] = {}
    for key in ("allowed_models", "denied_models"):
        value = body.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key} must be a list of strings")
        lists[key] = value
    try:
        return PlacementRules.parse(mode, lists["allowed_models"], lists["denied_models"])
    except PatternError as exc:
        raise ValueError(str(exc)) from None
