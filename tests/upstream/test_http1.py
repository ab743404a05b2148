"""The hot-path HTTP/1.1 client against raw loopback servers that misbehave on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.conftest import free_port
from turnout.errors import UpstreamError
from turnout.upstream.client import ConnectFailed, UpstreamClient

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)  # type: ignore[arg-type]
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length) if length else b""


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[tuple[str, RawServer]]]]:
    servers: list[RawServer] = []

    async def make(handler: Handler) -> tuple[str, RawServer]:
        server = RawServer(handler)
        servers.append(server)
        return await server.start(), server

    yield make
    for server in servers:
        await server.stop()


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    c = UpstreamClient(connect_timeout_s=2, total_timeout_s=5)
    yield c
    await c.close()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


async def test_keep_alive_reuses_one_connection(serve, client: UpstreamClient) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await read_request(reader)
            writer.write(ok(b'{"echo": %d}' % len(body)))
            await writer.drain()

    url, server = await serve(handler)
    for n in range(5):
        async with client.request("POST", url + "/x", label="w", body=b"a" * n) as resp:
            assert resp.status == 200 and resp.content_type == "application/json"
            assert await resp.read() == b'{"echo": %d}' % n
    assert server.connections == 1


async def test_connection_close_is_not_reused(serve, client: UpstreamClient) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"{}", b"Connection: close\r\n"))
        await writer.drain()

    url, server = await serve(handler)
    for _ in range(2):
        async with client.request("GET", url, label="w") as resp:
            assert await resp.read() == b"{}"
    assert server.connections == 2


async def test_chunked_stream_arrives_chunk_by_chunk(serve, client: UpstreamClient) -> None:  # type: ignore[no-untyped-def]
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"6\r\nfirst\n\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
        await writer.drain()

    url, _ = await serve(handler)
    async with client.request("POST", url, label="w", body=b"{}") as resp:
        assert resp.content_type == "text/event-stream"
        chunks = resp.chunks()
        assert await chunks.__anext__() == b"first\n"  # before the server sent the rest
        release.set()
        assert [c async for c in chunks] == [b"second\n"]


async def test_body_until_eof(serve, client: UpstreamClient) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nno length here")
        await writer.drain()

    url, _ = await serve(handler)
    async with client.request("GET", url, label="w") as resp:
        assert await resp.read() == b"no length here"


async def test_stale_keep_alive_connection_is_retried(serve, client: UpstreamClient) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"{}"))  # says keep-alive, then closes the idle connection anyway
        await writer.drain()

    url, server = await serve(handler)
    async with client.request("GET", url, label="w") as resp:
        await resp.read()
    await asyncio.sleep(0.05)
    async with client.request("GET", url, label="w") as resp:
        assert resp.status == 200 and await resp.read() == b"{}"
    assert server.connections == 2


async def test_refused_is_connect_failed(client: UpstreamClient) -> None:
    with pytest.raises(ConnectFailed, match="cannot connect"):
        async with client.request("GET", f"http://127.0.0.1:{free_port()}/", label="w"):
            pass


async def test_total_timeout(serve, client: UpstreamClient) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(30)

    url, _ = await serve(handler)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(UpstreamError, match="timed out"):
        async with client.request("GET", url, label="w", timeout_s=0.2):
            pass
    assert loop.time() - started < 2


@pytest.mark.parametrize(
    ("reply", "fragment"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", "invalid HTTP response"),
        (b"", "connection closed by the worker"),
    ],
)
async def test_broken_responses(serve, client: UpstreamClient, reply: bytes, fragment: str) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()

    url, _ = await serve(handler)
    with pytest.raises(UpstreamError, match=fragment):
        async with client.request("GET", url, label="w"):
            pass


async def test_truncated_body_is_an_error(serve, client: UpstreamClient) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await writer.drain()

    url, _ = await serve(handler)
    async with client.request("GET", url, label="w") as resp:
        with pytest.raises(UpstreamError, match="stream broke"):
            await resp.read()


async def test_large_body_with_slow_reader(serve, client: UpstreamClient) -> None:  # type: ignore[no-untyped-def]
    payload = bytes(range(256)) * (4 * 4096)  # 4 MiB: over the high-water mark, so reading pauses

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload))
        writer.write(payload)
        await writer.drain()

    url, _ = await serve(handler)
    got = bytearray()
    async with client.request("GET", url, label="w") as resp:
        async for chunk in resp.chunks():
            got += chunk
            await asyncio.sleep(0)
    assert bytes(got) == payload


def test_keep_alive_on_uvloop() -> None:
    """``turnout serve`` runs on uvloop (:mod:`turnout.gateway.server`), whose transports are not subclasses of
    ``asyncio.Transport``: the client must take them as they are, and reuse its connection there too."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> tuple[list[bytes], int]:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await read_request(reader)
                writer.write(ok(b'{"ok": 1}'))
                await writer.drain()

        server = RawServer(handler)
        url = await server.start()
        client = UpstreamClient(connect_timeout_s=2, total_timeout_s=5)
        bodies = []
        try:
            for _ in range(3):
                async with client.request("POST", url + "/x", label="w", body=b"{}") as resp:
                    bodies.append(await resp.read())
        finally:
            await client.close()
            await server.stop()
        return bodies, server.connections

    bodies, connections = uvloop.run(main())
    assert bodies == [b'{"ok": 1}'] * 3
    assert connections == 1
