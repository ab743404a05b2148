"""Property-based fuzzing of the hand-written HTTP/1.1 client: no response ever crosses between requests.

A raw loopback worker answers each request with a script Hypothesis draws: interim 1xx heads, a final
head framed correctly or not (body longer or shorter than announced, bad chunk sizes, until-close), and
then possibly something extra: a forged second response (the "other tenant's answer"), garbage, or a forged
response sent late while the connection idles in the pool. Every request names itself in its path and
every honest answer echoes that name, so the invariant is checkable: a request gets its own answer (or a
prefix of it, when the worker itself cut it), or an UpstreamError; never another request's bytes, and a
well-formed answer always arrives intact whatever the previous answer on that connection did.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnout.errors import UpstreamError
from turnout.upstream.client import UpstreamClient

FORGED = b'{"id":"LEAK"}'
FRAMINGS = ("length", "chunked", "until_close", "length_short", "length_long_close", "bad_chunk", "close_mid")
GOOD = {"length", "chunked", "until_close"}  # framings whose answer must arrive whole
EXTRAS = ("none", "forged", "garbage", "late_forged")


@dataclass(frozen=True)
class Script:
    interims: tuple[int, ...]
    framing: str
    extra: str
    keep_alive: bool


scripts = st.builds(
    Script,
    interims=st.lists(st.sampled_from([100, 102, 103]), max_size=3).map(tuple),
    framing=st.sampled_from(FRAMINGS),
    extra=st.sampled_from(EXTRAS),
    keep_alive=st.booleans(),
)


def forged_response() -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(FORGED),
        FORGED,
    )


def render(script: Script, body: bytes) -> tuple[bytes, bool]:
    """(bytes to send, close afterwards)."""
    out = b""
    for status in script.interims:
        extra = b"Link: </style.css>; rel=preload\r\n" if status == 103 else b""
        out += b"HTTP/1.1 %d Interim\r\n%s\r\n" % (status, extra)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    if not script.keep_alive:
        head += b"Connection: close\r\n"
    close = not script.keep_alive
    if script.framing == "length":
        out += head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    elif script.framing == "chunked":
        half = len(body) // 2
        out += head + b"Transfer-Encoding: chunked\r\n\r\n"
        out += b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])
    elif script.framing == "until_close":
        out += head.replace(b"Connection: close\r\n", b"") + b"Connection: close\r\n\r\n" + body
        close = True
    elif script.framing == "length_short":  # announces fewer bytes than it sends: the rest is stray
        out += head + b"Content-Length: %d\r\n\r\n%s" % (len(body) - 3, body)
    elif script.framing == "length_long_close":  # announces more than it sends, then closes
        out += head + b"Content-Length: %d\r\n\r\n%s" % (len(body) + 50, body)
        close = True
    elif script.framing == "bad_chunk":
        out += head + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n%s\r\n0\r\n\r\n" % body
    else:  # close_mid
        out += head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body[: len(body) // 2])
        close = True
    if script.framing in ("until_close", "length_long_close", "close_mid"):
        return out, close  # by the worker's own framing, anything more would be this body's bytes
    if script.extra == "forged":
        out += forged_response()
    elif script.extra == "garbage":
        out += b"\x00\xffNOT HTTP\r\n\r\n"
    return out, close


async def read_head(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    return head.split(b" ", 2)[1]  # the request target


async def run_scenario(plan: list[Script]) -> None:
    by_path: dict[bytes, Script] = {}
    tasks: set[asyncio.Task[None]] = set()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                path = await read_head(reader)
                script = by_path[path]
                data, close = render(script, b'{"id":"%s"}' % path)
                writer.write(data)
                await writer.drain()
                if script.extra == "late_forged" and not close:
                    await asyncio.sleep(0.01)  # while the client's connection sits idle in its pool
                    writer.write(forged_response())
                    await writer.drain()
                if close:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def track(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(handler(reader, writer))
        tasks.add(task)

    server = await asyncio.start_server(track, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = UpstreamClient(connect_timeout_s=2, total_timeout_s=2)
    try:
        for n, script in enumerate(plan):
            path = b"/r%d" % n
            by_path[path] = script
            own = b'{"id":"%s"}' % path
            got: bytes | None = None
            try:
                async with client.request("GET", url + path.decode(), label="w") as resp:
                    status = resp.status
                    got = await resp.read()
            except UpstreamError:
                got = None
            if got is not None:
                assert status == 200, (script, status)
                assert b"LEAK" not in got, (n, script, got)
                assert own.startswith(got), (n, script, got)
            if script.framing in GOOD:
                assert got == own, (n, script, got)
            await asyncio.sleep(0.03 if script.extra == "late_forged" else 0)
    finally:
        await client.close()
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(scripts, min_size=1, max_size=6))
def test_no_response_crosses_requests(plan: list[Script]) -> None:
    asyncio.run(run_scenario(plan))
