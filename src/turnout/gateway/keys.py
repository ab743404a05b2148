"""Typed keys for the objects hung off the aiohttp application (no module globals)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from turnout.admin.accounts import AdminSignIns
    from turnout.admin.auth import AdminAuth
    from turnout.config import Settings
    from turnout.fleet.endpoints import EndpointManager
    from turnout.fleet.poller import Poller
    from turnout.fleet.state import Fleet
    from turnout.gateway.accounting import Accountant
    from turnout.gateway.dispatch import Dispatcher
    from turnout.gateway.proxy import Proxy
    from turnout.metrics import Metrics
    from turnout.store.audit import AuditLog
    from turnout.store.db import Database
    from turnout.store.keys import KeyStore
    from turnout.store.usage import UsageStore

__all__ = [
    "ACCOUNTANT",
    "ADMIN_AUTH",
    "AUDIT",
    "AUDIT_ACTOR",
    "DATABASE",
    "DISPATCHER",
    "ENDPOINTS",
    "FLEET",
    "KEYS",
    "METRICS",
    "POLLER",
    "PROXY",
    "SETTINGS",
    "SIGNINS",
    "USAGE",
]

SETTINGS: web.AppKey[Settings] = web.AppKey("settings")
FLEET: web.AppKey[Fleet] = web.AppKey("fleet")
DISPATCHER: web.AppKey[Dispatcher] = web.AppKey("dispatcher")
PROXY: web.AppKey[Proxy] = web.AppKey("proxy")
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
POLLER: web.AppKey[Poller] = web.AppKey("poller")
ADMIN_AUTH: web.AppKey[AdminAuth] = web.AppKey("admin_auth")
ACCOUNTANT: web.AppKey[Accountant] = web.AppKey("accountant")
DATABASE: web.AppKey[Database] = web.AppKey("database")
KEYS: web.AppKey[KeyStore] = web.AppKey("keys")
AUDIT: web.AppKey[AuditLog] = web.AppKey("audit")
USAGE: web.AppKey[UsageStore] = web.AppKey("usage")
SIGNINS: web.AppKey[AdminSignIns] = web.AppKey("signins")
ENDPOINTS: web.AppKey[EndpointManager] = web.AppKey("endpoints")
# Who an admin request's audit entries name: "admin-api" (Bearer token) unless set, "admin-ui" for a browser session.
AUDIT_ACTOR: web.RequestKey[str] = web.RequestKey("audit_actor")
