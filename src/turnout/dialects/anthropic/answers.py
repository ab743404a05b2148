"""Worker answers as Anthropic Messages: whole answers here, streams in :mod:`.events` (pure).

Shared rules: a worker's reasoning text (OpenAI-style ``reasoning_content`` or ``reasoning``, Ollama's
``thinking``) is a ``thinking`` block before the text; tool calls are ``tool_use`` blocks whose ``input`` is an
object (OpenAI's JSON-string arguments are parsed; what does not parse to an object is kept as
``{"_raw": "<the arguments>"}``); ``stop_reason`` is ``max_tokens`` for a length stop, else ``tool_use`` when the
model called tools, ``stop_sequence`` when the worker says which of the request's stop sequences matched (vLLM's
``stop_reason``), ``refusal`` for a content filter, else ``end_turn``. Usage is the worker's count where it
reported one: ``input_tokens`` excludes the prompt tokens the worker read from its cache
(``cache_read_input_tokens``), as Anthropic counts them.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson

from turnout.dialects.base import Counts, Timing
from turnout.dialects.readable import ResponseShapeError, answer_message, first_choice, ollama_message

__all__ = [
    "ResponseShapeError",
    "Usage",
    "message_from_ollama",
    "message_from_openai",
    "message_id",
    "stop_reason",
    "tool_input",
    "tool_use_id",
]

JSON = dict[str, Any]
_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def message_id(source: object) -> str:
    """``msg_<the worker's id>``, or one derived from the answer itself (the dialect reads no clock or random)."""
    if isinstance(source, str) and _ID.fullmatch(source):
        return f"msg_{source}"
    return "msg_" + hashlib.sha256(orjson.dumps(source, option=orjson.OPT_NON_STR_KEYS)).hexdigest()[:24]


def tool_use_id(worker_id: object, message: str, n: int) -> str:
    """The worker's own call id when it is a valid Anthropic id, else one unique to the message and position."""
    if isinstance(worker_id, str) and _ID.fullmatch(worker_id):
        return worker_id
    return f"toolu_{message.removeprefix('msg_')[:24]}_{n}"


def tool_input(arguments: object) -> JSON:
    """Tool-call arguments (a JSON string from OpenAI-style workers, an object from Ollama) as an object."""
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {"_raw": arguments}
        return parsed if isinstance(parsed, dict) else {"_raw": arguments}
    return {"_raw": orjson.dumps(arguments, option=orjson.OPT_NON_STR_KEYS).decode()}


def stop_reason(finish: object, tools: bool, matched: str | None) -> str:
    if finish == "length":
        return "max_tokens"
    if tools or finish in ("tool_calls", "function_call"):
        return "tool_use"
    if matched is not None:
        return "stop_sequence"
    if finish == "content_filter":
        return "refusal"
    return "end_turn"


class Usage:
    """What the worker counted, as Anthropic's usage and the gateway's :class:`Counts`."""

    __slots__ = ("cached", "estimate", "output", "prompt")

    def __init__(self, estimate: int) -> None:
        self.estimate = estimate  # the gateway's prompt estimate, shown when the worker reports no count
        self.prompt: int | None = None
        self.cached = 0
        self.output: int | None = None

    def openai(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        prompt, output = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
        if prompt is not None:
            self.prompt = prompt
            details = usage.get("prompt_tokens_details")
            cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
            self.cached = min(cached or 0, prompt)
        if output is not None:
            self.output = output

    def ollama(self, final: JSON) -> None:
        prompt, output = _count(final.get("prompt_eval_count")), _count(final.get("eval_count"))
        if prompt is not None:
            self.prompt = prompt
        if output is not None:
            self.output = output

    def anthropic(self, fallback_output: int = 0) -> JSON:
        prompt = self.estimate if self.prompt is None else self.prompt
        return {
            "input_tokens": prompt - self.cached,
            "output_tokens": fallback_output if self.output is None else self.output,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.cached,
        }

    def counts(self, fallback_output: int, seconds: float) -> Counts:
        return Counts(self.prompt, fallback_output if self.output is None else self.output, seconds)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _matched(choice: JSON, stops: list[str]) -> str | None:
    matched = choice.get("stop_reason")  # vLLM: the stop string that ended the answer
    return matched if isinstance(matched, str) and matched in stops else None


def message_from_openai(
    answer: JSON, model: str, stops: list[str], estimate: int, timing: Timing
) -> tuple[JSON, Counts]:
    """A ``/v1/chat/completions`` answer as a Message. The wrong shape, or a message that cannot be read
    (:mod:`turnout.dialects.readable`), raises :class:`ResponseShapeError`."""
    choice = first_choice(answer)
    message = answer_message(choice)
    msg_id = message_id(answer.get("id") or answer)
    thinking = _text(message.get("reasoning_content")) or _text(message.get("reasoning"))
    content = _blocks(message, thinking, msg_id)
    usage = Usage(estimate)
    usage.openai(answer.get("usage"))
    matched = _matched(choice, stops)
    tools = any(block["type"] == "tool_use" for block in content)
    out = _message(msg_id, model, content, stop_reason(choice.get("finish_reason"), tools, matched), matched)
    out["usage"] = usage.anthropic()
    return out, usage.counts(0, timing.total_ns / 1e9)


def _blocks(message: JSON, thinking: str, msg_id: str) -> list[JSON]:
    """A worker's answer message (OpenAI's or Ollama's: the same ``content`` and ``tool_calls`` fields) as a
    Message's content blocks: its thinking, its text, then each named tool call."""
    content: list[JSON] = []
    if thinking:
        content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    text = _text(message.get("content"))
    if text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls")
    for n, call in enumerate(calls if isinstance(calls, list) else []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            continue
        call_id = tool_use_id(call.get("id"), msg_id, n)
        content.append(
            {
                "type": "tool_use",
                "id": call_id,
                "name": function["name"],
                "input": tool_input(function.get("arguments")),
            }
        )
    return content


def message_from_ollama(answer: JSON, model: str, estimate: int, timing: Timing) -> tuple[JSON, Counts]:
    """An ``/api/chat`` answer (``done: true``) as a Message."""
    message = ollama_message(answer)
    assert message is not None  # a whole answer has one, or ollama_message raised
    msg_id = message_id(answer)
    content = _blocks(message, _text(message.get("thinking")), msg_id)
    usage = Usage(estimate)
    usage.ollama(answer)
    tools = any(block["type"] == "tool_use" for block in content)
    out = _message(msg_id, model, content, stop_reason(answer.get("done_reason"), tools, None), None)
    out["usage"] = usage.anthropic()
    seconds = (_count(answer.get("eval_duration")) or timing.total_ns) / 1e9
    return out, usage.counts(0, seconds)


def _message(msg_id: str, model: str, content: list[JSON], reason: str, matched: str | None) -> JSON:
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": matched,
    }
