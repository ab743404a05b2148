"""The "AI models / endpoints" page: registered external endpoints with their live state and since when,
the Add / Edit form with "Test connection" before saving, and Remove.

The list is what ``GET /admin/api/endpoints`` answers (:func:`turnout.admin.endpoints_api.list_endpoints`),
rendered as a fragment (``/admin/endpoints/fragment``) the page polls, so states refresh without a reload.
Every change and test is a call from ``static/endpoints.js`` to the JSON API: ``POST /admin/api/endpoints/test``
(a dry run of the unsaved form), ``POST /admin/api/endpoints``, ``PATCH`` / ``DELETE
/admin/api/endpoints/{name}`` with the row's ``If-Match``, ``POST /admin/api/endpoints/{name}/test``. Which
field a failed check is about, and whether a URL is private, come from the API's answers.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from turnout.admin.endpoints_api import list_endpoints
from turnout.admin.ui.answers import answer
from turnout.admin.ui.display import iso, ms, when
from turnout.admin.ui.render import page, render

__all__ = ["POLL_S", "add_endpoints_routes"]

POLL_S = 5  # the list refreshes this often


async def _state(request: web.Request) -> dict[str, Any]:
    body = await answer(list_endpoints, request)
    return {
        "endpoints": body["endpoints"],
        "private_allowed": body.get("private_networks_allowed", True),
        "poll_s": POLL_S,
        "when": when,
        "iso": iso,
        "ms": ms,
    }


@page
async def endpoints_page(request: web.Request) -> web.StreamResponse:
    return render(request, "endpoints.html", active="ui.endpoints", **await _state(request))


@page
async def endpoints_fragment(request: web.Request) -> web.StreamResponse:
    return render(request, "_endpoints_list.html", **await _state(request))


def add_endpoints_routes(app: web.Application) -> None:
    app.router.add_get("/admin/endpoints", endpoints_page, name="ui.endpoints")
    app.router.add_get("/admin/endpoints/fragment", endpoints_fragment, name="ui.endpoints.fragment")
