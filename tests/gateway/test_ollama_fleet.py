"""End to end: the gateway in front of several Ollama emulators, driven by the official clients."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator

import aiohttp
import ollama
import openai
import pytest

from tests.conftest import Clients, EmulatorFactory, GatewayFactory, free_port, worker
from turnout.gateway.keys import FLEET, POLLER


async def test_openai_client_chat_and_stream(
    emulator: EmulatorFactory, gateway: GatewayFactory, clients: Clients
) -> None:
    emu = await emulator("n1", ["llama3.2:latest"])
    gw = await gateway([worker("n1", emu.url)])
    client = clients.openai(gw.url)
    try:
        reply = await client.chat.completions.create(
            model="llama3.2:latest", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content == "[n1] w1 w2 w3 w4"
        assert reply.usage is not None and reply.usage.completion_tokens == 5
        stream = await client.chat.completions.create(
            model="llama3.2:latest", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
        assert "".join(p or "" for p in pieces) == "[n1] w1 w2 w3 w4"
        completion = await client.completions.create(model="llama3.2:latest", prompt="once")
        assert completion.choices[0].text.startswith("[n1]")
        emb = await client.embeddings.create(model="llama3.2:latest", input=["a", "b"])
        assert len(emb.data) == 2
        models = await client.models.list()
        assert [m.id for m in models.data] == ["llama3.2:latest"]
        one = await client.models.retrieve("llama3.2:latest")
        assert one.id == "llama3.2:latest"
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("nope")
    finally:
        await client.close()
    assert emu.served("/v1/chat/completions") == 2  # OpenAI dialect uses Ollama's own /v1 routes


async def test_ollama_client_all_routes(emulator: EmulatorFactory, gateway: GatewayFactory, clients: Clients) -> None:
    emu = await emulator("n1", ["llama3.2:latest", "nomic-embed-text:latest"], loaded=["llama3.2:latest"])
    gw = await gateway([worker("n1", emu.url)])
    client = clients.ollama(gw.url)
    reply = await client.chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}])
    assert reply.message.content == "[n1] w1 w2 w3 w4"
    assert reply.done and reply.eval_count == 5
    parts = [
        p async for p in await client.chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}], stream=True)
    ]
    assert parts[-1].done and "".join(p.message.content or "" for p in parts) == "[n1] w1 w2 w3 w4"
    gen = await client.generate(model="llama3.2", prompt="x")
    assert gen.response.startswith("[n1]")
    emb = await client.embed(model="nomic-embed-text", input=["a", "b"])
    assert len(emb.embeddings) == 2
    legacy = await client.embeddings(model="nomic-embed-text", prompt="a")
    assert len(legacy.embedding) == 8
    show = await client.show("llama3.2")
    assert show.modelfile is not None and "FROM" in show.modelfile
    tags = await client.list()
    assert {m.model for m in tags.models} == {"llama3.2:latest", "nomic-embed-text:latest"}
    ps = await client.ps()
    assert [m.model for m in ps.models] == ["llama3.2:latest"]
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/api/version") as resp:
        assert (await resp.json())["version"]
    # stream defaults to true on /api/chat, as in Ollama
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{gw.url}/api/chat", json={"model": "llama3.2", "messages": [{"role": "user", "content": "x"}]}
        ) as resp,
    ):
        assert resp.content_type == "application/x-ndjson"
        lines = [json.loads(line) for line in (await resp.read()).splitlines()]
        assert len(lines) == 6 and lines[-1]["done"] is True


async def test_routes_to_the_worker_that_has_the_model(
    emulator: EmulatorFactory, gateway: GatewayFactory, clients: Clients
) -> None:
    a = await emulator("a", ["llama3.2:latest"])
    b = await emulator("b", ["qwen3:8b"])
    gw = await gateway([worker("a", a.url), worker("b", b.url)])
    client = clients.ollama(gw.url)
    for _ in range(3):
        assert (await client.chat(model="qwen3:8b", messages=[])).message.content.startswith("[b]")
        assert (await client.chat(model="llama3.2", messages=[])).message.content.startswith("[a]")
    with pytest.raises(ollama.ResponseError) as info:
        await client.chat(model="mistral:7b", messages=[])
    assert info.value.status_code == 404
    assert 'model "mistral:7b" is not installed on any eligible worker' in info.value.error


async def test_spreads_load_and_prefers_loaded(
    emulator: EmulatorFactory, gateway: GatewayFactory, clients: Clients
) -> None:
    a = await emulator("a", ["m:1"], token_delay_s=0.02)
    b = await emulator("b", ["m:1"], token_delay_s=0.02)
    gw = await gateway([worker("a", a.url), worker("b", b.url)])
    client = clients.openai(gw.url)
    try:
        await asyncio.gather(*(client.chat.completions.create(model="m:1", messages=[]) for _ in range(4)))
        assert (a.served(), b.served()) == (2, 2)  # spread by load
        a.behaviour.loaded, b.behaviour.loaded = [], ["m:1"]
        await gw.app[POLLER].poll_all()
        for _ in range(4):
            await client.chat.completions.create(model="m:1", messages=[])
        assert (a.served(), b.served()) == (2, 6)  # loaded affinity
    finally:
        await client.close()


async def test_placement_hides_and_blocks(emulator: EmulatorFactory, gateway: GatewayFactory, clients: Clients) -> None:
    a = await emulator("a", ["gemma4:latest", "gemma4:2b", "llama3.2:latest"])
    b = await emulator("b", ["gemma4:2b"])
    placement = {"mode": "allow_all", "allowed_models": ["gemma4:latest"], "denied_models": ["gemma4:*"]}
    gw = await gateway(
        [
            worker("a", a.url, model_placement=placement),
            worker("b", b.url, model_placement={"mode": "whitelist", "allowed_models": ["llama*"]}),
        ]
    )
    client = clients.ollama(gw.url)
    names = {m.model for m in (await client.list()).models}
    assert names == {"gemma4:latest", "llama3.2:latest"}  # gemma4:2b is only on workers that block it
    assert (await client.chat(model="gemma4:latest", messages=[])).message.content.startswith("[a]")
    with pytest.raises(ollama.ResponseError) as info:
        await client.chat(model="gemma4:2b", messages=[])
    assert info.value.status_code == 403
    assert 'a: denied by rule "gemma4:*"' in info.value.error and "b: not in its whitelist" in info.value.error
    assert a.served("/api/chat") == 1 and b.served("/api/chat") == 0


async def test_failover_when_a_worker_is_unreachable(
    emulator: EmulatorFactory, gateway: GatewayFactory, clients: Clients
) -> None:
    a = await emulator("a", ["m:1"])
    b = await emulator("b", ["m:1"])
    # hold_s 0: with both down, the error at once, not after a hold for them to come back
    gw = await gateway([worker("a", a.url), worker("b", b.url)], routing={"hold_s": 0})
    await a.stop()  # dies after the first poll: the gateway still thinks it is healthy
    client = clients.ollama(gw.url)
    for _ in range(3):
        assert (await client.chat(model="m:1", messages=[])).message.content.startswith("[b]")
    inventory = await _admin_get(gw, "/admin/api/inventory")
    state = {w["name"]: w for w in inventory["workers"]}
    assert state["a"]["healthy"] is False and "cannot connect" in state["a"]["last_error"]
    await b.stop()
    with pytest.raises(ollama.ResponseError) as info:
        await client.chat(model="m:1", messages=[])
    assert info.value.status_code in (502, 503)


async def test_no_healthy_worker_is_503(gateway: GatewayFactory) -> None:
    gw = await gateway([worker("a", f"http://127.0.0.1:{free_port()}")])
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": []}) as resp,
    ):
        body = await resp.json()
        assert resp.status == 503 and resp.headers["Retry-After"]
        assert body["error"]["code"] == "no_healthy_worker"
        assert body["error"]["message"] == 'no healthy worker for "m": a down (connection refused)'  # the poll's
        # the fixture's health interval is an hour: a 503's Retry-After stays a short hint
        assert gw.settings.health.interval_s == 3600 and 1 <= int(resp.headers["Retry-After"]) <= 30


@pytest.mark.parametrize("dialect", ["openai", "ollama"])
async def test_mid_stream_failure_ends_with_error_frame(
    emulator: EmulatorFactory, gateway: GatewayFactory, dialect: str
) -> None:
    emu = await emulator("a", ["m:1"], drop_after_chunks=2)
    gw = await gateway([worker("a", emu.url)])
    path = "/v1/chat/completions" if dialect == "openai" else "/api/chat"
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}{path}", json={"model": "m:1", "messages": [], "stream": True}) as resp,
    ):
        raw = await resp.read()
    if dialect == "openai":
        frames = [f for f in raw.split(b"\n\n") if f]
        assert frames[-1].startswith(b"data: ")
        last = json.loads(frames[-1][6:])
        assert "stream" in last["error"]["message"] and last["error"]["code"] == "upstream_error"
        assert len(frames) == 3
    else:
        lines = [json.loads(x) for x in raw.splitlines()]
        assert len(lines) == 3 and "error" in lines[-1] and "done" not in lines[-1]


async def test_client_disconnect_cancels_upstream(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["m:1"], tokens=200, token_delay_s=0.02)
    gw = await gateway([worker("a", emu.url)])
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{gw.url}/api/chat", json={"model": "m:1", "messages": []})
        await resp.content.readline()
        resp.close()
    for _ in range(200):
        if emu.cancelled:
            break
        await asyncio.sleep(0.01)
    assert emu.cancelled == 1 and emu.active == 0
    assert gw.app[FLEET].workers["a"].in_flight == 0


async def test_worker_limit_queues_then_times_out(
    emulator: EmulatorFactory, gateway: GatewayFactory, clients: Clients
) -> None:
    emu = await emulator("a", ["m:1"], tokens=5, token_delay_s=0.05)
    gw = await gateway([worker("a", emu.url, max_concurrent=1)], routing={"queue_timeout_s": 5})
    client = clients.ollama(gw.url)
    replies = await asyncio.gather(*(client.chat(model="m:1", messages=[]) for _ in range(3)))
    assert all(r.done for r in replies) and emu.peak_active == 1

    gw2 = await gateway([worker("a", emu.url, max_concurrent=1)], routing={"queue_timeout_s": 0.05})
    client2 = clients.ollama(gw2.url)
    results = await asyncio.gather(*(client2.chat(model="m:1", messages=[]) for _ in range(2)), return_exceptions=True)
    errors = [r for r in results if isinstance(r, ollama.ResponseError)]
    assert len(errors) == 1 and errors[0].status_code == 503 and "busy" in errors[0].error


async def test_per_model_limit_uses_patterns(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["qwen3:8b", "other:1"], token_delay_s=0.05)
    gw = await gateway(
        [worker("a", emu.url)], routing={"model_max_concurrent": {"qwen3:*": 1}, "queue_timeout_s": 0.05}
    )
    async with aiohttp.ClientSession() as http:

        async def call(model: str) -> int:
            async with http.post(f"{gw.url}/v1/chat/completions", json={"model": model, "messages": []}) as r:
                await r.read()
                return r.status

        statuses = await asyncio.gather(call("qwen3:8b"), call("qwen3:8b"), call("other:1"), call("other:1"))
    assert sorted(statuses[:2]) == [200, 503]
    assert statuses[2:] == [200, 200]


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/chat/completions", b"[1]", 400, "JSON object"),
        ("/v1/chat/completions", b'{"messages": []}', 400, 'missing "model"'),
        ("/v1/chat/completions", b'{"model": 5}', 400, '"model" must be a string'),
        ("/v1/chat/completions", b'{"model": "m:1", "stream": "yes"}', 400, '"stream"'),
        ("/v1/embeddings", b"", 400, "empty"),
        ("/api/chat", b"{not json", 400, "not valid JSON"),
        ("/api/generate", b'{"prompt": "x"}', 400, 'missing "model"'),
        ("/api/chat", b'{"model": "' + b"x" * 3000 + b'"}', 413, "larger than the limit"),
        ("/v1/chat/completions", b'{"model": "' + b"x" * 3000 + b'"}', 413, "larger than the limit"),
        ("/v1/chat/completions", b'{"model": "m:1", "x": ' + b"[" * 65 + b"]" * 65 + b"}", 400, "deeper than 64"),
        ("/api/chat", b'{"model": "m:1", "x": ' + b'{"a":' * 70 + b"1" + b"}" * 70 + b"}", 400, "deeper than 64"),
        ("/v1/chat/completions", b'{"model": "m:1\\r\\nX-Evil: 1"}', 400, "control character U+000D"),
        ("/api/chat", b'{"model": "m\\u0000:1"}', 400, "control character U+0000"),
        ("/api/show", b'{"name": "m\\n"}', 400, "control character U+000A"),
        ("/v1/embeddings", b'{"model": "' + b"m" * 257 + b'"}', 400, "at most 256"),
        ("/v1/chat/completions", b'{"model": "m:1", "max_tokens": 9223372036854775808}', 400, "max_tokens"),
        ("/api/generate", b'{"model": "m:1", "options": {"num_predict": -9}}', 400, "num_predict"),
    ],
)
async def test_bad_requests_in_dialect(
    emulator: EmulatorFactory, gateway: GatewayFactory, path: str, body: bytes, status: int, fragment: str
) -> None:
    emu = await emulator("a", ["m:1"])
    gw = await gateway([worker("a", emu.url)], limits={"max_body_bytes": 2048})
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}{path}", data=body, headers={"Content-Type": "application/json"}) as resp,
    ):
        payload = await resp.json()
    assert resp.status == status
    message = payload["error"] if path.startswith("/api") else payload["error"]["message"]
    assert isinstance(message, str) and fragment in message
    assert emu.served() == 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
async def test_the_body_limit_holds_where_the_size_is_known_only_once_read(
    emulator: EmulatorFactory, gateway: GatewayFactory, path: str
) -> None:
    """A chunked body (no Content-Length) and a gzip-encoded one that decodes past the limit are refused like
    an announced one; a small body sent either way is served."""
    emu = await emulator("a", ["m:1"])
    gw = await gateway([worker("a", emu.url)], limits={"max_body_bytes": 2048})
    big = b'{"model": "m:1", "messages": [], "pad": "' + b"x" * 3000 + b'"}'
    small = b'{"model": "m:1", "messages": [], "stream": false}'

    async def chunks(data: bytes) -> AsyncIterator[bytes]:
        for i in range(0, len(data), 500):
            yield data[i : i + 500]

    async with aiohttp.ClientSession() as http:
        sent = [
            (chunks(big), {}, 413),
            (gzip.compress(big), {"Content-Encoding": "gzip"}, 413),  # about 60 bytes on the wire
            (chunks(small), {}, 200),
            (gzip.compress(small), {"Content-Encoding": "gzip"}, 200),
        ]
        for data, headers, status in sent:
            async with http.post(f"{gw.url}{path}", data=data, headers=headers) as resp:
                payload = await resp.json(content_type=None)
                assert resp.status == status, payload
                if status == 413:
                    message = payload["error"] if path.startswith("/api") else payload["error"]["message"]
                    assert "larger than the limit of 2048 bytes" in message
    assert emu.served() == 2


async def test_unknown_route_and_method(gateway: GatewayFactory) -> None:
    gw = await gateway([])
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.url}/v1/nothing") as resp:
            assert resp.status == 404 and "no route" in (await resp.json())["error"]["message"]
        async with http.get(f"{gw.url}/api/chat") as resp:
            assert resp.status == 405 and isinstance((await resp.json())["error"], str)
        async with http.post(f"{gw.url}/api/chat", json={"model": "m"}) as resp:
            body = await resp.json()
            assert resp.status == 503 and "no workers are configured" in body["error"]


async def test_metrics_exposition(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("a", ["m:1"])
    gw = await gateway([worker("a", emu.url)])
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/api/chat", json={"model": "m:1", "messages": [], "stream": False}) as r:
            assert r.status == 200
        async with http.get(f"{gw.url}/metrics") as r:
            text = await r.text()
    for name in (
        "turnout_requests_total",
        "turnout_request_duration_seconds_bucket",
        "turnout_in_flight_requests",
        'turnout_worker_healthy{worker="a"} 1.0',
        'turnout_routing_decisions_total{outcome="routed"}',
        "turnout_queue_wait_seconds_bucket",
    ):
        assert name in text, name


async def _admin_get(gw: object, path: str) -> dict:  # type: ignore[type-arg]
    from tests.conftest import Gateway

    assert isinstance(gw, Gateway)
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}{path}", headers=gw.admin_headers) as resp:
        assert resp.status == 200
        return await resp.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("reply", [b"garbage\r\n\r\n", b'HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"cut'])
async def test_broken_worker_is_502_in_dialect(gateway: GatewayFactory, reply: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"GET"):
                body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        gw = await gateway([worker("raw", f"http://127.0.0.1:{port}", type="openai")])
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{gw.url}/v1/chat/completions", json={"model": "m", "messages": []}) as resp:
                body = await resp.json()
                assert resp.status == 502 and body["error"]["code"] == "upstream_error"
            async with http.post(f"{gw.url}/api/chat", json={"model": "m", "messages": [], "stream": False}) as resp:
                body = await resp.json()
                assert resp.status == 502 and isinstance(body["error"], str)
    finally:
        server.close()
        await server.wait_closed()
