"""The SSRF guard at dial time, with real sockets on loopback only (nothing else is ever dialed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from turnout.upstream.client import DialGuard, DialRefused, UpstreamClient

STRICT = DialGuard(allow_private=False)
OPTED_IN = DialGuard(allow_private=True)


@pytest.fixture
async def server() -> AsyncIterator[int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(
                    b"HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest/meta-data/\r\n"
                    b"Content-Length: 0\r\n\r\n"
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    yield srv.sockets[0].getsockname()[1]
    srv.close()
    await srv.wait_closed()


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    c = UpstreamClient(connect_timeout_s=2, total_timeout_s=5)
    yield c
    await c.close()


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "localhost", "localhost.", "2130706433", "0177.0.0.1", "0x7f.0.0.1", "127.1", "[::ffff:127.0.0.1]"],
)
async def test_loopback_spellings_refused_without_opt_in(client: UpstreamClient, server: int, host: str) -> None:
    with pytest.raises(DialRefused, match="refused to dial"):
        async with client.request("GET", f"http://{host}:{server}/v1/models", label="ep", guard=STRICT):
            pass


@pytest.mark.parametrize("host", ["127.0.0.1", "2130706433", "localhost."])
async def test_opt_in_allows_private(client: UpstreamClient, server: int, host: str) -> None:
    async with client.request("GET", f"http://{host}:{server}/", label="ep", guard=OPTED_IN) as resp:
        assert resp.status == 302  # and the redirect is returned, never followed


@pytest.mark.parametrize("host", ["169.254.169.254", "[fe80::1]", "0.0.0.0", "[::]", "metadata.google.internal"])
async def test_always_refused_even_with_opt_in(client: UpstreamClient, host: str) -> None:
    with pytest.raises(DialRefused):
        async with client.request("GET", f"http://{host}/", label="ep", guard=OPTED_IN):
            pass


async def test_dns_answer_that_changes_is_checked_at_each_dial(server: int) -> None:
    answers = [["127.0.0.1"], ["169.254.169.254"]]
    asked: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers[min(len(asked) - 1, 1)]

    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=5, resolver=resolver)
    try:
        async with client.request("GET", f"http://ep.test:{server}/", label="ep", guard=OPTED_IN) as resp:
            assert resp.status == 302
            resp._conn.close()  # force a fresh dial (and resolution) next time
        with pytest.raises(DialRefused, match="metadata"):
            async with client.request("GET", f"http://ep.test:{server}/", label="ep", guard=OPTED_IN):
                pass
    finally:
        await client.close()
    assert asked == ["ep.test", "ep.test"]


async def test_only_allowed_addresses_are_dialed(server: int) -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return ["169.254.169.254", "127.0.0.1"]  # a name with one bad and one good answer

    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=5, resolver=resolver)
    try:
        async with client.request("GET", f"http://mixed.test:{server}/", label="ep", guard=OPTED_IN) as resp:
            assert resp.status == 302
    finally:
        await client.close()
