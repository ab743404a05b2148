"""Forwarding one call to a worker: pass-through when dialects match, translation when they differ.

* OpenAI client -> any worker: the same ``/v1`` path (Ollama serves ``/v1`` itself).
* Ollama client -> Ollama worker: the same ``/api`` path.
* Ollama client -> OpenAI-style worker: requests, responses and streams are translated
  (:mod:`turnout.core.translate`).

Streams are written chunk by chunk as they arrive. If the worker fails after the stream started,
the client gets a final error frame in its dialect. A worker that cannot be reached is marked down
and the next candidate is tried (only before anything was sent to the client).
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any

import orjson
from aiohttp import web

from turnout.config import Settings
from turnout.core import translate
from turnout.core.endpoint_health import EndpointState
from turnout.core.routing import NoRoute
from turnout.core.signals import tokens_per_second
from turnout.errors import BadRequest, TurnoutError, Unavailable, UpstreamError
from turnout.fleet.claims import ClaimBindings
from turnout.fleet.state import Fleet, WorkerState
from turnout.gateway.accounting import Outcome
from turnout.gateway.calls import Call, Endpoint
from turnout.gateway.catalog import iso_time, unknown_details
from turnout.gateway.dialect import Dialect, error_frame, error_response, json_response
from turnout.gateway.dispatch import Dispatcher, Lease, no_route_error
from turnout.metrics import Metrics
from turnout.upstream.client import ConnectFailed, UpstreamClient, UpstreamResponse

__all__ = ["Proxy"]

_EVAL_COUNT = re.compile(rb'"eval_count"\s*:\s*(\d+)')
_EVAL_DURATION = re.compile(rb'"eval_duration"\s*:\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_PROMPT_TOKENS = re.compile(rb'"(?:prompt_eval_count|prompt_tokens)"\s*:\s*(\d+)')
_TAIL = 4096
_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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

    async def serve(self, request: web.Request, call: Call, outcome: Outcome, tenant: str = "") -> web.StreamResponse:
        if call.endpoint is Endpoint.SHOW:
            return await self._show(call)
        if self.claims is not None:
            self.claims.gate(call.model)  # 503 for a claimed model that is asleep, activating or failed
        endpoint = self.fleet.endpoint_for(call.model)
        fallback = None if endpoint is None or endpoint.external is None else endpoint.external.fallback_model
        if fallback is None or call.fallback_from is not None:
            return await self._serve_once(request, call, outcome, tenant)
        assert endpoint is not None
        try:
            return await self._serve_once(request, call, outcome, tenant)
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
        outcome.fallback_from = origin
        redirected = replace(call, model=fallback, payload=payload, body=orjson.dumps(payload), fallback_from=origin)
        return await self._serve_once(request, redirected, outcome, tenant)

    async def _serve_once(self, request: web.Request, call: Call, outcome: Outcome, tenant: str) -> web.StreamResponse:
        exclude: set[str] = set()
        failure: ConnectFailed | None = None
        for _ in range(self.settings.routing.max_attempts):
            try:
                lease = await self.dispatcher.acquire(call.model, frozenset(exclude), tenant)
            except TurnoutError:
                if failure is not None:  # every reachable candidate failed: report the real cause
                    raise failure from None
                raise
            outcome.worker = lease.worker.name
            try:
                return await self._attempt(request, call, lease, outcome)
            except ConnectFailed as exc:
                self.metrics.upstream_errors.labels(lease.worker.name, "connect").inc()
                lease.worker.mark_down(exc.message)
                if lease.worker.external is not None:
                    lease.worker.external.state = EndpointState.UNREACHABLE
                self.dispatcher.wake_all()
                exclude.add(lease.worker.name)
                failure = exc
            finally:
                lease.release()
        assert failure is not None
        raise failure

    async def _attempt(self, request: web.Request, call: Call, lease: Lease, outcome: Outcome) -> web.StreamResponse:
        worker = lease.worker
        if call.dialect is Dialect.OLLAMA and self.fleet.is_openai(worker.name):
            return await self._translated(request, call, lease, outcome)
        body = call.body
        upstream = _upstream_name(worker, lease.model)
        if upstream != call.model:
            body = orjson.dumps({**call.payload, "model": upstream})
        return await self._passthrough(request, call, worker, call.path, body, outcome)

    # -- same dialect ----------------------------------------------------------------------------
    async def _passthrough(
        self, request: web.Request, call: Call, worker: WorkerState, path: str, body: bytes, outcome: Outcome
    ) -> web.StreamResponse:
        started = time.perf_counter()
        async with self.client.request(
            "POST",
            worker.base_url + path,
            body=body,
            headers=worker.headers,
            label=worker.name,
            **_dial_options(worker),
        ) as up:
            _check_fallback(worker, up.status)
            if not call.stream or up.status >= 300:
                data = await up.read()
                if up.status < 300:
                    self._learn(worker, call.model, data, time.perf_counter() - started, outcome)
                return _relay(call, up, data)
            resp = web.StreamResponse(status=up.status, headers=_stream_headers(call))
            resp.content_type = up.content_type
            await resp.prepare(request)
            tail = b""
            events = 0
            first: float | None = None
            try:
                async for chunk in up.chunks():
                    await resp.write(chunk)
                    if first is None:
                        first = time.perf_counter()
                    tail = (tail + chunk)[-_TAIL:]
                    events += chunk.count(b"data:")
                if not _finished(call.dialect, tail):
                    raise UpstreamError(f"{worker.name}: the stream ended before the model finished")
            except UpstreamError as exc:
                outcome.failed = True
                self.metrics.upstream_errors.labels(worker.name, "stream").inc()
                await resp.write(error_frame(call.dialect, exc))
            else:
                elapsed = time.perf_counter() - (first or started)
                self._learn(worker, call.model, tail, elapsed, outcome, stream_events=max(events - 1, 0))
            await resp.write_eof()
            return resp

    # -- Ollama client, OpenAI-style worker --------------------------------------------------------
    async def _translated(self, request: web.Request, call: Call, lease: Lease, outcome: Outcome) -> web.StreamResponse:
        p, model = call.payload, _upstream_name(lease.worker, lease.model)
        generate = call.endpoint is Endpoint.GENERATE
        try:
            if call.endpoint is Endpoint.CHAT:
                path, req = "/v1/chat/completions", translate.chat_to_openai(p, model, stream=call.stream)
            elif generate:
                path, req = translate.generate_to_openai(p, model, stream=call.stream)
            else:
                legacy = call.endpoint is Endpoint.EMBED_LEGACY
                path, req = "/v1/embeddings", translate.embed_to_openai(p, model, legacy=legacy)
        except translate.TranslationError as exc:
            raise BadRequest(str(exc)) from None
        worker = lease.worker
        started = time.perf_counter_ns()
        async with self.client.request(
            "POST",
            worker.base_url + path,
            body=orjson.dumps(req),
            headers=worker.headers,
            label=worker.name,
            **_dial_options(worker),
        ) as up:
            _check_fallback(worker, up.status)
            if up.status >= 300:
                data = await up.read()
                return _json(translate.ollama_error_from_openai(data, up.status), up.status, call)
            if not call.stream:
                parsed = _decode(await up.read(), worker.name)
                timing = translate.Timing(iso_time(), time.perf_counter_ns() - started)
                if call.endpoint in (Endpoint.EMBED, Endpoint.EMBED_LEGACY):
                    legacy = call.endpoint is Endpoint.EMBED_LEGACY
                    usage = parsed.get("usage")
                    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                        outcome.prompt_tokens = usage["prompt_tokens"]
                    return _json(translate.embed_from_openai(parsed, call.model, timing, legacy=legacy), 200, call)
                out = translate.chat_from_openai(parsed, call.model, timing, generate=generate)
                self._observe(worker, call.model, out, outcome)
                return _json(out, 200, call)
            return await self._translate_stream(request, call, worker, up, started, generate, outcome)

    async def _translate_stream(
        self,
        request: web.Request,
        call: Call,
        worker: WorkerState,
        up: UpstreamResponse,
        started: int,
        generate: bool,
        outcome: Outcome,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=_stream_headers(call))
        resp.content_type = "application/x-ndjson"
        await resp.prepare(request)
        translator = translate.ChatStreamTranslator(model=call.model, generate=generate)
        first_ns = 0
        try:
            done = False
            async for line in up.lines():
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                event = _decode(data, worker.name)
                if "error" in event:
                    raise UpstreamError(translate.ollama_error_from_openai(data, 500)["error"])
                for obj in translator.feed(event, iso_time()):
                    if not first_ns:
                        first_ns = time.perf_counter_ns() - started
                    await resp.write(orjson.dumps(obj) + b"\n")
            if not done and translator.finish_reason is None:
                raise UpstreamError(f"{worker.name}: the stream ended before the model finished")
            timing = translate.Timing(iso_time(), time.perf_counter_ns() - started, first_ns)
            final = translator.finish(timing)
            for obj in final:
                await resp.write(orjson.dumps(obj) + b"\n")
            self._observe(worker, call.model, final[-1], outcome)
        except UpstreamError as exc:
            outcome.failed = True
            self.metrics.upstream_errors.labels(worker.name, "stream").inc()
            await resp.write(error_frame(Dialect.OLLAMA, exc))
        await resp.write_eof()
        return resp

    async def _show(self, call: Call) -> web.StreamResponse:
        decision = self.dispatcher.locate(call.model)
        if isinstance(decision, NoRoute):
            raise no_route_error(decision, int(self.settings.health.interval_s))
        worker = self.fleet.workers[decision.best.worker]
        if not self.fleet.is_openai(worker.name):
            return await self._passthrough_show(call, worker, _upstream_name(worker, decision.best.model))
        entry = worker.tags.get(decision.best.model, {})
        return _json(
            {
                "modelfile": "",
                "parameters": "",
                "template": "",
                "details": unknown_details(),
                "model_info": {"general.architecture": "", "turnout.owned_by": entry.get("owned_by", "")},
                "capabilities": ["completion"],
                "modified_at": iso_time(entry.get("created")),
            }
        )

    async def _passthrough_show(self, call: Call, worker: WorkerState, upstream: str) -> web.StreamResponse:
        body = call.body if upstream == call.model else orjson.dumps({**call.payload, "model": upstream})
        async with self.client.request(
            "POST",
            worker.base_url + "/api/show",
            body=body,
            headers=worker.headers,
            label=worker.name,
            **_dial_options(worker),
        ) as up:
            return _relay(call, up, await up.read())

    # -- helpers ---------------------------------------------------------------------------------
    def _learn(
        self,
        worker: WorkerState,
        model: str,
        data: bytes,
        seconds: float,
        outcome: Outcome,
        *,
        stream_events: int = 0,
    ) -> None:
        """Token counts for accounting, and tokens/s from Ollama's eval stats, else OpenAI usage (or
        stream events) over wall time."""
        prompt = _PROMPT_TOKENS.search(data)
        outcome.prompt_tokens = int(prompt[1]) if prompt else 0
        count, duration = _EVAL_COUNT.search(data), _EVAL_DURATION.search(data)
        if count and duration:
            outcome.completion_tokens = int(count[1])
            worker.observe_speed(model, tokens_per_second(int(count[1]), int(duration[1]) / 1e9))
            return
        tokens = _COMPLETION_TOKENS.search(data)
        outcome.completion_tokens = int(tokens[1]) if tokens else stream_events
        worker.observe_speed(model, tokens_per_second(outcome.completion_tokens, seconds))

    def _observe(self, worker: WorkerState, model: str, final: dict[str, Any], outcome: Outcome) -> None:
        outcome.prompt_tokens = int(final.get("prompt_eval_count") or 0)
        outcome.completion_tokens = int(final.get("eval_count") or 0)
        ns = final.get("eval_duration") or final.get("total_duration") or 0
        worker.observe_speed(model, tokens_per_second(final.get("eval_count"), ns / 1e9))


class _NeedFallback(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _upstream_name(worker: WorkerState, model: str) -> str:
    return model if worker.external is None else worker.external.upstream_name(model)


def _dial_options(worker: WorkerState) -> dict[str, Any]:
    """SSRF guard for endpoints, and the latency budget (time to response headers) when a fallback is set."""
    ext = worker.external
    if ext is None:
        return {}
    budget = ext.latency_budget_ms / 1000 if ext.fallback_model and ext.latency_budget_ms else None
    return {"guard": ext.guard, "headers_timeout_s": budget}


def _check_fallback(worker: WorkerState, status: int) -> None:
    ext = worker.external
    if ext is not None and ext.fallback_model and status >= 500:
        raise _NeedFallback(f"http_{status}")


def _stream_headers(call: Call) -> dict[str, str]:
    if call.fallback_from is None:
        return _STREAM_HEADERS
    return {**_STREAM_HEADERS, "X-Fallback-From": call.fallback_from}


def _relay(call: Call, up: UpstreamResponse, data: bytes) -> web.StreamResponse:
    """A buffered worker answer as it came; a non-JSON error page becomes an error in the caller's dialect."""
    if up.status >= 300 and up.content_type != "application/json":
        text = data.decode("utf-8", "replace").strip()[:300]
        err = UpstreamError(f"worker answered HTTP {up.status}" + (f": {text}" if text else ""))
        err.status = up.status if up.status >= 400 else 502
        response: web.StreamResponse = error_response(call.dialect, err)
    else:
        response = web.Response(status=up.status, body=data, content_type=up.content_type or "application/json")
    if call.fallback_from is not None:
        response.headers["X-Fallback-From"] = call.fallback_from
    return response


def _finished(dialect: Dialect, tail: bytes) -> bool:
    if dialect is Dialect.OLLAMA:
        last = tail.rstrip().rsplit(b"\n", 1)[-1]
        return b'"done":true' in last.replace(b" ", b"") or b'"error"' in last
    return b"[DONE]" in tail or b'"error"' in tail


def _decode(data: bytes, label: str) -> dict[str, Any]:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamError(f"{label}: worker sent invalid JSON") from None
    if not isinstance(value, dict):
        raise UpstreamError(f"{label}: worker sent a JSON {type(value).__name__}, expected an object")
    return value


def _json(obj: Any, status: int = 200, call: Call | None = None) -> web.Response:
    response = json_response(obj, status)
    if call is not None and call.fallback_from is not None:
        response.headers["X-Fallback-From"] = call.fallback_from
    return response
