"""An OpenAI stream made whole: the ``chat.completion`` or ``text_completion`` the worker would have answered in one
piece, from the frames of the stream it sent instead.

Used where the gateway asks a worker for a stream that its client did not: a Batch API line that may be stopped for
an interactive request is sent to llama.cpp's server as a stream, because llama-server stops a streamed request at
its next token once the connection is closed, and a non-streamed one only at a check about a second after it began
(bench/slot_release.py). The line's output then holds the answer in one piece, as it would have without the stream.

The shapes are OpenAI's: a chunk's ``choices[].delta`` (``role``, ``content``, ``refusal``, ``tool_calls`` by their
``index``, with a function's ``name`` and ``arguments`` in pieces) and ``logprobs.content``; a completion chunk's
``choices[].text`` and its ``logprobs`` lists; the usage in the last chunk (``stream_options.include_usage``). What
llama-server adds is kept: a delta's ``reasoning_content``, and the ``timings`` of its last chunk. A frame that is
not of these shapes raises ValueError (the proxy answers it as the worker's failure, 502).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["whole_chat", "whole_completion"]

_TEXT = ("content", "reasoning_content", "refusal")  # a delta's text fields, concatenated in order
_TOP = ("id", "created", "model", "system_fingerprint", "service_tier")  # a chunk's fields the answer repeats


def whole_chat(frames: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The ``chat.completion`` of a stream of ``chat.completion.chunk`` frames."""
    top, choices = _read(frames, _delta)
    return {**_head(top, "chat.completion"), "choices": [choices[i].message(i) for i in sorted(choices)], **_tail(top)}


def whole_completion(frames: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The ``text_completion`` of a stream of ``text_completion`` frames."""
    top, choices = _read(frames, _text)
    return {**_head(top, "text_completion"), "choices": [choices[i].text(i) for i in sorted(choices)], **_tail(top)}


def _read(
    frames: Iterable[dict[str, Any]], part: Callable[[_Choice, dict[str, Any]], None]
) -> tuple[dict[str, Any], dict[int, _Choice]]:
    """The top-level fields and each choice of a stream; ``part`` reads a choice's own piece of one frame."""
    top: dict[str, Any] = {}
    choices: dict[int, _Choice] = {}
    for frame in frames:
        _top(frame, top)
        for choice in _choices(frame):
            state = choices.setdefault(_index(choice), _Choice())
            part(state, choice)
            state.finish(choice)
    return top, choices


def _delta(state: _Choice, choice: dict[str, Any]) -> None:
    delta = choice.get("delta")
    if delta is not None:
        state.delta(_object(delta, "a choice's delta"))


def _text(state: _Choice, choice: dict[str, Any]) -> None:
    text = choice.get("text")
    if text is not None:
        state.texts["content"].append(_string(text, "a choice's text"))


class _Choice:
    __slots__ = ("finish_reason", "logprobs", "role", "texts", "tools")

    def __init__(self) -> None:
        self.role: str | None = None
        self.texts: dict[str, list[str]] = {name: [] for name in _TEXT}
        self.tools: dict[int, dict[str, Any]] = {}
        self.finish_reason: Any = None
        self.logprobs: dict[str, list[Any]] | None = None  # None: no chunk carried any

    def delta(self, delta: dict[str, Any]) -> None:
        role = delta.get("role")
        if role is not None:
            self.role = _string(role, "a delta's role")
        for name in _TEXT:
            piece = delta.get(name)
            if piece is not None:
                self.texts[name].append(_string(piece, f"a delta's {name}"))
        calls = delta.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise ValueError("a delta's tool_calls is not a list")
            for call in calls:
                self._tool(_object(call, "a tool call"))

    def _tool(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self.tools))
        if type(index) is not int:
            raise ValueError("a tool call's index is not an integer")
        tool = self.tools.setdefault(index, {"id": None, "type": "function", "name": [], "arguments": []})
        for field in ("id", "type"):
            if call.get(field) is not None:
                tool[field] = _string(call[field], f"a tool call's {field}")
        function = call.get("function")
        if function is not None:
            function = _object(function, "a tool call's function")
            for field in ("name", "arguments"):
                if function.get(field) is not None:
                    tool[field].append(_string(function[field], f"a tool call's function {field}"))

    def finish(self, choice: dict[str, Any]) -> None:
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        logprobs = choice.get("logprobs")
        if logprobs is None:
            return
        logprobs = _object(logprobs, "a choice's logprobs")
        kept = self.logprobs if self.logprobs is not None else {}
        self.logprobs = kept
        for name, value in logprobs.items():
            if value is None:
                kept.setdefault(name, [])
            elif isinstance(value, list):
                kept.setdefault(name, []).extend(value)
            else:
                raise ValueError(f"a choice's logprobs.{name} is not a list")

    def message(self, index: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role or "assistant"}
        content = self.texts["content"]
        message["content"] = "".join(content) if content or not self.tools else None
        for name in ("reasoning_content", "refusal"):
            if self.texts[name]:
                message[name] = "".join(self.texts[name])
        if self.tools:
            message["tool_calls"] = [
                {
                    "id": tool["id"],
                    "type": tool["type"],
                    "function": {"name": "".join(tool["name"]), "arguments": "".join(tool["arguments"])},
                }
                for _, tool in sorted(self.tools.items())
            ]
        return {"index": index, "message": message, "logprobs": self.logprobs, "finish_reason": self.finish_reason}

    def text(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            "text": "".join(self.texts["content"]),
            "logprobs": self.logprobs,
            "finish_reason": self.finish_reason,
        }


def _top(frame: dict[str, Any], top: dict[str, Any]) -> None:
    if not isinstance(frame, dict):
        raise ValueError("a stream frame is not an object")
    for name in _TOP:
        if frame.get(name) is not None:
            top.setdefault(name, frame[name])
    for name in ("usage", "timings"):  # the last that says
        if frame.get(name) is not None:
            top[name] = _object(frame[name], f"a chunk's {name}")


def _choices(frame: dict[str, Any]) -> list[dict[str, Any]]:
    choices = frame.get("choices")
    if choices is None:
        return []
    if not isinstance(choices, list):
        raise ValueError("a chunk's choices is not a list")
    return [_object(c, "a choice") for c in choices]


def _index(choice: dict[str, Any]) -> int:
    index = choice.get("index", 0)
    if type(index) is not int or index < 0:
        raise ValueError("a choice's index is not a non-negative integer")
    return index


def _head(top: dict[str, Any], kind: str) -> dict[str, Any]:
    head = {name: top[name] for name in ("id",) if name in top}
    head["object"] = kind
    head.update((name, top[name]) for name in ("created", "model") if name in top)
    return head


def _tail(top: dict[str, Any]) -> dict[str, Any]:
    return {name: top[name] for name in ("system_fingerprint", "service_tier", "usage", "timings") if name in top}


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object")
    return value


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string")
    return value
