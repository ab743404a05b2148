"""The placement override file (`model-placement.json`): UI rules that beat the config baseline.

File format::

    {"version": 1, "workers": {"node-1": {"mode": "whitelist", "allowed_models": [...], "denied_models": [...]}}}

The file is loaded whole or not at all. If it is unreadable or invalid at start, loading raises
:class:`PlacementFileError` (the gateway refuses to start and says which file and why). If it breaks
while running (edited by hand), the last good overrides stay in force, the error is shown by the admin
API, and writes are refused until the file is fixed or deleted, so a hand edit is never overwritten.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from turnout.core.patterns import PatternError
from turnout.core.placement import PlacementRules
from turnout.state.atomic import write_atomic

__all__ = ["FILE_VERSION", "PlacementFileError", "PlacementStore"]

FILE_VERSION = 1
_RULE_KEYS = {"mode", "allowed_models", "denied_models"}


class PlacementFileError(Exception):
    """The override file cannot be used; the message names the file and the problem."""


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

    # -- reading ---------------------------------------------------------------------------------
    def load(self) -> None:
        """Load at start; raises PlacementFileError instead of starting with a broken file."""
        self._overrides, self._stamp = self._read()
        self.error = None

    def refresh(self) -> None:
        """Pick up a hand edit. A broken file keeps the last good overrides and records the error."""
        try:
            stamp = self._current_stamp()
        except OSError as exc:
            self.error = f"{self.path}: cannot stat: {exc.strerror}"
            return
        if stamp == self._stamp:
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
    def put(self, worker: str, rules: PlacementRules) -> None:
        self._write({**self._overrides, worker: rules})

    def delete(self, worker: str) -> bool:
        if worker not in self._overrides:
            return False
        self._write({k: v for k, v in self._overrides.items() if k != worker})
        return True

    def _write(self, overrides: dict[str, PlacementRules]) -> None:
        self.refresh()
        if self.error is not None:
            raise PlacementFileError(f"refusing to overwrite a broken override file: {self.error}")
        document = {
            "version": FILE_VERSION,
            "workers": {name: rules.to_json() for name, rules in sorted(overrides.items())},
        }
        write_atomic(self.path, (json.dumps(document, indent=2) + "\n").encode())
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
            stamp = self._current_stamp()
            if stamp is None:
                return {}, None
            raw = self.path.read_bytes()
        except OSError as exc:
            raise PlacementFileError(f"{self.path}: cannot read: {exc.strerror}") from None
        return parse_overrides(raw, self.path), stamp


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
