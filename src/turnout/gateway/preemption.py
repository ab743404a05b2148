"""A batch request that may be stopped while it holds a slot (which one is stopped, and when:
:mod:`turnout.core.preemption`).

The Batch API's runner sends each line as a task, with a :class:`Stoppable` in the request
(``request[STOPPABLE]``); the proxy hands :meth:`Stoppable.stop` to :meth:`Dispatcher.acquire`, which calls it when
a waiting request of a higher class needs the slot (a line not stopped too often before: ``preemptible``,
:func:`turnout.core.preemption.may_stop`), whichever process or replica routes that request (the dispatcher offers
the line through its occupancy: :meth:`turnout.gateway.occupancy.Occupancy.offer`).
Stopping cancels the task: the worker's connection is closed (llama-server then frees its slot at its next token
when the request was sent as a stream, which the proxy does for such a request on llama.cpp:
:mod:`turnout.dialects.openai_whole`), the slot is given back, the limits it reserved are refunded and no usage row
is written for it (nobody was answered); the runner sends the line again (:mod:`turnout.gateway.batch_runner`).
The runner stops a line itself, for good, when its batch is cancelled while the line waits for a slot, or when the
batch's window ends.

On llama.cpp's server a stopped chat line is **continued, not started over**: what its stream had answered when it
was stopped (:class:`Partial`: the text and its tokens, one per content frame, as llama-server streams them) goes
back as the start of the answer, a trailing ``assistant`` message, which llama-server continues (it prefills a
trailing assistant message: its ``--prefill-assistant``, the default), with ``max_tokens`` less what was answered;
the continuation's text follows the partial one in the answer, and its usage counts the answer as one request
would have (the partial tokens as completion, not prompt). Only a plain answer is continued (one choice, text, no
tools, reasoning, logprobs or structured output); a line sent again to another kind of engine starts over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson
from aiohttp import web

from turnout.dialects.base import Call, Endpoint
from turnout.dialects.openai_whole import whole_chat, whole_completion
from turnout.dialects.streams import FrameError, StreamKind, StreamWatch
from turnout.errors import UpstreamError
from turnout.gateway.dispatch import Lease
from turnout.upstream.client import MAX_ANSWER_BYTES, UpstreamResponse

__all__ = [
    "STOPPABLE",
    "WHOLE",
    "Partial",
    "Stoppable",
    "as_stream",
    "continued",
    "joining",
    "made_whole",
    "partial_of",
    "whole_answer",
]

Whole = Callable[[list[dict[str, Any]]], dict[str, Any]]
# The calls asked in one piece that may be sent as a stream (whole_answer), and what makes their stream whole.
WHOLE: dict[Endpoint, Whole] = {Endpoint.CHAT: whole_chat, Endpoint.COMPLETIONS: whole_completion}


class Partial(NamedTuple):
    """What the stopped attempts of a chat line had answered: its text, and its tokens (content frames)."""

    text: str
    tokens: int


class Stoppable:
    """One attempt at a batch request, run as ``task``; ``stopped``: :meth:`stop` cancelled it. ``preemptible``:
    the dispatcher may stop it for a request of a higher class (else only its runner does: a cancel, the window's
    end); ``sent``: it was given a slot (the proxy sets it), so a cancel lets it end where it waited unsent;
    ``queue_s``: how long it may wait in the gateway's queue for a slot (None: ``routing.queue_timeout_s``). A line
    waits as long as its batch's window lasts, keeping its place, so that it ages there
    (:func:`turnout.core.admission.served_as`) rather than rejoining the queue's end every ``queue_timeout_s``."""

    __slots__ = ("frames", "partial", "preemptible", "queue_s", "sent", "stopped", "task")

    def __init__(
        self, *, preemptible: bool = True, queue_s: float | None = None, partial: Partial | None = None
    ) -> None:
        self.task: asyncio.Task[object] | None = None
        self.stopped = False
        self.preemptible = preemptible
        self.queue_s = queue_s
        self.sent = False
        self.partial = partial  # what earlier attempts answered, to continue (:func:`continued`)
        self.frames: list[dict[str, Any]] | None = None  # this attempt's stream frames so far (:func:`made_whole`)

    def stop(self) -> None:
        if not self.stopped and self.task is not None and not self.task.done():
            self.stopped = True
            self.task.cancel()


STOPPABLE: web.RequestKey[Stoppable] = web.RequestKey("stoppable")


def whole_answer(call: Call, lease: Lease) -> Whole | None:
    """What makes the stream whole when a call its client asked in one piece is sent as a stream (None: it is not):
    when it may be stopped (a batch line: its lease has a ``stop``), on llama.cpp's server, which frees the slot of
    a stopped non-streamed request only about a second after it began (bench/slot_release.py; vLLM, SGLang and
    Ollama stop either kind at once), for the calls :data:`WHOLE` can make whole."""
    if lease.stop is None or call.stream or lease.worker.engine_family != "llamacpp":
        return None
    return WHOLE.get(call.endpoint)


def as_stream(
    body: dict[str, Any], endpoint: Endpoint, whole: Whole, stoppable: Stoppable | None
) -> tuple[dict[str, Any], Whole]:
    """The body of a call answered in one piece as it is sent, a stream (with its usage), and what makes its frames
    the answer: a stopped chat line's, the continuation of what it had answered (:func:`continued`)."""
    sent = {**body, "stream": True, "stream_options": {"include_usage": True}}
    partial = None if stoppable is None or endpoint is not Endpoint.CHAT else stoppable.partial
    going_on = continued(sent, partial)
    if going_on is None or partial is None:
        return sent, whole
    return going_on, joining(whole, partial)


# the fields of a chat request whose answer is not plain text continued as it stands
_NOT_CONTINUED = ("tools", "functions", "response_format", "logprobs", "top_logprobs", "grammar", "json_schema")


def continued(body: dict[str, Any], partial: Partial | None) -> dict[str, Any] | None:
    """The chat request ``body`` asking the engine to continue ``partial`` (None: there is nothing to continue, or
    the request is not one that is continued: more than one choice, tools, structured output, logprobs, its own
    trailing assistant message, or no tokens left)."""
    if partial is None or not partial.text or partial.tokens < 1:
        return None
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return None
    if messages[-1].get("role") == "assistant" or any(body.get(name) for name in _NOT_CONTINUED):
        return None
    if body.get("n") not in (None, 1):
        return None
    out = {**body, "messages": [*messages, {"role": "assistant", "content": partial.text}]}
    for name in ("max_completion_tokens", "max_tokens"):
        most = body.get(name)
        if isinstance(most, int) and not isinstance(most, bool):
            if most - partial.tokens < 1:
                return None
            out[name] = most - partial.tokens
    return out


def joining(whole: Whole, partial: Partial) -> Whole:
    """``whole`` for a continuation of ``partial``: the answer's text is the partial one and then the continuation's;
    its usage counts the partial tokens as completion, as the one request would have (the engine read them as
    prompt)."""

    def joined(frames: list[dict[str, Any]]) -> dict[str, Any]:
        answer = whole(frames)
        message = answer["choices"][0]["message"]
        message["content"] = partial.text + (message.get("content") or "")
        usage = answer.get("usage")
        if isinstance(usage, dict):
            prompt = max(int(usage.get("prompt_tokens") or 0) - partial.tokens, 0)
            completion = int(usage.get("completion_tokens") or 0) + partial.tokens
            usage.update(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        return answer

    return joined


def partial_of(frames: list[dict[str, Any]] | None, before: Partial | None) -> Partial | None:
    """What a stopped attempt's chat stream (``frames``) had answered, after what ``before`` had (None: nothing that
    is continued: another choice than the first, tool calls or reasoning)."""
    if not frames:
        return before
    pieces: list[str] = []  # one per content frame: a token each, as llama-server streams them
    for frame in frames:
        for choice in frame.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if delta is None:
                continue
            if not isinstance(delta, dict) or choice.get("index", 0) != 0:
                return None
            if delta.get("tool_calls") or delta.get("reasoning_content") or delta.get("function_call"):
                return None
            content = delta.get("content")
            if content is not None and not isinstance(content, str):
                return None
            if content:
                pieces.append(content)
    if not pieces:
        return before
    text = "".join(pieces)
    if before is None:
        return Partial(text, len(pieces))
    return Partial(before.text + text, before.tokens + len(pieces))


async def made_whole(
    up: UpstreamResponse, lease: Lease, whole: Whole, drain_s: float, stoppable: Stoppable | None = None
) -> bytes:
    """The body of a stream asked for a call answered in one piece: its frames, made whole. A stream cut short is
    the worker's failure; one that ends with the worker's error frame, its error answer. ``stoppable``: the frames
    so far are its ``frames`` (a stopped attempt's partial answer, to continue)."""
    loop = asyncio.get_running_loop()
    watch = StreamWatch(StreamKind.SSE, collect=True)
    if stoppable is not None:
        stoppable.frames = watch.frames
    size = 0
    async for chunk in up.chunks():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            up.abandon()
            raise UpstreamError(f"{lease.worker.name}: the answer is larger than {MAX_ANSWER_BYTES} bytes")
        now = loop.time()
        lease.worker.record_progress(now)
        lease.answering(now)
        try:
            watch.feed(chunk)
        except FrameError as exc:
            up.abandon()
            raise UpstreamError(f"{lease.worker.name}: {exc}") from None
        if watch.ended:
            up.finish_later(drain_s)
            break
    if watch.error is not None:
        raise UpstreamError(f"{lease.worker.name}: {watch.error}")
    if not watch.ended:
        raise UpstreamError(f"{lease.worker.name}: the stream ended before the model finished")
    try:
        answer = whole(watch.frames)
    except ValueError as exc:
        raise UpstreamError(f"{lease.worker.name}: the worker's stream has an unexpected shape ({exc})") from None
    if any(choice["finish_reason"] is None for choice in answer["choices"]):
        raise UpstreamError(f"{lease.worker.name}: the stream ended before the model finished")
    return orjson.dumps(answer)
