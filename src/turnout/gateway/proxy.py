"""Forwarding one call to a worker: pass-through when the worker speaks the client's dialect, the dialect's
translation when it does not (:meth:`turnout.dialects.base.ClientAPI.translation`; the proxy knows dialects only
through :mod:`turnout.dialects.base`'s interface).

* OpenAI client -> any worker: the same ``/v1`` path (Ollama serves ``/v1`` itself).
* Ollama client -> Ollama worker: the same ``/api`` path.
* Ollama client -> OpenAI-style worker: requests, responses and streams are translated
  (:class:`turnout.dialects.ollama.OllamaOnOpenAI`).
* Responses client -> a worker that serves the Responses API itself: pass-through; any other worker: translated
  onto its Chat Completions route (:class:`turnout.dialects.responses.ResponsesOnChat`).
* Anthropic client -> a worker that serves the Messages API itself (``native_apis``): the same path, with the
  client's ``anthropic-version`` and ``anthropic-beta`` headers; any other worker: translated
  (:mod:`turnout.dialects.anthropic`). ``count_tokens`` there asks the worker's tokenizer
  (:class:`~turnout.dialects.base.TokenCounter`) and says in ``X-Turnout-Token-Count`` whether the count is
  the worker's (``tokenizer``) or the gateway's estimate (``estimate``): :mod:`turnout.gateway.inspection`, as
  Ollama's ``/api/show`` is.

A worker whose engine schedules by priority itself (vLLM started with ``--scheduling-policy priority``, SGLang with
``--enable-priority-scheduling``: a worker's ``priority_scheduling``, with ``priority_high_first`` for SGLang's
default order, or a ModelClaim whose args say so) gets each call's class as the engine's per-request ``priority``
(:func:`turnout.core.priority.engine_priority`), in the body of the routes whose requests have one
(chat, completions, embeddings, Responses; the client's own value is replaced) and in vLLM's ``X-Vllm-Priority``
header (which vLLM reads first, and for its Messages route too). Any other worker gets the body as the client sent
it.

A client stream whose kind has a keep-alive (Anthropic's ``ping`` event, :func:`turnout.dialects.streams.keepalive`)
gets one each time the worker has been silent, or sent nothing the client is sent, for ``limits.stream_keepalive_s``.
A streamed call held for more than a second gets its headers and keep-alives while it waits, and its worker's stream
then goes out on that response (:mod:`turnout.gateway.held_stream`).

Streams are written chunk by chunk as they arrive. If the worker fails after the stream started,
the client gets a final error frame in its dialect. A worker that cannot be reached is marked down
and the next candidate is tried (only before anything was sent to the client).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, cast

import orjson
from aiohttp import web

from turnout.config import Settings
from turnout.core.admission import Priority
from turnout.core.health import failure_reason
from turnout.core.priority import Ordering, engine_priority
from turnout.core.signals import Reported, reported
from turnout.dialects import CLIENT_APIS, NATIVE_HEADERS, api
from turnout.dialects.base import (
    Call,
    Dialect,
    Endpoint,
    StreamTranslation,
    Timing,
    TokenCounter,
    Translation,
    TranslationError,
)
from turnout.dialects.streams import FrameError, StreamKind, StreamWatch, held_keepalive, keepalive, parse_object
from turnout.errors import BadRequest, TurnoutError, Unavailable, UpstreamError
from turnout.fleet.claims import ClaimBindings
from turnout.fleet.state import Fleet, WorkerState
from turnout.gateway.access import ROUTE
from turnout.gateway.accounting import Outcome
from turnout.gateway.answers import WorkerAnswers, json_answer, raw_json
from turnout.gateway.catalog import iso_time
from turnout.gateway.dispatch import Ask, Dispatcher, Lease
from turnout.gateway.held_stream import HeldStream, open_stream, stream_headers
from turnout.gateway.hold import HOLDABLE, hold_limit
from turnout.gateway.inspection import COUNT_SOURCE, Inspector
from turnout.gateway.learning import AnswerLearner
from turnout.gateway.occupancy import Ticket
from turnout.gateway.preemption import STOPPABLE, Whole, as_stream, made_whole, whole_answer
from turnout.gateway.timing import PHASES, Phases, model_label, unrouted_label
from turnout.gateway.trace_context import passed_on
from turnout.metrics import Metrics
from turnout.responses import error_frame
from turnout.upstream.client import ConnectFailed, NoAnswer, UpstreamClient, UpstreamResponse

if TYPE_CHECKING:
    from turnout.gateway.tracing import Tracing

__all__ = ["Proxy"]

# Exceptions a translator may raise on a worker answer of the wrong shape; they become a 502, never a 500.
_SHAPE_ERRORS = (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError)
# No-route answers that, for a claimed model, mean "in a transition" rather than what they say.
_UNROUTABLE = frozenset({"no_healthy_worker", "no_workers", "model_not_found", "model_not_installed"})
# After a stream's terminal frame the client's answer is complete and the request ends (its slot is freed, a
# client that leaves now cancels nothing); the rest of the worker's body is read in the background, for keep-alive,
# for at most this long, and a worker still sending then loses the connection.
_DRAIN_S = 1.0
# What a held stream of each client dialect is sent while it waits (None: it gets nothing early; held_stream).
_HELD_PINGS = {dialect: held_keepalive(client.stream_kind) for dialect, client in CLIENT_APIS.items()}
EXPLAIN_HEADER = "X-Turnout-Route"  # routing.explain_header: "<worker>; <why>"
ENGINE_PRIORITY_HEADER = "X-Vllm-Priority"  # vllm/entrypoints/generate/base/serving.py: read before the body's
# The calls whose vLLM request has a ``priority`` field (vllm/entrypoints/openai/*/protocol.py,
# vllm/entrypoints/pooling/base/protocol.py); the Messages route reads the header only.
_PRIORITY_BODIES = frozenset({Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.EMBEDDINGS, Endpoint.RESPONSES})


class Proxy:
    def __init__(
        self,
        settings: Settings,
        fleet: Fleet,
        dispatcher: Dispatcher,
        client: UpstreamClient,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.fleet = fleet
        self.dispatcher = dispatcher
        self.client = client
        self.metrics = metrics
        self.claims: ClaimBindings | None = None  # set when GPU pools are configured
        # (worker, client dialect): the worker refused a translation's first form and took its alternate (OpenAI's
        # json_schema response_format for llama-cpp-python's; fields that are not OpenAI's own for OpenAI's API)
        self._alternate_form: set[tuple[str, Dialect]] = set()
        self._explain = settings.routing.explain_header
        self._claim_priority: dict[str, Ordering] = {}  # claim workers whose engine schedules by priority
        self.learner = AnswerLearner(settings, fleet, metrics)
        self.answers = WorkerAnswers(metrics)
        self.inspector = Inspector(settings, fleet, dispatcher, self.answers, self._post)  # /api/show, count_tokens
        self.tracing: Tracing | None = None  # set when telemetry.otlp_endpoint is (turnout.wiring)

    async def serve(
        self,
        request: web.Request,
        call: Call,
        outcome: Outcome,
        tenant: str = "",
        priority: Priority = Priority.STANDARD,
    ) -> web.StreamResponse:
        """``priority``: the dispatcher's class for the call (``batch`` for a Batch API line), passed to
        :meth:`Dispatcher.acquire`."""
        if self.tracing is not None and isinstance(request, web.BaseRequest):  # (a Batch API line has no span)
            phases = request[PHASES]
            phases.span = self.tracing.begin(request, call, phases)
        if call.stream and (ping := _HELD_PINGS.get(call.dialect)) is not None:  # its headers go early if held
            keepalive_s = self.settings.limits.stream_keepalive_s
            request[PHASES].held_stream = HeldStream(request, call, ping, keepalive_s)
        if call.endpoint is Endpoint.SHOW:
            return await self.inspector.show(call)
        if self.claims is not None and self.claims.claimed(call.model):
            return await self._serve_claimed(request, call, outcome, tenant, self.claims, priority)
        endpoint = self.fleet.endpoint_for(call.model)
        fallback = None if endpoint is None or endpoint.external is None else endpoint.external.fallback_model
        if fallback is None or call.fallback_from is not None:
            return await self._serve_once(request, call, outcome, tenant, priority)
        assert endpoint is not None
        try:
            return await self._serve_once(request, call, outcome, tenant, priority)
        except _NeedFallback as why:
            reason = why.reason
        except (ConnectFailed, Unavailable) as exc:  # endpoint down, unreachable or refused by the SSRF guard
            reason = exc.code
        except UpstreamError as exc:
            if exc.code != "headers_timeout":
                raise
            reason = "latency_budget"
        self.metrics.fallbacks.labels(endpoint.name, reason).inc()
        origin = f"{endpoint.name}/{endpoint.external.upstream_name(call.model)}"  # type: ignore[union-attr]
        payload = {**call.payload, "model": fallback}
        # the body as a worker gets it, with the fallback's model: it may differ from the payload (a Responses
        # continuation's body leaves out the previous_response_id that its payload keeps for the answer)
        body = orjson.dumps({**parse_object(call.body), "model": fallback})
        outcome.fallback_from = origin
        redirected = call._replace(model=fallback, payload=payload, body=body, fallback_from=origin)
        return await self._serve_once(request, redirected, outcome, tenant, priority)

    async def _serve_claimed(
        self,
        request: web.Request,
        call: Call,
        outcome: Outcome,
        tenant: str,
        claims: ClaimBindings,
        priority: Priority,
    ) -> web.StreamResponse:
        """A claimed model is answered by its claim's state at every instant: held while it gets ready (asleep and
        woken, activating: :mod:`turnout.gateway.hold`), then the claim's 503 for one still not ready or failed; and
        when its engine cannot be reached (the moment between a de-route and the status saying so), the claim's
        "changing state" 503, never the generic no-route answer."""
        model = call.model
        ticket = None
        refusal = None if model in self.fleet.bindings else claims.refusal(model, unreachable=True)
        if refusal is not None:  # (asking for the refusal sent the wake of a sleeping model)
            limit_s = hold_limit(request.headers, self.settings.routing.hold_s)
            if limit_s <= 0 or refusal.code not in HOLDABLE:
                raise refusal
            counts = self.metrics.classes[priority]  # a held request waits too (for its model's engine)
            counts.waiting += 1
            try:
                ticket = await self.dispatcher.hold(
                    model, tenant, priority, lambda: model in self.fleet.bindings, limit_s, request[PHASES]
                )
            finally:
                counts.waiting -= 1
            if ticket is None:
                raise claims.refusal(model, unreachable=True) or refusal
        try:
            return await self._serve_once(request, call, outcome, tenant, priority, ticket)
        except TurnoutError as exc:
            if not isinstance(exc, ConnectFailed) and exc.code not in _UNROUTABLE:
                raise  # saturation of a live engine, a bad request: real answers
            refusal = claims.refusal(call.model, unreachable=True)
            if refusal is None:
                raise
            raise refusal from None

    async def _serve_once(
        self,
        request: web.Request,
        call: Call,
        outcome: Outcome,
        tenant: str,
        priority: Priority,
        ticket: Ticket | None = None,
    ) -> web.StreamResponse:
        """``ticket``: the place in the queue a hold kept for it."""
        exclude: set[str] = set()
        failure: ConnectFailed | None = None
        routing = self.settings.routing
        ask = Ask(call, request.headers, routing.session_header)
        phases = request[PHASES]
        counts = self.metrics.classes[priority]  # waiting and running requests of the class (scraped, Overview)
        hold_s = hold_limit(request.headers, routing.hold_s)
        stoppable = request.get(STOPPABLE)
        stop = stoppable.stop if stoppable is not None and stoppable.preemptible else None
        for _ in range(routing.max_attempts):
            held = 0.0 if phases.holds is None else phases.hold  # (a hold inside acquire is its own phase)
            counts.waiting += 1
            asked = time.perf_counter()
            try:
                lease = await self.dispatcher.acquire(
                    call.model,
                    frozenset(exclude),
                    tenant,
                    ask,
                    priority=priority,
                    ticket=ticket,
                    hold_s=hold_s,
                    queue_s=None if stoppable is None else stoppable.queue_s,
                    phases=phases,
                    stop=stop,
                )
                ticket = None
            except TurnoutError as exc:
                phases.queued(asked, time.perf_counter(), held)
                if exc.status == 503 and phases.model is None:  # it waited, or could not: counted by its model
                    phases.model, phases.worker = unrouted_label(self.fleet, call.model), "-"
                if failure is not None:  # every reachable candidate failed: report the real cause
                    raise failure from None
                raise
            finally:
                counts.waiting -= 1
            phases.queued(asked, time.perf_counter(), held)
            if stoppable is not None:
                stoppable.sent = True
            counts.running += 1
            worker = lease.worker
            phases.model, phases.worker = model_label(worker, lease.model), worker.name
            outcome.worker = worker.name
            request[ROUTE] = lease.why
            response: web.StreamResponse | None = None
            try:
                if phases.span is None:  # (the client's trace context, if any, goes on as it came)
                    response = await self._forward(request, call, lease, outcome, passed_on(request.headers))
                else:
                    response = await self._traced(request, call, lease, outcome, phases)
                if self._explain and not response.prepared:  # a stream has it already (_stream_headers)
                    response.headers[EXPLAIN_HEADER] = _explained(lease)
            except ConnectFailed as exc:
                phases.connect_failed(exc.connect_s)
                self.metrics.upstream_errors.labels(lease.worker.name, "connect").inc()
                lease.worker.mark_down(exc.message, failure_reason(exc.code))
                self.dispatcher.wake_all()
                exclude.add(lease.worker.name)
                failure = exc
            except NoAnswer as exc:  # sent, and the connection broke before an answer: the worker's failure
                self.metrics.upstream_errors.labels(lease.worker.name, "no_answer").inc()
                lease.worker.record_failure(exc.message, asyncio.get_running_loop().time(), failure_reason(exc.code))
                self.dispatcher.wake_all()
                raise
            finally:
                lease.release()
                counts.running -= 1
            if response is not None:
                if not response.prepared:  # a whole answer: its slot counts as free everywhere before it goes out
                    await self.dispatcher.occupancy.settle()
                return response
        assert failure is not None
        raise failure

    def claims_changed(self) -> None:
        """The claims changed: which claim-bound engines schedule by priority, and in which order (their args say)."""
        claims = self.claims
        if claims is not None:
            views = claims.source.views()
            self._claim_priority = {
                claims.worker_name(v.key): v.priority_ordering for v in views if v.priority_ordering is not None
            }

    def _engine_priority(self, lease: Lease) -> int | None:
        """The call's class as its engine's own priority, where the engine schedules by it; else None."""
        worker = lease.worker
        config = worker.config
        if config.priority_scheduling:
            ordering = Ordering.HIGH_FIRST if config.priority_high_first else Ordering.LOW_FIRST
        else:
            claimed = self._claim_priority.get(worker.name)
            if claimed is None:
                return None
            ordering = claimed
        grant = lease.grant
        return engine_priority(Priority.STANDARD if grant is None else grant.priority, ordering)

    async def _traced(
        self, request: web.Request, call: Call, lease: Lease, outcome: Outcome, phases: Phases
    ) -> web.StreamResponse:
        """One try on one worker while tracing is on: the worker is sent the call's span as its parent, and the span
        is told how the try went. (Tracing off, the client's own W3C ``traceparent`` and ``tracestate`` go to the
        worker as they came, so that an engine that traces, vLLM or SGLang, joins the client's trace.)"""
        span = phases.span
        assert span is not None
        trace = span.to_worker(call, lease.worker, lease.worker.upstream_name(lease.model))
        try:
            response = await self._forward(request, call, lease, outcome, trace)
        except BaseException as exc:
            span.worker_done(phases, outcome, None, exc)
            raise
        span.worker_done(phases, outcome, response.status, None)
        return response

    async def _forward(
        self, request: web.Request, call: Call, lease: Lease, outcome: Outcome, trace: dict[str, str] | None
    ) -> web.StreamResponse:
        """One try on ``lease``'s worker; ``trace``: the W3C trace context headers it is sent (or None)."""
        worker = lease.worker
        rank = self._engine_priority(lease)
        translation = api(call.dialect).translation(worker.speaks, call.endpoint, worker.native_apis)
        if translation is not None:
            if call.endpoint is Endpoint.COUNT_TOKENS:  # checked first: a Protocol's isinstance is not cheap
                assert isinstance(translation, TokenCounter), translation
                return await self.inspector.count_tokens(call, lease, translation, outcome)
            return await self._translated(request, call, lease, cast(Translation, translation), outcome, trace, rank)
        body = call.body
        upstream = worker.upstream_name(lease.model)
        if rank is not None and call.endpoint in _PRIORITY_BODIES:  # the body as sent, with the class's priority
            body = orjson.dumps({**parse_object(call.body), "model": upstream, "priority": rank})
        elif upstream != call.model:
            body = orjson.dumps({**call.payload, "model": upstream})
        whole = whole_answer(call, lease)
        if whole is not None:  # asked as a stream, answered in one piece (gateway.preemption)
            sent, whole = as_stream(parse_object(body), call.endpoint, whole, request.get(STOPPABLE))
            body = orjson.dumps(sent)
        return await self._passthrough(request, call, lease, body, outcome, trace, rank, whole)

    # -- same dialect ----------------------------------------------------------------------------
    async def _passthrough(
        self,
        request: web.Request,
        call: Call,
        lease: Lease,
        body: bytes,
        outcome: Outcome,
        trace: dict[str, str] | None,
        rank: int | None = None,
        whole: Whole | None = None,
    ) -> web.StreamResponse:
        """``lease.model``: the name the worker knows it by (its failures and successes are counted under it).
        ``whole``: the call was sent as a stream that its client did not ask for; this makes its frames the answer
        in one piece (:mod:`turnout.dialects.openai_whole`)."""
        worker, model = lease.worker, lease.model
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        forward = NATIVE_HEADERS.get(call.dialect)
        extra = None if forward is None else {k: v for k in forward if (v := request.headers.get(k)) is not None}
        if trace is not None:
            extra = trace if extra is None else {**extra, **trace}
        if rank is not None:
            extra = {**(extra or {}), ENGINE_PRIORITY_HEADER: str(rank)}
        phases = request[PHASES]
        async with self._post(worker, call.path, body, extra) as up:
            phases.connected(up.connect_s, up.sent_at)
            _check_fallback(worker, model, up.status)
            if up.status >= 300:
                phases.first_byte(up.head_at)
                return self.answers.worker_error(call, worker, model, up.status, await up.read(), loop.time())
            if not _streaming(call, up):
                phases.first_byte(up.head_at)
                if whole is not None and up.content_type != "application/json":
                    data = await made_whole(up, lease, whole, _DRAIN_S, request.get(STOPPABLE))
                else:
                    data = await up.read()
                answer = self.answers.checked(worker, model, data, loop.time())
                self.learner.learn(lease, call, answer, started, None, outcome)
                if outcome.keep is not None:
                    await outcome.keep(answer)
                reply = raw_json(data, up.status, call)
                if call.endpoint is Endpoint.COUNT_TOKENS:
                    reply.headers[COUNT_SOURCE] = "tokenizer"
                return reply
            kind = api(call.dialect).stream_kind
            watch = StreamWatch(kind)

            def fail(err: TurnoutError) -> bytes:
                return error_frame(call.dialect, err, watch)

            headers = self._stream_headers(request, call, lease)
            resp = await open_stream(request, phases.held_stream, up.status, headers, up.content_type)
            ping = keepalive(kind)
            idle = None if ping is None else self.settings.limits.stream_keepalive_s
            first: float | None = None
            answered = False  # the client's response is complete (eof written)
            try:
                async for chunk in up.chunks(idle):
                    if not chunk:  # the worker has been silent for a while: the client's keep-alive
                        await resp.write(ping)  # type: ignore[arg-type]  # idle is None without one
                        continue
                    now = loop.time()
                    worker.record_progress(now)
                    seen = watch.events
                    data = watch.feed(chunk)
                    if watch.events != seen:
                        lease.answering(now)
                    if watch.finished and outcome.keep is not None:  # the answer is whole: kept before it goes out
                        await outcome.keep(watch.final or {"usage": watch.usage})
                    if watch.ended:
                        await self._give_back(lease)
                    if data:
                        if first is None:
                            first = time.perf_counter()
                            phases.first_byte(first)
                        await resp.write(data)
                    if watch.ended:
                        answered = True
                        up.finish_later(_DRAIN_S)
                        await self._end_stream(resp, fail, worker, model, watch, outcome, loop.time())
                        break
                if not answered:
                    watch.close()
                    answered = True
                    await self._end_stream(resp, fail, worker, model, watch, outcome, loop.time())
            except (UpstreamError, FrameError) as exc:
                if not answered:
                    watch.finished = False
                    await self._stream_failed(resp, fail, worker, model, exc, outcome, loop.time())
            except asyncio.CancelledError:
                if not answered:
                    await _cut_short(resp, fail)
                raise
            if watch.finished:
                if kind is StreamKind.NDJSON and watch.final:
                    final = watch.final
                else:
                    final = {"usage": watch.usage, "timings": watch.timings}
                self.learner.learn(lease, call, final, started, first, outcome, stream_events=max(watch.events - 1, 0))
            return resp

    async def _end_stream(
        self,
        resp: web.StreamResponse,
        fail: Callable[[TurnoutError], bytes],
        worker: WorkerState,
        model: str,
        watch: StreamWatch,
        outcome: Outcome,
        now: float,
    ) -> None:
        """The stream reached its end: complete, the worker's own error frame, or cut short (an error frame)."""
        if watch.error is not None:
            outcome.failed = True
            self.metrics.upstream_errors.labels(worker.name, "stream").inc()
            worker.record_model_failure(model, f"stream error frame: {watch.error}", now, "error frames in streams")
            await resp.write_eof()
        elif watch.truncated:
            exc = UpstreamError(f"{worker.name}: the stream ended before the model finished")
            await self._stream_failed(resp, fail, worker, model, exc, outcome, now)
        else:
            worker.record_success(now, model)
            if watch.tail:  # the worker closed after the model's finish without its dialect's last event
                await resp.write(watch.tail)
            await resp.write_eof()

    async def _stream_failed(
        self,
        resp: web.StreamResponse,
        fail: Callable[[TurnoutError], bytes],
        worker: WorkerState,
        model: str,
        exc: Exception,
        outcome: Outcome,
        now: float,
    ) -> None:
        outcome.failed = True
        self.metrics.upstream_errors.labels(worker.name, "stream").inc()
        err = exc if isinstance(exc, UpstreamError) else UpstreamError(f"{worker.name}: {exc}")
        worker.record_model_failure(model, err.message, now, "streams breaking")
        await resp.write(fail(err))
        await resp.write_eof()

    # -- a client dialect the worker does not speak: its dialect's translation --------------------------
    async def _translated(
        self,
        request: web.Request,
        call: Call,
        lease: Lease,
        translation: Translation,
        outcome: Outcome,
        trace: dict[str, str] | None,
        rank: int | None = None,
    ) -> web.StreamResponse:
        try:
            path, req = translation.request(call, lease.worker.upstream_name(lease.model))
        except TranslationError as exc:
            raise BadRequest(str(exc)) from None
        extra = trace
        if rank is not None:  # (a translation's worker request is one of OpenAI's: chat, completions, embeddings)
            req["priority"] = rank
            extra = {**(trace or {}), ENGINE_PRIORITY_HEADER: str(rank)}
        worker = lease.worker
        loop = asyncio.get_running_loop()
        started = time.perf_counter_ns()
        alternate = translation.alternate(req)
        form = (worker.name, call.dialect)
        if alternate is not None and form in self._alternate_form:
            req, alternate = alternate, None  # this worker takes the other form
        headers = translation.headers(call)
        phases = request[PHASES]
        async with self._post(worker, path, orjson.dumps(req), extra) as up:
            phases.connected(up.connect_s, up.sent_at)
            _check_fallback(worker, lease.model, up.status)
            rejected = await up.read() if up.status >= 300 else b""
            # llama_cpp.server answers a response_format it does not know with 500 (a validation error its
            # handler reports as a server error): 400, 422 and 500 all earn one retry in the other form
            if up.status >= 300 and not (alternate is not None and up.status in (400, 422, 500)):
                phases.first_byte(up.head_at)
                return self.answers.worker_error(call, worker, lease.model, up.status, rejected, loop.time())
            if up.status < 300:
                return await self._translated_answer(request, call, lease, translation, up, started, outcome, headers)
        assert alternate is not None  # the worker refused OpenAI's json_schema form: try the one it may take
        del rejected
        async with self._post(worker, path, orjson.dumps(alternate), extra) as up:
            phases.connected(up.connect_s, up.sent_at)
            if up.status >= 300:  # refused in both forms: the worker's own answer to the second says why
                phases.first_byte(up.head_at)
                return self.answers.worker_error(call, worker, lease.model, up.status, await up.read(), loop.time())
            self._alternate_form.add(form)
            return await self._translated_answer(request, call, lease, translation, up, started, outcome, headers)

    async def _translated_answer(
        self,
        request: web.Request,
        call: Call,
        lease: Lease,
        translation: Translation,
        up: UpstreamResponse,
        started: int,
        outcome: Outcome,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        worker = lease.worker
        if not _streaming(call, up):
            request[PHASES].first_byte(up.head_at)
            parsed = self.answers.checked(worker, lease.model, await up.read(), loop.time())
            timing = Timing(iso_time(), time.perf_counter_ns() - started)
            try:
                out, counts = translation.answer(call, parsed, timing)
            except _SHAPE_ERRORS as exc:
                raise UpstreamError(f"{worker.name}: the worker's answer has an unexpected shape ({exc})") from None
            outcome.prompt_tokens = counts.prompt_tokens
            outcome.completion_tokens = counts.completion_tokens
            if lease.choice:
                self.learner.observe(
                    lease, call, reported(parsed), counts.completion_tokens, None, timing.total_ns / 1e9
                )
            if outcome.keep is not None:
                await outcome.keep(out)
            response = json_answer(out, 200, call)
            response.headers.update(headers)
            return response
        return await self._translate_stream(request, call, lease, translation, up, started, outcome, headers)

    async def _translate_stream(
        self,
        request: web.Request,
        call: Call,
        lease: Lease,
        translation: Translation,
        up: UpstreamResponse,
        started: int,
        outcome: Outcome,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        worker = lease.worker
        phases = request[PHASES]
        head = self._stream_headers(request, call, lease)
        if headers:
            head = {**head, **headers}
        resp = await open_stream(request, phases.held_stream, 200, head, translation.content_type)
        translator = translation.stream(call)
        watch = StreamWatch(translation.worker_stream, collect=True)

        def fail(err: TurnoutError) -> bytes:
            return b"".join(translation.frame(obj) for obj in translator.fail(err))

        ping = keepalive(api(call.dialect).stream_kind)
        idle = None if ping is None else self.settings.limits.stream_keepalive_s
        quiet_since = loop.time()  # when the client was last sent something
        stamp, stamped = "", 0.0  # the events' timestamp, made again when a millisecond has passed (not per chunk)
        first_ns = 0
        answered = False
        try:
            async for chunk in up.chunks(idle):
                now = loop.time()
                if chunk:
                    worker.record_progress(now)
                    seen = watch.events
                    watch.feed(chunk)
                    if watch.events != seen:
                        lease.answering(now)
                data = b""
                if watch.frames:
                    if not first_ns:  # the worker's first frame, whether or not it translates into anything the
                        # client is sent yet (tokens that decode to no text: llama-server then sends only its last)
                        first_ns = time.perf_counter_ns() - started
                        phases.first_byte(time.perf_counter())
                    if now - stamped >= 0.001:
                        stamp, stamped = iso_time(), now
                    events = _translate_events(translator, watch.frames, stamp, worker.name)
                    data = b"".join(map(translation.frame, events))
                    watch.frames.clear()
                if watch.ended:  # this chunk's frames go out with the last ones, in one write
                    up.finish_later(_DRAIN_S)
                    await self._finish_translated(
                        resp, call, lease, watch, translation, translator, started, first_ns, outcome, data
                    )
                    answered = True
                    break
                if data:
                    await resp.write(data)
                    quiet_since = now
                elif idle is not None and now - quiet_since >= idle:  # the worker silent, or sending what
                    await resp.write(ping)  # type: ignore[arg-type]  # the client is not sent yet (tool calls)
                    quiet_since = now
            if not answered:
                watch.close()
                await self._finish_translated(
                    resp, call, lease, watch, translation, translator, started, first_ns, outcome, b""
                )
                answered = True
        except (UpstreamError, FrameError) as exc:
            if not answered:
                await self._stream_failed(resp, fail, worker, lease.model, exc, outcome, loop.time())
        except asyncio.CancelledError:
            if not answered:
                await _cut_short(resp, fail)
            raise
        return resp

    async def _finish_translated(
        self,
        resp: web.StreamResponse,
        call: Call,
        lease: Lease,
        watch: StreamWatch,
        translation: Translation,
        translator: StreamTranslation,
        started: int,
        first_ns: int,
        outcome: Outcome,
        pending: bytes,
    ) -> None:
        """The worker's stream ended: ``pending`` (the client's frames of its last chunk) and the client's last
        frames go out with the end of the answer; a stream that did not end with the model's finish raises, after
        ``pending`` (the caller then ends the answer with an error frame)."""
        now = asyncio.get_running_loop().time()
        worker, model = lease.worker, lease.model
        failure = None
        if watch.error is not None:
            failure = UpstreamError(f"{worker.name}: {watch.error}")
        elif translator.finish_reason is None:  # [DONE] or a close before the model's own finish
            failure = UpstreamError(f"{worker.name}: the stream ended before the model finished")
        if failure is not None:
            if pending:
                await resp.write(pending)
            raise failure
        timing = Timing(iso_time(), time.perf_counter_ns() - started, first_ns)
        try:
            final, counts = translator.finish(timing)
        except _SHAPE_ERRORS as exc:
            raise UpstreamError(f"{worker.name}: the worker's stream has an unexpected shape ({exc})") from None
        if outcome.keep is not None:  # the answer is whole: kept before its last frame goes out
            await outcome.keep(final[-1])
        outcome.prompt_tokens = counts.prompt_tokens
        outcome.completion_tokens = counts.completion_tokens
        if lease.choice:
            rep = Reported(counts.prompt_tokens, counts.completion_tokens)
            total_s = (time.perf_counter_ns() - started) / 1e9
            self.learner.observe(
                lease, call, rep, counts.completion_tokens, first_ns / 1e9 if first_ns else None, total_s
            )
        worker.record_success(now, model)
        await self._give_back(lease)
        await resp.write_eof(pending + b"".join(map(translation.frame, final)))

    async def _give_back(self, lease: Lease) -> None:
        """The worker has answered: its slot is given back, and counts as free on every replica, before the end of
        the answer goes out (so the client's next turn, on any replica, finds the worker that holds its prefix free)."""
        lease.release()
        await self.dispatcher.occupancy.settle()

    # -- helpers ---------------------------------------------------------------------------------
    def _post(
        self,
        worker: WorkerState,
        path: str,
        body: bytes,
        extra: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> AbstractAsyncContextManager[UpstreamResponse]:
        """One proxied call: the worker's own headers (never the client's key) and ``extra`` client headers of the
        dialect's own (:data:`turnout.dialects.NATIVE_HEADERS`), its SSRF guard and budget."""
        return self.client.request(
            "POST",
            worker.base_url + path,
            body=body,
            headers={**worker.headers, **extra} if extra else worker.headers,
            label=worker.name,
            timeout_s=timeout_s,
            **_dial_options(worker),
        )

    def _stream_headers(self, request: web.Request, call: Call, lease: Lease) -> dict[str, str]:
        headers = stream_headers(request, call)
        return {**headers, EXPLAIN_HEADER: _explained(lease)} if self._explain else headers


def _explained(lease: Lease) -> str:
    return f"{lease.worker.name}; {lease.why}"


class _NeedFallback(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _dial_options(worker: WorkerState) -> dict[str, Any]:
    """SSRF guard for endpoints, and the latency budget (time to response headers) when a fallback is set."""
    ext = worker.external
    if ext is None:
        return {}
    budget = ext.latency_budget_ms / 1000 if ext.fallback_model and ext.latency_budget_ms else None
    return {"guard": ext.guard, "headers_timeout_s": budget}


def _check_fallback(worker: WorkerState, model: str, status: int) -> None:
    """An endpoint with a fallback model answered 5xx: counted against its model, then the fallback takes over."""
    ext = worker.external
    if ext is not None and ext.fallback_model and status >= 500:
        worker.record_model_failure(model, f"HTTP {status}", asyncio.get_running_loop().time())
        raise _NeedFallback(f"http_{status}")


async def _cut_short(resp: web.StreamResponse, fail: Callable[[TurnoutError], bytes]) -> None:
    """A stream cancelled mid-way (the gateway stopping after its drain timeout, or the client gone) ends with
    an error frame rather than silently; best effort, since the client may be the one that left."""
    err = Unavailable(
        "the gateway stopped before this answer was complete; send the request again", code="gateway_stopping"
    )
    with contextlib.suppress(Exception):
        await resp.write(fail(err))


def _streaming(call: Call, up: UpstreamResponse) -> bool:
    """A streamed answer, unless the worker ignored ``stream`` and sent one JSON document."""
    return call.stream and up.content_type != "application/json"


def _translate_events(
    translator: StreamTranslation, events: list[dict[str, Any]], created: str, label: str
) -> list[dict[str, Any]]:
    """The client's frames for the worker's events that arrived together (stamped ``created``)."""
    try:
        return translator.feed(events, created)
    except _SHAPE_ERRORS as exc:
        raise UpstreamError(f"{label}: the worker's stream has an unexpected shape ({exc})") from None
