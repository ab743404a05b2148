"""An OTLP/HTTP trace receiver for the tests: what a collector (the OpenTelemetry Collector's ``otlphttp``
receiver) does with ``POST /v1/traces``: a protobuf ``ExportTraceServiceRequest``, gzip-compressed when its
``Content-Encoding`` says so, answered with an empty ``ExportTraceServiceResponse`` (the OTLP specification,
"OTLP/HTTP Request" and "Success"). Decoded with the official ``opentelemetry-proto`` messages.

``hang``: the receiver takes requests and never answers them until :meth:`Collector.release` (a collector too slow
to keep up).
"""

from __future__ import annotations

import asyncio
import gzip
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.conftest import serve_app


@dataclass
class Span:
    """One received span, its ids as hex (as W3C traceparent writes them)."""

    service: str
    name: str
    kind: str  # SERVER, CLIENT, INTERNAL...
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: dict[str, int] = field(default_factory=dict)  # name -> time
    durations: dict[str, float] = field(default_factory=dict)  # event name -> its turnout.duration_ms
    status: str = "UNSET"


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which is not None else None


class Collector:
    def __init__(self, hang: bool = False) -> None:
        self.spans: list[Span] = []
        self.requests = 0  # export requests received
        self.answered = 0  # ... and answered
        self.encodings: set[str] = set()
        self._released = asyncio.Event()
        if not hang:
            self._released.set()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        base, self._runner = await serve_app(app)
        self.url = f"{base}/v1/traces"
        return self.url

    def release(self) -> None:
        self._released.set()

    async def stop(self) -> None:
        self.release()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        self.requests += 1
        body = await request.read()
        encoding = request.headers.get("Content-Encoding", "identity")
        self.encodings.add(encoding)
        if encoding == "gzip" and body[:2] == b"\x1f\x8b":  # (aiohttp's server inflates a request body itself)
            body = gzip.decompress(body)
        assert request.content_type == "application/x-protobuf", request.content_type
        export = ExportTraceServiceRequest.FromString(body)
        await self._released.wait()
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    self.spans.append(
                        Span(
                            service=str(resource.get("service.name", "")),
                            name=s.name,
                            kind=s.SpanKind.Name(s.kind).removeprefix("SPAN_KIND_"),
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            events={e.name: e.time_unix_nano for e in s.events},
                            durations={
                                e.name: _value(a.value)
                                for e in s.events
                                for a in e.attributes
                                if a.key == "turnout.duration_ms"
                            },
                            status=s.status.StatusCode.Name(s.status.code).removeprefix("STATUS_CODE_"),
                        )
                    )
        self.answered += 1
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    def named(self, name: str, service: str = "turnout") -> list[Span]:
        return [s for s in self.spans if s.name == name and s.service == service]
