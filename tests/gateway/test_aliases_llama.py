"""Model aliases with a real engine: the llama.cpp server (OpenAI API) on the tiny generated model, asked for by
an alias through the official openai and ollama clients (pass-through and translated), streams included."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import ollama
import openai
import pytest

from tests.conftest import Engine, Gateway, GatewayFactory, create_key, start_llama, worker
from tests.gateway.test_aliases import usage_rows

ALIAS = "claude-sonnet-4-5"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """An engine of this module's own (the session's keeps llama.cpp's prompt cache from test to test)."""
    started = start_llama(tiny_model, "tiny", tmp_path_factory.mktemp("llama-aliases") / "server.log", "--embedding")
    yield started
    started.stop()


@pytest.fixture
async def gw(engine: Engine, gateway: GatewayFactory) -> AsyncIterator[Gateway]:
    yield await gateway([worker("llama", engine.url, type="openai")], aliases={ALIAS: "tiny"}, auth={"open": False})


async def test_openai_and_ollama_clients_ask_a_real_engine_by_its_alias(gw: Gateway) -> None:
    _, key = create_key(gw, app="agents", scopes=["tiny"])
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0) as client:
        answer = await client.chat.completions.create(model=ALIAS, messages=HI, max_tokens=4)
        assert answer.choices[0].finish_reason in ("length", "stop") and answer.usage is not None
        stream = await client.chat.completions.create(model=ALIAS, messages=HI, max_tokens=4, stream=True)
        finishes = [c.choices[0].finish_reason async for c in stream if c.choices]
        assert finishes[-1] in ("length", "stop")
        assert [m.id async for m in client.models.list()] == [ALIAS, "tiny"]
        assert (await client.embeddings.create(model=ALIAS, input="hi")).data[0].embedding
    sdk = ollama.AsyncClient(host=gw.url, headers={"Authorization": f"Bearer {key}"})
    try:  # an Ollama client, translated onto the OpenAI-style engine
        reply = await sdk.chat(model=ALIAS, messages=HI, options={"num_predict": 4})
        assert reply.done and reply.eval_count
        chunks = [
            c async for c in await sdk.generate(model=ALIAS, prompt="hi", stream=True, options={"num_predict": 4})
        ]
        assert chunks[-1].done
        assert [m.model for m in (await sdk.list()).models] == [ALIAS, "tiny"]
    finally:
        await sdk.close()
    rows = await usage_rows(gw)
    assert {(r["model"], r["alias"], r["worker"]) for r in rows} == {("tiny", ALIAS, "llama")}, rows
    assert sum(r["requests"] for r in rows) == 5 and all(r["errors"] == 0 for r in rows)
