"""The Audit page: the audit log newest first, filtered by action, actor, target and time, each entry's
before and after side by side with the changed fields named.

Entries are what ``GET /admin/api/audit`` answers for the page's query (:func:`turnout.admin.accounts.audit`:
the same filters and checks); the filter menus list what ``GET /admin/api/audit/facets`` answers. A bad
filter (an unreadable time, say) is shown next to its field and the page lists nothing.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from turnout.admin.accounts import audit, audit_facets
from turnout.admin.ui.answers import answer, without_blanks
from turnout.admin.ui.display import changes, iso, pretty, when
from turnout.admin.ui.render import page, render
from turnout.errors import Unprocessable

__all__ = ["FILTERS", "add_audit_routes"]

FILTERS = ("action", "actor", "target", "since", "until", "limit")


def _entry(entry: dict[str, Any]) -> dict[str, Any]:
    before, after = entry["before"], entry["after"]
    return {
        **entry,
        "before_text": None if before is None else pretty(before),
        "after_text": None if after is None else pretty(after),
        "changes": changes(before, after),
        "size": max((len(x) if isinstance(x, dict) else 1 for x in (before, after) if x is not None), default=0),
    }


@page
async def audit_page(request: web.Request) -> web.StreamResponse:
    filters = {name: request.query.get(name, "") for name in FILTERS}
    error: dict[str, Any] | None = None
    try:
        entries = (await answer(audit, without_blanks(request)))["entries"]
    except Unprocessable as exc:
        entries, error = [], {"field": (exc.field or "").split(".")[0].split("[")[0], "message": exc.message}
    facets = await answer(audit_facets, request)
    return render(
        request,
        "audit.html",
        active="ui.audit",
        entries=[_entry(e) for e in entries],
        actions=facets["actions"],
        actors=facets["actors"],
        filters=filters,
        filtered=any(filters.values()),
        error=error,
        when=when,
        iso=iso,
    )


def add_audit_routes(app: web.Application) -> None:
    app.router.add_get("/admin/audit", audit_page, name="ui.audit")
