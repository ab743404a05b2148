"""The real Claude Code CLI (`claude -p`, from npm) answering a prompt through Turnout, with the environment
docs/clients.md gives: ANTHROPIC_BASE_URL the gateway, the key as ANTHROPIC_API_KEY (x-api-key) or
ANTHROPIC_AUTH_TOKEN (Bearer), ANTHROPIC_MODEL a model the gateway serves.

Claude Code sends what the captures in tests/dialects/golden/anthropic show (/v1/messages?beta=true, a stream,
adaptive thinking, a dozen tools, role "system" messages...). Workers: the Ollama emulator as an Ollama worker
(its answer is a Bash tool call, so the whole tool loop runs: Claude Code runs `ls` and sends the listing back),
the same as a worker that serves the Messages API itself, and the real llama.cpp engine on a generated model
that ends its answers (Claude Code treats reaching max_tokens as an error).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import EmulatorFactory, Engine, GatewayFactory, create_key, start_llama, worker
from tests.support.claude_code import run_claude
from tests.support.tiny_gguf import write_tiny_model
from turnout.gateway.keys import ACCOUNTANT, USAGE

LS = {"name": "Bash", "arguments": {"command": "ls", "description": "List the files in the current directory"}}


async def test_claude_code_runs_a_tool_through_an_ollama_worker(
    emulator: EmulatorFactory, gateway: GatewayFactory, tmp_path: Path
) -> None:
    ollama = await emulator("ollama", ["qwen3-coder:30b"], tool_call=LS)
    gw = await gateway([worker("ollama", ollama.url)], auth={"open": False})
    record, key = create_key(gw, app="claude")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "marker-file.txt").write_text("x")

    run = await run_claude(gw.url, "qwen3-coder:30b", "list the files in the current directory", tmp_path, api_key=key)

    assert run.returncode == 0, (run.stdout, run.stderr)
    assert run.stdout.strip() == "[ollama] w1 w2 w3 w4"
    [(path, first), (_, second)] = ollama.calls
    assert path == "/api/chat" and first["stream"] is True and "think" not in first
    system = first["messages"][0]
    assert system["role"] == "system" and "x-anthropic-billing-header" not in system["content"]
    assert {t["function"]["name"] for t in first["tools"]} >= {"Bash", "Read", "Write", "Edit"}
    assert "DeferredToolPlaceholder" not in {t["function"]["name"] for t in first["tools"]}  # defer_loading
    assert [m["role"] for m in first["messages"]] == ["system", "user"]  # the role "system" messages joined
    assert "list the files in the current directory" in first["messages"][1]["content"]
    call = second["messages"][-2]
    assert call["role"] == "assistant" and call["tool_calls"][0]["function"] == {"index": 0, **LS}
    result = second["messages"][-1]
    assert result["role"] == "tool" and result["tool_name"] == "Bash" and "marker-file.txt" in result["content"]
    assert result["tool_call_id"] == call["tool_calls"][0]["id"]
    await gw.app[ACCOUNTANT].usage.flush()
    rows = [r for r in gw.app[USAGE].summary(since=0) if r["key"] == record.prefix]
    assert [(r["endpoint"], r["requests"], r["errors"]) for r in rows] == [("anthropic:messages", 2, 0)]


async def test_claude_code_through_a_worker_that_serves_messages_itself(
    emulator: EmulatorFactory, gateway: GatewayFactory, tmp_path: Path
) -> None:
    native = await emulator("native", ["qwen3-coder:30b"], tool_call=LS)
    gw = await gateway([worker("native", native.url, native_apis=["anthropic"])], auth={"open": False})
    _, key = create_key(gw, app="claude")

    run = await run_claude(gw.url, "qwen3-coder:30b", "list the files", tmp_path, auth_token=key)

    assert run.returncode == 0 and run.stdout.strip() == "[native] w1 w2 w3 w4", (run.stdout, run.stderr)
    [(path, first), (_, second)] = native.calls
    assert (
        path == "/v1/messages"
        and first["thinking"]["type"] == "adaptive"
        and first["system"][0]["text"].startswith("x-anthropic-billing-header")
    )  # unchanged
    assert second["messages"][-1]["role"] in ("user", "system")
    results = [b for m in second["messages"] if isinstance(m["content"], list) for b in m["content"]]
    assert any(b.get("type") == "tool_result" for b in results), json.dumps(second)[:2000]
    headers = native.headers_seen[-1]
    assert "claude-code-20250219" in headers["anthropic-beta"] and headers["anthropic-version"] == "2023-06-01"
    assert key not in json.dumps(headers)


@pytest.fixture(scope="module")
def ending_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """llama.cpp on a generated model that ends its answers after a few tokens, with room for Claude Code's
    prompt (about 15,000 of its tokens)."""
    folder = tmp_path_factory.mktemp("llama-claude")
    model = write_tiny_model(folder / "ending.gguf", eos_logit=2.2)
    started = start_llama(model, "tiny-coder", folder / "server.log", "--ctx-size", "24576")
    yield started
    started.stop()


async def test_claude_code_on_llama_cpp(ending_engine: Engine, gateway: GatewayFactory, tmp_path: Path) -> None:
    gw = await gateway([worker("llama", ending_engine.url, type="openai")], auth={"open": False})
    record, key = create_key(gw, app="claude")

    run = await run_claude(gw.url, "tiny-coder", "say hi", tmp_path, auth_token=key)

    assert run.returncode == 0, (run.stdout, run.stderr)
    await gw.app[ACCOUNTANT].usage.flush()
    [row] = [r for r in gw.app[USAGE].summary(since=0) if r["key"] == record.prefix]
    assert (row["endpoint"], row["worker"], row["errors"]) == ("anthropic:messages", "llama", 0)
    # Claude Code's whole prompt reached the model: llama.cpp evaluated it (its log counts the tokens)
    evaluated = _prompt_tokens_evaluated(Path(ending_engine.log.name))
    assert evaluated and max(evaluated) > 10_000, evaluated


def _prompt_tokens_evaluated(log: Path) -> list[int]:
    return [int(n) for n in re.findall(r"prompt eval time = .* / +(\d+) tokens", log.read_text())]
