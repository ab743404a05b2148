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
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from aiohttp import web

from turnout.admin.accounts import add_account_routes
from turnout.admin.aliases_api import add_alias_routes
from turnout.admin.api import add_admin_routes
from turnout.admin.auth import AdminAuth
from turnout.admin.backup_api import add_backup_routes
from turnout.admin.batches_api import add_batch_routes
from turnout.admin.changes import AdminSignIns
from turnout.admin.endpoints_api import add_endpoint_routes
from turnout.admin.keys import ADMIN_AUTH, PEOPLE, SIGNINS
from turnout.admin.people_api import add_people_routes
from turnout.admin.ui import add_ui_routes, check_admin
from turnout.config import ConfigError, Settings
from turnout.controller.claim_sources import LocalSource
from turnout.controller.local import ClaimFiles, LocalController, Pool, policy_text
from turnout.controller.metrics import ControllerMetrics
from turnout.core import demo as demo_rules
from turnout.core.prefix import PrefixIndex
from turnout.fleet.claims import ClaimBindings, RedisWakeLock
from turnout.fleet.endpoints import EndpointManager
from turnout.fleet.poller import Poller
from turnout.fleet.state import MAX_SESSIONS, Fleet
from turnout.gateway.access import AccessLog
from turnout.gateway.accounting import Accountant
from turnout.gateway.aliases import Aliases
from turnout.gateway.batch_lease import Leases, RedisLeases, SqlLeases
from turnout.gateway.batch_runner import BatchRunner
from turnout.gateway.dispatch import Dispatcher
from turnout.gateway.frame import middleware, request_ids
from turnout.gateway.keys import (
    ACCOUNTANT,
    ADMIN_GATE,
    ALIASES,
    AUDIT,
    BATCH_RUNNER,
    BATCH_STORE,
    DATABASE,
    DISPATCHER,
    ENDPOINTS,
    FLEET,
    KEYS,
    METRICS,
    PEERS,
    POLLER,
    PROXY,
    REQUEST_IDS,
    SETTINGS,
    STORED,
    USAGE,
)
from turnout.gateway.limiter import LocalLimiter, RedisLimiter, TokenLimiter
from turnout.gateway.peers import Peers
from turnout.gateway.process_metrics import every_process
from turnout.gateway.proxy import Proxy
from turnout.gateway.redis_fleet import FleetSync, SharedProbes
from turnout.gateway.redis_occupancy import RedisOccupancy
from turnout.gateway.routes import add_client_routes
from turnout.gateway.shared_limits import SharedLimiter
from turnout.gateway.stored import StoredResponses
from turnout.gateway.supervised import SupervisedOccupancy
from turnout.masking import SECRETS
from turnout.metrics import Metrics
from turnout.redaction import handler_args
from turnout.runtime.demo import DemoAgent
from turnout.runtime.demo_install import model_path
from turnout.state.changes import ChangeCounter
from turnout.state.placement_shared import SharedPlacementStore
from turnout.state.running import GatewayMark
from turnout.store.aliases import AliasStore
from turnout.store.audit import AuditLog
from turnout.store.batches import BatchStore
from turnout.store.db import Database, database_url
from turnout.store.endpoints import EndpointStore
from turnout.store.keys import KeyStore
from turnout.store.listings import ModelListings
from turnout.store.people import PeopleStore
from turnout.store.responses import ResponseStore
from turnout.store.secrets import SecretBox
from turnout.store.shared_state import SharedState
from turnout.store.usage import UsageStore
from turnout.upstream.client import UpstreamClient

if TYPE_CHECKING:
    from turnout.gateway.tracing import Tracing

__all__ = ["DEMO", "create_app"]

log = logging.getLogger("turnout.gateway")

DEMO: web.AppKey[DemoAgent | None] = web.AppKey("demo")  # the demo model's pool agent, when the demo runs
DEMO_TICK_S = 1.0  # the claims tick when only the demo pool runs (no pools section): ready a second sooner


async def _metrics(request: web.Request) -> web.Response:
    body = await every_process(request.app)  # (one process's own unless `serve --workers N` runs several)
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def _healthz(request: web.Request) -> web.Response:
    fleet = request.app[FLEET]
    up = sum(1 for w in fleet.workers.values() if w.healthy)
    occupancy = request.app[DISPATCHER].occupancy
    # pid: which gateway process answered (`turnout serve --workers N` runs several on one port); shared_state: with
    # storage.redis_url, whether the replicas' shared routing state (Redis) answers ("local": this replica's own)
    body: dict[str, object] = {"status": "ok", "workers": len(fleet.workers), "healthy_workers": up, "pid": os.getpid()}
    if isinstance(occupancy, RedisOccupancy):
        body["shared_state"] = "redis" if occupancy.up else "local"
        body["replicas"] = occupancy.replicas
    return web.json_response(body)


def _claim_bindings(
    settings: Settings, fleet: Fleet, client: UpstreamClient, metrics: Metrics, demo: DemoAgent | None
) -> ClaimBindings | None:
    if settings.pools is None and demo is None:
        return None
    redis_url = settings.storage.redis_url
    lock = RedisWakeLock(redis_url) if redis_url else None
    if settings.pools is not None and settings.pools.kubernetes is not None:
        if demo is not None:
            raise ConfigError(
                "the demo model runs on the gateway's own local controller, and pools.kubernetes leaves claims to "
                "the operator: serve without the demo model (--no-demo)"
            )
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
        for a in (settings.pools.agents if settings.pools is not None else [])
    ]
    if demo is not None and settings.demo is not None:
        if any(p.name == demo.pool for p in pools):  # `serve --demo` on such a config (the file's own is refused)
            raise ConfigError(
                f"the demo model's pool is named {demo.pool}, as a pool of pools.agents is: rename that pool, or "
                "serve without the demo model (--no-demo)"
            )
        policy = demo_rules.pool_policy(settings.demo.sleep_after_s)
        pools.append(Pool(demo.pool, demo.url, "127.0.0.1", 1, demo_rules.pool_labels(demo.pool), policy_text(policy)))
    files = ClaimFiles(settings.data_dir)
    controller = LocalController(files, pools, client, metrics=ControllerMetrics(metrics.registry))
    interval = settings.pools.interval_s if settings.pools is not None else DEMO_TICK_S
    return ClaimBindings(fleet, LocalSource(controller), interval, lock)


def _demo(settings: Settings) -> DemoAgent | None:
    """The demo model's pool agent and its claim (applied in the data dir, as `turnout claim apply` would), when
    the settings run the demo; otherwise a demo claim an earlier start left behind is removed (only the one this
    gateway wrote: it carries the demo label)."""
    files = ClaimFiles(settings.data_dir)
    path = files.dir / f"{demo_rules.MODEL}.json"
    if settings.demo is None:
        left = files.read(demo_rules.MODEL) if path.exists() else None
        if left is not None and demo_rules.DEMO_LABEL in left.get("metadata", {}).get("labels", {}):
            files.remove(demo_rules.MODEL)
        return None
    model = model_path()
    if model is None:
        raise ConfigError(
            f"the demo model is not installed: {demo_rules.missing_line(('model',))}, or serve without it (--no-demo)"
        )
    document = demo_rules.claim_document(settings.demo.name, str(model), settings.demo.threads)
    current = files.read(demo_rules.MODEL)
    if current is not None and demo_rules.DEMO_LABEL not in current.get("metadata", {}).get("labels", {}):
        raise ConfigError(
            f"a claim named {demo_rules.MODEL} that is not the demo's is in {files.dir}: delete it (turnout claim "
            "delete) or serve without the demo model (--no-demo)"
        )
    if current is None or current.get("deleting") or current.get("spec") != document["spec"]:
        files.apply(document)
    return DemoAgent(settings.demo.name, settings.data_dir)


def _limiter(settings: Settings, processes: int, limits: socket.socket | None) -> TokenLimiter:
    """Redis when configured (any number of replicas), else the supervisor of `--workers N` (``limits``: this
    process's channel to it), else memory: each is exact for the processes that share it."""
    if settings.storage.redis_url:
        return RedisLimiter(settings.storage.redis_url, timeout_s=settings.storage.redis_timeout_ms / 1000)
    if limits is not None:
        return SharedLimiter(limits)
    if processes > 1:  # counting in memory here would give each process the whole limit
        raise ValueError("a process of `turnout serve --workers N` counts limits through its supervisor (limits=)")
    return LocalLimiter()


def _occupancy(settings: Settings, fleet: Fleet, metrics: Metrics) -> RedisOccupancy | None:
    """Redis keeps the requests in flight and the queue for every replica when configured; else the dispatcher keeps
    them in memory."""
    url = settings.storage.redis_url
    if not url:
        return None
    routing = settings.routing

    def index(worker: str) -> PrefixIndex | None:
        state = fleet.workers.get(worker)
        return None if state is None else state.prefix

    return RedisOccupancy(
        url,
        timeout_s=settings.storage.redis_timeout_ms / 1000,
        index=index,
        tenant_caps={name: tenant.max_concurrent for name, tenant in settings.tenants.items()},
        max_blocks=routing.prefix_max_blocks,
        max_sessions=MAX_SESSIONS,
        prefix_ttl_s=routing.prefix_ttl_s,
        on_change=metrics.shared_state,
    )


async def _catch_up(app: web.Application) -> None:
    """Re-read what another process or replica of this gateway changed through its admin API (people and their
    tokens are read from the store on every use: nothing of them is kept)."""
    app[ACCOUNTANT].forget()
    await app[FLEET].placement.pull()
    await app[ENDPOINTS].sync()
    await app[ALIASES].reload()
    app[DISPATCHER].wake_all()


def _peers(settings: Settings, processes: int, shared: SharedState, reload: Callable[[], Awaitable[None]]) -> Peers:
    """The other gateway processes on this data dir (`serve --workers N`, or replicas sharing the dir) through
    its change counter, and every replica through the store's change version (and Redis, when configured):
    their admin changes picked up, ours announced. A single process on a data dir it cannot write goes without
    the counter (the store's version still carries its changes)."""
    counter = None
    try:
        counter = ChangeCounter(settings.data_dir)
    except OSError as exc:
        if processes > 1:
            raise
        log.warning(
            "cannot share admin changes through %s (%s): other gateways there take them from the store's poll",
            settings.data_dir,
            exc.strerror or exc,
        )
    return Peers(reload, counter=counter, shared=shared, redis_url=settings.storage.redis_url)


def _tracing(settings: Settings, metrics: Metrics) -> Tracing | None:
    """Traces to an OTLP collector, when one is configured (the OpenTelemetry SDK is imported only then)."""
    if settings.telemetry.otlp_endpoint is None:
        return None
    from turnout.gateway.tracing import Tracing

    return Tracing(settings.telemetry, metrics)


def _dispatcher(
    settings: Settings,
    fleet: Fleet,
    metrics: Metrics,
    limiter: TokenLimiter,
    processes: int,
    limits: socket.socket | None,
) -> tuple[RedisOccupancy | None, SharedLimiter | None, Dispatcher]:
    """The dispatcher on the occupancy this process shares: Redis's (replicas), the supervisor's (`serve --workers
    N` without Redis: ``channel``, its end of the supervisor's socket pair), or its own."""
    occupancy = _occupancy(settings, fleet, metrics)
    if occupancy is not None and isinstance(limiter, RedisLimiter):
        limiter.replicas = lambda: occupancy.replicas  # each one's share of a limit while Redis is away
    channel = None
    supervised = None
    if occupancy is None and processes > 1 and limits is not None:  # the supervisor keeps it for every process
        channel = limiter if isinstance(limiter, SharedLimiter) else SharedLimiter(limits)
        supervised = SupervisedOccupancy(channel)
        channel.on_told = supervised.told
    dispatcher = Dispatcher(
        fleet,
        settings.routing,
        metrics,
        retry_after_s=max(1, int(settings.health.interval_s)),
        tenants=settings.tenants,
        occupancy=occupancy or supervised,
    )
    return occupancy, channel, dispatcher


def _batch_runner(
    app: web.Application, settings: Settings, database: Database, keys: KeyStore, aliases: Aliases
) -> BatchRunner:
    """The Batch API's store and runner: one runner per batch at a time, by a lease in Redis or the store."""
    batch_store = app[BATCH_STORE] = BatchStore(database)
    leases: Leases = (
        RedisLeases(settings.storage.redis_url, settings.batches.lease_s)
        if settings.storage.redis_url
        else SqlLeases(batch_store, settings.batches.lease_s)
    )
    return BatchRunner(
        app, batch_store, settings.batches, leases, keys=keys, aliases=aliases, request_ids=app[REQUEST_IDS]
    )


def _claims_changed(proxy: Proxy, dispatcher: Dispatcher, fleet: Fleet, demo: DemoAgent | None) -> Callable[[], None]:
    """What a change of the claims sets going: waiters route again, the proxy learns which claims' engines schedule
    by priority, and the demo says it is ready once its model is bound."""

    def changed() -> None:
        dispatcher.wake_all()
        proxy.claims_changed()
        if demo is not None and demo_rules.MODEL in fleet.bindings:
            demo.announce_ready()

    return changed


def _add_routes(app: web.Application) -> None:
    add_client_routes(app)
    add_admin_routes(app)
    add_account_routes(app)
    add_endpoint_routes(app)
    add_alias_routes(app)
    add_backup_routes(app)
    add_batch_routes(app)
    add_people_routes(app)
    add_ui_routes(app)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)


def _credentials(settings: Settings, admin_token: str) -> list[str | None]:
    """Credentials with no recognisable shape, masked by value in every log line and audit entry while it runs."""
    credentials = [admin_token, settings.oidc_client_secret, *(worker.api_key for worker in settings.workers)]
    credentials += [
        urlsplit(url).password for url in (settings.storage.database_url, settings.storage.redis_url) if url
    ]
    credentials += settings.telemetry.headers.values()  # a collector's credential
    return credentials


@dataclass
class _Parts:
    """What the gateway's lifecycle starts and stops (:func:`create_app`)."""

    settings: Settings
    credentials: list[str | None]
    client: UpstreamClient
    tracing: Tracing | None
    occupancy: RedisOccupancy | None
    channel: SharedLimiter | None
    accountant: Accountant
    poller: Poller
    sync: FleetSync | None
    endpoints: EndpointManager
    aliases: Aliases
    demo: DemoAgent | None
    claims: ClaimBindings | None
    batch_runner: BatchRunner
    peers: Peers
    database: Database


async def _lifecycle(app: web.Application, parts: _Parts) -> AsyncIterator[None]:
    """Start what the gateway runs, in order; stop it in reverse when the app stops."""
    p = parts
    mark = GatewayMark(p.settings.data_dir)  # `turnout backup restore` refuses while a gateway runs here
    for value in p.credentials:
        SECRETS.add(value)
    await p.client.start()
    if p.tracing is not None:
        p.tracing.start()
    if p.occupancy is not None:
        await p.occupancy.start()
    if p.channel is not None:
        p.channel.listen()
    await p.accountant.start()
    await p.poller.poll_all()
    p.poller.start()
    if p.sync is not None:
        p.sync.start()
    await p.endpoints.start()
    await p.aliases.start()
    if p.demo is not None:
        await p.demo.start()
    if p.claims is not None:
        p.claims.start()
    p.batch_runner.start()
    await p.peers.start()
    yield
    await p.batch_runner.stop()  # first: its lines' answers are written while the rest still runs
    await p.peers.stop()
    if p.claims is not None:
        await p.claims.stop()
    await p.aliases.stop()
    if p.demo is not None:
        await p.demo.stop()  # after the claims loop: nothing starts the engine again
    await p.endpoints.stop()
    await p.poller.stop()
    if p.sync is not None:
        await p.sync.stop()
    if p.occupancy is not None:
        await p.occupancy.close()
    await p.accountant.close()
    await app[STORED].close()
    await p.client.close()
    if p.tracing is not None:
        await p.tracing.close()  # the last spans, the collector given at most telemetry.export_timeout_s
    p.database.close()
    p.peers.close()
    for value in p.credentials:
        SECRETS.discard(value)
    mark.release()


def create_app(
    settings: Settings, *, admin_token: str, processes: int = 1, limits: socket.socket | None = None
) -> web.Application:
    """Build the gateway. Raises PlacementFileError if the override file is unusable, StoreError if the
    database cannot be opened or migrated. ``processes`` > 1: one of the processes of `turnout serve
    --workers N`: its rate and token limits are counted by the supervisor through ``limits`` (its end of the
    supervisor's socket pair) unless Redis is configured, and so are its requests in flight, its wait queue and
    the workers' prefix indexes (through ``limits`` too); admin changes are shared."""
    database = Database.migrated(database_url(settings.storage.database_url, settings.data_dir))
    shared = SharedState(database)
    placement = SharedPlacementStore(settings.placement_file, shared)
    placement.load()
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
    occupancy, channel, dispatcher = _dispatcher(settings, fleet, metrics, limiter, processes, limits)
    poller = Poller(fleet, client, on_change=dispatcher.wake_all)
    sync = None
    if occupancy is not None:  # one probe per worker across replicas, and their learned figures pooled
        poller.probes = SharedProbes(occupancy, settings.health.interval_s)
        sync = FleetSync(occupancy, fleet)
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
    tracing = _tracing(settings, metrics)
    app[PROXY].tracing = tracing
    app[ADMIN_AUTH] = AdminAuth(admin_token, enabled=settings.auth.break_glass)
    app[PEOPLE] = PeopleStore(database)
    app[ADMIN_GATE] = check_admin
    app[DATABASE] = database
    app[KEYS] = keys
    app[USAGE] = usage
    app[AUDIT] = AuditLog(database)
    app[ACCOUNTANT] = accountant
    app[SIGNINS] = AdminSignIns()
    app[ENDPOINTS] = endpoints
    aliases = app[ALIASES] = Aliases(settings.aliases, AliasStore(database))
    app[STORED] = StoredResponses(ResponseStore(database), settings.responses.store_days)
    app[REQUEST_IDS] = request_ids()
    batch_runner = app[BATCH_RUNNER] = _batch_runner(app, settings, database, keys, aliases)
    demo = _demo(settings)
    app[DEMO] = demo
    claims = _claim_bindings(settings, fleet, client, metrics, demo)
    if claims is not None:
        app[PROXY].claims = claims
        claims.on_change = _claims_changed(app[PROXY], dispatcher, fleet, demo)
    peers = app[PEERS] = _peers(settings, processes, shared, lambda: _catch_up(app))
    _add_routes(app)
    credentials = _credentials(settings, admin_token)

    parts = _Parts(
        settings,
        credentials,
        client,
        tracing,
        occupancy,
        channel,
        accountant,
        poller,
        sync,
        endpoints,
        aliases,
        demo,
        claims,
        batch_runner,
        peers,
        database,
    )
    app.cleanup_ctx.append(lambda app: _lifecycle(app, parts))
    return app
