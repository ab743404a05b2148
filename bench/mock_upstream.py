"""A deliberately fast OpenAI-compatible mock for benchmarks (raw asyncio, keep-alive, fixed answers).

Not a test emulator: it answers every POST with the same completion, or with 64 SSE chunks when the
body contains ``"stream": true``, so that proxies, not the upstream, are what a benchmark measures.
``GET /__count`` answers how many POSTs it has answered, so a benchmark can check that a proxy really
reached it. ``POST /v1/traces`` is taken as an OTLP/HTTP collector takes spans (and not counted), for a gateway
that traces (``bench/ab.py --traces``). Run: python bench/mock_upstream.py PORT
"""

from __future__ import annotations

import asyncio
import json
import sys

CHUNKS = 64
_COMPLETION = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "mock",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hello from the mock"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
    }
).encode()
_MODELS = json.dumps(
    {"object": "list", "data": [{"id": "mock", "object": "model", "created": 0, "owned_by": "bench"}]}
).encode()


def _chunk(i: int) -> bytes:
    event = {
        "id": "cmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "mock",
        "choices": [
            {"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": "stop" if i == CHUNKS - 1 else None}
        ],
    }
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _fixed(body: bytes, content_type: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: "
        + content_type
        + b"\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


_NONSTREAM = _fixed(_COMPLETION, b"application/json")
_MODELS_RESP = _fixed(_MODELS, b"application/json")
_TRACES_RESP = _fixed(b"", b"application/x-protobuf")  # an empty ExportTraceServiceResponse: all spans taken
_STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_STREAM_PARTS = [b"%x\r\n%s\r\n" % (len(c), c) for c in [*(_chunk(i) for i in range(CHUNKS)), b"data: [DONE]\n\n"]]


_served = [0]  # POSTs answered (one event loop: no lock)


class MockProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            marker = head.find(b"content-length:")
            if marker >= 0:
                length = int(
                    head[
                        marker + 15 : head.find(b"\r\n", marker) if head.find(b"\r\n", marker) > 0 else len(head)
                    ].strip()
                )
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            self._answer(head, body)

    def _answer(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        if head.startswith(b"get /__count"):
            self.transport.write(_fixed(str(_served[0]).encode(), b"text/plain"))
        elif head.startswith(b"get"):
            self.transport.write(_MODELS_RESP)
        elif head.startswith(b"post /v1/traces"):  # an OTLP/HTTP collector's answer (bench/ab.py --traces): not counted
            self.transport.write(_TRACES_RESP)
        elif b'"stream": true' in body or b'"stream":true' in body:
            _served[0] += 1
            self.transport.write(_STREAM_HEAD)
            for part in _STREAM_PARTS:
                self.transport.write(part)
            self.transport.write(b"0\r\n\r\n")
        else:
            _served[0] += 1
            self.transport.write(_NONSTREAM)


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(MockProtocol, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
