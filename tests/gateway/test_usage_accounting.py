"""Usage through the gateway: refusals count as the key's errors, unreported token counts are estimated,
and a roll-up the database refuses is dropped, logged and counted while every other one is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import text

from tests.conftest import Clients, EmulatorFactory, Engine, Gateway, GatewayFactory, create_key, worker
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
    import orjson

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


async def test_llama_cpp_stream_without_usage_is_charged_the_prompt_estimate(
    llama_engine: Engine, gateway: GatewayFactory, clients: Clients
) -> None:
    """A stream that does not ask for usage (``stream_options.include_usage``) gets none from llama.cpp's server, as
    from OpenAI's API (llama-cpp-python's server never sent any): the proxy reports no prompt count (None),
    accounting estimates."""
    gw = await gateway([worker("llama", llama_engine.url, type="openai")], auth={"open": False})
    record, key = make_key(gw, daily_tokens=100_000)
    client = clients.openai(gw.url)
    client.api_key = key
    stream = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello " * 50}], max_tokens=6, stream=True
    )
    chunks = [c async for c in stream]
    assert chunks and all(c.usage is None for c in chunks)  # the worker really reported nothing
    [row] = await usage_rows(gw, key=record.prefix)
    assert row["statuses"] == {"200": 1} and row["prompt_tokens"] >= 300 // 4  # ~ body bytes / 4
    assert 1 <= row["completion_tokens"] <= 7
