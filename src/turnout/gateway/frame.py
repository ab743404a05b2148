"""Every request's frame: the answer's dialect by path, the admin gate, errors in the route's dialect,
metrics, where its time went (``Server-Timing``, the phase histograms, its span: :mod:`turnout.gateway.timing`),
catching up with the other processes of `turnout serve --workers N`, and the fast way to a fixed route.

:func:`request_handler` is what the server calls for each request (:func:`turnout.gateway.server.start_runner`);
:func:`middleware` is the app's one middleware, for a request aiohttp's router resolved. Both end in
:func:`_respond`. The admin gate is the admin package's (:data:`turnout.gateway.keys.ADMIN_GATE`, set by
:func:`turnout.wiring.create_app`): the gateway does not import the admin package it serves.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import hdrs, web
from aiohttp.web_urldispatcher import AbstractRoute, PlainResource, UrlMappingMatchInfo

from turnout.core.endpoint_urls import api_path
from turnout.dialects import dialect_of
from turnout.dialects.base import Dialect
from turnout.errors import NotFound, TurnoutError
from turnout.gateway.access import REQUEST_ID
from turnout.gateway.keys import ADMIN_GATE, METRICS, PEERS, REQUEST_IDS
from turnout.gateway.timing import PHASES, SERVER_TIMING, Phases
from turnout.responses import ERROR_CODE, error_response

__all__ = ["Handler", "fixed_routes", "middleware", "request_handler", "request_ids"]

log = logging.getLogger("turnout.gateway")

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]  # web.Server's request_handler

_READS = frozenset({"GET", "HEAD", "OPTIONS"})
CLIENT_GONE = 499  # the status of a request whose client went away before its answer (nginx's)


def request_ids() -> Iterator[str]:
    """The ids of a process's requests (``app[REQUEST_IDS]``): a random part of the process's own, so that the
    processes of `serve --workers N` and replicas never share one, then a counter (no system call per request)."""
    prefix = f"req_{secrets.token_hex(8)}"
    return (f"{prefix}{n:08x}" for n in itertools.count())


def _dialect(path: str) -> Dialect:
    """The shape of the answers on ``path``: an endpoint's own URL (``/endpoints/<name>/api/...``) too."""
    return dialect_of(api_path(path))


@web.middleware
async def middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The app's one middleware, for a request aiohttp's router resolved (see :func:`request_handler`)."""
    resource = request.match_info.route.resource
    endpoint = resource.canonical if resource is not None else "unmatched"
    return await _respond(request, handler, _dialect(request.path), endpoint)


async def _respond(
    request: web.Request,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    dialect: Dialect,
    endpoint: str,
) -> web.StreamResponse:
    """Every request's frame: admin auth, errors in the route's dialect, metrics, catching up with the other
    processes on this data dir (`turnout serve --workers N`), and announcing admin changes to every replica."""
    app = request.app
    metrics = app[METRICS]
    started = time.perf_counter()
    phases = request[PHASES] = Phases(started)  # where its time goes (turnout.gateway.timing)
    metrics.requests_in_flight += 1
    peers = app[PEERS]  # always set: .get() of a missing key costs an exception on every request
    request_id = None
    if dialect is Dialect.ANTHROPIC:  # every Anthropic answer names its request (header request-id)
        ids: Iterator[str] = app[REQUEST_IDS]
        request_id = request[REQUEST_ID] = next(ids)
    try:
        if peers.moved():
            await peers.catch_up()  # another process changed keys, placement or endpoints: take them first
        refused = None
        if dialect is Dialect.ADMIN:  # who asks, and may they (the role table): a refusal is its own answer
            refused = await app[ADMIN_GATE](request)
        response = refused if refused is not None else await handler(request)
        if dialect is Dialect.ADMIN and request.method not in _READS and response.status < 400:
            await peers.announce()  # before the answer leaves: the others re-read before their next request
    except TurnoutError as exc:
        response = _error(dialect, exc, request_id)
    except web.HTTPException as exc:
        if exc.status == 404:
            err: TurnoutError = NotFound(f"no route {request.method} {request.path}", code="unknown_route")
        else:
            err = TurnoutError(exc.reason, code="http_error")
            err.status = exc.status
        response = _error(dialect, err, request_id)
    except ConnectionResetError:
        raise  # the client went away mid-response: nothing to answer, not a gateway error
    except asyncio.CancelledError:  # the client went away (handler_cancellation), or the server stops
        _client_gone(request, started)
        metrics.request_done(dialect.value, endpoint, CLIENT_GONE, time.perf_counter() - started)
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        response = _error(dialect, TurnoutError("internal error; see the gateway log"), request_id)
    finally:
        metrics.requests_in_flight -= 1
        held = phases.held_stream
        if held is not None:
            held.close()
    if held is not None and held.response is not None and response is not held.response:
        response = await held.instead(response)  # a held stream's headers went out: it ends with an error event
    now = time.perf_counter()
    streamed = response.prepared  # a stream sent its headers already (the proxy's stream headers)
    if not streamed:
        response.headers[SERVER_TIMING] = phases.header(now)
        if request_id is not None:
            response.headers["request-id"] = request_id
    if phases.model is not None:  # a proxied call that was routed, or waited for a worker
        first, sent = phases.first_at, phases.sent_at
        metrics.phases.record(
            phases.model,
            phases.worker or "-",
            streamed,
            phases.queue,
            0.0 if phases.holds is None else phases.hold,
            phases.upstream,
            first - sent if first and sent else None,  # (Phases.ttft, without the property's call)
            now - started,
            now,
        )
    if phases.span is not None:
        phases.span.finish(request, response, phases, now)
    metrics.request_done(dialect.value, endpoint, response.status, now - started)
    return response


def _client_gone(request: web.Request, started: float) -> None:
    """The access line of a request whose handler was cancelled: aiohttp writes none for it (a client that gave up
    in the queue left no trace), so it is written here, as nginx does: status 499, error ``client_gone``."""
    protocol = request.protocol
    if protocol is None:
        return
    gone = web.Response(status=CLIENT_GONE, reason="Client Closed Request")
    gone[ERROR_CODE] = "client_gone"
    since = asyncio.get_running_loop().time() - (time.perf_counter() - started)  # log_access wants loop time
    protocol.log_access(request, gone, since)


def _error(dialect: Dialect, err: TurnoutError, request_id: str | None) -> web.Response:
    if request_id is not None:
        err.headers["request-id"] = request_id  # the answer's header, and Anthropic's error body names it too
    return error_response(dialect, err)


def fixed_routes(app: web.Application) -> dict[tuple[str, str], tuple[AbstractRoute, Dialect, str]]:
    """(method, path) -> (route, dialect, metrics label) for every request aiohttp's router would resolve to a
    plain resource's route with that method: what :func:`request_handler` takes without the router."""
    fixed: dict[tuple[str, str], tuple[AbstractRoute, Dialect, str]] = {}
    any_method: set[str] = set()  # paths a "*" route took first: the router picks it for every method
    for route in app.router.routes():  # in the order they were added, which is the order the router tries
        resource = route.resource
        if not isinstance(resource, PlainResource):
            continue
        path = resource.canonical
        if route.method == hdrs.METH_ANY:
            any_method.add(path)
        elif path not in any_method:
            fixed.setdefault((route.method, path), (route, _dialect(path), path))
    return fixed


def request_handler(app: web.Application) -> Handler:
    """What the server calls for each request of ``app`` (``web.Server.request_handler``; see
    :func:`turnout.gateway.server.start_runner`).

    A request for one of the app's fixed paths (``POST /v1/chat/completions``, ``GET /v1/models``, ...: a
    plain resource with a concrete method) goes straight to its handler inside :func:`_respond`, without
    aiohttp's router walk and middleware chain, which cost about a twentieth of a proxied request's CPU
    (bench/README.md). The rest (paths with variables or a query, percent-escapes, ``Expect``, unknown routes,
    a method the path does not take) goes through ``app._handle`` as usual. Both end in the same handler and
    the same :func:`_respond`, so the answer is the same either way (tests/gateway/test_request_handler.py).
    ``app`` must be frozen (its runner set up): its routes no longer change."""
    if tuple(app.middlewares) != (middleware,):  # someone added a middleware: the router's way applies it
        return app._handle  # type: ignore[return-value]  # aiohttp's server only makes web.Request
    fixed = fixed_routes(app)
    handle = app._handle

    async def handle_request(request: web.BaseRequest) -> web.StreamResponse:
        found = fixed.get((request.method, request.raw_path))
        if found is None or hdrs.EXPECT in request.headers:
            return await handle(request)  # type: ignore[arg-type]  # aiohttp's server only makes web.Request
        route, dialect, endpoint = found
        match_info = UrlMappingMatchInfo({}, route)
        match_info.add_app(app)
        match_info.freeze()
        request._match_info = match_info  # type: ignore[attr-defined]  # what app._handle sets after resolving
        return await _respond(request, route.handler, dialect, endpoint)  # type: ignore[arg-type]

    return handle_request
