"""OpenTelemetry traces (``telemetry.otlp_endpoint``, :mod:`turnout.gateway.tracing`), received by an OTLP/HTTP
endpoint the test serves itself and decoded with ``opentelemetry-proto``: the spans of a call and its phases in the
GenAI semantic conventions, the client's trace context taken and the gateway's passed on to the worker, and a
collector that hangs or is away costing the requests nothing."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import aiohttp

from tests.conftest import EmulatorFactory, Engine, GatewayFactory, eventually, free_port, worker
from tests.support.otlp_collector import Collector, Span
from turnout.gateway.keys import METRICS

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6}


def _telemetry(url: str, **extra: Any) -> dict[str, Any]:
    return {"otlp_endpoint": url, "export_every_s": 0.05, "export_timeout_s": 2, **extra}


async def _spans_of(collector: Collector, trace_id: str, count: int) -> list[Span]:
    async def arrived() -> list[Span]:
        spans = [s for s in collector.spans if s.trace_id == trace_id]
        return spans if len(spans) >= count else []

    return list(await eventually(arrived, f"{count} spans of trace {trace_id}", limit_s=20, every_s=0.05))


async def test_a_call_is_a_span_under_the_clients_with_its_phases(
    llama_engine: Engine, gateway: GatewayFactory, collector: Collector
) -> None:
    gw = await gateway([worker("llama", llama_engine.url, type="openai")], telemetry=_telemetry(collector.url))
    async with aiohttp.ClientSession() as http:
        headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}
        async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=headers) as r:
            assert r.status == 200
            timing = r.headers["Server-Timing"]
            usage = (await r.json())["usage"]
    (span,) = await _spans_of(collector, TRACE_ID, 1)
    assert span.name == "chat tiny" and span.kind == "SERVER" and span.parent_id == CLIENT_SPAN  # the client's child
    assert span.service == "turnout" and span.status == "UNSET"
    port = urlsplit(llama_engine.url).port
    assert span.attributes == {
        # the GenAI inference: the call, the worker that answered it (its engine, its address), the answer
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "tiny",
        "gen_ai.request.stream": False,
        "gen_ai.provider.name": span.attributes["gen_ai.provider.name"],
        "gen_ai.response.model": "tiny",
        "gen_ai.usage.input_tokens": usage["prompt_tokens"],
        "gen_ai.usage.output_tokens": usage["completion_tokens"],
        "server.address": "127.0.0.1",
        "server.port": port,
        # the HTTP request
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
        "client.address": "127.0.0.1",
        # Turnout's
        "turnout.worker": "llama",
        "turnout.route": "only candidate",
    }
    assert span.attributes["gen_ai.provider.name"] in ("llamacpp", "openai")
    # the phases as events, in the order they happened, inside the span, as long as the header says
    assert list(span.events) == ["queue", "connected", "first_byte"]
    assert span.start_ns <= span.events["queue"] <= span.events["connected"] <= span.events["first_byte"]
    assert span.events["first_byte"] <= span.end_ns
    told = dict(part.split(";dur=") for part in timing.split(", "))
    for event, phase in (("queue", "queue"), ("connected", "upstream"), ("first_byte", "ttft")):
        assert abs(span.durations[event] - float(told[phase])) <= 0.051, (span.durations, timing)  # (told to 0.1)
    assert collector.encodings == {"gzip"}


async def test_the_worker_is_told_the_gateways_span_as_its_parent(
    emulator: EmulatorFactory, gateway: GatewayFactory, collector: Collector
) -> None:
    """What an engine that traces (vLLM, SGLang) reads: the traceparent naming the gateway's span; a stream's first
    chunk as its time to first chunk."""
    emu = await emulator("ollama")
    gw = await gateway([worker("ollama", emu.url)], telemetry=_telemetry(collector.url))
    body = {**CHAT, "model": "llama3.2", "stream": True}
    headers = {"traceparent": TRACEPARENT}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert r.status == 200
        await r.read()
    (span,) = await _spans_of(collector, TRACE_ID, 1)
    assert emu.headers_seen[-1]["traceparent"] == f"00-{TRACE_ID}-{span.span_id}-01"
    assert span.attributes["gen_ai.response.time_to_first_chunk"] > 0
    assert span.attributes["gen_ai.provider.name"] == "ollama" and span.attributes["gen_ai.request.stream"] is True


async def test_with_tracing_off_the_clients_own_trace_context_goes_to_the_worker(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    emu = await emulator("ollama")
    gw = await gateway([worker("ollama", emu.url)])
    body = {**CHAT, "model": "llama3.2"}
    async with aiohttp.ClientSession() as http:
        for headers in (
            {"traceparent": TRACEPARENT, "tracestate": "vendor=1"},
            {"traceparent": "00-nothex-b7ad6b7169203331-01", "tracestate": "vendor=1"},
            {},
        ):
            async with http.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200
    passed, invalid, none = (
        {k.lower(): v for k, v in seen.items() if k.lower() in ("traceparent", "tracestate")}
        for seen in emu.headers_seen[-3:]
    )
    assert passed == {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}
    assert invalid == none == {}


async def test_an_error_answer_is_a_span_with_its_error_type(
    llama_engine: Engine, gateway: GatewayFactory, collector: Collector
) -> None:
    gw = await gateway([worker("llama", llama_engine.url, type="openai")], telemetry=_telemetry(collector.url))
    unknown = {**CHAT, "model": "nope"}
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}/v1/chat/completions", json=unknown) as r:
        assert r.status == 404
    # a trace of its own (no traceparent came), with the one phase it went through
    span = await eventually(lambda: _first_server(collector), "the 404's span", limit_s=20, every_s=0.05)
    assert span.name == "chat nope" and span.parent_id == "" and list(span.events) == ["queue"]
    assert span.attributes["error.type"] == "model_not_found" and span.attributes["http.response.status_code"] == 404
    assert span.status == "UNSET"  # the client's error, not the gateway's
    assert "server.address" not in span.attributes  # no worker answered


async def _first_server(collector: Collector) -> Span | None:
    return next((s for s in collector.spans if s.kind == "SERVER"), None)


async def test_a_collector_that_hangs_costs_the_requests_nothing(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """The collector takes the first export and never answers: every request is answered all the same, and the
    spans that find the export queue full are dropped and counted, not waited for."""
    hanging = Collector(hang=True)
    await hanging.start()
    try:
        emu = await emulator("ollama")
        gw = await gateway([worker("ollama", emu.url)], telemetry=_telemetry(hanging.url, queue_spans=8))
        body = {**CHAT, "model": "llama3.2"}
        async with aiohttp.ClientSession() as http:
            for _ in range(40):
                async with http.post(f"{gw.url}/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                    await r.read()
        assert hanging.answered == 0  # the collector has answered nothing yet
        dropped = gw.app[METRICS].spans_dropped
        # a span a request; at most 8 queued and 8 in the export the collector holds
        assert dropped["queue_full"] >= 40 - 16, dropped
        text = gw.app[METRICS].render().decode()
        assert f'turnout_trace_spans_dropped_total{{reason="queue_full"}} {float(dropped["queue_full"])}' in text
        await gw.stop()  # waits for the last export at most export_timeout_s
    finally:
        await hanging.stop()


async def test_an_absent_collector_costs_the_requests_nothing(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    emu = await emulator("ollama")
    nowhere = f"http://127.0.0.1:{free_port()}/v1/traces"  # nothing listens there
    gw = await gateway([worker("ollama", emu.url)], telemetry=_telemetry(nowhere, export_timeout_s=0.5))
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "model": "llama3.2"}) as r:
                assert r.status == 200
    dropped = gw.app[METRICS].spans_dropped

    async def failed() -> int:
        return dropped["export_failed"]

    assert await eventually(failed, "the failed export to be counted", limit_s=20) >= 3
