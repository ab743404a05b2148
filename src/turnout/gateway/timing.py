"""Where a request's time went: its phases, recorded while it runs, told in its ``Server-Timing`` header, the
access line, the phase histograms (:mod:`turnout.phase_stats`) and its trace (:mod:`turnout.gateway.tracing`).

The request frame (:func:`turnout.gateway.frame._respond`) makes one :class:`Phases` per request
(``request[PHASES]``) and ends it; the proxy records what happens between. The phases, in the order they happen:

``queue``
    waiting in the gateway's queue for a slot: the time inside ``Dispatcher.acquire`` (the routing decision
    included, a few microseconds), less any ``hold`` recorded inside it; summed over the attempts of a call.
``hold``
    held (:mod:`turnout.gateway.hold`): waiting for a wake or an activation (a claimed model whose engine is
    asleep, waking, activating or scheduling: the wait inside ``Dispatcher.hold``) or for workers expected back
    (the wait inside ``Dispatcher.acquire`` while its only workers are down for a moment); recorded by the
    dispatcher through :class:`Holding`; absent when the request was not held.
``upstream``
    connecting to the worker: from asking the connection pool for a connection to the request written on it
    (name lookup and TCP connect on a new connection; about 0 on a kept-alive one); summed over the attempts
    (a worker that could not be reached, then the next).
``ttft``
    from the request written to the worker to the first byte of its answer: for a stream, the first chunk of
    the answer's body (an engine sends it once the first token is generated); for an answer in one piece, its
    response head (which, for an engine, comes with the whole answer).
``total``
    the whole request in the gateway, from its frame's start to the answer ready to go out (a stream: to its
    end, in the access line, the histograms and the trace; never in its header, sent before the body).

``Server-Timing`` (W3C Server Timing: ``name;dur=<milliseconds>``, comma-separated; browsers' developer tools
show it) carries each phase the request went through, in that order, to a tenth of a millisecond. A stream's
header goes out before its body, so it carries only what is known by then: ``queue``, ``hold`` and
``upstream``; its ``ttft`` and ``total`` are in the access line, the histograms and the span (an HTTP trailer
could carry them, but most clients never read trailers). An error the gateway answers itself carries the phases
it went through (a queue timeout: ``queue`` and ``total``; a refused key: ``total``).

How a hold records itself: the dispatcher wraps each held wait in a :class:`Holding` (``with Holding(phases,
metrics):``, or ``begin()`` and ``end()`` where the wait spans loop turns), ``phases`` the request's
(``request[PHASES]``, which the proxy hands to ``Dispatcher.hold`` and ``Dispatcher.acquire``), ``metrics`` the
app's. Its span is the ``hold`` phase (the header, the access line's ``hold=``, the ``hold`` histogram, an event of
the call's span), and while it runs the request counts in ``turnout_held_requests``. A hold inside
``Dispatcher.acquire`` is taken out of the ``queue`` phase (:meth:`Phases.queued`); one in ``Dispatcher.hold``,
before the request asks for a slot, counts as ``hold`` only. A streamed call's hold also tells its
:attr:`Phases.held_stream`, whose headers go out while it is still held (:mod:`turnout.gateway.held_stream`): their
``Server-Timing`` has only the phases ended by then (none, or ``queue``), and the whole one comes as an SSE comment
before the answer's first event.
"""

from __future__ import annotations

import math
import time
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from aiohttp import web
from multidict import istr

from turnout.core.routing import installed_name
from turnout.fleet.state import Fleet, WorkerState
from turnout.phase_stats import OTHER_MODEL

if TYPE_CHECKING:
    from turnout.dialects.base import Call
    from turnout.gateway.accounting import Outcome
    from turnout.metrics import Metrics

__all__ = [
    "PHASES",
    "SERVER_TIMING",
    "CallTrace",
    "HeldStreamHook",
    "Holding",
    "Phases",
    "model_label",
    "unrouted_label",
]

SERVER_TIMING = istr("Server-Timing")  # (a header name as aiohttp's own: set without folding its case again)


_USUAL = "queue;dur=%.1f, upstream;dur=%.1f, ttft;dur=%.1f, total;dur=%.1f"
_NO_WAIT = "queue;dur=0.0, upstream;dur=0.0, ttft;dur=%.1f, total;dur=%.1f"


class Phases:
    """One request's phases (``perf_counter`` seconds). The request path only adds numbers here; the header,
    the access line's fields, the histograms and the span are made from them at the end.

    No ``__slots__``: a request makes one, and with the defaults on the class only what a request goes through is
    set on it (most requests set a few of these; a slotted instance would have to set them all)."""

    queue: float | None = None  # seconds in the queue (None: never asked for a slot)
    queue_from = 0.0  # when the first attempt asked for a slot, and when the last had one (the span's)
    queue_to = 0.0
    holds: list[tuple[float, float]] | None = None  # (start, end) of each hold
    upstream: float | None = None  # seconds connecting to workers
    sent_at = 0.0  # when the request was written to the worker that answered
    first_at = 0.0  # when that worker's first byte arrived
    # the labels its histograms go under (set once the call was routed or queued; None: not a proxied call)
    model: str | None = None
    worker: str | None = None
    span: CallTrace | None = None  # its trace, while tracing is on (turnout.gateway.tracing)
    # a streamed call whose stream may go out early while it is held (turnout.gateway.held_stream); told of its holds
    held_stream: HeldStreamHook | None = None

    def __init__(self, started: float) -> None:
        self.started = started

    # -- recorded on the request path ------------------------------------------------------------------
    def queued(self, started: float, ended: float, held_before: float) -> None:
        """One attempt waited from ``started`` to ``ended`` for a slot; ``held_before``: :attr:`hold` then (a hold
        inside the wait is its own phase)."""
        waited = ended - started
        if self.holds is not None:
            waited = max(waited - (self.hold - held_before), 0.0)
        self.queue = waited if self.queue is None else self.queue + waited
        if not self.queue_from:
            self.queue_from = started
        self.queue_to = ended

    def held(self, started: float, ended: float) -> None:
        """The request was held (a wake, an activation) from ``started`` to ``ended``."""
        if self.holds is None:
            self.holds = []
        self.holds.append((started, ended))

    def connected(self, connect_s: float, sent_at: float) -> None:
        """A worker's connection was had in ``connect_s`` and the request written on it at ``sent_at``."""
        self.upstream = connect_s if self.upstream is None else self.upstream + connect_s
        self.sent_at = sent_at
        self.first_at = 0.0

    def connect_failed(self, seconds: float) -> None:
        """A worker could not be reached, after trying for ``seconds`` (the next one may be)."""
        self.upstream = seconds if self.upstream is None else self.upstream + seconds

    def first_byte(self, at: float) -> None:
        if not self.first_at:
            self.first_at = at

    # -- read at the end -----------------------------------------------------------------------------------
    @property
    def hold(self) -> float:
        """Seconds held, in all (0: never)."""
        holds = self.holds
        return 0.0 if holds is None else math.fsum(end - start for start, end in holds)

    @property
    def ttft(self) -> float | None:
        return self.first_at - self.sent_at if self.first_at and self.sent_at else None

    def header(self, now: float | None) -> str:
        """The ``Server-Timing`` value; ``now``: the answer's end (``total``), None for a stream's header."""
        queue, upstream, sent, first = self.queue, self.upstream, self.sent_at, self.first_at
        if self.holds is None and queue is not None and upstream is not None and first and sent and now:
            ttft = first - sent
            # the usual proxied answer, in one format call (%-formatting: the quickest way to four numbers; and
            # the most usual of all, no wait and a kept-alive connection, with the two that read 0.0 made once)
            queue_ms, upstream_ms = queue * 1000, upstream * 1000
            if queue_ms < 0.05 and upstream_ms < 0.05:
                return _NO_WAIT % (ttft * 1000, (now - self.started) * 1000)
            return _USUAL % (queue_ms, upstream_ms, ttft * 1000, (now - self.started) * 1000)
        parts = [f"{name};dur={seconds * 1000:.1f}" for name, seconds in self.told()]
        if now is not None:
            parts.append(f"total;dur={(now - self.started) * 1000:.1f}")
        return ", ".join(parts)

    def told(self) -> list[tuple[str, float]]:
        """(phase, seconds) for each phase the request went through, ``total`` aside."""
        out = []
        if self.queue is not None:
            out.append(("queue", self.queue))
        if self.holds is not None:
            out.append(("hold", self.hold))
        if self.upstream is not None:
            out.append(("upstream", self.upstream))
        ttft = self.ttft
        if ttft is not None:
            out.append(("ttft", ttft))
        return out


class HeldStreamHook(Protocol):
    """A streamed call's stream, which goes out early while the call is held
    (:class:`turnout.gateway.held_stream.HeldStream`): :class:`Holding` tells it when a hold begins and ends, the
    proxy takes its response for the worker's stream, and the request frame ends it."""

    response: web.StreamResponse | None  # once its headers went out (or are going)

    def held(self) -> None: ...

    def released(self) -> None: ...

    async def take(self, headers: dict[str, str]) -> web.StreamResponse: ...

    async def instead(self, answer: web.StreamResponse) -> web.StreamResponse: ...

    def close(self) -> None: ...


class CallTrace(Protocol):
    """A proxied call's trace (:class:`turnout.gateway.tracing.Traced`): the proxy and the frame tell it what
    happens; it makes the spans."""

    def to_worker(self, call: Call, worker: WorkerState, model: str) -> dict[str, str]:
        """A try on ``worker`` begins: the trace context headers to send it."""
        ...

    def worker_done(
        self, phases: Phases, outcome: Outcome, status: int | None, error: BaseException | None
    ) -> None: ...

    def finish(self, request: web.Request, response: web.StreamResponse, phases: Phases, now: float) -> None: ...


class Holding:
    """``with Holding(phases, metrics):`` around a request's held wait (or :meth:`begin`, then :meth:`end` once):
    it is the request's ``hold`` phase (header, access line, histograms, a ``hold`` event in its trace) for as long
    as it runs, and counts in the gauge of requests held now (``turnout_held_requests``), however the block ends.
    ``phases`` None (a caller that keeps no timing: a test driving the dispatcher) counts in the gauge only."""

    __slots__ = ("metrics", "phases", "started")

    def __init__(self, phases: Phases | None, metrics: Metrics) -> None:
        self.phases = phases
        self.metrics = metrics
        self.started = 0.0

    def begin(self) -> Holding:
        self.metrics.requests_held += 1
        self.started = time.perf_counter()
        phases = self.phases
        if phases is not None and phases.held_stream is not None:
            phases.held_stream.held()
        return self

    def end(self) -> None:
        """The wait is over (call once)."""
        self.metrics.requests_held -= 1
        phases = self.phases
        if phases is not None:
            phases.held(self.started, time.perf_counter())
            if phases.held_stream is not None:
                phases.held_stream.released()

    def __enter__(self) -> Holding:
        return self.begin()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.end()


def model_label(worker: WorkerState, model: str) -> str:
    """The model label of a request ``worker`` answered, ``model`` the name it knows it by: that name where the
    worker's inventory lists it (or the worker is a claim's engine, serving one model), else
    :data:`~turnout.phase_stats.OTHER_MODEL`: a worker whose inventory is not known is sent whatever name a client
    writes, and labels must stay as few as the fleet's models."""
    if worker.claim is not None:
        return model
    inventory = worker.inventory
    return model if inventory is not None and model in inventory else OTHER_MODEL


def unrouted_label(fleet: Fleet, model: str) -> str:
    """The model label of a request that got no worker (a queue timeout, a hold that ran out, its workers down):
    the model as a worker's inventory lists it, or a claim's, else :data:`~turnout.phase_stats.OTHER_MODEL`."""
    if model in fleet.bindings:
        return model
    for state in fleet.workers.values():
        listed = installed_name(model, state.inventory)
        if listed is not None:
            return listed
    return OTHER_MODEL


PHASES: web.RequestKey[Phases] = web.RequestKey("timing_phases")
