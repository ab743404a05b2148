"""Real PostgreSQL and Redis servers for tests, started and stopped by the suite itself.

PostgreSQL refuses to run as root, so when the suite runs as root the cluster belongs to the
``postgres`` system user (``runuser``). Both listen on loopback ports only.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["postgres_server", "redis_server"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    raise RuntimeError(f"{name} not found: install PostgreSQL (scripts/test does: apt-get install postgresql)")


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yields a SQLAlchemy URL of a fresh throwaway cluster's ``postgres`` database."""
    as_root = os.geteuid() == 0
    base = Path(tempfile.mkdtemp(prefix="turnout-pg-"))
    run_as = ["runuser", "-u", "postgres", "--"] if as_root else []
    if as_root:
        shutil.chown(base, "postgres", "postgres")
    port = _free_port()
    data, log = base / "data", base / "log"
    subprocess.run(
        [*run_as, _tool("initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *run_as,
            _tool("pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(log),
            "-w",
            "-t",
            "60",
            "-o",
            f"-k {base} -c listen_addresses=127.0.0.1 -p {port} -c fsync=off -c max_connections=200",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*run_as, _tool("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], capture_output=True
        )
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def redis_server(port: int | None = None) -> Iterator[str]:
    """A throwaway redis-server on loopback (``port``: this one, e.g. to start again where one was stopped)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not found: install it (scripts/test does: apt-get install redis-server)")
    port = port or _free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
