"""One pooled HTTP client for every worker call: polls and proxied requests.

Wraps an ``aiohttp.ClientSession``. Connection failures, timeouts and broken bodies become
:class:`turnout.errors.UpstreamError`; :class:`ConnectFailed` (a subclass) means the worker was never
reached, so the caller may safely try another one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from turnout.errors import UpstreamError

__all__ = ["ConnectFailed", "UpstreamClient", "UpstreamResponse"]


class ConnectFailed(UpstreamError):
    """The worker could not be reached at all; nothing was sent, another worker may be tried."""


@dataclass(slots=True)
class UpstreamResponse:
    status: int
    content_type: str
    _resp: aiohttp.ClientResponse
    _label: str

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamError(f"{self._label}: response failed: {_describe(exc)}") from None

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (for streams)."""
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamError(f"{self._label}: stream broke: {_describe(exc)}") from None

    async def lines(self) -> AsyncIterator[bytes]:
        """Body split on newlines, each line without its terminator (for NDJSON and SSE translation)."""
        buffer = b""
        async for chunk in self.chunks():
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r")
        if buffer:
            yield buffer


class UpstreamClient:
    def __init__(self, *, connect_timeout_s: float, total_timeout_s: float) -> None:
        self._connect_timeout = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._default_timeout = aiohttp.ClientTimeout(total=total_timeout_s, sock_connect=connect_timeout_s)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        return self._session

    @asynccontextmanager
    async def request(
        self,
        method: str,
        url: str,
        *,
        label: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> AsyncIterator[UpstreamResponse]:
        timeout = (
            self._default_timeout
            if timeout_s is None
            else aiohttp.ClientTimeout(total=timeout_s, sock_connect=self._connect_timeout)
        )
        try:
            resp = await self.session.request(method, url, data=body, headers=headers, timeout=timeout)
        except (aiohttp.ClientConnectorError, aiohttp.ServerTimeoutError, aiohttp.ClientOSError) as exc:
            raise ConnectFailed(f"{label}: cannot connect: {_describe(exc)}") from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamError(f"{label}: request failed: {_describe(exc)}") from None
        try:
            yield UpstreamResponse(resp.status, resp.content_type, resp, label)
        except BaseException:
            resp.close()  # abandoned mid-body (client gone, error): drop the connection, never reuse it
            raise
        else:
            resp.release()

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


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return text
