"""Typed keys for the objects hung off the aiohttp application (no module globals)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from turnout.admin.auth import AdminAuth
    from turnout.config import Settings
    from turnout.fleet.poller import Poller
    from turnout.fleet.state import Fleet
    from turnout.gateway.dispatch import Dispatcher
    from turnout.gateway.proxy import Proxy
    from turnout.metrics import Metrics

__all__ = ["ADMIN_AUTH", "DISPATCHER", "FLEET", "METRICS", "POLLER", "PROXY", "SETTINGS"]

SETTINGS: web.AppKey[Settings] = web.AppKey("settings")
FLEET: web.AppKey[Fleet] = web.AppKey("fleet")
DISPATCHER: web.AppKey[Dispatcher] = web.AppKey("dispatcher")
PROXY: web.AppKey[Proxy] = web.AppKey("proxy")
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
POLLER: web.AppKey[Poller] = web.AppKey("poller")
ADMIN_AUTH: web.AppKey[AdminAuth] = web.AppKey("admin_auth")
