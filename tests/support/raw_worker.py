"""A worker that answers inference calls with exactly the bytes a test scripts, for misbehaviour tests.

Listing routes answer like a healthy server (OpenAI ``/v1/models``; Ollama ``/api/tags``, ``/api/ps``,
``/api/version``) so the gateway's polls see a live worker holding ``models``. Every POST takes the next
:class:`Reply` from the queue (or the default one): raw HTTP bytes, sent in the given pieces, then
optionally a close. Nothing here parses what the gateway sends beyond the request head and its length.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

import orjson

__all__ = ["RawWorker", "Reply", "http", "ndjson", "sse"]


@dataclass
class Reply:
    pieces: list[bytes]
    close: bool = False
    gap_s: float = 0.0  # pause between pieces (separate TCP segments)


def http(status: int, body: bytes, content_type: str = "application/json", *, chunked: bool = False) -> bytes:
    head = b"HTTP/1.1 %d X\r\nContent-Type: %s\r\n" % (status, content_type.encode())
    if chunked:
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + (b"%x\r\n%s\r\n" % (len(body), body) if body else b"")
    return head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def sse(*frames: object) -> bytes:
    return b"".join(b"data: " + (f if isinstance(f, bytes) else orjson.dumps(f)) + b"\n\n" for f in frames)


def ndjson(*objs: object) -> bytes:
    return b"".join(orjson.dumps(o) + b"\n" for o in objs)


@dataclass
class RawWorker:
    models: list[str] = field(default_factory=lambda: ["m:1"])
    default: Reply | None = None
    replies: deque[Reply] = field(default_factory=deque)
    posts: list[bytes] = field(default_factory=list)
    connections: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path = head.split(b" ", 2)[:2]
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                reply = self._listing(path) if method == b"GET" else self._next(body)
                for n, piece in enumerate(reply.pieces):
                    if n and reply.gap_s:
                        await asyncio.sleep(reply.gap_s)
                    writer.write(piece)
                    await writer.drain()
                if reply.close:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def _next(self, body: bytes) -> Reply:
        self.posts.append(body)
        if self.replies:
            return self.replies.popleft()
        assert self.default is not None, "no reply scripted for this request"
        return self.default

    def _listing(self, path: bytes) -> Reply:
        if path.startswith(b"/v1/models"):
            data = {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "raw"} for m in self.models]}
        elif path.startswith(b"/api/tags"):
            data = {"models": [{"name": m, "model": m, "size": 1, "digest": "d"} for m in self.models]}
        elif path.startswith(b"/api/ps"):
            data = {"models": []}
        else:
            data = {"version": "0.12.0"}
        return Reply([http(200, orjson.dumps(data))])
