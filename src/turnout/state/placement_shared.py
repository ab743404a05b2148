"""The placement overrides of a gateway on a shared store: the store holds them, each data dir's override file is
their copy. Used by :mod:`turnout.wiring` for every gateway (one process on SQLite included).

Where the truth lives: the ``placement`` row of :mod:`turnout.store.shared_state`, whose document is the override
file's content in the design's format (``{"version": 1, "workers": {...}}``). Every replica, on any machine,
shares the store, so a change written through one replica is read by the others (each re-reads it when the
change version moves: :mod:`turnout.gateway.peers`), and each writes it into its own override file atomically:
the file stays the design's format, what operators read, and what backups hold.

- **Start** (:meth:`SharedPlacementStore.load`): when the store has no overrides yet, this data dir's file is
  brought in (the first replica to start on a store wins; a broken file refuses the start, as before). When the
  file was edited by hand while no gateway ran, the edit goes into the store. Then the file is made a copy of
  the store's document.
- **Writes** (:meth:`~SharedPlacementStore.transaction`, ``put``, ``delete``): under the file's lock (the
  processes of one data dir) and the row's lock (every replica), from the store's latest document; the file is
  written after the store's commit.
- **Hand edits while running**: the file's lock file records the SHA-256 and store version of the last content a
  gateway wrote into the file. A file with other content was edited by hand: a valid edit goes into the store
  (so it reaches every replica), a broken one is reported (``error``) and refuses this replica's writes until it
  is fixed or deleted; it is never overwritten. A deleted file is only a copy gone: it is written again.
- **Copies**: a replica writes the store's document into its file when it is newer than what the file holds
  (the store version in the record), so a slow reader never puts an older copy back.

Database calls of writes and of taking in a hand edit run where the caller is (the admin API's transaction is
synchronous by design: nothing awaits between its check and its write); the copy of a change made elsewhere is
read in a thread (:meth:`~SharedPlacementStore.pull`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from turnout.atomic import write_atomic
from turnout.core.placement import PlacementRules
from turnout.state.placement_store import (
    PlacementFileError,
    PlacementStore,
    lock_path,
    locked,
    parse_overrides,
    render_overrides,
)
from turnout.store.db import StoreError
from turnout.store.shared_state import PLACEMENT, Document, Locked, SharedState

__all__ = ["SharedPlacementStore", "remember_written"]

log = logging.getLogger("turnout.placement")

_ABSENT = "absent"  # the recorded digest of "no file"


@dataclass(frozen=True, slots=True)
class _Record:
    version: int
    sha256: str


def _digest(raw: bytes | None) -> str:
    return _ABSENT if raw is None else hashlib.sha256(raw).hexdigest()


def remember_written(path: Path, raw: bytes | None, version: int) -> None:
    """Record that a gateway (or a restore) wrote ``raw`` (None: removed the file) into the override file
    ``path``, from the store's ``version`` of the document. The caller holds the file's lock."""
    record = json.dumps({"version": version, "sha256": _digest(raw)}).encode()
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
    finally:
        os.close(fd)


def _recorded(path: Path) -> _Record | None:
    """What a gateway last wrote into the file, or None (never written by one: a file of an older version)."""
    try:
        doc = json.loads(lock_path(path).read_bytes() or b"null")
        return _Record(int(doc["version"]), str(doc["sha256"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _text(raw: bytes | None, path: Path) -> str | None:
    """The file's content as the store keeps it, after the same checks as at start. Raises PlacementFileError."""
    if raw is None:
        return None
    parse_overrides(raw, path)
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise PlacementFileError(f"{path}: not UTF-8 text") from None


class SharedPlacementStore(PlacementStore):
    def __init__(self, path: Path, shared: SharedState, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(path)
        self.shared = shared
        self.clock = clock
        self.version = 0  # the store's write count of the overrides in memory
        self._document = Document(0, None)  # the store's document they were read from
        self._row: Locked | None = None  # inside transaction(): the row, locked
        self._written: Document | None = None  # inside transaction(): what put/delete wrote

    # -- start -----------------------------------------------------------------------------------
    def load(self) -> None:
        """Bring the file in when the store has no overrides yet (or it was edited while stopped), then make the
        file the store's copy. Raises PlacementFileError (a broken file) or StoreError."""
        with locked(self.path):
            doc = self._bring_in(self._file())
            self._copy(doc, always=True)
        self._apply(doc, force=True)
        self.error = None

    def _bring_in(self, raw: bytes | None) -> Document:
        doc = self.shared.document(PLACEMENT)
        if doc is None:
            text = _text(raw, self.path)
            if self.shared.create(PLACEMENT, text, now=self.clock()) and text is not None:
                log.info("placement overrides: %s brought into the shared store", self.path)
            doc = self.shared.document(PLACEMENT)
            assert doc is not None  # ours, or the one of a replica that was first
            return doc
        if self._edited(raw):
            text = _text(raw, self.path)
            if text != doc.text:
                log.warning("placement overrides: %s was edited while the gateway was stopped; stored", self.path)
                doc = self._store(text)
        elif _recorded(self.path) is None and raw is not None and raw.decode(errors="replace") != doc.text:
            log.warning(
                "placement overrides: %s is replaced by the shared store's overrides (another replica brought its "
                "file in first)",
                self.path,
            )
        return doc

    # -- reading ---------------------------------------------------------------------------------
    def refresh(self, *, force: bool = False) -> None:
        """Take in a hand edit of the file (or report a broken one); the overrides themselves follow the store
        (:meth:`pull`)."""
        try:
            stamp = self._current_stamp()
        except OSError as exc:
            self.error = f"{self.path}: cannot stat: {exc.strerror}"
            return
        if stamp == self._stamp and not force:
            return
        try:
            raw = self._file()
            if self._edited(raw):
                with locked(self.path):
                    self._take_edit()
            else:
                self.error = None
                if raw is None and self._document.text is not None:  # the copy was deleted: written again
                    with locked(self.path):
                        self._copy(self._document)
        except (PlacementFileError, StoreError) as exc:  # tried again at the next refresh
            self.error = str(exc)
            return
        self._stamp = stamp

    async def pull(self) -> None:
        """Take the store's overrides (another replica changed them) and copy them into the file."""
        doc = await asyncio.to_thread(self.shared.document, PLACEMENT)
        if doc is None or doc.version < self.version:
            return  # a read older than what is in force already (a write of this process finished meanwhile)
        with locked(self.path):
            if not self._take_edit():  # a hand edit goes in first (then it is newer), a broken one is kept
                self._copy(doc)
        self._apply(doc)  # the store's overrides are in force, whatever this data dir's file holds

    # -- writing ---------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[None]:
        """The file's lock and the store row's lock, with the overrides as the store holds them now: a change
        decided inside (without awaiting) and written with ``put`` or ``delete`` starts from every replica's last
        write. Raises PlacementFileError when this data dir's file is broken, StoreError when the store fails."""
        if self._writing:
            yield
            return
        with locked(self.path):
            self._take_edit()
            if self.error is not None:
                raise PlacementFileError(f"refusing to overwrite a broken override file: {self.error}")
            before = (dict(self._overrides), self.version)
            try:
                with self.shared.locked(PLACEMENT) as row:
                    self._apply(row.current or Document(0, None), force=True)
                    self._row, self._written, self._writing = row, None, True
                    try:
                        yield
                    finally:
                        self._row, self._writing = None, False
            except BaseException:
                self._overrides, self.version = before  # rolled back: nothing of it is in force
                raise
            written, self._written = self._written, None
            if written is not None:
                self._copy(written)

    def _write(self, overrides: dict[str, PlacementRules]) -> None:
        assert self._row is not None, "put and delete write inside transaction()"
        self._written = self._row.write(render_overrides(overrides).decode(), now=self.clock())
        self._overrides, self.version = overrides, self._written.version

    # -- internals -------------------------------------------------------------------------------
    def _file(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise PlacementFileError(f"{self.path}: cannot read: {exc.strerror}") from None

    def _edited(self, raw: bytes | None) -> bool:
        """True when the file's content is not what a gateway last wrote there. Never for a missing file (a copy
        deleted is written again from the store; overrides are removed through the admin API), nor for a file no
        gateway of this version has written (that one is brought in at start, or replaced)."""
        record = _recorded(self.path)
        return raw is not None and record is not None and record.sha256 != _digest(raw)

    def _take_edit(self) -> bool:
        """Under the file's lock: a hand edit goes into the store (True), a broken one is reported (True); False
        when the file is what a gateway wrote."""
        raw = self._file()
        if not self._edited(raw):
            self.error = None
            return False
        try:
            text = _text(raw, self.path)
        except PlacementFileError as exc:
            self.error = f"{exc} (the stored overrides stay in force; fix or delete the file)"
            return True
        doc = self._store(text)
        remember_written(self.path, raw, doc.version)
        self._stamp = self._current_stamp()
        self._apply(doc, force=True)
        self.error = None
        log.info("placement overrides: the edit of %s is stored for every replica", self.path)
        return True

    def _store(self, text: str | None) -> Document:
        with self.shared.locked(PLACEMENT) as row:
            doc = row.write(text, now=self.clock())
        self.shared.bump_changes(now=self.clock())  # the other replicas re-read it
        return doc

    def _copy(self, doc: Document, *, always: bool = False) -> None:
        """Under the file's lock: write the store's ``doc`` into the file unless the file holds it (or a newer
        one) already. A failed write is logged: the store has the change, and the next copy tries again."""
        record = _recorded(self.path)
        raw = None if doc.text is None else doc.text.encode()
        try:
            current = self._file()
            if (
                not always
                and record is not None
                and record.version >= doc.version
                and record.sha256 == _digest(current)
            ):
                return  # the file holds this document or a newer one
            if current != raw:
                if raw is None:
                    self.path.unlink(missing_ok=True)
                else:
                    write_atomic(self.path, raw)
            remember_written(self.path, raw, doc.version)
        except (OSError, PlacementFileError) as exc:
            log.error("placement overrides: cannot write the copy %s: %s", self.path, exc)
            return
        self._stamp = self._current_stamp()

    def _apply(self, doc: Document, *, force: bool = False) -> None:
        if doc.version < self.version and not force:
            return
        try:
            overrides = {} if doc.text is None else parse_overrides(doc.text.encode(), self.path)
        except PlacementFileError as exc:  # only a store written by hand: keep what is in force
            log.error("placement overrides: the shared store's document is not valid: %s", exc)
            return
        self._overrides, self.version, self._document = overrides, doc.version, doc
