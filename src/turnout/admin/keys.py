"""Typed keys for the admin package's objects on the aiohttp application and its requests."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from turnout.admin.auth import AdminAuth
    from turnout.admin.changes import AdminSignIns
    from turnout.store.people import PeopleStore

__all__ = ["ADMIN_AUTH", "PEOPLE", "SIGNINS"]

ADMIN_AUTH: web.AppKey[AdminAuth] = web.AppKey("admin_auth")
SIGNINS: web.AppKey[AdminSignIns] = web.AppKey("signins")
PEOPLE: web.AppKey[PeopleStore] = web.AppKey("people")
