"""`create_app(settings)`: builds every object and wires the gateway, the admin API and UI, and the local claims
controller onto one aiohttp application. The composition root: the one module that imports every package, so
that none of them has to import the packages above it (docs/architecture.md draws the layers).

Request flow: frame (admin gate, error rendering, metrics; :mod:`turnout.gateway.frame`) -> handler -> Call ->
Dispatcher (route + slots + queue) -> Proxy (worker). Background: the fleet Poller, endpoint checks, claims.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from turnout.admin.accounts import add_account_routes
from turnout.admin.api import add_admin_routes
from turnout.admin.auth import AdminAuth
from turnout.admin.backup_api import add_backup_routes
from turnout.admin.changes import AdminSignIns
from turnout.admin.endpoints_api import add_endpoint_routes
from turnout.admin.keys import ADMIN_AUTH, SIGNINS
from turnout.admin.ui import add_ui_routes, check_admin
from turnout.config import ConfigError, Settings
from turnout.controller.claim_sources import LocalSource
from turnout.controller.local import ClaimFiles, LocalController, Pool, policy_text
from turnout.controller.metrics import ControllerMetrics
from turnout.fleet.claims import ClaimBindings, RedisWakeLock
from turnout.fleet.endpoints import EndpointManager
from turnout.fleet.poller import Poller
from turnout.fleet.state import Fleet
from turnout.gateway.access import AccessLog
from turnout.gateway.accounting import Accountant
from turnout.gateway.dispatch import Dispatcher
from turnout.gateway.frame import middleware
from turnout.gateway.keys import (
    ACCOUNTANT,
    ADMIN_GATE,
    AUDIT,
    DATABASE,
    DISPATCHER,
    ENDPOINTS,
    FLEET,
    KEYS,
    METRICS,
    PEERS,
    POLLER,
    PROXY,
    SETTINGS,
    USAGE,
)
from turnout.gateway.limiter import LocalLimiter, RedisLimiter, TokenLimiter
from turnout.gateway.peers import Peers
from turnout.gateway.proxy import Proxy
from turnout.gateway.routes import add_client_routes
from turnout.gateway.shared_limits import SharedLimiter
from turnout.gateway.shared_prefixes import SharedPrefixes
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

__all__ = ["create_app"]

log = logging.getLogger("turnout.gateway")


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
    supervisor's socket pair) unless Redis is configured; admin changes are shared, and so are the records of
    the workers' prefix indexes (through ``limits`` too)."""
    placement = PlacementStore(settings.placement_file)
    placement.load()
    database = Database(database_url(settings.storage.database_url, settings.data_dir))
    database.migrate()
    keys, usage = KeyStore(database), UsageStore(database)
    limiter = _limiter(settings, processes, limits)
    accountant = Accountant(settings, keys, usage, limiter=limiter)
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
    shared = None
    if processes > 1 and limits is not None:  # one prefix index for all the processes
        channel = limiter if isinstance(limiter, SharedLimiter) else SharedLimiter(limits)
        shared = dispatcher.shared = SharedPrefixes(channel, fleet)
    poller = Poller(fleet, client, on_change=dispatcher.wake_all)
    endpoints = EndpointManager(settings, fleet, client, EndpointStore(database), secrets)
    endpoints.on_change = dispatcher.wake_all

    app = web.Application(
        middlewares=[middleware],
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
    app[ADMIN_GATE] = check_admin
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
        if shared is not None:
            shared.listen()
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
