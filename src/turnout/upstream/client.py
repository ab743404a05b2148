"""One pooled HTTP client for every worker call: polls and proxied requests.

Built on :mod:`turnout.upstream.http1`. A request's whole life (connect, headers, body or stream) is
bounded by one total timeout; connect has its own. Failures become :class:`turnout.errors.UpstreamError`;
:class:`ConnectFailed` means nothing reached the worker, so the caller may safely try another one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from turnout.errors import UpstreamError
from turnout.upstream.http1 import (
    ConnectFailed,
    Connection,
    DialGuard,
    DialRefused,
    NoAnswer,
    Pool,
    Resolver,
    encode_request,
    split_url,
    system_resolver,
)

__all__ = [
    "MAX_ANSWER_BYTES",
    "ConnectFailed",
    "DialGuard",
    "DialRefused",
    "NoAnswer",
    "UpstreamClient",
    "UpstreamResponse",
]

MAX_ANSWER_BYTES = 256 << 20  # a non-streamed answer is buffered whole: bounded (large embedding batches fit)


class UpstreamResponse:
    """A worker's answer, its head arrived. ``connect_s``: how long getting a connection and writing the request on
    it took (a kept-alive one: about 0); ``sent_at``: when the request was written, ``head_at``: when the answer's
    head arrived (``time.perf_counter``; the request's timing phases, :mod:`turnout.gateway.timing`)."""

    __slots__ = ("_conn", "_label", "connect_s", "content_type", "head_at", "sent_at", "settle_s", "status")

    def __init__(self, conn: Connection, label: str, connect_s: float, sent_at: float) -> None:
        self._conn = conn
        self._label = label
        self.status = conn.status
        self.content_type = conn.content_type
        self.settle_s: float | None = None
        self.connect_s = connect_s
        self.sent_at = sent_at
        self.head_at = time.perf_counter()

    def finish_later(self, limit_s: float) -> None:
        """The caller has what it needs: when it leaves the request, the rest of the body is read (and dropped)
        in the background for at most ``limit_s``, so that the connection can be reused, instead of being closed
        at once; the caller does not wait for it."""
        self.settle_s = limit_s

    async def read(self, limit: int = MAX_ANSWER_BYTES) -> bytes:
        """The whole body; an answer larger than ``limit`` bytes is an UpstreamError (and is not reused)."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.chunks():
            size += len(chunk)
            if size > limit:
                self.abandon()
                raise UpstreamError(f"{self._label}: the answer is larger than {limit} bytes", code="answer_too_large")
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def abandon(self) -> None:
        """Stop reading: the connection is closed, never pooled (a body not read to its end is not clean)."""
        self._conn.close()

    async def chunks(self, idle_s: float | None = None) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (for streams); the connection's error, if any, after what arrived before it.
        ``idle_s``: an empty chunk each time the worker has sent nothing for that long (a stream's keep-alive).
        One generator, not one wrapping :func:`iter_body`: a stream of tokens takes one step per token."""
        conn = self._conn
        if idle_s is None:
            while True:
                if conn.body:
                    yield conn.take()
                    continue
                if conn.error is not None:
                    self._raise_error()
                if conn.complete:
                    return
                await conn.wait()
        idle = _Silence(conn, idle_s)
        try:
            while True:
                if conn.body:
                    idle.heard()
                    yield conn.take()
                    continue
                if conn.error is not None:
                    self._raise_error()
                if conn.complete:
                    return
                idle.arm()
                if not await conn.wait():
                    yield b""
        finally:
            idle.stop()

    def _raise_error(self) -> None:
        error = self._conn.error
        if isinstance(error, UpstreamError):
            raise UpstreamError(f"{self._label}: stream broke: {error.message}") from None
        assert error is not None
        raise error


class _Silence:
    """Interrupts a connection's wait once the worker has sent nothing for ``idle_s``. One timer per silence, not
    one per wait (a stream waits once per token): it fires, finds the last byte recent and re-arms for the new
    due time, or interrupts the wait; with nobody waiting it stops (the stream is over) until armed again."""

    __slots__ = ("conn", "idle_s", "last", "loop", "timer")

    def __init__(self, conn: Connection, idle_s: float) -> None:
        self.conn = conn
        self.idle_s = idle_s
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self.timer: asyncio.TimerHandle | None = None

    def heard(self) -> None:
        self.last = self.loop.time()

    def arm(self) -> None:
        if self.timer is None:
            self.timer = self.loop.call_at(self.last + self.idle_s, self._fire)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self) -> None:
        self.timer = None
        now = self.loop.time()
        if now < self.last + self.idle_s:
            self.arm()  # the worker spoke meanwhile
        elif self.conn.interrupt():
            self.last = now  # the next interruption after another full silence


class _Exchange:
    """One ``async with client.request(...)`` block (a class, not ``asynccontextmanager``: it runs for every
    proxied request, and a generator-based context manager costs several microseconds more)."""

    __slots__ = (
        "body",
        "client",
        "guard",
        "headers",
        "headers_timeout_s",
        "label",
        "method",
        "response",
        "timeout_s",
        "timer",
        "url",
    )

    def __init__(
        self,
        client: UpstreamClient,
        method: str,
        url: str,
        label: str,
        body: bytes | None,
        headers: Mapping[str, str] | None,
        timeout_s: float | None,
        guard: DialGuard | None,
        headers_timeout_s: float | None,
    ) -> None:
        self.client = client
        self.method = method
        self.url = url
        self.label = label
        self.body = body
        self.headers = headers
        self.timeout_s = timeout_s
        self.guard = guard
        self.headers_timeout_s = headers_timeout_s
        self.response: UpstreamResponse | None = None
        self.timer: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> UpstreamResponse:
        self.response = await self.client._open(self)
        return self.response

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        assert self.timer is not None and self.response is not None
        self.timer.cancel()
        self.client._close(self.response, kind is not None)


class UpstreamClient:
    def __init__(
        self, *, connect_timeout_s: float, total_timeout_s: float, resolver: Resolver = system_resolver
    ) -> None:
        self._total_timeout = total_timeout_s
        self._pool = Pool(connect_timeout_s, resolver)
        self._settling: set[asyncio.Task[None]] = set()  # connections reading the rest of a body (finish_later)

    async def start(self) -> None:
        """Nothing to open up front; kept so the app lifecycle reads symmetrically."""

    async def close(self) -> None:
        for task in list(self._settling):
            task.cancel()
        self._pool.close()

    async def _settle(self, conn: Connection, limit_s: float) -> None:
        """Read the rest of a body nobody waits for, then pool the connection (closed unless it ended clean)."""
        try:
            async with asyncio.timeout(limit_s):
                while not conn.complete and conn.error is None:
                    if conn.body:
                        conn.take()
                    else:
                        await conn.wait()
        except TimeoutError:
            pass  # still sending: release() closes it
        except BaseException:
            conn.close()
            raise
        self._pool.release(conn)

    def request(
        self,
        method: str,
        url: str,
        *,
        label: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        guard: DialGuard | None = None,
        headers_timeout_s: float | None = None,
    ) -> _Exchange:
        """``async with client.request(...) as response``: the response once its head arrived; leaving the block
        releases the connection (pooled if its body was read to a clean end). ``guard``: SSRF policy for the
        dial. ``headers_timeout_s``: give up (UpstreamError, code ``headers_timeout``) when no response headers
        arrived in time (fallback latency budgets)."""
        return _Exchange(self, method, url, label, body, headers, timeout_s, guard, headers_timeout_s)

    async def _open(self, x: _Exchange) -> UpstreamResponse:
        label, headers_timeout_s = x.label, x.headers_timeout_s
        target = split_url(x.url)
        data = encode_request(x.method, target, x.headers, x.body)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (x.timeout_s or self._total_timeout)
        dialing = time.perf_counter()
        while True:
            try:
                conn, reused = await self._pool.connect(target, label, x.guard)
            except ConnectFailed as exc:
                exc.connect_s = time.perf_counter() - dialing
                raise
            timer = loop.call_at(deadline, conn.timed_out, label)
            try:
                assert conn.transport is not None
                conn.transport.write(data)
                sent_at = time.perf_counter()
                if headers_timeout_s is None:
                    while not conn.headers_done and conn.error is None:
                        await conn.wait()
                else:
                    async with asyncio.timeout(headers_timeout_s):
                        while not conn.headers_done and conn.error is None:
                            await conn.wait()
            except TimeoutError:
                timer.cancel()
                conn.close()
                raise UpstreamError(
                    f"{label}: no response headers within {headers_timeout_s:g}s", code="headers_timeout"
                ) from None
            except BaseException:
                timer.cancel()
                conn.close()
                raise
            if conn.headers_done:
                x.timer = timer
                return UpstreamResponse(conn, label, sent_at - dialing, sent_at)
            timer.cancel()
            conn.close()
            if reused and not conn.received_any and loop.time() < deadline:
                continue  # a stale keep-alive connection closed by the worker: retry once on a fresh one
            error = conn.error
            message = error.message if isinstance(error, UpstreamError) else str(error)
            code = error.code if isinstance(error, UpstreamError) else None
            text = message if message.startswith(label) else f"{label}: {message}"
            if code == "timeout":  # sent and waited for: slow, not broken
                raise UpstreamError(text, code=code)
            raise NoAnswer(text, code=code)

    def _close(self, response: UpstreamResponse, failed: bool) -> None:
        """The caller left the block: ``failed`` (an exception, the client gone) closes the connection; else it
        is pooled, or read to its end in the background first (``finish_later``)."""
        conn = response._conn
        if failed:
            conn.close()  # abandoned mid-body (client gone, error): never reuse the connection
        elif response.settle_s is not None and not conn.complete and conn.error is None and not conn.lost:
            task = asyncio.get_running_loop().create_task(self._settle(conn, response.settle_s))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
        else:
            self._pool.release(conn)

    async def get_json(
        self, url: str, *, label: str, timeout_s: float, headers: Mapping[str, str] | None = None
    ) -> Any:
        """GET and decode JSON; raises UpstreamError on any failure or a non-2xx status."""
        async with self.request("GET", url, label=label, timeout_s=timeout_s, headers=headers) as resp:
            body = await resp.read()
            if resp.status >= 300:
                raise UpstreamError(f"{label}: HTTP {resp.status} from {url}")
            try:
                return orjson.loads(body)
            except orjson.JSONDecodeError:
                raise UpstreamError(f"{label}: {url} did not return JSON") from None

    async def get_text(self, url: str, *, label: str, timeout_s: float) -> str:
        async with self.request("GET", url, label=label, timeout_s=timeout_s) as resp:
            body = await resp.read()
            if resp.status >= 300:
                raise UpstreamError(f"{label}: HTTP {resp.status} from {url}")
            return body.decode("utf-8", "replace")
