"""The real Codex CLI (`codex exec`, from npm, installed by scripts/agent-clis) through Turnout.

Codex speaks only the Responses API: one streamed POST /v1/responses a model call, store: false, its instructions
as developer messages, a hosted web_search tool among its functions, and it needs response.completed (without it:
"stream closed before response.completed", exit 1). Configured as docs/clients.md says (a local model provider with
wire_api = "responses" and env_key), with its own HOME and CODEX_HOME, and proxies that lead nowhere so that
nothing leaves the machine.

Workers: the real llama.cpp engine on the tiny generated model (a real answer, real tokens), and a scripted chat
worker that calls Codex's exec_command tool and then answers, for a whole tool loop and a resumed second turn.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import Engine, Gateway, GatewayFactory, create_key, start_llama, worker
from tests.gateway.test_usage_accounting import usage_rows
from tests.support.raw_worker import RawWorker, Reply, http, sse

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTIONS = "You are a coding agent. Answer briefly.\n"


@pytest.fixture(scope="module")
def codex() -> str:
    """The codex binary: from TURNOUT_AGENT_CLIS (scripts/test exports it), else from scripts/agent-clis."""
    folder = (
        os.environ.get("TURNOUT_AGENT_CLIS")
        or subprocess.run(
            [str(ROOT / "scripts" / "agent-clis")], capture_output=True, text=True, check=True, timeout=1800
        ).stdout.strip()
    )
    path = Path(folder) / "codex"
    assert path.exists(), f"no codex in {folder}"
    return str(path)


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """llama.cpp with room for Codex's prompt (its tools alone are some 5,000 tokens of the tiny model's)."""
    log = tmp_path_factory.mktemp("llama-codex") / "server.log"
    started = start_llama(tiny_model, "tiny", log, "--ctx-size", "16384")
    yield started
    started.stop()


def setup_codex(tmp: Path, base_url: str, model: str) -> tuple[Path, dict[str, str]]:
    """A fresh HOME and CODEX_HOME with the provider config of docs/clients.md; (workdir, environment)."""
    home, codex_home, work = tmp / "home", tmp / "codex-home", tmp / "work"
    for folder in (home, codex_home, work):
        folder.mkdir(exist_ok=True)
    # a short system prompt instead of Codex's 20 KB one, and no sub-agent or goal tools: the tiny model reads
    # every token of the prompt at a few thousand tokens a second on these machines
    (codex_home / "instructions.md").write_text(INSTRUCTIONS)
    (codex_home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "turnout"\n'
        f'model_instructions_file = "{codex_home / "instructions.md"}"\n'
        "\n[model_providers.turnout]\n"
        'name = "Turnout"\n'
        f'base_url = "{base_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "TURNOUT_KEY"\n'
        "\n[features]\ngoals = false\n"
        "\n[agents]\nenabled = false\n"
        "\n[analytics]\nenabled = false\n"
    )
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "CODEX_HOME": str(codex_home),
        "TERM": "dumb",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    return work, env


async def run_codex(codex: str, work: Path, env: dict[str, str], key: str, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        codex,
        "exec",
        "--skip-git-repo-check",
        *args,
        cwd=work,
        env={**env, "TURNOUT_KEY": key},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), 300)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    return process.returncode or 0, out.decode(errors="replace")


async def test_codex_answers_through_turnout_on_llama_cpp(
    codex: str, engine: Engine, gateway: GatewayFactory, tmp_path: Path
) -> None:
    gw = await gateway([worker("llama", engine.url, type="openai")], auth={"open": False})
    _, key = create_key(gw, app="codex")
    work, env = setup_codex(tmp_path, gw.url, "tiny")
    code, out = await run_codex(codex, work, env, key, "say hi")
    assert code == 0, out
    assert "\ncodex\n" in out and "ERROR" not in out and "warning: `" not in out, out  # its answer, no complaint
    [row] = [r for r in await usage_rows(gw) if r["endpoint"] == "openai:responses"]
    assert row["worker"] == "llama" and row["requests"] == 1 and row["errors"] == 0, row
    assert row["prompt_tokens"] > 1000 and row["completion_tokens"] > 0, row  # llama.cpp's own counts


def chat_chunks(*deltas: dict[str, Any], finish: str) -> bytes:
    frames: list[object] = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    frames += [
        {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        {"choices": [], "usage": {"prompt_tokens": 900, "completion_tokens": 9, "total_tokens": 909}},
        b"[DONE]",
    ]
    return http(200, sse(*frames), "text/event-stream")


async def test_codex_runs_a_tool_through_turnout_and_resumes(
    codex: str, gateway: GatewayFactory, tmp_path: Path
) -> None:
    """A whole tool loop: the worker calls exec_command, Codex runs it and sends its output back, the worker
    answers; then `codex exec resume --last` sends the whole history again."""
    call = {"index": 0, "id": "call_ls", "type": "function", "function": {"name": "exec_command", "arguments": ""}}
    raw = RawWorker(models=["coder"])
    raw.replies.extend(
        [
            Reply(
                [
                    chat_chunks(
                        {"role": "assistant", "tool_calls": [call]},
                        {"tool_calls": [{"index": 0, "function": {"arguments": '{"cmd": "echo turnout"}'}}]},
                        finish="tool_calls",
                    )
                ]
            ),
            Reply([chat_chunks({"content": "The command printed"}, {"content": " turnout."}, finish="stop")]),
            Reply([chat_chunks({"content": "You are welcome."}, finish="stop")]),
        ]
    )
    url = await raw.start()
    try:
        gw: Gateway = await gateway([worker("scripted", url, type="openai")], auth={"open": False})
        _, key = create_key(gw, app="codex")
        work, env = setup_codex(tmp_path, gw.url, "coder")
        code, out = await run_codex(codex, work, env, key, "run echo turnout")
        assert code == 0, out
        assert "echo turnout" in out and "The command printed turnout." in out, out
        code, out = await run_codex(codex, work, env, key, "resume", "--last", "thanks")
        assert code == 0 and "You are welcome." in out, out
    finally:
        await raw.stop()
    first, second, third = (orjson.loads(b) for b in raw.posts)
    assert first["stream"] is True and "web_search" not in json.dumps(first["tools"])  # the hosted tool is dropped
    assert "exec_command" in [t["function"]["name"] for t in first["tools"]]
    assert first["messages"][0]["role"] == "system" and first["messages"][0]["content"].startswith(INSTRUCTIONS.strip())
    # the tool's output came back as the answer to the worker's call
    assistant, tool = second["messages"][-2:]
    assert assistant["tool_calls"][0]["id"] == "call_ls"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"cmd": "echo turnout"}
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_ls" and "turnout" in tool["content"]
    # the resumed turn carries the whole conversation, the first turn's tool call and answer included
    roles = [m["role"] for m in third["messages"]]
    assert roles[-4:] == ["assistant", "tool", "assistant", "user"] and third["messages"][-1]["content"].endswith(
        "thanks"
    )
    rows = [r for r in await usage_rows(gw) if r["endpoint"] == "openai:responses"]
    assert sum(r["requests"] for r in rows) == 3 and all(r["errors"] == 0 for r in rows), rows
