"""Usage through the gateway: refusals count as the key's errors, unreported token counts are estimated,
and a roll-up the database refuses is dropped, logged and counted while every other one is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from sqlalchemy import text

from tests.conftest import Clients, EmulatorFactory, Engine, Gateway, GatewayFactory, create_key, worker
from tests.support.raw_worker import RawWorker, Reply, http
from turnout.dialects.base import Call, Endpoint
from turnout.gateway.accounting import Outcome
from turnout.gateway.keys import ACCOUNTANT, DATABASE, USAGE
from turnout.responses import Dialect
from turnout.store.keys import KeyRecord

CHAT = {"model": "qwen3:8b", "messages": [], "stream": False}


def make_key(gw: Gateway, **kw: Any) -> tuple[KeyRecord, str]:
    record, plaintext = create_key(gw, **kw)
    return record, plaintext


async def post(gw: Gateway, path: str, body: dict[str, Any], key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}{path}", json=body, headers=headers) as r:
        await r.read()
        return r.status


async def usage_rows(gw: Gateway, **query: str) -> list[dict[str, Any]]:
    qs = "&".join(f"{k}={v}" for k, v in {"since": "1h", **query}.items())
    async with (
        aiohttp.ClientSession(headers=gw.admin_headers) as http,
        http.get(f"{gw.url}/admin/api/usage?{qs}") as r,
    ):
        assert r.status == 200
        rows: list[dict[str, Any]] = (await r.json())["rows"]
        return rows


@pytest.fixture
async def locked(emulator: EmulatorFactory, gateway: GatewayFactory) -> Gateway:
    emu = await emulator("a", ["qwen3:8b", "llama3.2:latest"], tokens=5)
    return await gateway([worker("a", emu.url)], auth={"open": False, "default_completion_tokens": 50})


async def test_scope_and_limit_refusals_are_errors_of_the_key(locked: Gateway) -> None:
    scoped, scoped_key = make_key(locked, scopes=["qwen3:*"])
    assert await post(locked, "/api/chat", {**CHAT, "model": "llama3.2"}, scoped_key) == 403
    assert await post(locked, "/api/chat", CHAT, scoped_key) == 200
    limited, limited_key = make_key(locked, rpm=1)
    assert await post(locked, "/v1/chat/completions", CHAT, limited_key) == 200
    assert await post(locked, "/v1/chat/completions", CHAT, limited_key) == 429
    budget, budget_key = make_key(locked, daily_tokens=10)  # less than any reservation
    assert await post(locked, "/v1/chat/completions", CHAT, budget_key) == 429

    refused = next(r for r in await usage_rows(locked, key=scoped.prefix) if r["model"] == "llama3.2")
    assert refused["requests"] == 1 and refused["errors"] == 1 and refused["statuses"] == {"403": 1}
    assert refused["prompt_tokens"] == 0 and refused["completion_tokens"] == 0 and refused["worker"] is None
    served = next(r for r in await usage_rows(locked, key=scoped.prefix) if r["model"] == "qwen3:8b")
    assert served["errors"] == 0 and served["statuses"] == {"200": 1}

    rows = await usage_rows(locked, key=limited.prefix, bucket="day")
    assert sum(r["requests"] for r in rows) == 2 and sum(r["errors"] for r in rows) == 1
    by_worker = {r["worker"]: r for r in rows}
    assert by_worker[None]["statuses"] == {"429": 1} and by_worker[None]["prompt_tokens"] == 0
    assert by_worker["a"]["statuses"] == {"200": 1}

    [over] = await usage_rows(locked, key=budget.prefix)
    assert over["statuses"] == {"429": 1} and over["errors"] == 1 and over["completion_tokens"] == 0
    # the same summary backs `turnout usage`; the refusals are the key's, not anonymous
    assert {r["key"] for r in await usage_rows(locked)} == {scoped.prefix, limited.prefix, budget.prefix}


def _call(payload: dict[str, Any]) -> Call:
    body = orjson.dumps(payload)
    return Call(Dialect.OPENAI, Endpoint.CHAT, "/v1/chat/completions", body, payload, payload["model"], True)


@pytest.mark.parametrize(
    ("prompt", "completion", "status", "expect_prompt", "expect_completion", "settles"),
    [
        (None, 7, 200, "estimate", 7, "estimate+7"),  # llama_cpp.server stream: events counted, no usage
        (None, None, 200, "estimate", 0, "reserved"),  # nothing reported at all: keep the reservation
        (11, None, 200, 11, 0, "11"),  # an embedding: prompt only
        (3, 4, 200, 3, 4, "7"),
        (None, None, 502, 0, 0, "0"),  # failed: refunded, nothing estimated
        (None, 6, 500, 0, 6, "0"),
    ],
)
async def test_unreported_prompt_tokens_settle_with_the_estimate(
    locked: Gateway,
    prompt: int | None,
    completion: int | None,
    status: int,
    expect_prompt: int | str,
    expect_completion: int,
    settles: str,
) -> None:
    accountant = locked.app[ACCOUNTANT]
    record, _ = make_key(locked, daily_tokens=100_000)
    call = _call({**CHAT, "messages": [{"role": "user", "content": "word " * 200}], "max_tokens": 30})
    ticket = await accountant.admit(record, call)
    assert ticket.prompt_estimate == len(call.body) // 4 and ticket.reserved == ticket.prompt_estimate + 30
    await accountant.finish(
        ticket, call, Outcome(worker="a", prompt_tokens=prompt, completion_tokens=completion), status
    )

    probe = await accountant.admit(record, call)  # what the day's budget holds now
    [(_, decision)] = probe.admitted
    assert decision.tokens_remaining is not None
    settled = 100_000 - decision.tokens_remaining - probe.reserved
    expected = {"estimate+7": ticket.prompt_estimate + 7, "reserved": ticket.reserved}.get(settles)
    assert settled == (expected if expected is not None else int(settles))
    await accountant.finish(probe, call, Outcome(failed=True), 499)

    await accountant.usage.flush()
    [row] = [r for r in locked.app[USAGE].summary(since=0, key_id=record.id) if r["statuses"].get(str(status))]
    assert row["prompt_tokens"] == (ticket.prompt_estimate if expect_prompt == "estimate" else expect_prompt)
    assert row["completion_tokens"] == expect_completion


async def test_refused_roll_up_is_logged_counted_and_the_rest_written(
    locked: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    with locked.app[DATABASE].engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TRIGGER poison BEFORE INSERT ON usage_rollup WHEN NEW.model = 'poison'"
                " BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
            )
        )
    _, key = make_key(locked)
    assert await post(locked, "/api/chat", {**CHAT, "model": "poison"}, key) in (404, 503)
    for _ in range(3):
        assert await post(locked, "/api/chat", CHAT, key) == 200
    rows = await usage_rows(locked)  # flushes first
    assert [(r["model"], r["requests"]) for r in rows] == [("qwen3:8b", 3)]
    assert any("usage roll-up dropped" in r.getMessage() and "model='poison'" in r.getMessage() for r in caplog.records)
    async with aiohttp.ClientSession() as http, http.get(f"{locked.url}/metrics") as r:
        metrics = await r.text()
    assert "turnout_usage_rows_dropped_total 1.0" in metrics
    assert await post(locked, "/api/chat", CHAT, key) == 200
    assert sum(r["requests"] for r in await usage_rows(locked)) == 4  # nothing stuck behind the dropped row


async def test_refusals_and_names_at_column_limits_are_recorded_on_postgres(
    emulator: EmulatorFactory, gateway: GatewayFactory, postgres_database: str, tmp_path: Path
) -> None:
    emu = await emulator("a", ["qwen3:8b"], tokens=5)
    gw = await gateway(
        [worker("a", emu.url)],
        auth={"open": False},
        storage={"data_dir": str(tmp_path / "pg-data"), "database_url": postgres_database},
    )
    record, key = make_key(gw, scopes=["qwen3:*", "é*", "模*"])
    at_limit = ["é" * 256, "模型" * 128]  # 256 characters: what the column holds, in 512 and 768 UTF-8 bytes
    for model in at_limit:
        assert await post(gw, "/v1/chat/completions", {**CHAT, "model": model}, key) >= 400  # not installed
    assert await post(gw, "/v1/chat/completions", {**CHAT, "model": "llama3.2"}, key) == 403
    assert await post(gw, "/v1/chat/completions", CHAT, key) == 200
    rows = await usage_rows(gw, key=record.prefix)
    assert sum(r["requests"] for r in rows) == 4 and sum(r["errors"] for r in rows) == 3
    assert {*at_limit, "llama3.2", "qwen3:8b"} == {r["model"] for r in rows}
    assert next(r for r in rows if r["model"] == "llama3.2")["statuses"] == {"403": 1}


async def test_llama_cpp_stream_without_usage_is_charged_the_engines_counts(
    llama_engine: Engine, gateway: GatewayFactory, clients: Clients
) -> None:
    """A stream that does not ask for usage (``stream_options.include_usage``) gets none from llama.cpp's server, as
    from OpenAI's API: its last frame's timings still say what the engine evaluated and generated, and that is what
    is charged (before, the prompt was estimated from the body and the completion from the content frames: 0 when
    the tiny model's tokens were bytes of no whole character, which llama.cpp's server sends no frame for)."""
    gw = await gateway([worker("llama", llama_engine.url, type="openai")], auth={"open": False})
    record, key = make_key(gw, daily_tokens=100_000)
    client = clients.openai(gw.url)
    client.api_key = key
    messages: list[Any] = [{"role": "user", "content": "hello " * 50}]
    stream = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, stream=True)
    chunks = [c async for c in stream]
    assert chunks and all(c.usage is None for c in chunks)  # the worker really reported nothing
    [row] = await usage_rows(gw, key=record.prefix)
    direct = await clients.openai(llama_engine.url).chat.completions.create(
        model="tiny", messages=messages, max_tokens=1
    )
    assert direct.usage is not None
    assert row["statuses"] == {"200": 1} and row["prompt_tokens"] == direct.usage.prompt_tokens
    assert 1 <= row["completion_tokens"] <= 6


# -- what a client is told of its tokens is what it is billed (issue 32, item 10) ------------------------------------
async def _ollama_stream(url: str, key: str, content: str) -> dict[str, Any]:
    """An Ollama client's streamed /api/chat: its final object."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "stream": True}
    body["options"] = {"num_predict": 4}
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/api/chat", json=body, headers=headers) as r:
        assert r.status == 200
        lines = [line for line in (await r.read()).splitlines() if line]
    final: dict[str, Any] = orjson.loads(lines[-1])
    assert final["done"] is True, lines[-1]
    return final


async def test_an_ollama_stream_without_usage_tells_the_client_what_it_is_billed(
    llama_engine: Engine, gateway: GatewayFactory
) -> None:
    """llama_cpp.server's streams carry no usage, even when asked (``stream_options.include_usage``): the Ollama
    client is told the prompt estimate the request is billed, not 0; and the answer's count it is billed."""
    gw = await gateway([worker("llama", llama_engine.url, type="openai")], auth={"open": False})
    record, key = make_key(gw)
    told = [await _ollama_stream(gw.url, key, text) for text in ("hello " * 40, "the sky is blue " * 10)]
    assert all(final["prompt_eval_count"] > 0 for final in told), told
    await gw.app[ACCOUNTANT].usage.flush()
    [row] = gw.app[USAGE].summary(since=0, key_id=record.id)
    assert row["requests"] == 2
    assert row["prompt_tokens"] == sum(final["prompt_eval_count"] for final in told)
    assert row["completion_tokens"] == sum(final["eval_count"] for final in told)


async def test_a_responses_stream_without_usage_tells_the_client_what_it_is_billed(
    llama_engine: Engine, gateway: GatewayFactory
) -> None:
    gw = await gateway([worker("llama", llama_engine.url, type="openai")], auth={"open": False})
    record, key = make_key(gw)
    body = {"model": "tiny", "input": "hello " * 40, "max_output_tokens": 4, "stream": True}
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http, http.post(f"{gw.url}/v1/responses", json=body, headers=headers) as r:
        events = [orjson.loads(line[6:]) for line in (await r.read()).splitlines() if line.startswith(b"data: ")]
    final = events[-1]
    assert final["type"] in ("response.completed", "response.incomplete"), final
    usage = final["response"]["usage"]
    assert usage is not None and usage["input_tokens"] > 0  # the estimate, as billed (it was null)
    await gw.app[ACCOUNTANT].usage.flush()
    [row] = gw.app[USAGE].summary(since=0, key_id=record.id)
    assert (row["prompt_tokens"], row["completion_tokens"]) == (usage["input_tokens"], usage["output_tokens"])


async def test_the_estimate_follows_the_models_own_counts(locked: Gateway) -> None:
    """The prompt estimate is the body's size over the bytes per token learned from the worker's counts for the
    model and API (a model not counted yet: the API's figure; 4 until one is counted): the same call, estimated
    again after an answer counted 40 tokens for it, is estimated about 40."""
    accountant = locked.app[ACCOUNTANT]
    call = _call({**CHAT, "messages": [{"role": "user", "content": "word " * 200}]})
    first = await accountant.admit(None, call)
    assert first.prompt_estimate == len(call.body) // 4
    await accountant.finish(first, call, Outcome(worker="a", prompt_tokens=40, completion_tokens=3), 200)
    assert (await accountant.admit(None, call)).prompt_estimate == 40
    other = call._replace(model="llama3.2:latest")  # another model, none of its own learned: the API's figure
    assert (await accountant.admit(None, other)).prompt_estimate == 40
    await accountant.finish(first, other, Outcome(worker="a", prompt_tokens=80, completion_tokens=3), 200)
    assert (await accountant.admit(None, other)).prompt_estimate == 80  # then its own
    assert (await accountant.admit(None, call)).prompt_estimate == 40
    messages = _call({**CHAT, "messages": [{"role": "user", "content": "word " * 200}]})._replace(
        dialect=Dialect.ANTHROPIC, endpoint=Endpoint.MESSAGES
    )
    assert (await accountant.admit(None, messages)).prompt_estimate == len(call.body) // 4  # another API: 4
    failed = await accountant.admit(None, call)
    await accountant.finish(failed, call, Outcome(worker="a", prompt_tokens=400, failed=True), 502)  # not learned
    assert (await accountant.admit(None, call)).prompt_estimate == 40


async def test_an_ollama_embedding_without_usage_tells_the_client_what_it_is_billed(gateway: GatewayFactory) -> None:
    raw = RawWorker(models=["e:1"])
    answer = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}]}
    raw.default = Reply([http(200, orjson.dumps(answer))])
    try:
        gw = await gateway([worker("raw", await raw.start(), type="openai")], auth={"open": False})
        record, key = make_key(gw)
        body = {"model": "e:1", "input": "the sky is blue " * 8}
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession() as http_, http_.post(f"{gw.url}/api/embed", json=body, headers=headers) as r:
            told = await r.json()
        assert r.status == 200 and told["embeddings"] == [[0.5, 0.25]] and told["prompt_eval_count"] > 0
        await gw.app[ACCOUNTANT].usage.flush()
        [row] = gw.app[USAGE].summary(since=0, key_id=record.id)
        assert row["prompt_tokens"] == told["prompt_eval_count"]
    finally:
        await raw.stop()
