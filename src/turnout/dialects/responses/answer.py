"""A Responses API answer built from a Chat Completions answer (pure): the ``response`` object, its output items,
status and usage. Also what the stream converter (:mod:`.stream`) builds its events from.

* The worker's reasoning text (``reasoning_content``, as llama.cpp and older vLLM send it, or ``reasoning``, as
  Ollama's ``/v1`` and newer vLLM do) is a ``reasoning`` item with a ``reasoning_text`` part, first.
* Its text is a ``message`` item (one ``output_text`` part); an answer with neither text nor tool calls still has
  one, empty, so that every client finds a message.
* Its tool calls are ``function_call`` items (arguments a JSON string, as OpenAI's), given back their namespace,
  or ``custom_tool_call`` items (the ``input`` argument) and ``tool_search_call`` items, as the request's tools
  were (:class:`~.request.ToolNames`).
* ``finish_reason`` ``length`` is ``status: "incomplete"`` with ``incomplete_details.reason: "max_output_tokens"``
  (``content_filter``: ``"content_filter"``); any other is ``completed``.
* usage: ``input_tokens``, ``output_tokens``, ``total_tokens`` and their details (cached and reasoning tokens)
  from the worker's counts; a count it did not report is what the gateway bills instead (its prompt estimate, a
  stream's content pieces), as every translation tells its client.

Ids are made from the response's own id (``resp_<hex>`` given by the gateway): ``msg_<hex>_<n>``, ``fc_<hex>_<n>``
and so on for output item ``n``, so the module needs no randomness and no clock.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from turnout.dialects.base import JSON
from turnout.dialects.readable import ResponseShapeError, answer_message, first_choice
from turnout.dialects.responses.request import TOOL_SEARCH, ToolNames

__all__ = [
    "ResponseShapeError",
    "call_item",
    "epoch",
    "from_chat",
    "head",
    "message_item",
    "reasoning_item",
    "status_of",
    "usage_of",
]

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_ITEM_PREFIX = {"function": "fc", "custom": "ctc", TOOL_SEARCH: "tsc"}


def epoch(created_at: str) -> int:
    """Seconds since the epoch of an ISO timestamp (the Responses API's ``created_at``); 0 when it is not one."""
    try:
        return int(datetime.fromisoformat(created_at).timestamp())
    except ValueError:
        return 0


def head(payload: JSON, response_id: str, created_at: int, model: str) -> JSON:
    """The response object as it starts (``in_progress``, no output): what the request asked for, echoed."""
    reasoning = payload.get("reasoning")
    text = payload.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    verbosity = text.get("verbosity") if isinstance(text, dict) else None
    metadata = payload.get("metadata")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "background": False,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "instructions": _either(payload.get("instructions"), str, list),
        "max_output_tokens": _either(payload.get("max_output_tokens"), int),
        "max_tool_calls": _either(payload.get("max_tool_calls"), int),
        "model": payload["model"] if isinstance(payload.get("model"), str) else model,
        "output": [],
        "parallel_tool_calls": payload.get("parallel_tool_calls") is not False,
        "previous_response_id": _either(payload.get("previous_response_id"), str),
        "prompt_cache_key": _either(payload.get("prompt_cache_key"), str),
        "reasoning": {
            "effort": reasoning.get("effort") if isinstance(reasoning, dict) else None,
            "summary": reasoning.get("summary") if isinstance(reasoning, dict) else None,
        },
        "safety_identifier": _either(payload.get("safety_identifier"), str),
        "service_tier": "default",
        "store": payload.get("store") is not False,
        "temperature": _number(payload.get("temperature"), 1.0),
        "text": {
            "format": fmt if isinstance(fmt, dict) else {"type": "text"},
            "verbosity": verbosity if isinstance(verbosity, str) else "medium",
        },
        "tool_choice": _either(payload.get("tool_choice"), str, dict) or "auto",
        "tools": payload["tools"] if isinstance(payload.get("tools"), list) else [],
        "top_logprobs": 0,
        "top_p": _number(payload.get("top_p"), 1.0),
        "truncation": "disabled",
        "usage": None,
        "user": _either(payload.get("user"), str),
        "metadata": metadata if isinstance(metadata, dict) else {},
    }


def status_of(finish_reason: object) -> tuple[str, JSON | None]:
    """(status, incomplete_details) for the worker's finish reason."""
    reason = _INCOMPLETE.get(finish_reason) if isinstance(finish_reason, str) else None
    return ("incomplete", {"reason": reason}) if reason else ("completed", None)


def usage_of(usage: object, estimate: int = 0, output: int = 0) -> JSON | None:
    """The Responses usage object for the worker's chat usage. A count the worker did not report is what the
    gateway bills instead: ``estimate`` for the prompt, ``output`` (a stream's content pieces) for the answer;
    None when the worker reported no counts and the gateway has no estimate."""
    if not isinstance(usage, dict):
        usage = {}
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    if prompt is None and completion is None and not estimate:
        return None
    prompt = estimate if prompt is None else prompt
    completion = output if completion is None else completion
    cached = _count(_obj(usage.get("prompt_tokens_details")).get("cached_tokens")) or 0
    reasoning = _count(_obj(usage.get("completion_tokens_details")).get("reasoning_tokens")) or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def item_id(response_id: str, prefix: str, index: int) -> str:
    return f"{prefix}_{response_id.removeprefix('resp_')}_{index}"


def reasoning_item(response_id: str, index: int, text: str, status: str = "completed") -> JSON:
    return {
        "id": item_id(response_id, "rs", index),
        "type": "reasoning",
        "status": status,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def message_item(response_id: str, index: int, text: str, status: str = "completed") -> JSON:
    return {
        "id": item_id(response_id, "msg", index),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def call_item(response_id: str, index: int, call_id: str, name: str, arguments: str, names: ToolNames) -> JSON:
    """The client's item for a tool call of the worker's (its function ``name``, arguments a JSON string)."""
    tool = names.client(name)
    call_id = call_id or item_id(response_id, "call", index)
    item: JSON = {"id": item_id(response_id, _ITEM_PREFIX[tool.kind], index), "status": "completed"}
    if tool.kind == TOOL_SEARCH:
        parsed = _parse(arguments)
        item.update(
            type="tool_search_call",
            call_id=call_id,
            execution="client",
            arguments=parsed if isinstance(parsed, dict) else {},
        )
        return item
    if tool.kind == "custom":
        parsed = _parse(arguments)
        given = parsed.get("input") if isinstance(parsed, dict) else None
        item.update(
            type="custom_tool_call",
            call_id=call_id,
            name=tool.name,
            input=given if isinstance(given, str) else arguments,
        )
    else:
        item.update(type="function_call", call_id=call_id, name=tool.name, arguments=arguments)
    if tool.namespace is not None:
        item["namespace"] = tool.namespace
    return item


def from_chat(
    answer: JSON, payload: JSON, names: ToolNames, response_id: str, created_at: int, model: str, estimate: int = 0
) -> tuple[JSON, JSON]:
    """(the client's response, the worker's usage object or {}) for a whole chat/completions answer (``estimate``:
    the prompt's tokens as the gateway bills them when the worker counts none). A worker
    answer of the wrong shape, or whose message cannot be read (:mod:`turnout.dialects.readable`), raises
    :class:`ResponseShapeError`."""
    choice = first_choice(answer)
    message = answer_message(choice)
    status, incomplete = status_of(choice.get("finish_reason"))
    item_status = "incomplete" if status == "incomplete" else "completed"
    output: list[JSON] = []
    thought = _reasoning_text(message)
    if thought:
        output.append(reasoning_item(response_id, len(output), thought))
    text = message.get("content")
    calls = message.get("tool_calls")
    calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    if (isinstance(text, str) and text) or not calls:
        output.append(message_item(response_id, len(output), text if isinstance(text, str) else "", item_status))
    for call in calls:
        function = _obj(call.get("function"))
        name = function.get("name")
        if not isinstance(name, str) or not name:
            continue
        arguments = function.get("arguments")
        if not isinstance(arguments, str):  # an object (Ollama's form) is written as OpenAI's JSON string
            arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
        call_id = call.get("id") if isinstance(call.get("id"), str) else ""
        output.append(call_item(response_id, len(output), call_id, name, arguments, names))
    usage = _obj(answer.get("usage"))
    out = head(payload, response_id, created_at, model)
    out.update(status=status, incomplete_details=incomplete, output=output, usage=usage_of(usage, estimate))
    if status == "completed":
        out["completed_at"] = created_at
    return out, usage


def _reasoning_text(message: JSON) -> str:
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _parse(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):
        return None


def _either(value: object, *types: type) -> Any:
    return value if isinstance(value, types) and not isinstance(value, bool) else None


def _number(value: object, default: float) -> float:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else default


def _obj(value: object) -> JSON:
    return value if isinstance(value, dict) else {}


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
