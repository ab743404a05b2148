"""OpenTelemetry traces of proxied calls, sent to an OTLP/HTTP collector (``telemetry.otlp_endpoint``; off by
default, and then this module is not imported).

Each call that passed its key and limits checks is one span, the root of a trace or, when the request carries a
W3C ``traceparent``, a child of the client's span. It follows the OpenTelemetry GenAI semantic conventions for an
inference (named ``{gen_ai.operation.name} {gen_ai.request.model}``: ``chat llama3``), as the gateway serves it
(kind SERVER):

* the call: ``gen_ai.operation.name`` (``chat``, ``text_completion``, ``embeddings``), ``gen_ai.request.model``
  (as asked, an alias resolved; ``turnout.alias`` the alias), ``gen_ai.request.stream``; the HTTP request:
  ``http.request.method``, ``http.route`` (and ``url.path`` where it differs: an endpoint's own URL),
  ``client.address``, ``http.response.status_code``;
* the worker that answered: ``server.address`` and ``server.port`` (its URL's), ``gen_ai.provider.name`` (its
  engine where its listing names one, ``vllm``, ``sglang``, ``llamacpp``, else its API, ``ollama`` or ``openai``),
  ``gen_ai.response.model`` (the name it serves the model by), ``turnout.worker``, ``turnout.route`` (why it);
* the answer: ``gen_ai.usage.input_tokens`` and ``output_tokens`` (the worker's counts, else the gateway's, as
  accounted), ``gen_ai.response.time_to_first_chunk`` (a stream's ``ttft``, seconds), ``error.type`` (an error
  answer's ``code``; ``stream_failed`` for a stream that broke) with the span's status ERROR for a 5xx or a broken
  stream;
* the phases (:mod:`turnout.gateway.timing`) as events, each at the moment its phase ended with its length in
  ``turnout.duration_ms``: ``queue``, ``hold`` (each wait for a wake or an activation), ``connected`` (the
  ``upstream`` phase), ``first_byte`` (``ttft``); and ``upstream_failed`` (with its ``error.type``) for each worker
  tried that could not be reached.

The worker is sent this span as its parent (``traceparent``, ``tracestate``): vLLM and SGLang, tracing, put their
own request spans under it. One span a call rather than one per phase, and no attribute that another one says:
what a span costs to make and to encode (each attribute checked, then encoded, in Python) is most of what tracing
costs (bench/README.md).

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
        """A proxied call's trace: its span, started when the request's frame started, the client's trace context
        (``traceparent``) its parent."""
        tracer = self._tracer
        if tracer is None:
            return None
        offset = time.time_ns() - time.perf_counter_ns()
        parent = self.propagator.extract(request.headers)
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else request.path
        operation = _OPERATIONS.get(call.endpoint, call.endpoint.value)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": call.model,
            "gen_ai.request.stream": call.stream,
            "http.request.method": request.method,
            "http.route": route,
        }
        if request.path != route:  # an endpoint's own URL (/endpoints/<name>/v1/...)
            attributes["url.path"] = request.path
        if request.remote:
            attributes["client.address"] = request.remote
        if call.alias is not None:
            attributes["turnout.alias"] = call.alias
        span = tracer.start_span(
            f"{operation} {call.model}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=int(phases.started * 1e9) + offset,
        )
        return Traced(self, span, offset)

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
    try on a worker by the proxy, ended by the request's frame."""

    __slots__ = ("carrier", "failed", "offset", "reported", "span", "stream", "tracing")

    def __init__(self, tracing: Tracing, span: Span, offset: int) -> None:
        self.tracing = tracing
        self.span = span
        self.offset = offset  # epoch ns - perf_counter ns
        self.carrier: dict[str, str] | None = None  # what the workers are sent (the span's context: made once)
        self.reported: tuple[int | None, int | None] = (None, None)  # the worker's own token counts
        self.stream = False
        self.failed = False  # the answer began, and its stream broke

    def _ns(self, perf: float) -> int:
        return int(perf * 1e9) + self.offset

    def to_worker(self, call: Call, worker: WorkerState, model: str) -> dict[str, str]:
        host, port = self.tracing.address(worker)
        self.stream = call.stream
        self.span.set_attributes(
            {
                "gen_ai.provider.name": worker.engine_family or worker.config.type.value,
                "gen_ai.response.model": model,
                "server.address": host,
                "server.port": port,
                "turnout.worker": worker.name,
            }
        )
        carrier = self.carrier
        if carrier is None:
            carrier = self.carrier = {}
            self.tracing.propagator.inject(carrier, context=set_span_in_context(self.span))
        return carrier

    def worker_done(self, phases: Phases, outcome: Outcome, status: int | None, error: BaseException | None) -> None:
        if error is not None or status is None:  # a try that failed (the next worker may be tried)
            self.span.add_event("upstream_failed", {"error.type": _error_type(error, status, outcome) or "unknown"})
            return
        self.reported = (outcome.prompt_tokens, outcome.completion_tokens)
        if outcome.failed:  # the worker's stream broke, or carried its error
            self.failed = True

    def finish(self, request: web.Request, response: web.StreamResponse, phases: Phases, now: float) -> None:
        span = self.span
        if phases.queue is not None:
            span.add_event("queue", {"turnout.duration_ms": phases.queue * 1000}, self._ns(phases.queue_to))
        for started, ended in phases.holds or ():
            span.add_event("hold", {"turnout.duration_ms": (ended - started) * 1000}, self._ns(ended))
        if phases.sent_at:
            span.add_event(
                "connected", {"turnout.duration_ms": (phases.upstream or 0.0) * 1000}, self._ns(phases.sent_at)
            )
            ttft = phases.ttft
            if ttft is not None:
                span.add_event("first_byte", {"turnout.duration_ms": ttft * 1000}, self._ns(phases.first_at))
                if self.stream:
                    span.set_attribute("gen_ai.response.time_to_first_chunk", ttft)
        status = response.status
        attributes: dict[str, Any] = {"http.response.status_code": status}
        why = request.get(ROUTE)
        if why is not None:
            attributes["turnout.route"] = why
        prompt, completion = self.reported
        row = request.get(USAGE_ROW)
        if row is not None:  # the worker's counts where it gave them, else the gateway's, as accounted
            attributes["gen_ai.usage.input_tokens"] = prompt if prompt is not None else row.prompt_tokens
            attributes["gen_ai.usage.output_tokens"] = completion if completion is not None else row.completion_tokens
        if status >= 400:
            attributes["error.type"] = response.get(ERROR_CODE) or str(status)
        elif self.failed:
            attributes["error.type"] = "stream_failed"
        span.set_attributes(attributes)
        if status >= 500 or self.failed:  # (a 4xx is the client's: the span's status stays unset)
            span.set_status(Status(StatusCode.ERROR))
        span.end(self._ns(now))


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
