"""Typed keys for the objects hung off the aiohttp application (no module globals)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

if TYPE_CHECKING:
    from turnout.config import Settings
    from turnout.fleet.endpoints import EndpointManager
    from turnout.fleet.poller import Poller
    from turnout.fleet.state import Fleet
    from turnout.gateway.accounting import Accountant
    from turnout.gateway.aliases import Aliases
    from turnout.gateway.dispatch import Dispatcher
    from turnout.gateway.peers import Peers
    from turnout.gateway.proxy import Proxy
    from turnout.gateway.stored import StoredResponses
    from turnout.metrics import Metrics
    from turnout.store.audit import AuditLog
    from turnout.store.batches import BatchStore
    from turnout.store.db import Database
    from turnout.store.keys import KeyStore
    from turnout.store.usage import UsageStore

__all__ = [
    "ACCOUNTANT",
    "ADMIN_GATE",
    "ALIASES",
    "AUDIT",
    "BATCH_RUNNER",
    "BATCH_STORE",
    "DATABASE",
    "DISPATCHER",
    "ENDPOINTS",
    "FLEET",
    "KEYS",
    "METRICS",
    "PEERS",
    "POLLER",
    "PROXY",
    "REQUEST_IDS",
    "SETTINGS",
    "STORED",
    "USAGE",
]

SETTINGS: web.AppKey[Settings] = web.AppKey("settings")
FLEET: web.AppKey[Fleet] = web.AppKey("fleet")
DISPATCHER: web.AppKey[Dispatcher] = web.AppKey("dispatcher")
PROXY: web.AppKey[Proxy] = web.AppKey("proxy")
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
POLLER: web.AppKey[Poller] = web.AppKey("poller")
ACCOUNTANT: web.AppKey[Accountant] = web.AppKey("accountant")
DATABASE: web.AppKey[Database] = web.AppKey("database")
KEYS: web.AppKey[KeyStore] = web.AppKey("keys")
AUDIT: web.AppKey[AuditLog] = web.AppKey("audit")
USAGE: web.AppKey[UsageStore] = web.AppKey("usage")
ENDPOINTS: web.AppKey[EndpointManager] = web.AppKey("endpoints")
ALIASES: web.AppKey[Aliases] = web.AppKey("aliases")  # the model aliases in force (turnout.gateway.aliases)
BATCH_STORE: web.AppKey[BatchStore] = web.AppKey("batch_store")  # the Batch API's files, batches, answers


class BatchNudge(Protocol):
    """What the Batch API's routes tell this process's batch runner (:class:`turnout.gateway.batch_runner.BatchRunner`,
    which imports the gateway's handlers: named here by what it does)."""

    def nudge(self) -> None: ...
    def cancelled(self, batch_id: str) -> None: ...


BATCH_RUNNER: web.AppKey[BatchNudge] = web.AppKey("batch_runner")  # runs this process's share of the batches
STORED: web.AppKey[StoredResponses] = web.AppKey("stored_responses")  # the Responses API's stored answers
# Other gateway processes on this data dir (None only where the data dir has no change counter).
PEERS: web.AppKey[Peers] = web.AppKey("peers")
# The admin package's gate for /admin/... (who asks, and whether their role may), run by the request frame before
# the handler: None lets the request in, a response is the refusal to send instead (a UI page's 403); set by
# turnout.wiring.create_app, so that the gateway does not import the admin package it serves.
ADMIN_GATE: web.AppKey[Callable[[web.Request], Awaitable[web.StreamResponse | None]]] = web.AppKey("admin_gate")
# The ids of this process's requests, for APIs whose answers carry one (turnout.gateway.frame.request_ids).
REQUEST_IDS: web.AppKey[Iterator[str]] = web.AppKey("request_ids")
