"""Golden files for the OpenAI Responses API on a Chat Completions worker (turnout.dialects.responses).

One file per case under golden/responses/: the client's request (most captured from Codex CLI, the openai SDK and
the OpenAI Agents SDK, /work/captures at the time), the worker's answer (``worker_answer``) or its stream events
(``worker_stream``), and what the translation makes of them: the request the worker gets (``worker_request``,
its path, body and the answer's headers) and the client's answer (``answer``) or stream events (``stream``) with
the counts accounting gets. To refresh after an intended change: TURNOUT_UPDATE_GOLDEN=1 pytest
tests/dialects/test_responses_translate.py, then review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from turnout.dialects import openai, responses
from turnout.dialects.base import Call, Dialect, Endpoint, Timing, TranslationError, WorkerAPI
from turnout.errors import UpstreamError

GOLDEN = Path(__file__).parent / "golden" / "responses"
CASES = sorted(GOLDEN.glob("*.json"))


def call_of(request: dict[str, Any], answer_id: str = "resp_0123456789abcdef") -> Call:
    body = json.dumps(request).encode()
    stream = request.get("stream") is True
    return Call(
        Dialect.RESPONSES, Endpoint.RESPONSES, "/v1/responses", body, request, request["model"], stream, None, answer_id
    )


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    translation = responses.API.translation(WorkerAPI.OPENAI, Endpoint.RESPONSES, frozenset())
    assert translation is not None
    call = call_of(case["request"], case["answer_id"])
    path, body = translation.request(call, case["model"])
    out: dict[str, Any] = {"worker_request": {"path": path, "body": body, "headers": translation.headers(call)}}
    timing = Timing(created_at=case["created_at"], total_ns=2_000_000_000, first_token_ns=500_000_000)
    if "worker_stream" in case:
        translator = translation.stream(call)
        events = [e for event in case["worker_stream"] for e in translator.feed(event, case["created_at"])]
        final, counts = translator.finish(timing)
        out["stream"] = events + final
    else:
        answer, counts = translation.answer(call, case["worker_answer"], timing)
        out["answer"] = answer
    out["counts"] = list(counts)
    return out


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_golden(path: Path) -> None:
    case = json.loads(path.read_text())
    actual = run_case(case)
    if os.environ.get("TURNOUT_UPDATE_GOLDEN"):
        case.update(actual)
        path.write_text(json.dumps(case, indent=2, ensure_ascii=False) + "\n")
    for key, value in actual.items():
        assert value == case[key], key


def test_there_are_golden_cases_from_each_client() -> None:
    sources = {json.loads(p.read_text())["source"].split("/")[1] for p in CASES if "captures/" in p.read_text()[:300]}
    assert {"codex-exec", "codex-exec-gpt55", "sdk-openai-python", "sdk-openai-agents"} <= sources
    assert len(CASES) >= 10


def _stream_types(case: str) -> list[str]:
    return [e["type"] for e in json.loads((GOLDEN / f"{case}.json").read_text())["stream"]]


def test_every_stream_numbers_its_events_and_ends_once() -> None:
    for path in CASES:
        case = json.loads(path.read_text())
        if "stream" not in case:
            continue
        events = case["stream"]
        assert [e["sequence_number"] for e in events] == list(range(len(events))), path.stem
        ends = [
            e["type"] for e in events if e["type"] in ("response.completed", "response.incomplete", "response.failed")
        ]
        assert ends == [events[-1]["type"]], path.stem
        assert events[0]["type"] == "response.created" and events[1]["type"] == "response.in_progress", path.stem


def test_namespace_call_comes_back_with_its_namespace() -> None:
    case = json.loads((GOLDEN / "codex_exec_namespace_call_stream.json").read_text())
    names = [t["function"]["name"] for t in case["worker_request"]["body"]["tools"]]
    assert "multi_agent_v1__spawn_agent" in names and "web_search" not in names
    done = [e["item"] for e in case["stream"] if e["type"] == "response.output_item.done"]
    assert done == [
        {
            "id": "fc_0123456789abcdef_0",
            "status": "completed",
            "type": "function_call",
            "call_id": "chatcmpl-tool-1",
            "name": "spawn_agent",
            "arguments": '{"message": "check the tests"}',
            "namespace": "multi_agent_v1",
        }
    ]
    assert case["worker_request"]["headers"] == {"X-Turnout-Dropped-Tools": "web_search"}


def test_codex_instructions_are_one_system_message_and_reasoning_is_dropped() -> None:
    case = json.loads((GOLDEN / "codex_patch_reasoning_custom_call_stream.json").read_text())
    messages = case["worker_request"]["body"]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "user", "assistant", "tool"]
    assert messages[0]["content"].startswith("You are")
    assert messages[3]["tool_calls"][0]["function"]["name"] == "apply_patch"
    assert json.loads(messages[3]["tool_calls"][0]["function"]["arguments"])["input"].startswith("*** Begin Patch")
    custom = [e for e in case["stream"] if e["type"] == "response.output_item.done"][-1]["item"]
    assert custom["type"] == "custom_tool_call" and custom["input"].endswith("*** End Patch\n")


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        ({"input": 3}, "input must be a string or a list"),
        ({"input": [1]}, "input[0] must be an object"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "needs a call_id"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "call_id"),
        ({"input": "x", "tools": {}}, "tools must be a list"),
        ({"input": "x", "tools": [{"type": "function"}]}, "needs a name"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": "hot"}, "temperature must be a number"),
        ({"input": "x", "instructions": 5}, "instructions must be"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "schema": "no"}}}, "text.format.schema"),
    ],
)
def test_requests_that_cannot_be_translated_say_which_field(request_: dict[str, Any], fragment: str) -> None:
    translation = responses.API.translation(WorkerAPI.OPENAI, Endpoint.RESPONSES, frozenset())
    assert translation is not None
    with pytest.raises(TranslationError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        translation.request(call_of({"model": "m", **request_}), "m")


def test_a_native_worker_gets_no_translation() -> None:
    assert responses.API.translation(WorkerAPI.OPENAI, Endpoint.RESPONSES, frozenset({"responses"})) is None
    assert responses.API.translation(WorkerAPI.OLLAMA, Endpoint.RESPONSES, frozenset({"anthropic"})) is not None


def test_a_broken_stream_ends_with_response_failed_numbered_on() -> None:
    translation = responses.API.translation(WorkerAPI.OPENAI, Endpoint.RESPONSES, frozenset())
    assert translation is not None
    translator = translation.stream(call_of({"model": "m", "input": "hi", "stream": True}))
    events = translator.feed({"choices": [{"index": 0, "delta": {"content": "Hel"}}]}, "2026-12-04T14:31:00Z")
    (failed,) = translator.fail(UpstreamError("w: the stream ended before the model finished"))
    assert failed["type"] == "response.failed"
    assert failed["sequence_number"] == events[-1]["sequence_number"] + 1
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {
        "code": "server_error",
        "message": "w: the stream ended before the model finished",
    }
    assert failed["response"]["output"][0]["content"][0]["text"] == "Hel"
    assert translation.frame(failed).startswith(b"event: response.failed\ndata: {")


def test_prompt_parts_and_session_key() -> None:
    case = json.loads((GOLDEN / "codex_exec_tool_result_stream.json").read_text())
    call = call_of(case["request"])
    parts = responses.API.prompt_parts(call)
    body = case["worker_request"]["body"]
    assert len(parts) == 1 + 1 + (len(body["messages"]) - 1)  # system, tools, then each message
    # the worker sees the chat request it becomes: its parts are that chat request's, so a conversation keeps its
    # worker whichever of the two APIs a client speaks
    chat = Call(Dialect.OPENAI, Endpoint.CHAT, "/v1/chat/completions", b"", body, body["model"], True, None, "")
    assert parts == openai.API.prompt_parts(chat)
    assert body["messages"][0]["content"] in parts[0]
    assert "Chunk ID" in parts[-1]
    assert responses.API.session_key(call, {}) == case["request"]["prompt_cache_key"]
    assert responses.API.session_key(call_of({"model": "m", "input": "x"}), {}) is None
    assert responses.API.prompt_parts(call_of({"model": "m", "input": 5})) == []
