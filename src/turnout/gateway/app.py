"""`create_app(settings)`: builds every object, wires them onto one aiohttp application.

Request flow: middleware (admin auth, error rendering, metrics) -> handler -> Call -> Dispatcher
(route + slots + queue) -> Proxy (worker). Background: the fleet Poller.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import hdrs, web
from aiohttp.web_urldispatcher import AbstractRoute, PlainResource, UrlMappingMatchInfo

from turnout.admin.accounts import AdminSignIns, add_account_routes
from turnout.admin.api import add_admin_routes
from turnout.admin.auth import AdminAuth
from turnout.admin.backup_api import add_backup_routes
from turnout.admin.endpoints_api import add_endpoint_routes
from turnout.admin.ui import add_ui_routes, check_admin
from turnout.config import ConfigError, Settings
from turnout.controller.local import ClaimFiles, LocalController, Pool, policy_text
from turnout.controller.metrics import ControllerMetrics
from turnout.core.endpoint_urls import api_path
from turnout.errors import NotFound, TurnoutError
from turnout.fleet.claim_sources import LocalSource
from turnout.fleet.claims import ClaimBindings, RedisWakeLock
from turnout.fleet.endpoints import EndpointManager
from turnout.fleet.poller import Poller
from turnout.fleet.state import Fleet
from turnout.gateway.access import AccessLog
from turnout.gateway.accounting import Accountant
from turnout.gateway.dialect import Dialect, error_response
from turnout.gateway.dispatch import Dispatcher
from turnout.gateway.keys import (
    ACCOUNTANT,
    ADMIN_AUTH,
    AUDIT,
    DATABASE,
    DISPATCHER,
    ENDPOINTS,
    FLEET,
    KEYS,
    METRICS,
    POLLER,
    PROXY,
    SETTINGS,
    SIGNINS,
    USAGE,
)
from turnout.gateway.limiter import LocalLimiter, RedisLimiter, TokenLimiter
from turnout.gateway.peers import Peers
from turnout.gateway.proxy import Proxy
from turnout.gateway.routes import add_client_routes
from turnout.gateway.server import Handler
from turnout.gateway.shared_limits import SharedLimiter
from turnout.masking import SECRETS
from turnout.metrics import Metrics
from turnout.redaction import handler_args
from turnout.state.changes import ChangeCounter
from turnout.state.placement_store import PlacementStore
from turnout.state.running import GatewayMark
from turnout.store.audit import AuditLog
from turnout.store.db import Database, database_url
from turnout.store.endpoints import EndpointStore
from turnout.store.keys import KeyStore
from turnout.store.listings import ModelListings
from turnout.store.secrets import SecretBox
from turnout.store.usage import UsageStore
from turnout.upstream.client import UpstreamClient

__all__ = ["create_app", "fixed_routes", "request_handler"]

log = logging.getLogger("turnout.gateway")

PEERS: web.AppKey[Peers | None] = web.AppKey("peers")  # None only where the data dir has no change counter
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


def _dialect(path: str) -> Dialect:
    if path.startswith("/admin/"):
        return Dialect.ADMIN
    if api_path(path).startswith("/api/"):  # an endpoint's own URL too: /endpoints/<name>/api/...
        return Dialect.OLLAMA
    return Dialect.OPENAI


@web.middleware
async def _middleware(
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
    """Every request's frame: admin auth, errors in the route's dialect, metrics, and catching up with the
    other processes of `turnout serve --workers N`."""
    app = request.app
    metrics = app[METRICS]
    started = time.perf_counter()
    metrics.requests_in_flight += 1
    peers = app[PEERS]  # always set: .get() of a missing key costs an exception on every request
    try:
        if peers is not None and peers.moved():
            await peers.catch_up()  # another process changed keys, placement or endpoints: take them first
        if dialect is Dialect.ADMIN:
            await check_admin(request)  # Bearer token, or a browser session + CSRF; UI pages check their own
        response = await handler(request)
        if peers is not None and dialect is Dialect.ADMIN and request.method not in _READS and response.status < 400:
            peers.announce()  # before the answer leaves: the other processes re-read before their next request
    except TurnoutError as exc:
        response = error_response(dialect, exc)
    except web.HTTPException as exc:
        if exc.status == 404:
            err: TurnoutError = NotFound(f"no route {request.method} {request.path}", code="unknown_route")
        else:
            err = TurnoutError(exc.reason, code="http_error")
            err.status = exc.status
        response = error_response(dialect, err)
    except ConnectionResetError:
        raise  # the client went away mid-response: nothing to answer, not a gateway error
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        response = error_response(dialect, TurnoutError("internal error; see the gateway log"))
    finally:
        metrics.requests_in_flight -= 1
    metrics.request_done(dialect.value, endpoint, response.status, time.perf_counter() - started)
    return response


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
    if tuple(app.middlewares) != (_middleware,):  # someone added a middleware: the router's way applies it
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


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def _healthz(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    up = sum(1 for w in fleet.workers.values() if w.healthy)
    # pid: which gateway process answered (`turnout serve --workers N` runs several on one port)
    return web.json_response({"status": "ok", "workers": len(fleet.workers), "healthy_workers": up, "pid": os.getpid()})


def _claim_bindings(settings: Settings, fleet: Fleet, client: UpstreamClient, metrics: Metrics) -> ClaimBindings | None:
    if settings.pools is None:
        return None
    redis_url = settings.storage.redis_url
    lock = RedisWakeLock(redis_url) if redis_url else None
    if settings.pools.kubernetes is not None:
        try:
            from turnout.controller.kube import KubeRoutes
        except ImportError as exc:
            raise ConfigError(
                f"pools.kubernetes needs the operator extra: pip install 'turnout[operator]' ({exc})"
            ) from exc
        cfg = settings.pools.kubernetes
        kubeconfig = None if cfg.kubeconfig is None else settings.base_dir / cfg.kubeconfig
        try:
            source = KubeRoutes(tuple(cfg.namespaces), kubeconfig, client)
        except Exception as exc:  # the kubernetes client raises several kinds for a bad or missing kubeconfig
            raise ConfigError(f"pools.kubernetes: cannot load the cluster credentials: {exc}") from exc
        return ClaimBindings(fleet, source, settings.pools.interval_s, lock)
    pools = [
        Pool(a.name, str(a.agent_url).rstrip("/"), a.address, a.gpus, dict(a.labels), policy_text(a.policy))
        for a in settings.pools.agents
    ]
    controller = LocalController(
        ClaimFiles(settings.data_dir), pools, client, metrics=ControllerMetrics(metrics.registry)
    )
    return ClaimBindings(fleet, LocalSource(controller), settings.pools.interval_s, lock)


def _limiter(settings: Settings, processes: int, limits: socket.socket | None) -> TokenLimiter:
    """Redis when configured (any number of replicas), else the supervisor of `--workers N` (``limits``: this
    process's channel to it), else memory: each is exact for the processes that share it."""
    if settings.storage.redis_url:
        return RedisLimiter(settings.storage.redis_url)
    if limits is not None:
        return SharedLimiter(limits)
    if processes > 1:  # counting in memory here would give each process the whole limit
        raise ValueError("a process of `turnout serve --workers N` counts limits through its supervisor (limits=)")
    return LocalLimiter()


async def _catch_up(app: web.Application) -> None:
    """Re-read what another process of this gateway changed through its admin API."""
    app[ACCOUNTANT].forget()
    app[FLEET].placement.refresh(force=True)
    await app[ENDPOINTS].sync()
    app[DISPATCHER].wake_all()


def _peers(settings: Settings, processes: int, reload: Callable[[], Awaitable[None]]) -> Peers | None:
    """The other gateway processes on this data dir (`serve --workers N`, or replicas sharing the dir): their
    admin changes picked up at the start of the next request, ours announced. A single process on a data dir
    it cannot write goes without (others there then see its changes at their next poll round)."""
    try:
        return Peers(ChangeCounter(settings.data_dir), reload)
    except OSError as exc:
        if processes > 1:
            raise
        log.warning(
            "cannot share admin changes with other gateways on %s (%s): they see them at their next poll round",
            settings.data_dir,
            exc.strerror or exc,
        )
        return None


def create_app(
    settings: Settings, *, admin_token: str, processes: int = 1, limits: socket.socket | None = None
) -> web.Application:
    """Build the gateway. Raises PlacementFileError if the override file is unusable, StoreError if the
    database cannot be opened or migrated. ``processes`` > 1: one of the processes of `turnout serve
    --workers N`: its rate and token limits are counted by the supervisor through ``limits`` (its end of the
    supervisor's socket pair) unless Redis is configured; admin changes are shared."""
    placement = PlacementStore(settings.placement_file)
    placement.load()
    database = Database(database_url(settings.storage.database_url, settings.data_dir))
    database.migrate()
    keys, usage = KeyStore(database), UsageStore(database)
    accountant = Accountant(settings, keys, usage, limiter=_limiter(settings, processes, limits))
    secrets = SecretBox.load(settings.data_dir, settings.endpoint_env.secret_key)
    fleet = Fleet(settings, placement)
    listings = ModelListings(database)
    fleet.first_listed.update(listings.all())  # models listed before (by this process's siblings, or last run)
    fleet.keep_listing = listings.keep
    metrics = Metrics(fleet)
    accountant.usage.on_dropped = metrics.usage_rows_dropped.inc
    client = UpstreamClient(
        connect_timeout_s=settings.limits.connect_timeout_s,
        total_timeout_s=settings.limits.upstream_timeout_s,
    )
    dispatcher = Dispatcher(
        fleet,
        settings.routing,
        metrics,
        retry_after_s=max(1, int(settings.health.interval_s)),
        tenants=settings.tenants,
    )
    poller = Poller(fleet, client, on_change=dispatcher.wake_all)
    endpoints = EndpointManager(settings, fleet, client, EndpointStore(database), secrets)
    endpoints.on_change = dispatcher.wake_all

    app = web.Application(
        middlewares=[_middleware],
        client_max_size=settings.limits.max_body_bytes,
        # server and access logs that never print a secret; the access log says who asked for what
        handler_args={**handler_args(), "access_log_class": AccessLog},
    )
    app[SETTINGS] = settings
    app[FLEET] = fleet
    app[METRICS] = metrics
    app[DISPATCHER] = dispatcher
    app[POLLER] = poller
    app[PROXY] = Proxy(settings, fleet, dispatcher, client, metrics)
    app[ADMIN_AUTH] = AdminAuth(admin_token)
    app[DATABASE] = database
    app[KEYS] = keys
    app[USAGE] = usage
    app[AUDIT] = AuditLog(database)
    app[ACCOUNTANT] = accountant
    app[SIGNINS] = AdminSignIns()
    app[ENDPOINTS] = endpoints
    claims = _claim_bindings(settings, fleet, client, metrics)
    if claims is not None:
        claims.on_change = dispatcher.wake_all
        app[PROXY].claims = claims
    app[PEERS] = _peers(settings, processes, lambda: _catch_up(app))
    add_client_routes(app)
    add_admin_routes(app)
    add_account_routes(app)
    add_endpoint_routes(app)
    add_backup_routes(app)
    add_ui_routes(app)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)

    # Credentials with no recognisable shape, masked by value in every log line and audit entry while it runs.
    credentials = [admin_token, *(worker.api_key for worker in settings.workers)]
    credentials += [
        urlsplit(url).password for url in (settings.storage.database_url, settings.storage.redis_url) if url
    ]

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        mark = GatewayMark(settings.data_dir)  # `turnout backup restore` refuses while a gateway runs here
        for value in credentials:
            SECRETS.add(value)
        await client.start()
        await accountant.start()
        await poller.poll_all()
        poller.start()
        await endpoints.start()
        if claims is not None:
            claims.start()
        yield
        if claims is not None:
            await claims.stop()
        await endpoints.stop()
        await poller.stop()
        await accountant.close()
        await client.close()
        database.close()
        peers = app[PEERS]
        if peers is not None:
            peers.close()
        for value in credentials:
            SECRETS.discard(value)
        mark.release()

    app.cleanup_ctx.append(lifecycle)
    return app
