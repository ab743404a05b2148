"""Rendering UI pages: the Jinja2 environment, the ``@page`` decorator and ``render()``.

Every page handler is ``@page``-decorated: it runs only for a signed-in browser (others are sent to the
sign-in form, or told by ``HX-Redirect`` when the call came from htmx), a state-changing call must carry the
session's CSRF token (403, nothing changes), and a :class:`TurnoutError` it raises becomes an error page (or
an error fragment for htmx) in the user's language. ``render(request, "page.html", **context)`` gives every
template ``t`` (messages), ``lang``, ``csrf``, ``nav``, ``static`` and ``page`` (the active nav entry).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
from aiohttp import web

from turnout.admin.changes import PRINCIPAL
from turnout.admin.ui.assets import ASSETS
from turnout.admin.ui.i18n import COOKIE, LANGUAGES, Catalogs, pick_language
from turnout.admin.ui.security import cached_session, check_csrf, current_session, session_principal
from turnout.admin.ui.sessions import Session
from turnout.core.roles import Principal, decide, rule_for
from turnout.errors import NotFound, TurnoutError

__all__ = [
    "NAV",
    "UI",
    "NavEntry",
    "Ui",
    "add_not_found_route",
    "htmx",
    "language",
    "page",
    "redirect",
    "render",
    "render_fragment",
    "session_of",
    "translator",
]

TEMPLATES = Path(__file__).with_name("templates")
STATIC = Path(__file__).with_name("static")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class NavEntry:
    route: str  # the aiohttp route name; the entry is shown only once a page registered that name
    label: str  # message key


NAV = (
    NavEntry("ui.overview", "nav.overview"),
    NavEntry("ui.placement", "nav.placement"),
    NavEntry("ui.endpoints", "nav.endpoints"),
    NavEntry("ui.models", "nav.models"),
    NavEntry("ui.keys", "nav.keys"),
    NavEntry("ui.usage", "nav.usage"),
    NavEntry("ui.batches", "nav.batches"),
    NavEntry("ui.audit", "nav.audit"),
    NavEntry("ui.pools", "nav.pools"),
    NavEntry("ui.persistence", "nav.persistence"),
    NavEntry("ui.people", "nav.people"),
)


@dataclass
class Ui:
    """The UI's objects, built once per app (``app[UI]``)."""

    catalogs: Catalogs = field(default_factory=Catalogs.load)
    env: jinja2.Environment = field(
        default_factory=lambda: jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
    )


UI: web.AppKey[Ui] = web.AppKey("ui")
PAGE_SESSION: web.RequestKey[Session] = web.RequestKey("turnout_ui_page_session")


def language(request: web.Request) -> str:
    return pick_language(request.cookies.get(COOKIE), request.headers.get("Accept-Language"))


def translator(request: web.Request) -> Callable[..., str]:
    """``t(key, **fields)`` in the request's language (templates get the same ``t``)."""
    catalogs, lang = request.app[UI].catalogs, language(request)

    def t(key: str, **fields: object) -> str:
        return catalogs.text(lang, key, **fields)

    return t


def htmx(request: web.Request) -> bool:
    return request.headers.get("HX-Request") == "true"


def session_of(request: web.Request) -> Session:
    """The signed-in session of a ``@page`` handler's request."""
    return request[PAGE_SESSION]


def _context(request: web.Request, active: str | None, extra: Mapping[str, Any]) -> dict[str, Any]:
    ui = request.app[UI]
    lang = language(request)
    catalogs = ui.catalogs
    named = request.app.router.named_resources()
    session = request.get(PAGE_SESSION) or cached_session(request)
    principal: Principal | None = request.get(PRINCIPAL)
    if principal is None and session is not None:
        principal = session_principal(session)
    t = translator(request)

    def can(method: str, path: str) -> bool:
        """Whether the signed-in principal may call ``method path`` (a route template): the gate's own rule,
        so that the page hides or disables what the server would refuse."""
        return principal is not None and decide(principal, rule_for(method, path)).allowed

    nav = []
    for e in NAV:
        if e.route in named:
            url = str(named[e.route].url_for())
            if can("GET", url):
                nav.append({"url": url, "label": t(e.label), "active": e.route == active})
    return {
        "t": t,
        "lang": lang,
        "languages": [(code, catalogs.text(code, "lang.name")) for code in LANGUAGES],
        "csrf": session.csrf if session is not None else "",
        "signed_in": session is not None,
        "principal": principal,
        "can": can,
        "nav": nav,
        "page": active,
        "path": request.path_qs,
        "static": request.app[ASSETS].url,
        **extra,
    }


def render(
    request: web.Request, template: str, *, status: int = 200, active: str | None = None, **context: Any
) -> web.Response:
    """A whole page (``template`` extends ``base.html``) or a fragment, as text/html."""
    html = request.app[UI].env.get_template(template).render(_context(request, active, context))
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")


render_fragment = render  # the same call; the name says a template that does not extend base.html


def redirect(location: str) -> web.Response:
    """303 See Other (returned, not raised: the gateway's middleware turns raised HTTP errors into JSON)."""
    return web.Response(status=303, headers={"Location": location})


def page(handler: Handler) -> Handler:
    """Decorate a UI handler: signed-in only, CSRF on state changes, errors as pages."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        session = await current_session(request)
        if session is None:
            target = "/admin?next=" + quote(request.path_qs, safe="")
            if htmx(request):  # back to the page that asked for the fragment, not to the fragment
                here = urlsplit(request.headers.get("HX-Current-URL", ""))
                target = "/admin?next=" + quote(here.path + (f"?{here.query}" if here.query else ""), safe="")
                return web.Response(status=401, headers={"HX-Redirect": target})
            if request.method == "GET":
                return redirect(target)
            return render(request, "error.html", status=401, message_key="error.signed_out", message="")
        request[PAGE_SESSION] = session
        try:
            await check_csrf(request, session)
            return await handler(request)
        except TurnoutError as exc:
            template = "_error.html" if htmx(request) else "error.html"
            return render(request, template, status=exc.status, message_key=None, message=exc.message)

    return wrapped


@page
async def not_found(request: web.Request) -> web.StreamResponse:
    """Any other ``/admin/...`` page: a 404 page in the user's language (the JSON API keeps its JSON 404)."""
    raise NotFound(f"no page {request.path}", code="unknown_page")


def add_not_found_route(app: web.Application) -> None:
    """Register last: it matches every UI path no other route took."""
    app.router.add_get(r"/admin/{tail:(?!api/|static/).+}", not_found, name="ui.not_found")
