"""Gateway replicas on loopback, as a platform team runs them: one PostgreSQL and one Redis shared, N `turnout
serve` processes each with its own data dir, and nginx round robin in front (its config built from the shipped
example, deploy/nginx/turnout.conf). For tests (the ``replica_fleet`` fixture in tests/conftest.py) and benches
(bench/changes.py). Everything it starts it stops, also when starting fails halfway.

    with ReplicaFleet(workdir, {"workers": [...]}, replicas=3, postgres=server_url) as fleet:
        fleet.url                   # nginx in front (fleet.replicas[i].url: one replica)
        fleet.kill(1)               # SIGKILL replica 1; fleet.start_replica(1): again (same port and data dir)
        fleet.redis.stop(); fleet.redis.start()   # same port, empty again
        fleet.replicas[0].log()     # what replica 0 printed (its log file)
        fleet.balancer.served_by()  # which replica nginx sent each request to (its access log)

Options: ``replicas``, ``postgres``, ``redis`` (False: no Redis, no ``storage.redis_url``), ``balancer`` (False: no
nginx; ``fleet.url`` is the first replica), ``log_level``, ``env`` (added to every replica's environment),
``healthy_workers`` (a replica is ready once its ``/healthz`` counts that many), ``serve_args`` (more `turnout
serve` options for every replica, such as ``["--workers", "2"]``). Each replica's config is the given one with
``storage`` pointing at its own data dir, the fleet's database and Redis (:meth:`ReplicaFleet.config_of`).

``postgres``: a PostgreSQL server's URL (tests pass the session's server): the fleet creates a database of its
own there and drops it afterwards; None starts a server of its own (seconds more). In async tests use
``async with`` (or ``await fleet.astart()`` / ``await fleet.aclose()``): start and stop run in a thread, so a
worker served on the test's own event loop (an emulator) answers the replicas' first health polls meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests.support.services import RedisServer, fresh_postgres_database, postgres_server

__all__ = ["ADMIN_TOKEN", "NGINX_EXAMPLE", "Balancer", "Replica", "ReplicaFleet", "balancer_site"]

ROOT = Path(__file__).resolve().parents[2]
NGINX_EXAMPLE = ROOT / "deploy" / "nginx" / "turnout.conf"
ADMIN_TOKEN = "replica-fleet-admin-token"
TURNOUT = [sys.executable, "-m", "turnout"]
START_S = 60.0  # the most a process is given to answer its first request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_json(url: str, timeout: float = 2.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, limit_s: float = 20) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


# -- one gateway replica ------------------------------------------------------------------------------------------


@dataclass
class Replica:
    """One `turnout serve` process: its own port, data dir, config file and log file."""

    name: str
    port: int
    home: Path  # config.json, serve.log and data/ live here
    env: dict[str, str]
    log_level: str = "info"
    args: tuple[str, ...] = ()  # more `turnout serve` options (`--workers 2`...)
    proc: subprocess.Popen[bytes] | None = None
    _log: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def config(self) -> Path:
        return self.home / "config.json"

    @property
    def log_path(self) -> Path:
        return self.home / "serve.log"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        """Start the process (output appended to :attr:`log_path`); :meth:`wait_ready` waits for it."""
        if self.alive:
            raise RuntimeError(f"replica {self.name} is running already")
        self.close_log()
        self._log = self.log_path.open("ab")
        argv = [*TURNOUT, "serve", "--config", str(self.config), "--port", str(self.port)]
        self.proc = subprocess.Popen(
            [*argv, "--log-level", self.log_level, *self.args], stdout=self._log, stderr=subprocess.STDOUT, env=self.env
        )

    def wait_ready(self, healthy_workers: int | None = None, limit_s: float = START_S) -> None:
        """Until ``/healthz`` answers (with at least ``healthy_workers`` healthy workers, when given)."""
        deadline = time.monotonic() + limit_s
        last: Any = None
        while time.monotonic() < deadline:
            if not self.alive:
                raise RuntimeError(f"replica {self.name} exited before it was ready:\n{_tail(self.log_path)}")
            with contextlib.suppress(OSError):
                status, last = _get_json(f"{self.url}/healthz", timeout=1)
                if status == 200 and (healthy_workers is None or last["healthy_workers"] >= healthy_workers):
                    return
            time.sleep(0.05)
        raise RuntimeError(
            f"replica {self.name} not ready in {limit_s} s (last /healthz: {last}):\n{_tail(self.log_path)}"
        )

    def kill(self) -> None:
        """SIGKILL, as a lost machine or an OOM kill: nothing of its shutdown runs."""
        if self.proc is not None:
            _stop(self.proc, signal.SIGKILL)
        self.close_log()

    def stop(self) -> None:
        """SIGTERM, as Kubernetes stops a pod: its shutdown runs (usage flushed, connections closed)."""
        if self.proc is not None:
            _stop(self.proc)
        self.close_log()

    def log(self) -> str:
        """Everything the process printed so far (every start of it)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


# -- the load balancer --------------------------------------------------------------------------------------------


_TEMPS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
_UPSTREAM_SERVER = re.compile(r"^(\s*)server\s+\S+:\d+(\s[^;]*)?;[^\n]*$", re.M)
_LISTEN = re.compile(r"^(\s*)listen\s+[^;]+;", re.M)


def balancer_site(ports: list[int], listen: int, example: Path = NGINX_EXAMPLE) -> str:
    """The shipped nginx example with its upstream servers replaced by loopback ``ports`` (the parameters of the
    example's first server line kept) and its listen line by ``127.0.0.1:listen``."""
    text = example.read_text()
    found = list(_UPSTREAM_SERVER.finditer(text))
    listens = list(_LISTEN.finditer(text))
    if not found or len(listens) != 1:
        raise RuntimeError(f"{example}: expected an upstream block with server lines and one listen line")
    indent, params = found[0].group(1), found[0].group(2) or ""
    servers = "\n".join(f"{indent}server 127.0.0.1:{port}{params};" for port in ports)
    text = text[: found[0].start()] + servers + text[found[-1].end() :]
    return _LISTEN.sub(lambda m: f"{m.group(1)}listen 127.0.0.1:{listen};", text, count=1)


@dataclass
class Balancer:
    """Debian's nginx as a plain process (its own prefix, config, logs and pid file; no daemon)."""

    home: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def access_log(self) -> Path:
        return self.home / "access.log"

    @property
    def error_log(self) -> Path:
        return self.home / "error.log"

    def write_config(self, replica_ports: list[int]) -> Path:
        home = self.home
        for temp in _TEMPS:
            (home / "temp" / temp).mkdir(parents=True, exist_ok=True)
        user = "user root root;\n" if os.geteuid() == 0 else ""  # workers reach the temp dirs under the test's
        conf = home / "nginx.conf"
        conf.write_text(
            f"{user}worker_processes 1;\n"
            f"error_log {self.error_log} warn;\n"
            f"pid {home / 'nginx.pid'};\n"
            "events { worker_connections 1024; }\n"
            "http {\n"
            # which replica served each request: $upstream_addr (more than one when nginx skipped a dead one)
            "    log_format turnout '$request $status upstream=$upstream_addr upstream_status=$upstream_status';\n"
            f"    access_log {self.access_log} turnout;\n"
            + "".join(f"    {t}_temp_path {home / 'temp' / t};\n" for t in _TEMPS)
            + balancer_site(replica_ports, self.port)
            + "\n}\n"
        )
        return conf

    def start(self, replica_ports: list[int]) -> None:
        exe = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(exe).exists():
            raise RuntimeError("nginx not found: install it (scripts/test does: apt-get install nginx)")
        conf = self.write_config(replica_ports)
        argv = [exe, "-p", str(self.home), "-e", str(self.error_log), "-c", str(conf), "-g", "daemon off;"]
        check = subprocess.run([*argv, "-t"], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"nginx refuses the config {conf}: {check.stderr}")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_S
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start: {_tail(self.error_log)}")
            time.sleep(0.02)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        _stop(proc, signal.SIGTERM, 10)  # fast shutdown: the master ends its workers
        with contextlib.suppress(ProcessLookupError):  # a worker the master did not wait for (its own group)
            os.killpg(proc.pid, signal.SIGKILL)

    def served_by(self) -> list[str]:
        """The upstream address of every request in the access log, in order."""
        try:
            lines = self.access_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [m.group(1) for line in lines if (m := re.search(r"upstream=(\S+)", line))]


# -- the fleet ----------------------------------------------------------------------------------------------------


class ReplicaFleet:
    """PostgreSQL, Redis, ``replicas`` gateways and nginx; see the module docstring."""

    def __init__(
        self,
        workdir: Path,
        config: Mapping[str, Any],
        *,
        replicas: int = 3,
        postgres: str | None = None,
        redis: bool = True,
        balancer: bool = True,
        log_level: str = "info",
        env: Mapping[str, str] | None = None,
        healthy_workers: int | None = None,
        serve_args: Sequence[str] = (),
    ) -> None:
        self.workdir = workdir
        self.base_config = dict(config)
        self.count = replicas
        self.postgres_server = postgres
        self.healthy_workers = healthy_workers
        self.log_level = log_level
        self.extra_env = dict(env or {})
        self.serve_args = tuple(serve_args)
        self.redis: RedisServer | None = RedisServer() if redis else None
        self.balancer: Balancer | None = Balancer(workdir / "nginx", _free_port()) if balancer else None
        self.replicas: list[Replica] = []
        self.database_url = ""
        self._stack = contextlib.ExitStack()

    # -- lifecycle --
    def start(self) -> Self:
        """Start everything, each replica's first poll of its workers done; on any failure stop what started."""
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        server = self.postgres_server or self._stack.enter_context(postgres_server())
        self.database_url = self._stack.enter_context(fresh_postgres_database(server))
        if self.redis is not None:
            self.redis.start()
            self._stack.callback(self.redis.stop)
        env = {**os.environ, "TURNOUT_ADMIN_TOKEN": ADMIN_TOKEN, **self.extra_env}
        for i in range(self.count):
            home = self.workdir / f"r{i}"
            home.mkdir(parents=True, exist_ok=True)
            replica = Replica(f"r{i}", _free_port(), home, env, self.log_level, self.serve_args)
            replica.config.write_text(json.dumps(self.config_of(replica), indent=2))
            self.replicas.append(replica)
        self._stack.callback(self._stop_replicas)
        for replica in self.replicas:  # all at once: they migrate a new database one by one (advisory lock)
            replica.spawn()
        for replica in self.replicas:
            replica.wait_ready(self.healthy_workers)
        if self.balancer is not None:
            self.balancer.home.mkdir(parents=True, exist_ok=True)
            self._stack.callback(self.balancer.stop)
            self.balancer.start([r.port for r in self.replicas])

    def config_of(self, replica: Replica) -> dict[str, Any]:
        """The replica's config.json: the fleet's, with storage pointing at its data dir and the shared stores."""
        storage = {
            **self.base_config.get("storage", {}),
            "data_dir": str(replica.data_dir),
            "database_url": self.database_url,
        }
        if self.redis is not None:
            storage["redis_url"] = self.redis.url
        return {**self.base_config, "storage": storage}

    def _stop_replicas(self) -> None:
        for replica in self.replicas:  # SIGTERM to all first: they shut down side by side
            if replica.alive and replica.proc is not None:
                replica.proc.terminate()
        for replica in self.replicas:
            replica.stop()

    def close(self) -> None:
        """Stop everything this fleet started (nginx, the replicas, Redis, its database or server)."""
        self._stack.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def astart(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- what tests use --
    @property
    def url(self) -> str:
        """Where clients go: nginx, or the first replica without a balancer."""
        return self.balancer.url if self.balancer is not None else self.replicas[0].url

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def kill(self, i: int) -> None:
        """SIGKILL replica ``i``."""
        self.replicas[i].kill()

    def stop(self, i: int) -> None:
        """SIGTERM replica ``i`` and wait for it to end."""
        self.replicas[i].stop()

    def start_replica(self, i: int) -> None:
        """Start replica ``i`` again (same port, data dir and config) and wait until it answers."""
        self.replicas[i].spawn()
        self.replicas[i].wait_ready(self.healthy_workers)

    async def astart_replica(self, i: int) -> None:
        await asyncio.to_thread(self.start_replica, i)

    def logs(self) -> dict[str, str]:
        """Every replica's log by name."""
        return {r.name: r.log() for r in self.replicas}
