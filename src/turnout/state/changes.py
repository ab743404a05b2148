"""A change counter shared by the gateway processes on one data dir (`turnout serve --workers N`, and replicas
started on the same data dir on one machine).

Each process keeps what it can in memory: placement overrides, looked-up keys, the endpoint registry, the model
aliases. When one process changes one of them through the admin API it adds one to this counter (8 bytes in
``changes.seq`` in the data dir, mapped into every process's memory); the others compare the counter with the
value they last saw at the start of each request (a memory read, no system call) and re-read what they keep
before going on.
Used by ``turnout.wiring`` (every gateway maps it; one on a data dir it cannot write goes without).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from pathlib import Path

__all__ = ["CHANGES_FILE", "ChangeCounter"]

CHANGES_FILE = "changes.seq"
_SIZE = 8


class ChangeCounter:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / CHANGES_FILE
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < _SIZE:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_size < _SIZE:  # another process may have sized it meanwhile
                    os.ftruncate(fd, _SIZE)
                fcntl.flock(fd, fcntl.LOCK_UN)
            self._map = mmap.mmap(fd, _SIZE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.seen = self.value()

    def value(self) -> int:
        return int(struct.unpack_from("<Q", self._map)[0])

    def moved(self) -> bool:
        """True when another process changed something since :meth:`caught_up` was last called."""
        return self.value() != self.seen

    def caught_up(self, value: int) -> None:
        self.seen = value

    def bump(self) -> None:
        """Tell the other processes that something changed (after the change is written)."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            before = self.value()
            struct.pack_into("<Q", self._map, 0, before + 1)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        if before == self.seen:  # nothing from the others is waiting: this process is up to date already
            self.seen = before + 1

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
