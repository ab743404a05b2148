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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from turnout.dialects.base import Call, Endpoint
from turnout.dialects.openai_whole import whole_chat, whole_completion
from turnout.dialects.streams import FrameError, StreamKind, StreamWatch
from turnout.errors import UpstreamError
from turnout.gateway.dispatch import Lease
from turnout.upstream.client import MAX_ANSWER_BYTES, UpstreamResponse

__all__ = ["STOPPABLE", "WHOLE", "Stoppable", "made_whole", "whole_answer"]

Whole = Callable[[list[dict[str, Any]]], dict[str, Any]]
# The calls asked in one piece that may be sent as a stream (whole_answer), and what makes their stream whole.
WHOLE: dict[Endpoint, Whole] = {Endpoint.CHAT: whole_chat, Endpoint.COMPLETIONS: whole_completion}


class Stoppable:
    """One attempt at a batch request, run as ``task``; ``stopped``: :meth:`stop` cancelled it. ``preemptible``:
    the dispatcher may stop it for a request of a higher class (else only its runner does: a cancel, the window's
    end); ``sent``: it was given a slot (the proxy sets it), so a cancel lets it end where it waited unsent;
    ``queue_s``: how long it may wait in the gateway's queue for a slot (None: ``routing.queue_timeout_s``). A line
    waits as long as its batch's window lasts, keeping its place, so that it ages there
    (:func:`turnout.core.admission.served_as`) rather than rejoining the queue's end every ``queue_timeout_s``."""

    __slots__ = ("preemptible", "queue_s", "sent", "stopped", "task")

    def __init__(self, *, preemptible: bool = True, queue_s: float | None = None) -> None:
        self.task: asyncio.Task[object] | None = None
        self.stopped = False
        self.preemptible = preemptible
        self.queue_s = queue_s
        self.sent = False

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


async def made_whole(up: UpstreamResponse, lease: Lease, whole: Whole, drain_s: float) -> bytes:
    """The body of a stream asked for a call answered in one piece: its frames, made whole. A stream cut short is
    the worker's failure; one that ends with the worker's error frame, its error answer."""
    loop = asyncio.get_running_loop()
    watch = StreamWatch(StreamKind.SSE, collect=True)
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
