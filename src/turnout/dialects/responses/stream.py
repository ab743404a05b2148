"""A Chat Completions stream as a Responses API stream (pure, incremental).

Fed the worker's decoded SSE events, it gives the client's Responses events, each with its ``sequence_number``
(from 0, one more each event), in the order the OpenAI SDK's stream accumulator and Codex read them:

* ``response.created`` and ``response.in_progress`` (the response as it starts) with the first worker event;
* reasoning text (``reasoning_content`` / ``reasoning`` deltas): a ``reasoning`` item, its ``reasoning_text``
  part and ``response.reasoning_text.delta`` events;
* text: a ``message`` item, its ``output_text`` part (``response.content_part.added``) and
  ``response.output_text.delta`` events; the reasoning item is done when the text starts;
* tool calls: a ``function_call`` item once its name is known and its arguments start, then
  ``response.function_call_arguments.delta`` events as they come; a call that stands for a ``custom`` tool (its
  input is the ``input`` argument, known only when the arguments are whole) or ``tool_search`` is sent whole at the
  end (``response.custom_tool_call_input.delta`` / ``.done`` for a custom tool);
* at the model's finish, every open item is done in output order (``.done`` events, ``response.content_part.done``,
  ``response.output_item.done``), then exactly one of ``response.completed`` / ``response.incomplete`` with the
  whole response and its usage. A stream that breaks after it started ends with ``response.failed``
  (:meth:`ResponsesStream.fail`), never silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from turnout.dialects.base import JSON, Counts, Timing
from turnout.dialects.readable import check_chunks, chunk_choices, chunk_delta
from turnout.dialects.responses import answer
from turnout.dialects.responses.request import ToolNames
from turnout.errors import TurnoutError

__all__ = ["ResponsesStream", "failed_response"]

_TEXT_ONLY = frozenset({"content", "role"})  # the keys of a delta that carries only text


@dataclass(slots=True)
class _Item:
    """One output item being streamed."""

    kind: str  # "reasoning", "message" or "call"
    index: int = -1  # output_index; -1 until the client has been told of it
    text: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    item: JSON | None = None  # the client's item as it was added
    streamed: bool = False  # a call whose argument deltas went out as they came


@dataclass(slots=True)
class ResponsesStream:
    payload: JSON
    names: ToolNames
    response_id: str
    model: str
    estimate: int = 0  # the prompt's tokens as the gateway bills them when the worker counts none
    finish_reason: str | None = None
    usage: JSON | None = None
    deltas: int = 0  # content, reasoning and argument deltas: the completion's size when the worker counts none
    _sequence: int = 0
    _head: JSON | None = None
    _output: list[JSON] = field(default_factory=list)  # items done, by output index (None: still open)
    _open: list[_Item] = field(default_factory=list)  # items added and not done yet, in output order
    _reasoning: _Item | None = None
    _message: _Item | None = None
    _calls: dict[int, _Item] = field(default_factory=dict)  # by the worker's tool-call index

    # -- the worker's events ------------------------------------------------------------------------
    def feed(self, events: list[JSON] | JSON, created_at: str) -> list[JSON]:
        """The client's events for the worker's stream events that arrived together (or for one event). An event
        whose message cannot be read raises before any of them is turned into events (so the numbers that
        :meth:`fail` goes on from are the ones the client was sent)."""
        if isinstance(events, dict):
            events = [events]
        check_chunks(events)
        if len(events) == 1:
            return self._feed_event(events[0], created_at)
        return [obj for event in events for obj in self._feed_event(event, created_at)]

    def _feed_event(self, event: JSON, created_at: str) -> list[JSON]:
        message = self._message
        if message is not None and self._head is not None:
            # the usual token frame (one choice, text only, no finish), once the message is open: its delta event
            # made at once; any other frame takes the general way below
            choices = event.get("choices")
            if type(choices) is list and len(choices) == 1 and "usage" not in event:
                choice = choices[0]
                delta = choice.get("delta") if type(choice) is dict else None
                if type(delta) is dict and delta.keys() <= _TEXT_ONLY and choice.get("finish_reason") is None:
                    text = delta.get("content")
                    if type(text) is str and text and choice.get("index", 0) == 0:
                        message.text.append(text)
                        self.deltas += 1
                        sequence = self._sequence
                        self._sequence = sequence + 1
                        assert message.item is not None
                        return [
                            {
                                "type": "response.output_text.delta",
                                "item_id": message.item["id"],
                                "output_index": message.index,
                                "content_index": 0,
                                "delta": text,
                                "logprobs": [],
                                "sequence_number": sequence,
                            }
                        ]
        out: list[JSON] = []
        if self._head is None:
            self._start(created_at, out)
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        for choice in chunk_choices(event):
            if choice.get("index", 0) != 0:
                continue  # one answer: the first choice's
            delta = chunk_delta(choice)
            if delta is not None:
                self._delta(delta, out)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self.finish_reason = reason
        return out

    def _start(self, created_at: str, out: list[JSON]) -> None:
        self._head = answer.head(self.payload, self.response_id, answer.epoch(created_at), self.model)
        out.append(self._event("response.created", response=self._head))
        out.append(self._event("response.in_progress", response=self._head))

    def _delta(self, delta: JSON, out: list[JSON]) -> None:
        thought = delta.get("reasoning_content")
        if not isinstance(thought, str) or not thought:
            thought = delta.get("reasoning")
        if isinstance(thought, str) and thought:
            if self._reasoning is None:
                self._reasoning = self._add(_Item("reasoning"), out)
            self._reasoning.text.append(thought)
            self.deltas += 1
            out.append(self._part_event("response.reasoning_text.delta", self._reasoning, delta=thought))
        text = delta.get("content")
        if isinstance(text, str) and text:
            if self._reasoning is not None:
                self._done(self._reasoning, out)
            if self._message is None:
                self._message = self._add(_Item("message"), out)
            self._message.text.append(text)
            self.deltas += 1
            out.append(self._part_event("response.output_text.delta", self._message, delta=text, logprobs=[]))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, dict):
                    self._call(call, out)

    def _call(self, call: JSON, out: list[JSON]) -> None:
        index = call.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            index = len(self._calls)
        slot = self._calls.get(index)
        if slot is None:
            slot = self._calls[index] = _Item("call")
        if isinstance(call.get("id"), str) and not slot.call_id:
            slot.call_id = call["id"]
        function = call.get("function")
        if not isinstance(function, dict):
            return
        if isinstance(function.get("name"), str) and slot.index < 0:
            slot.name += function["name"]
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            if arguments is None:
                return
            arguments = _dumps(arguments)  # an object (Ollama's form): the whole arguments at once
        if not arguments:
            return
        slot.text.append(arguments)
        self.deltas += 1
        if slot.index < 0 and slot.name and self.names.client(slot.name).kind == "function":
            slot.streamed = True
            self._close_text(out)
            self._add(slot, out)
        if slot.streamed:
            out.append(self._item_event("response.function_call_arguments.delta", slot, delta=arguments))

    # -- the end ------------------------------------------------------------------------------------
    def finish(self, timing: Timing) -> tuple[list[JSON], Counts]:
        out: list[JSON] = []
        if self._head is None:
            self._start(timing.created_at, out)
        if not self._open and not self._output and not any(s.name for s in self._calls.values()):
            self._message = self._add(_Item("message"), out)  # no text, no call: an empty message all the same
        for item in list(self._open):
            self._done(item, out)
        for slot in self._calls.values():  # calls sent whole: custom tools, tool_search, names known only now
            if slot.index < 0 and slot.name:
                self._done(self._add(slot, out), out)
        assert self._head is not None
        status, incomplete = answer.status_of(self.finish_reason)
        response = dict(self._head)
        response.update(status=status, incomplete_details=incomplete, output=self._output)
        response["usage"] = answer.usage_of(self.usage, self.estimate, self.deltas)
        if status == "completed":
            response["completed_at"] = self._head["created_at"]
        out.append(self._event(f"response.{status}", response=response))
        usage = self.usage or {}
        completion = _count(usage.get("completion_tokens"))
        counts = Counts(
            _count(usage.get("prompt_tokens")),
            self.deltas if completion is None else completion,  # llama_cpp.server's streams count nothing
            max(timing.total_ns - min(timing.first_token_ns, timing.total_ns), 0) / 1e9,
        )
        return out, counts

    def fail(self, err: TurnoutError) -> list[JSON]:
        head = self._head or answer.head(self.payload, self.response_id, 0, self.model)
        done = [item for item in self._output if item]  # an open item's place is an empty object
        partial = [self._client_item(item, "incomplete") for item in self._open]
        return [self._event("response.failed", response=failed_response(head, err, done + partial))]

    # -- items --------------------------------------------------------------------------------------
    def _close_text(self, out: list[JSON]) -> None:
        """A tool call starts: the reasoning and text before it are done."""
        for item in (self._reasoning, self._message):
            if item is not None:
                self._done(item, out)

    def _add(self, item: _Item, out: list[JSON]) -> _Item:
        """Tell the client of a new output item (and its first content part)."""
        item.index = len(self._output)
        self._output.append({})  # its place, filled when it is done
        self._open.append(item)
        added = self._client_item(item, "in_progress")
        if added["type"] == "function_call":
            added["arguments"] = ""
        elif added["type"] == "custom_tool_call":
            added["input"] = ""
        elif item.kind != "call":
            added["content"] = []
        item.item = added
        out.append(self._event("response.output_item.added", output_index=item.index, item=added))
        if item.kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._part_event("response.content_part.added", item, part=part))
        elif item.kind == "reasoning":
            out.append(self._part_event("response.content_part.added", item, part=_reasoning_part("")))
        return item

    def _done(self, item: _Item, out: list[JSON]) -> None:
        self._open.remove(item)
        final = self._client_item(item, "completed" if self.finish_reason != "length" else "incomplete")
        whole = "".join(item.text)
        if item.kind == "message":
            out.append(self._part_event("response.output_text.done", item, text=whole, logprobs=[]))
            out.append(self._part_event("response.content_part.done", item, part=final["content"][0]))
        elif item.kind == "reasoning":
            out.append(self._part_event("response.reasoning_text.done", item, text=whole))
            out.append(self._part_event("response.content_part.done", item, part=_reasoning_part(whole)))
        elif final["type"] == "function_call":
            if not item.streamed:  # sent whole at the end: its arguments in one delta
                out.append(self._item_event("response.function_call_arguments.delta", item, delta=final["arguments"]))
            out.append(self._item_event("response.function_call_arguments.done", item, arguments=final["arguments"]))
        elif final["type"] == "custom_tool_call":
            out.append(self._item_event("response.custom_tool_call_input.delta", item, delta=final["input"]))
            out.append(self._item_event("response.custom_tool_call_input.done", item, input=final["input"]))
        self._output[item.index] = final
        out.append(self._event("response.output_item.done", output_index=item.index, item=final))
        if item is self._reasoning:
            self._reasoning = None  # more reasoning text after this opens another reasoning item
        if item is self._message:
            self._message = None

    def _client_item(self, item: _Item, status: str) -> JSON:
        whole = "".join(item.text)
        if item.kind == "message":
            return answer.message_item(self.response_id, item.index, whole, status)
        if item.kind == "reasoning":
            return answer.reasoning_item(self.response_id, item.index, whole, status)
        made = answer.call_item(self.response_id, item.index, item.call_id, item.name, whole or "{}", self.names)
        made["status"] = status
        return made

    # -- events -------------------------------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> JSON:
        event: JSON = {"type": kind, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        return event

    def _item_event(self, kind: str, item: _Item, **fields: Any) -> JSON:
        assert item.item is not None
        return self._event(kind, item_id=item.item["id"], output_index=item.index, **fields)

    def _part_event(self, kind: str, item: _Item, **fields: Any) -> JSON:
        return self._item_event(kind, item, content_index=0, **fields)


def failed_response(head: JSON, err: TurnoutError, output: list[JSON]) -> JSON:
    """The response of a ``response.failed`` event: ``head`` failed with ``err``."""
    response = dict(head)
    response.update(
        status="failed",
        output=output,
        error={"code": "server_error", "message": err.message},
        incomplete_details=None,
    )
    return response


def _reasoning_part(text: str) -> JSON:
    return {"type": "reasoning_text", "text": text}


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
