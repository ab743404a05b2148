"""What prefix-aware routing and prefix caches rely on, checked on real Claude Code traffic (the captured requests
in golden/anthropic): the same history gives the same prompt from one turn to the next, and the session id is
found where Claude Code puts it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from turnout.dialects import anthropic
from turnout.dialects.anthropic import prompt
from turnout.dialects.base import Call, Dialect, Endpoint

GOLDEN = Path(__file__).parent / "golden" / "anthropic"


def case(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((GOLDEN / f"{name}.json").read_text())
    return loaded


def call_of(body: dict[str, Any]) -> Call:
    return Call(Dialect.ANTHROPIC, Endpoint.MESSAGES, "/v1/messages", orjson.dumps(body), body, body["model"], True)


def test_a_turns_prompt_starts_with_the_previous_turns() -> None:
    """Claude Code's second request (after the tool ran) repeats the first with its trailing role "system" message
    as a plain string instead of a block with cache_control: the worker sees the first prompt, unchanged, as the
    start of the second."""
    first = call_of(case("claude_code_unknown_model_tool_use_ollama_stream")["request"])
    second = call_of(case("claude_code_unknown_model_tool_result_openai_stream")["request"])
    before, after = anthropic.API.prompt_parts(first), anthropic.API.prompt_parts(second)
    assert len(after) > len(before) and after[: len(before)] == before
    assert not before[0].startswith(prompt.BILLING_HEADER) and before[0].startswith("You are a Claude agent")
    # and the same holds for the requests the workers are sent
    sent_first = prompt.openai_request(first.payload, "m", stream=True)["messages"]
    sent_second = prompt.openai_request(second.payload, "m", stream=True)["messages"]
    assert sent_second[: len(sent_first)] == sent_first


def test_the_session_is_claude_codes_session_id() -> None:
    captured = case("claude_code_unknown_model_tool_use_ollama_stream")
    header = dict((k.lower(), v) for k, v in captured["headers"])["x-claude-code-session-id"]
    call = call_of(captured["request"])
    assert anthropic.API.session_key(call, {}) == header
    # a plain user_id (the SDK's own example sets one) is the client's key as it is, as OpenAI chat's `user` is
    sdk = call_of(case("sdk_tools_metadata_stop_sequence_openai")["request"])
    assert anthropic.API.session_key(sdk, {}) == "capture-user-1"
    # Claude Code before its JSON user_id: user_<hash>_account_<uuid>_session_<uuid>
    legacy = {"model": "m", "messages": [], "metadata": {"user_id": "user_ab12_account_u-1_session_s-2"}}
    assert anthropic.API.session_key(call_of(legacy), {}) == "s-2"
    no_session = {"model": "m", "messages": [], "metadata": {"user_id": '{"device_id": "d"}'}}
    assert anthropic.API.session_key(call_of(no_session), {}) == '{"device_id": "d"}'
    assert anthropic.API.session_key(call_of({"model": "m", "messages": []}), {}) is None
    assert anthropic.API.session_key(call_of({"model": "m", "messages": [], "metadata": {"user_id": ""}}), {}) is None


def test_prompt_parts_of_a_request_that_cannot_be_read_are_none() -> None:
    assert anthropic.API.prompt_parts(call_of({"model": "m", "messages": "hi"})) == []


def test_the_plainest_form_for_a_strict_server() -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "top_k": 3,
        "stop_sequences": ["a", "b", "c", "d", "e"],
        "tool_choice": {"type": "any"},
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    request = prompt.openai_request(body, "w", stream=False)
    assert request["top_k"] == 3 and request["tool_choice"] == "required" and len(request["stop"]) == 5
    plain = prompt.openai_alternate(request)
    assert plain is not None and "top_k" not in plain and plain["tool_choice"] == "auto"
    assert plain["stop"] == ["a", "b", "c", "d"]
    assert prompt.openai_alternate(plain) is None  # nothing plainer to try
