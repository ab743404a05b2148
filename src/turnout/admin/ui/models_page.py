"""The "Model aliases" page (``/admin/models``): the aliases in force (model, source, where served, what each
hides), add or change one, remove a runtime one; and the models and aliases clients can ask for, with where each
is served.

The lists are what ``GET /admin/api/aliases`` and ``GET /admin/api/models`` answer
(:mod:`turnout.admin.aliases_api`), rendered as a fragment (``/admin/models/fragment``) that is reloaded after
every change and every :data:`POLL_S` seconds. Changes are calls from ``static/models.js`` to the JSON API:
``PUT /admin/api/aliases/{name}`` (with the row's ``If-Match`` when changing one) and ``DELETE`` with the row's
``If-Match``; a 422 is shown next to its field, a 412 says the list changed meanwhile.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from turnout.admin.aliases_api import list_aliases, list_models
from turnout.admin.ui.answers import answer
from turnout.admin.ui.display import iso, when
from turnout.admin.ui.render import page, render

__all__ = ["POLL_S", "add_models_routes"]

POLL_S = 10


async def _state(request: web.Request) -> dict[str, Any]:
    aliases = await answer(list_aliases, request)
    models = (await answer(list_models, request))["models"]
    return {
        "aliases": aliases["aliases"],
        "problems": aliases["problems"],
        "models": models,
        "model_names": sorted({m["alias_of"] or m["name"] for m in models}),
        "poll_s": POLL_S,
        "when": when,
        "iso": iso,
    }


@page
async def models_page(request: web.Request) -> web.StreamResponse:
    return render(request, "models.html", active="ui.models", **await _state(request))


@page
async def models_fragment(request: web.Request) -> web.StreamResponse:
    return render(request, "_models_list.html", **await _state(request))


def add_models_routes(app: web.Application) -> None:
    app.router.add_get("/admin/models", models_page, name="ui.models")
    app.router.add_get("/admin/models/fragment", models_fragment, name="ui.models.fragment")
