"""The Batches page: the OpenAI Batch API's batches of every app (a team-admin: their tenants'), newest first, each
with its state, progress (lines answered of the total, those that failed), its window and its files; filters by app
and state; a cancel for a batch that still runs.

The list is what ``GET /admin/api/batches`` answers for the page's query (:func:`turnout.admin.batches_api.
list_batch_views`), rendered as a fragment (``/admin/batches/fragment``) that htmx reloads every few seconds while
the page is open and after a cancel; the cancel is ``static/batches.js`` calling
``POST /admin/api/batches/{id}/cancel``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from turnout.admin.accounts import list_apps
from turnout.admin.batches_api import list_batches
from turnout.admin.ui.answers import answer, without_blanks
from turnout.admin.ui.display import iso, number, when
from turnout.admin.ui.render import page, render
from turnout.core.batches import STATUSES, can_cancel

__all__ = ["POLL_S", "add_batches_routes"]

POLL_S = 5
FILTERS = ("app", "status")


async def _state(request: web.Request) -> dict[str, Any]:
    batches = (await answer(list_batches, without_blanks(request)))["batches"]
    filters = {name: request.query.get(name, "") for name in FILTERS}
    return {
        "batches": batches,
        "apps": (await answer(list_apps, request))["apps"],
        "statuses": STATUSES,
        "filters": filters,
        "filter_query": urlencode({k: v for k, v in filters.items() if v}),
        "filtered": any(filters.values()),
        "poll_s": POLL_S,
        "cancellable": can_cancel,
        "when": when,
        "iso": iso,
        "number": number,
    }


@page
async def batches_page(request: web.Request) -> web.StreamResponse:
    return render(request, "batches.html", active="ui.batches", **await _state(request))


@page
async def batches_fragment(request: web.Request) -> web.StreamResponse:
    return render(request, "_batches_list.html", **await _state(request))


def add_batches_routes(app: web.Application) -> None:
    app.router.add_get("/admin/batches", batches_page, name="ui.batches")
    app.router.add_get("/admin/batches/fragment", batches_fragment, name="ui.batches.fragment")
