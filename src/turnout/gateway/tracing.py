"""OpenTelemetry traces of proxied calls, sent to an OTLP/HTTP collector (``telemetry.otlp_endpoint``; off by
default, and then this module is not imported).

Each call that passed its key and limits checks is a trace, or a part of the client's (its W3C ``traceparent``):

* the request's span (kind SERVER, named ``{method} {route}``: ``POST /v1/chat/completions``): the HTTP server
  attributes (``http.request.method``, ``url.path``, ``http.route``, ``http.response.status_code``,
  ``client.address``), the GenAI ones of the call as the client made it (``gen_ai.operation.name``,
  ``gen_ai.request.model``, ``gen_ai.request.stream``, ``gen_ai.usage.input_tokens`` and ``output_tokens`` as
  accounted), ``error.type`` (the error's ``code``) for an error answer, and ``turnout.worker``,
  ``turnout.route`` (why that worker);
* its children, the phases (:mod:`turnout.gateway.timing`): ``queue`` (the wait for a slot) and ``hold`` (each
  wait for a wake or an activation), and for each try on a worker an inference span following the OpenTelemetry
  GenAI semantic conventions (kind CLIENT, named ``{gen_ai.operation.name} {gen_ai.request.model}``: ``chat
  llama3``): ``gen_ai.operation.name`` (``chat``, ``text_completion``, ``embeddings``), ``gen_ai.provider.name``
  (the worker's engine where its listing names one, ``vllm``, ``sglang``, ``llamacpp``, else its API,
  ``ollama`` or ``openai``), ``gen_ai.request.model`` and ``gen_ai.response.model`` (the name the worker serves
  it by), ``gen_ai.usage.input_tokens`` and ``output_tokens`` (as the worker reported them),
  ``gen_ai.response.time_to_first_chunk`` (streams), ``server.address`` and ``server.port`` (the worker),
  ``http.response.status_code``, ``error.type``; with the events ``connected`` (the request written to the
  worker: the ``upstream`` phase ends) and ``first_byte`` (``ttft``). That span is the parent the worker is
  told of (``traceparent``): vLLM and SGLang, tracing, put their own spans under it.

A slow or absent collector costs the request path nothing: spans are queued (a bounded queue, ``queue_spans``)
and sent in batches by the SDK's own thread; when the queue is full a span is dropped rather than waited for, and
counted (``turnout_trace_spans_dropped_total{reason="queue_full"}``), as are the spans of a batch the collector
refused or that could not reach it (``reason="export_failed"``). Nothing on the request path waits for the
exporter, and closing waits for the last batch at most ``export_timeout_s``.

Settings are passed to the SDK explicitly; the environment variables it would read otherwise
(``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``) do not apply, but for the exporter's TLS and
header variables (``OTEL_EXPORTER_OTLP_TRACES_HEADERS``, ``..._CERTIFICATE``), which it reads for what is not given.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from turnout import __version__
from turnout.config import Telemetry
from turnout.dialects.base import Call, Endpoint
from turnout.errors import TurnoutError
from turnout.fleet.state import WorkerState
from turnout.gateway.access import ROUTE, USAGE_ROW
from turnout.gateway.accounting import Outcome
from turnout.gateway.timing import Phases
from turnout.metrics import Metrics
from turnout.responses import ERROR_CODE

__all__ = ["Traced", "Tracing"]

# gen_ai.operation.name by the kind of call (the GenAI registry's values where one fits)
_OPERATIONS = {
    Endpoint.CHAT: "chat",
    Endpoint.MESSAGES: "chat",
    Endpoint.RESPONSES: "chat",
    Endpoint.COMPLETIONS: "text_completion",
    Endpoint.GENERATE: "text_completion",
    Endpoint.EMBEDDINGS: "embeddings",
    Endpoint.EMBED: "embeddings",
    Endpoint.EMBED_LEGACY: "embeddings",
}
_MAX_BATCH = 512  # spans per export request (the SDK's default), fewer when the queue is smaller


class _CountedExporter(SpanExporter):
    """The OTLP exporter, counting what it was handed (``taken``: only the SDK's export thread writes it) and the
    spans of batches it could not deliver."""

    def __init__(self, exporter: SpanExporter, metrics: Metrics) -> None:
        self.exporter = exporter
        self.metrics = metrics
        self.taken = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.taken += len(spans)
        result = self.exporter.export(spans)
        if result is not SpanExportResult.SUCCESS:
            self.metrics.spans_dropped["export_failed"] += len(spans)
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class _BoundedProcessor(SpanProcessor):
    """The SDK's batch processor behind a count of the spans queued: at ``capacity`` an ended span is dropped and
    counted here, before the batch processor would drop one itself (and log a warning for each)."""

    def __init__(self, batch: BatchSpanProcessor, exporter: _CountedExporter, capacity: int, metrics: Metrics):
        self.batch = batch
        self.exporter = exporter
        self.capacity = capacity
        self.metrics = metrics
        self.handed = 0  # only the event loop's thread writes it

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if self.handed - self.exporter.taken >= self.capacity:
            self.metrics.spans_dropped["queue_full"] += 1
            return
        self.handed += 1
        self.batch.on_end(span)

    def shutdown(self) -> None:
        self.batch.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.batch.force_flush(timeout_millis)


class Tracing:
    """The app's tracer (``app[TRACING]``; the proxy's ``tracing``): :meth:`start` and :meth:`close` are the
    app's lifecycle's; :meth:`begin` starts a call's trace."""

    def __init__(self, settings: Telemetry, metrics: Metrics) -> None:
        assert settings.otlp_endpoint is not None
        self.settings = settings
        self.metrics = metrics
        self.propagator = TraceContextTextMapPropagator()
        self._provider: TracerProvider | None = None
        self._tracer: Tracer | None = None
        self._addresses: dict[str, tuple[str, int]] = {}  # worker base URL -> (host, port)

    def start(self) -> None:
        """The SDK's parts, made in the process that serves (``serve --workers N`` forks after building the app)."""
        settings = self.settings
        exporter = _CountedExporter(
            OTLPSpanExporter(
                endpoint=str(settings.otlp_endpoint),
                headers=dict(settings.headers) or None,
                timeout=settings.export_timeout_s,
                compression=Compression.Gzip,
            ),
            self.metrics,
        )
        capacity = settings.queue_spans
        batch = BatchSpanProcessor(
            exporter,
            max_queue_size=capacity,
            max_export_batch_size=min(_MAX_BATCH, capacity),
            schedule_delay_millis=settings.export_every_s * 1000,
            export_timeout_millis=settings.export_timeout_s * 1000,
        )
        provider = TracerProvider(
            sampler=ParentBasedTraceIdRatio(settings.sample_ratio),
            resource=Resource({"service.name": settings.service_name, "service.version": __version__}),
            shutdown_on_exit=False,
        )
        provider.add_span_processor(_BoundedProcessor(batch, exporter, capacity, self.metrics))
        self._provider = provider
        self._tracer = provider.get_tracer("turnout", __version__)

    async def close(self) -> None:
        """Send what is queued, waiting for it at most ``export_timeout_s`` (a collector that hangs keeps the
        SDK's thread, a daemon, until then; the gateway stops anyway)."""
        provider = self._provider
        if provider is None:
            return
        self._provider = self._tracer = None
        done = threading.Event()

        def shut() -> None:
            provider.shutdown()
            done.set()

        threading.Thread(target=shut, name="turnout-traces-close", daemon=True).start()
        await asyncio.to_thread(done.wait, self.settings.export_timeout_s + 1)

    def begin(self, request: web.Request, call: Call, phases: Phases) -> Traced | None:
        """A proxied call's trace: its request span, started when the request's frame started, the client's trace
        context (``traceparent``) its parent."""
        tracer = self._tracer
        if tracer is None:
            return None
        offset = time.time_ns() - time.perf_counter_ns()
        parent = self.propagator.extract(request.headers)
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else request.path
        operation = _OPERATIONS.get(call.endpoint, call.endpoint.value)
        attributes: dict[str, Any] = {
            "http.request.method": request.method,
            "url.path": request.path,
            "http.route": route,
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": call.model,
            "gen_ai.request.stream": call.stream,
            "turnout.api": call.api_name,
        }
        if request.remote:
            attributes["client.address"] = request.remote
        if call.alias is not None:
            attributes["turnout.alias"] = call.alias
        span = tracer.start_span(
            f"{request.method} {route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=int(phases.started * 1e9) + offset,
        )
        return Traced(self, tracer, span, offset, operation)

    def address(self, worker: WorkerState) -> tuple[str, int]:
        """(host, port) of the worker's URL, as ``server.address`` and ``server.port``."""
        url = worker.base_url
        found = self._addresses.get(url)
        if found is None:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            found = self._addresses[url] = (parts.hostname or "", port)
        return found


class Traced:
    """One call's trace (:class:`turnout.gateway.timing.CallTrace`): made by :meth:`Tracing.begin`, told of each
    try on a worker by the proxy, finished by the request's frame."""

    __slots__ = ("client", "model", "offset", "operation", "server", "stream", "tracer", "tracing")

    def __init__(self, tracing: Tracing, tracer: Tracer, server: Span, offset: int, operation: str) -> None:
        self.tracing = tracing
        self.tracer = tracer
        self.server = server
        self.offset = offset  # epoch ns - perf_counter ns
        self.operation = operation
        self.client: Span | None = None  # the try on a worker under way, its model (as sent), whether it streams
        self.model = ""
        self.stream = False

    def _ns(self, perf: float) -> int:
        return int(perf * 1e9) + self.offset

    def to_worker(self, call: Call, worker: WorkerState, model: str) -> dict[str, str]:
        host, port = self.tracing.address(worker)
        self.model, self.stream = model, call.stream
        self.client = span = self.tracer.start_span(
            f"{self.operation} {model}",
            context=set_span_in_context(self.server),
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": self.operation,
                "gen_ai.provider.name": worker.engine_family or worker.config.type.value,
                "gen_ai.request.model": model,
                "gen_ai.request.stream": call.stream,
                "server.address": host,
                "server.port": port,
                "turnout.worker": worker.name,
            },
        )
        carrier: dict[str, str] = {}
        self.tracing.propagator.inject(carrier, context=set_span_in_context(span))
        return carrier

    def worker_done(self, phases: Phases, outcome: Outcome, status: int | None, error: BaseException | None) -> None:
        span, self.client = self.client, None
        if span is None:
            return
        if phases.sent_at:
            span.add_event("connected", timestamp=self._ns(phases.sent_at))
            if phases.first_at:
                span.add_event("first_byte", timestamp=self._ns(phases.first_at))
                if self.stream:
                    span.set_attribute("gen_ai.response.time_to_first_chunk", phases.first_at - phases.sent_at)
        if status is not None:
            span.set_attribute("http.response.status_code", status)
            if status < 400:
                span.set_attribute("gen_ai.response.model", self.model)
        if outcome.prompt_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", outcome.prompt_tokens)
        if outcome.completion_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", outcome.completion_tokens)
        failure = _error_type(error, status, outcome)
        if failure is not None:
            span.set_attribute("error.type", failure)
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    def finish(self, request: web.Request, response: web.StreamResponse, phases: Phases, now: float) -> None:
        if self.client is not None:  # (a try the proxy never reported: ended with the request)
            self.client.end(self._ns(now))
            self.client = None
        server = self.server
        parent = set_span_in_context(server)
        if phases.queue is not None:
            queue = self.tracer.start_span("queue", context=parent, start_time=self._ns(phases.queue_from))
            queue.end(self._ns(phases.queue_to))
        for started, ended in phases.holds or ():
            self.tracer.start_span("hold", context=parent, start_time=self._ns(started)).end(self._ns(ended))
        status = response.status
        server.set_attribute("http.response.status_code", status)
        if phases.worker is not None:
            server.set_attribute("turnout.worker", phases.worker)
        why = request.get(ROUTE)
        if why is not None:
            server.set_attribute("turnout.route", why)
        row = request.get(USAGE_ROW)
        if row is not None:
            server.set_attribute("gen_ai.usage.input_tokens", row.prompt_tokens)
            server.set_attribute("gen_ai.usage.output_tokens", row.completion_tokens)
        if status >= 400:
            server.set_attribute("error.type", response.get(ERROR_CODE) or str(status))
            if status >= 500:
                server.set_status(Status(StatusCode.ERROR))
        server.end(self._ns(now))


def _error_type(error: BaseException | None, status: int | None, outcome: Outcome) -> str | None:
    """``error.type`` of a try on a worker: the gateway's error code, the worker's status, or what broke."""
    if error is not None:
        if isinstance(error, TurnoutError):
            return error.code
        if isinstance(error, asyncio.CancelledError):
            return "cancelled"
        return type(error).__qualname__
    if status is not None and status >= 400:
        return str(status)
    if outcome.failed:
        return "stream_failed"
    return None
