"""A real S3 API server for the tests: moto's server mode (``python -m moto.server``, the ``moto[server]`` package),
on a loopback port, with boto3 pointed at it through the environment the agent reads (``AWS_ENDPOINT_URL``,
test credentials, no instance metadata), and a TCP relay that can hold an answer midway (to see a download's
progress while it is under way)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.conftest import free_port

__all__ = ["AWS_ENV", "HeldRelay", "S3Server", "moto_server"]

# What the agent's boto3 reads (set with monkeypatch.setenv): moto takes any credentials; never the instance
# metadata service (a dial off this machine), never a credentials file of the machine's user.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
    "AWS_CONFIG_FILE": "/nonexistent/config",
    "AWS_MAX_ATTEMPTS": "1",
}


@dataclass
class S3Server:
    url: str
    proc: subprocess.Popen[bytes]

    @contextlib.contextmanager
    def client(self) -> Iterator[Any]:
        """A boto3 S3 client of this server, closed at the end (its sockets with it)."""
        import boto3

        client = boto3.session.Session().client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        try:
            yield client
        finally:
            client.close()


@contextlib.contextmanager
def moto_server() -> Iterator[S3Server]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # poll with a deadline: it answers once it listens
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, "moto's server exited"
                assert time.monotonic() < deadline, "moto's server did not answer within 60 s"
                time.sleep(0.1)
        yield S3Server(url, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class HeldRelay:
    """A TCP relay to ``upstream`` on a loopback port that, once ``hold_after`` bytes of answers have gone
    through it, forwards nothing more until :meth:`release` (the requests still go through)."""

    upstream_port: int
    hold_after: int
    released: asyncio.Event = field(default_factory=asyncio.Event)
    held: asyncio.Event = field(default_factory=asyncio.Event)
    sent: int = 0
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}"

    def release(self) -> None:
        self.released.set()

    async def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            self._tasks.discard(task)
            return
        ahead = asyncio.create_task(self._pump(reader, up_writer, hold=False))
        self._tasks.add(ahead)
        try:
            await self._pump(up_reader, writer, hold=True)
        finally:
            ahead.cancel()
            for w in (writer, up_writer):
                w.close()
            self._tasks.discard(task)
            self._tasks.discard(ahead)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, hold: bool) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while chunk := await reader.read(16384):
                if hold and not self.released.is_set() and self.sent + len(chunk) > self.hold_after:
                    cut = max(0, self.hold_after - self.sent)
                    writer.write(chunk[:cut])
                    await writer.drain()
                    self.sent += cut
                    self.held.set()
                    await self.released.wait()
                    chunk = chunk[cut:]
                writer.write(chunk)
                await writer.drain()
                if hold:
                    self.sent += len(chunk)
