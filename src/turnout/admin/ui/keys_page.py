"""The Keys page: API keys with their state (active / revoked / expired / in grace until T), last use,
scopes, limits and priority class (the key's own, or its tenant's default); filters by tenant, app, endpoint and
state; create (the key shown once), edit scopes, limits and class, rotate with a grace period, revoke.

The list is what ``GET /admin/api/keys`` answers for the page's own query (:func:`turnout.admin.accounts.
list_keys`: the same filters, computed state, ``last_used`` and ETag), rendered as a fragment
(``/admin/keys/fragment``) that is reloaded after every change and every 30 s (a grace period ends on its
own). Changes are calls from ``static/keys.js`` to the JSON API with the row's ``If-Match``. The page is
served ``no-store`` (it shows a new key once).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from turnout.admin.accounts import list_apps, list_keys, list_tenants
from turnout.admin.ui.answers import answer, without_blanks
from turnout.admin.ui.display import iso, number, when
from turnout.admin.ui.render import page, render
from turnout.core.priority import CLASSES
from turnout.gateway.keys import ENDPOINTS, SETTINGS
from turnout.store.keys import KEY_STATES

__all__ = ["FILTERS", "POLL_S", "add_keys_routes"]

POLL_S = 30
FILTERS = ("tenant", "app", "endpoint", "state")


async def _state(request: web.Request) -> dict[str, Any]:
    keys = (await answer(list_keys, without_blanks(request)))["keys"]
    filters = {name: request.query.get(name, "") for name in FILTERS}
    return {
        "keys": keys,
        "tenants": (await answer(list_tenants, request))["tenants"],
        "apps": (await answer(list_apps, request))["apps"],
        "endpoint_names": sorted(e["name"] for e in request.app[ENDPOINTS].describe()),
        "states": KEY_STATES,
        "classes": [p.value for p in CLASSES],
        "filters": filters,
        "filter_query": urlencode({k: v for k, v in filters.items() if v}),
        "filtered": any(filters.values()),
        "grace_h": round(request.app[SETTINGS].auth.rotate_grace_s / 3600, 2),
        "poll_s": POLL_S,
        "when": when,
        "iso": iso,
        "number": number,
    }


@page
async def keys_page(request: web.Request) -> web.StreamResponse:
    return render(request, "keys.html", active="ui.keys", **await _state(request))


@page
async def keys_fragment(request: web.Request) -> web.StreamResponse:
    return render(request, "_keys_list.html", **await _state(request))


def add_keys_routes(app: web.Application) -> None:
    app.router.add_get("/admin/keys", keys_page, name="ui.keys")
    app.router.add_get("/admin/keys/fragment", keys_fragment, name="ui.keys.fragment")
