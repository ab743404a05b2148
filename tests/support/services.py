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

__all__ = ["RedisServer", "fresh_postgres_database", "postgres_server", "redis_server"]


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


class RedisServer:
    """Debian's redis-server on a loopback port, with nothing saved to disk; stopped and started again on the
    same port (a restart comes back empty, as a Redis without persistence does)."""

    def __init__(self, port: int | None = None) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server not found: install it (scripts/test does: apt-get install redis-server)")
        self.exe = exe
        self.port = port or _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, limit_s: float = 20) -> None:
        """Start it and wait until it answers PING."""
        argv = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + limit_s
        while not self._pong():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL after 10 s); a no-op when it is not running."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def redis_server(port: int | None = None) -> Iterator[str]:
    """A throwaway redis-server on loopback (``port``: this one, e.g. to start again where one was stopped)."""
    server = RedisServer(port)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


_databases = iter(range(1, 1_000_000))


@contextmanager
def fresh_postgres_database(server: str) -> Iterator[str]:
    """A new, empty database on the PostgreSQL server whose URL is ``server`` (dropped afterwards)."""
    import sqlalchemy

    name = f"t{os.getpid()}_{next(_databases)}"
    admin = sqlalchemy.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    try:
        yield server.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()
