"""Golden files for the Anthropic Messages translation, both ways: one file per case under golden/anthropic/.

Each case: the client's request (``request``; for captured traffic, ``captured`` names the file under
/work/captures it was copied from: real Claude Code and `anthropic` SDK requests, with placeholder keys), the
worker it goes to (``worker``: ``openai`` or ``ollama``), the request the worker gets (``worker_request``: path and
body), the worker's answer (``worker_answer``, or the decoded events of its stream in ``worker_stream``) and the
client's answer (``answer``, or the Messages stream's events in ``events``) with what accounting is told
(``counts``). Count cases (``kind: count``) give the tokenizer requests and the answer for a tokenizer's reply.

To refresh after an intended change: TURNOUT_UPDATE_GOLDEN=1 pytest tests/dialects/test_anthropic_golden.py,
then review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from turnout.core.limits import prompt_estimate
from turnout.dialects import anthropic
from turnout.dialects.base import Call, Dialect, Endpoint, Timing, WorkerAPI

GOLDEN = Path(__file__).parent / "golden" / "anthropic"
TIMING = Timing(created_at="2026-12-04T10:00:00Z", total_ns=2_000_000_000, first_token_ns=500_000_000)
OUTPUTS = ("worker_request", "worker_alternate", "answer", "events", "counts", "tokenize", "counted")


def call_of(case: dict[str, Any]) -> Call:
    payload = case["request"]
    endpoint = Endpoint.COUNT_TOKENS if case.get("kind") == "count" else Endpoint.MESSAGES
    stream = bool(payload.get("stream")) and endpoint is Endpoint.MESSAGES
    body = orjson.dumps(payload)
    estimate = prompt_estimate(len(body)) if endpoint is Endpoint.MESSAGES else 0  # accounting's, nothing learned
    return Call(Dialect.ANTHROPIC, endpoint, "/v1/messages", body, payload, payload["model"], stream, estimate=estimate)


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    worker = WorkerAPI(case["worker"])
    call = call_of(case)
    translation = anthropic.API.translation(worker, call.endpoint, frozenset())
    out: dict[str, Any] = {}
    if case.get("kind") == "count":
        assert isinstance(translation, anthropic.CountOnOpenAI)
        out["tokenize"] = [[path, body] for path, body in translation.tokenize(call, "worker-model")]
        reply = case.get("tokenizer_answer")
        out["counted"] = translation.answer(call, None if reply is None else translation.count(reply))
        return out
    assert isinstance(translation, anthropic.MessagesOnOpenAI | anthropic.MessagesOnOllama)
    path, request = translation.request(call, "worker-model")
    out["worker_request"] = {"path": path, "body": request}
    alternate = translation.alternate(request)
    if alternate is not None:
        out["worker_alternate"] = alternate
    if "worker_stream" in case:
        stream = translation.stream(call)
        events = [e for event in case["worker_stream"] for e in stream.feed([event], TIMING.created_at)]
        final, counts = stream.finish(TIMING)
        out["events"] = events + final
    else:
        out["answer"], counts = translation.answer(call, case["worker_answer"], TIMING)
    out["counts"] = list(counts)
    return out


CASES = sorted(GOLDEN.glob("*.json"))


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_golden(path: Path) -> None:
    case = json.loads(path.read_text())
    actual = run_case(case)
    if os.environ.get("TURNOUT_UPDATE_GOLDEN"):
        case = {k: v for k, v in case.items() if k not in OUTPUTS} | actual
        path.write_text(json.dumps(case, indent=2, ensure_ascii=False) + "\n")
    assert actual == {k: case[k] for k in OUTPUTS if k in case}


def test_there_are_golden_cases_for_both_workers_and_both_answer_kinds() -> None:
    cases = [json.loads(p.read_text()) for p in CASES]
    kinds = {(c["worker"], "worker_stream" in c) for c in cases if c.get("kind") != "count"}
    assert kinds == {("openai", True), ("openai", False), ("ollama", True), ("ollama", False)}
    assert sum(1 for c in cases if "claude-code" in c.get("captured", "")) >= 4
    assert sum(1 for c in cases if c.get("captured", "").startswith("sdk-anthropic")) >= 3


def test_a_started_stream_is_well_formed_in_every_case() -> None:
    """message_start first, message_stop last, blocks opened and closed in order, deltas inside their block."""
    for path in CASES:
        case = json.loads(path.read_text())
        if "events" in case:
            assert_well_formed(case["events"])


def assert_well_formed(events: list[dict[str, Any]]) -> None:
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop", events
    assert events[-2]["type"] == "message_delta" and events[-2]["delta"]["stop_reason"] in (
        "end_turn",
        "max_tokens",
        "stop_sequence",
        "tool_use",
        "refusal",
    )
    open_block: dict[str, Any] | None = None
    expected_index = 0
    delta_types = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}
    partial = ""
    for event in events[1:-2]:
        kind = event["type"]
        if kind == "content_block_start":
            assert open_block is None and event["index"] == expected_index, events
            open_block, partial = event["content_block"], ""
        elif kind == "content_block_delta":
            assert open_block is not None and event["index"] == expected_index
            assert event["delta"]["type"] == delta_types[open_block["type"]], event
            partial += event["delta"].get("partial_json", "")
        elif kind == "content_block_stop":
            assert open_block is not None and event["index"] == expected_index
            if open_block["type"] == "tool_use":
                assert isinstance(json.loads(partial), dict)  # an SDK parses the fragments into the input object
            open_block, expected_index = None, expected_index + 1
        else:
            raise AssertionError(f"unexpected {kind} inside the message: {events}")
    assert open_block is None
