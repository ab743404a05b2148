"""The Persistenz / Persistence page: every state file and store with its path, size, last write and whether
a backup holds it, a backup download, and a restore upload.

The listing is what ``GET /admin/api/persistence`` answers (:func:`turnout.admin.backup_api.list_persistence`,
built from the same paths the backup uses). The download is a plain link to ``GET /admin/api/backup`` (the
secret key only when its box is ticked); the restore is ``POST /admin/api/backup/restore`` from
``static/persistence.js`` with the ZIP as a form file and the CSRF header, after a confirmation.
"""

from __future__ import annotations

from aiohttp import web

from turnout.admin.backup_api import list_persistence
from turnout.admin.ui.answers import answer
from turnout.admin.ui.display import iso, size, when
from turnout.admin.ui.render import page, render

__all__ = ["add_persistence_routes"]


@page
async def persistence_page(request: web.Request) -> web.StreamResponse:
    body = await answer(list_persistence, request)
    return render(
        request,
        "persistence.html",
        active="ui.persistence",
        data_dir=body["data_dir"],
        store=body["store"],
        entries=body["entries"],
        when=when,
        iso=iso,
        size=size,
    )


def add_persistence_routes(app: web.Application) -> None:
    app.router.add_get("/admin/persistence", persistence_page, name="ui.persistence")
