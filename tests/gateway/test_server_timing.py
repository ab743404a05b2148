"""Where the time went, as a client and an operator see it: the ``Server-Timing`` header of every answer (streams,
errors the gateway makes itself, a queue timeout), the access line's phase fields and the phase histograms, against
a real llama.cpp engine (llama_cpp.server: one request at a time)."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import EmulatorFactory, Engine, GatewayFactory, create_key, eventually, worker
from tests.support.raw_worker import RawWorker, Reply, sse
from turnout.gateway.keys import METRICS

_METRIC = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a token (RFC 9110), the metric's name
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


def server_timing(value: str) -> dict[str, float]:
    """A ``Server-Timing`` value as the W3C grammar reads it: metric *( ";" param ), comma-separated; ``dur`` in
    milliseconds. Fails on anything outside it (a name that is not a token, a dur that is not a number)."""
    out: dict[str, float] = {}
    for metric in value.split(","):
        name, *params = (part.strip() for part in metric.split(";"))
        assert _METRIC.fullmatch(name), value
        durations = [p.split("=", 1)[1] for p in params if p.split("=", 1)[0].strip() == "dur"]
        assert len(durations) == 1, value
        out[name] = float(durations[0])
        assert out[name] >= 0, value
    return out


async def test_an_answer_says_where_its_time_went(
    llama_engine: Engine, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await gateway([worker("llama", llama_engine.url, type="openai")])
    async with aiohttp.ClientSession() as http:
        with caplog.at_level(logging.INFO, logger="aiohttp.access"):
            async with http.post(f"{gw.url}/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200
                timing = server_timing(r.headers["Server-Timing"])
                await r.read()

            async def logged() -> bool:
                return any(rec.name == "aiohttp.access" for rec in caplog.records)

            await eventually(logged, "the access line", limit_s=10)
    # the phases of a proxied answer in one piece, in order, no hold (it was not held)
    assert list(timing) == ["queue", "upstream", "ttft", "total"]
    # they follow each other inside the request: together never more than its total
    assert timing["queue"] + timing["upstream"] + timing["ttft"] <= timing["total"] + 0.3  # (each rounded to 0.1)
    assert timing["ttft"] > 0  # the engine generated the answer before its first byte
    (record,) = [rec for rec in caplog.records if rec.name == "aiohttp.access"]
    line = record.getMessage()
    for name in ("queue", "upstream", "ttft"):
        assert re.search(rf" {name}=\d+\.\dms", line), line
        assert isinstance(getattr(record, f"{name}_ms"), float)
    assert " hold=" not in line and not hasattr(record, "hold_ms")
    assert abs(record.ttft_ms - timing["ttft"]) <= 0.1  # type: ignore[attr-defined]  # the header's, the line's


async def test_a_stream_header_carries_what_is_known_before_its_body(
    llama_engine: Engine, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await gateway([worker("llama", llama_engine.url, type="openai")])
    async with aiohttp.ClientSession() as http:
        with caplog.at_level(logging.INFO, logger="aiohttp.access"):
            async with http.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}) as r:
                assert r.status == 200 and r.content_type == "text/event-stream"
                timing = server_timing(r.headers["Server-Timing"])
                body = await r.read()
            assert body.rstrip().endswith(b"data: [DONE]")

            async def logged() -> bool:
                return any(rec.name == "aiohttp.access" for rec in caplog.records)

            await eventually(logged, "the access line", limit_s=10)
    assert list(timing) == ["queue", "upstream"]  # no first byte, no total: the body had not begun
    (record,) = [rec for rec in caplog.records if rec.name == "aiohttp.access"]
    assert record.ttft_ms > 0 and record.queue_ms >= 0  # type: ignore[attr-defined]  # the rest: in the access line
    # ... and in the histograms, as a stream
    text = gw.app[METRICS].render().decode()
    assert re.search(
        r'turnout_request_phase_seconds_count\{model="tiny",phase="ttft",stream="true",worker="llama"\} 1\.0', text
    ), text


async def test_a_translated_stream_whose_tokens_make_no_text_still_has_its_ttft(
    gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A model whose tokens decode to no text yet: llama-server holds back the bytes of an unfinished UTF-8
    character and, when the answer ends on one, streams only its last chunk, with no content (what it sent for 3
    tokens forced to the byte 0xE2, ``"logit_bias": {"231": 100}``, on the tiny model; the tiny model's random
    sampling does it to about 1 short answer in 20). The ``ttft`` of a stream translated into another dialect is
    still the worker's first event, not missing because no text went out before the end (an ``/api/chat``
    answer of 3 tokens once had no ``ttft=`` in its access line)."""
    final = {
        "choices": [{"finish_reason": "length", "index": 0, "delta": {}}],
        "created": 1796488193,
        "id": "chatcmpl-fpshT0VYKkCkSVcEve5YHe4Vfnk1z0xh",
        "model": "tiny",
        "system_fingerprint": "b0-unknown",
        "object": "chat.completion.chunk",
        "timings": {"cache_n": 0, "prompt_n": 21, "prompt_ms": 0.856, "predicted_n": 3, "predicted_ms": 0.218},
        "usage": {"completion_tokens": 3, "prompt_tokens": 21, "total_tokens": 24},
    }
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    raw = RawWorker(models=["tiny"], default=Reply([head, sse(final), sse(b"[DONE]")], close=True, gap_s=0.05))
    url = await raw.start()
    try:
        gw = await gateway([worker("llama", url, type="openai")])
        calls = [
            ("/api/chat", {"model": "tiny", "messages": CHAT["messages"], "options": {"num_predict": 3}}),
            ("/v1/messages", {"model": "tiny", "messages": CHAT["messages"], "max_tokens": 3}),
            ("/v1/responses", {"model": "tiny", "input": "hello there", "max_output_tokens": 3}),
        ]
        async with aiohttp.ClientSession() as http:
            with caplog.at_level(logging.INFO, logger="aiohttp.access"):
                for path, body in calls:
                    async with http.post(f"{gw.url}{path}", json={**body, "stream": True}) as r:
                        assert r.status == 200, await r.text()
                        await r.read()

                async def logged() -> list[logging.LogRecord]:
                    lines = [rec for rec in caplog.records if rec.name == "aiohttp.access"]
                    return lines if len(lines) == len(calls) else []

                records = await eventually(logged, "the access lines", limit_s=10)
    finally:
        await raw.stop()
    for record in records:
        line = record.getMessage()
        assert " tokens=21+3 " in line, line  # the engine made 3 tokens, none of them text yet
        # the worker's one event came after the pause the worker took (50 ms)
        assert re.search(r" ttft=\d+\.\dms", line) and record.ttft_ms >= 40, line  # type: ignore[attr-defined]


async def test_errors_the_gateway_makes_carry_the_phases_they_went_through(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """A refused key, a model routed nowhere, a queue timeout. The worker is the Ollama emulator, whose stream
    stalls after its first chunk (its /api/chat): its one slot stays taken for as long as the test needs."""
    emu = await emulator("ollama", stall_after_chunks=1)
    gw = await gateway(
        [worker("ollama", emu.url, max_concurrent=1)], routing={"queue_timeout_s": 0.3}, auth={"open": False}
    )
    _, key = create_key(gw)
    auth = {"Authorization": f"Bearer {key}"}
    chat = {**CHAT, "model": "llama3.2"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=chat) as r:  # no key: refused before anything
            assert r.status == 401
            assert list(server_timing(r.headers["Server-Timing"])) == ["total"]
        async with http.post(f"{gw.url}/v1/chat/completions", json={**chat, "model": "nope"}, headers=auth) as r:
            assert r.status == 404  # routed nowhere: it asked for a slot, waited for none
            assert list(server_timing(r.headers["Server-Timing"])) == ["queue", "total"]
        # the worker's one slot taken by a stream that stalls, the next request waits in the queue until its
        # timeout: a 503 with the queue time it spent
        ollama_chat = {"model": "llama3.2", "messages": CHAT["messages"], "stream": True}
        async with http.post(f"{gw.url}/api/chat", json=ollama_chat, headers=auth) as first:
            assert first.status == 200
            await first.content.readline()
            async with http.post(f"{gw.url}/v1/chat/completions", json=chat, headers=auth) as r:
                assert r.status == 503 and (await r.json())["error"]["code"] == "saturated"
                timing = server_timing(r.headers["Server-Timing"])
    assert list(timing) == ["queue", "total"]
    assert timing["queue"] >= 300 and timing["total"] >= timing["queue"]  # the configured wait, all of it queued
    # the timeout is in the queue histogram of its model (as the worker lists it), with no worker
    text = gw.app[METRICS].render().decode()
    assert re.search(
        r'turnout_request_phase_seconds_count\{model="llama3.2:latest",phase="queue",stream="false",worker="-"\} 1\.0',
        text,
    ), text


async def test_prometheus_reads_the_phase_histograms(
    llama_engine: Engine, gateway: GatewayFactory, tmp_path: Path
) -> None:
    """promtool (Prometheus's own checker) accepts the exposition, and the histograms count what was sent."""
    gw = await gateway([worker("llama", llama_engine.url, type="openai")])
    async with aiohttp.ClientSession() as http:
        for stream in (False, True, False):
            async with http.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": stream}) as r:
                assert r.status == 200
                await r.read()
        async with http.get(f"{gw.url}/metrics") as r:
            text = await r.text()
    exposition = tmp_path / "metrics.txt"
    exposition.write_text(text)
    done = await asyncio.to_thread(
        subprocess.run, ["promtool", "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert "error" not in (done.stdout + done.stderr).lower(), done.stdout + done.stderr
    counts = dict(
        re.findall(
            r'turnout_request_phase_seconds_count\{model="tiny",phase="(\w+)",stream="false",worker="llama"\} (\S+)',
            text,
        )
    )
    assert counts == {"queue": "2.0", "upstream": "2.0", "ttft": "2.0", "total": "2.0"}  # no hold: none was held
    assert "turnout_held_requests 0.0" in text
    # buckets are cumulative and end with every sample
    buckets = re.findall(
        r'turnout_request_phase_seconds_bucket\{le="([^"]+)",model="tiny",phase="total",stream="true",'
        r'worker="llama"\} (\S+)',
        text,
    )
    values = [float(v) for _, v in buckets]
    assert buckets[-1][0] == "+Inf" and values == sorted(values) and values[-1] == 1.0
