"""A gateway's presence on a data dir: a shared ``flock`` on ``gateway.lock`` for as long as it runs, and the
address it listens on in ``gateway.address``.

The gateway holds the lock (shared, so replicas on one data dir can run side by side); ``turnout backup
restore`` asks for it exclusively without waiting and refuses when it cannot get it. The kernel drops the
lock when the process ends, however it ends, so there is nothing stale to clean up. The file stays empty.

``turnout serve`` records where it listens (``--host``/``--port`` may differ from the config's ``listen``), so that
the CLI on this machine reaches it (:func:`recorded_address`); the record counts only while the lock is held (a
gateway killed with SIGKILL leaves it behind, and the next one to start writes its own).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from pathlib import Path

from turnout.atomic import write_atomic

__all__ = [
    "ADDRESS_FILE",
    "LOCK_FILE",
    "GatewayMark",
    "forget_address",
    "gateway_running",
    "record_address",
    "recorded_address",
]

log = logging.getLogger("turnout.state")

LOCK_FILE = "gateway.lock"
ADDRESS_FILE = "gateway.address"


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


def record_address(data_dir: Path, host: str, port: int) -> None:
    """Record that this process's gateway listens on ``host``:``port`` (as bound; written atomically). A data dir
    that cannot take it (read-only) only costs the CLI the address: said once, never fatal."""
    body = json.dumps({"host": host, "port": port, "pid": os.getpid()}).encode()
    try:
        write_atomic(data_dir / ADDRESS_FILE, body, mode=0o600)
    except OSError as exc:
        log.warning("cannot record the address in %s (%s): the CLI dials listen's instead", data_dir, exc.strerror)


def forget_address(data_dir: Path) -> None:
    """Remove this process's record (another gateway's, written since, stays)."""
    path = data_dir / ADDRESS_FILE
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def recorded_address(data_dir: Path) -> tuple[str, int] | None:
    """Where the gateway holding ``data_dir`` said it listens (host as bound), or None: none recorded, none holds
    the data dir now (a record left by one that was killed), or a record that does not read."""
    try:
        record = json.loads((data_dir / ADDRESS_FILE).read_text())
        if not gateway_running(data_dir):
            return None
    except (OSError, ValueError):
        return None
    host, port = (record.get("host"), record.get("port")) if isinstance(record, dict) else (None, None)
    if not isinstance(host, str) or not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return None
    return host, port
