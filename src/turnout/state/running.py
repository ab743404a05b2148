"""A gateway's presence on a data dir: a shared ``flock`` on ``gateway.lock`` for as long as it runs.

The gateway holds the lock (shared, so replicas on one data dir can run side by side); ``turnout backup
restore`` asks for it exclusively without waiting and refuses when it cannot get it. The kernel drops the
lock when the process ends, however it ends, so there is nothing stale to clean up. The file stays empty.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path

__all__ = ["LOCK_FILE", "GatewayMark", "gateway_running"]

log = logging.getLogger("turnout.state")

LOCK_FILE = "gateway.lock"


class GatewayMark:
    """Held by a running gateway; ``release`` at shutdown."""

    def __init__(self, data_dir: Path) -> None:
        self._fd: int | None = None
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_SH)
        except OSError as exc:  # a read-only data dir still serves; only the restore's check is lost
            log.warning(
                "cannot hold %s in %s (%s): `turnout backup restore` cannot tell this gateway runs",
                LOCK_FILE,
                data_dir,
                exc.strerror or exc,
            )
            self.release()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None


def gateway_running(data_dir: Path) -> bool:
    """True while any process holds a gateway's mark on ``data_dir``."""
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
