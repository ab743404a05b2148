"""A streamed call that is held (:mod:`turnout.gateway.hold`: its model waking or activating, its workers expected
back) gets its stream's headers early and keep-alives while it waits, so that a client with a read timeout shorter
than the hold is not cut; used by the proxy (:mod:`turnout.gateway.proxy`), the dispatcher's holds (through
:class:`turnout.gateway.timing.Holding`) and the request frame (:mod:`turnout.gateway.frame`).

How it goes, for a call of a dialect with a keep-alive (:func:`turnout.dialects.streams.held_keepalive`):

1. A hold begins (:meth:`HeldStream.held`). If it is still held :data:`EARLY_S` later (1 s; or
   ``limits.stream_keepalive_s`` where that is less), the client is sent status 200, the stream's content type
   (``text/event-stream``) and the headers known then (:func:`stream_headers`: ``request-id``, the class it asked
   for, ``X-Fallback-From``, a ``Server-Timing`` of the phases ended by then), with a first keep-alive; then one
   every ``limits.stream_keepalive_s`` for as long as it waits (the hold, and the queue after it). A hold that ends
   before :data:`EARLY_S` has sent nothing: the call goes on exactly as one never held (its errors keep their
   status, its stream all its headers).
2. The worker's stream begins: the proxy takes the response (:meth:`HeldStream.take`) and writes the answer on it.
   The headers it would have had that did not go out (the whole ``Server-Timing``, ``X-Turnout-Route``, a
   translation's notes) come first, as one SSE comment, which clients skip and a person with ``curl -N`` reads.
3. Any answer in one piece that would have gone out instead (the hold's 503 once ``routing.hold_s`` ran out, a
   worker's error, a gateway error) cannot: the status line went out. It ends the stream as the dialect's own
   error event, its ``Retry-After`` in words (:meth:`HeldStream.instead`): OpenAI's ``data: {"error": ...}``,
   Anthropic's ``event: error``, the Responses API's ``response.failed``.

Ollama's NDJSON streams get nothing early: no line is skipped by Ollama's clients (its Go client's ``stream`` in
api/client.go and ollama-python's ``_client.py`` decode every line as JSON, and an empty one fails them), and Ollama
itself sends nothing while it loads a model, so its clients wait without a read timeout; such a call keeps its
503 with ``Retry-After`` when the hold runs out. docs/api.md ("What a held stream sees") says it per dialect.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from turnout.core.priority import HEADER as PRIORITY_HEADER
from turnout.dialects import worker_error_message
from turnout.dialects.base import Call
from turnout.errors import TurnoutError, UpstreamError
from turnout.gateway.access import PRIORITY, REQUEST_ID
from turnout.gateway.timing import PHASES, SERVER_TIMING, HeldStreamHook
from turnout.responses import ERROR, ERROR_CODE, error_frame

__all__ = ["EARLY_S", "HeldStream", "open_stream", "stream_headers"]

EARLY_S = 1.0  # a hold shorter than this sends nothing early (see the module's docstring)
_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_CONTENT_TYPE = "text/event-stream"  # every dialect with a held keep-alive streams SSE


class HeldStream:
    """One streamed call's stream while it may be held (``request[PHASES].held_stream``). ``ping``: its dialect's
    keep-alive; ``every_s``: ``limits.stream_keepalive_s``."""

    __slots__ = ("_stop", "_task", "call", "every_s", "ping", "request", "response", "sent")

    def __init__(self, request: web.Request, call: Call, ping: bytes, every_s: float) -> None:
        self.request: web.Request | None = request  # (None once the request ended: no cycle through its phases)
        self.call = call
        self.ping = ping
        self.every_s = every_s
        self.response: web.StreamResponse | None = None  # set as its headers start to go out
        self.sent: dict[str, str] = {}  # the headers that went out early
        self._stop: asyncio.Event | None = None  # set: the keep-alives (or the wait before the headers) end
        self._task: asyncio.Task[None] | None = None

    def held(self) -> None:
        """A hold begins: the headers go out if it lasts :data:`EARLY_S` (once they did, the keep-alives go on)."""
        if self.response is not None or self.request is None:
            return
        if self._stop is not None:
            self._stop.set()  # an earlier hold's wait, not yet woken to see that it ended
        stop = self._stop = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._keep(stop), name="held-stream")

    def released(self) -> None:
        """A hold ended: before its headers went out, nothing will go early (after, the keep-alives go on until
        the worker's stream takes over: the call may still wait in the queue)."""
        if self.response is None and self._stop is not None:
            self._stop.set()

    async def take(self, headers: dict[str, str]) -> web.StreamResponse:
        """The early response, for the worker's stream, which would have had ``headers``: those that did not go out
        (or went out with another value) are said first, as one SSE comment."""
        response = await self._stopped()
        sent = self.sent
        late = [f": {name}: {value}\n" for name, value in headers.items() if sent.get(name) != value]
        if late:
            await response.write("".join(late).encode() + b"\n")
        return response

    async def instead(self, answer: web.StreamResponse) -> web.StreamResponse:
        """``answer``, in one piece, could not go out (the stream's headers had): the stream ends with the dialect's
        error event saying what it would have said."""
        try:
            response = await self._stopped()
        except ConnectionResetError:
            return answer  # the client left before its headers were out: nothing to end
        err = failure(answer)
        response[ERROR_CODE] = err.code
        response[ERROR] = err
        with contextlib.suppress(ConnectionError):
            await response.write_eof(error_frame(self.call.dialect, err))
        return response

    def close(self) -> None:
        """The request ends (however): no more keep-alives."""
        if self._stop is not None:
            self._stop.set()
        self.request = None

    async def _stopped(self) -> web.StreamResponse:
        """The early response, once its keep-alives stopped (none is being written)."""
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            await self._task
        response = self.response
        assert response is not None
        if not response.prepared:  # its headers could not be written
            raise ConnectionResetError("the client left while its request was held")
        return response

    async def _keep(self, stop: asyncio.Event) -> None:
        if not await _rest(stop, min(EARLY_S, self.every_s)) or stop.is_set():
            return
        request = self.request
        if request is None:
            return
        headers = self.sent = stream_headers(request, self.call)
        response = self.response = web.StreamResponse(status=200, headers=headers)
        response.content_type = _CONTENT_TYPE
        try:
            await response.prepare(request)
            while True:
                await response.write(self.ping)
                if not await _rest(stop, self.every_s):
                    return
        except ConnectionError:
            return  # the client left: the request finds out on its next write, or is cancelled


async def open_stream(
    request: web.Request, held: HeldStreamHook | None, status: int, headers: dict[str, str], content_type: str
) -> web.StreamResponse:
    """The client's stream for the worker's answer: the one whose headers went out while it was held (``headers``
    said late, :meth:`HeldStream.take`), else a new one, prepared now."""
    if held is not None and held.response is not None:
        return await held.take(headers)
    response = web.StreamResponse(status=status, headers=headers)
    response.content_type = content_type
    await response.prepare(request)
    return response


async def _rest(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds``: True when they passed, False when ``stop`` was set first."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return True
    return False


def failure(answer: web.StreamResponse) -> TurnoutError:
    """What ``answer`` says, as the error a stream ends with: the gateway's own error as it was, a worker's error
    answer by its message, a worker's whole answer where a stream was asked as an error; its ``Retry-After`` in
    words (a header can no longer carry it)."""
    err = answer.get(ERROR)
    if err is None:
        if answer.status < 400:  # the worker ignored "stream" and answered in one piece
            err = UpstreamError(
                "the worker answered in one piece, not as a stream, after this stream's headers had gone out "
                "(the request was held); send the request again",
                code="upstream_not_streamed",
            )
        else:
            body = answer.body if isinstance(answer, web.Response) and isinstance(answer.body, bytes) else b""
            err = UpstreamError(worker_error_message(body, answer.status))
            err.status = answer.status
    retry = answer.headers.get("Retry-After")
    if retry is None:
        return err
    told = TurnoutError(f"{err.message} (try again in {retry} s)", code=err.code, retry_after=err.retry_after)
    told.status, told.type, told.headers = err.status, err.type, err.headers
    return told


def stream_headers(request: web.Request, call: Call) -> dict[str, str]:
    """A stream's headers, sent before its body: its ``Server-Timing`` says what had ended by then (the queue, a
    hold, the connect; :mod:`turnout.gateway.timing`), and is left out when nothing had."""
    request_id = request.get(REQUEST_ID)
    chosen = request.get(PRIORITY)
    said = chosen is not None and chosen.asked is not None  # the request named a class: the answer names its own
    timing = request[PHASES].header(None)
    headers = {**_STREAM_HEADERS, SERVER_TIMING: timing} if timing else dict(_STREAM_HEADERS)
    if call.fallback_from is not None:
        headers["X-Fallback-From"] = call.fallback_from
    if request_id is not None:
        headers["request-id"] = request_id
    if said:
        assert chosen is not None
        headers[PRIORITY_HEADER] = chosen.priority.value
    return headers
