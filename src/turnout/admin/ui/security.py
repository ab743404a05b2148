"""Browser security of the admin UI: session cookies, CSRF, security headers, and the admin API's gate.

- **Who may call ``/admin/api``**: a script with ``Authorization: Bearer <admin token>`` (unchanged, audited by
  :class:`turnout.admin.accounts.AdminSignIns`), or a signed-in browser with its session cookie. A browser's
  state-changing call (anything but GET/HEAD/OPTIONS) must also send its session's CSRF token in
  ``X-CSRF-Token``; without it the answer is 403 ``csrf_failed`` and nothing changes. The UI's pages check the
  same token (header, or a ``csrf_token`` form field) through :func:`check_csrf`.
- **Who is audited**: a browser's changes as ``admin-ui``; a script's as ``admin-api``, or as the
  ``cli:<user>`` that ``turnout`` commands name in ``X-Turnout-Actor`` (only ``cli:`` names are taken: the
  holder of the admin token may do anything anyway, so the header only labels its own changes).
- **Cookies** are ``HttpOnly; SameSite=Strict; Path=/admin``, and ``Secure`` when the request came over TLS or
  carries ``X-Forwarded-Proto: https``. That header is trusted from anyone because it can only make the
  cookie stricter: a client that forges it merely gets a cookie its own plain-HTTP browser will not send back.
- **Headers on every UI response**: a CSP without inline script or style, ``X-Frame-Options: DENY``,
  ``Referrer-Policy: no-referrer``, ``X-Content-Type-Options: nosniff``, and ``Cache-Control: no-store`` on
  every page (pages may show secrets such as a new key); static assets are versioned and cacheable.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from turnout.admin.changes import AUDIT_ACTOR
from turnout.admin.keys import ADMIN_AUTH, SIGNINS
from turnout.admin.ui.sessions import IDLE_S, Session, SessionStore
from turnout.errors import Forbidden, TurnoutError, Unauthorized

__all__ = [
    "ACTOR_HEADER",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "SAFE_METHODS",
    "SESSION_COOKIE",
    "SESSION_STORE",
    "UI_ACTOR",
    "add_security_headers",
    "check_admin",
    "check_csrf",
    "clear_cookie",
    "current_session",
    "is_ui_path",
    "set_cookie",
]

SESSION_COOKIE = "turnout_session"
CSRF_HEADER = "X-CSRF-Token"
ACTOR_HEADER = "X-Turnout-Actor"  # the CLI's cli:<user>, recorded as the audit actor of its changes
MAX_ACTOR = 128
CSRF_FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
COOKIE_PATH = "/admin"

SESSION_STORE: web.AppKey[SessionStore] = web.AppKey("ui_sessions")
UI_ACTOR = "admin-ui"  # the audit log's actor for changes made from a signed-in browser
_SESSION: web.RequestKey[Session | None] = web.RequestKey("turnout_ui_session")  # one look-up per request

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
STATIC_PREFIX = "/admin/static/"


def is_ui_path(path: str) -> bool:
    """The browser UI's own paths: ``/admin`` and everything under it except the JSON API."""
    return path == "/admin" or (path.startswith("/admin/") and not path.startswith("/admin/api/"))


def is_tls(request: web.Request) -> bool:
    return request.secure or request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower() == "https"


def set_cookie(request: web.Request, response: web.StreamResponse, name: str, value: str, max_age: float) -> None:
    response.set_cookie(
        name,
        value,
        max_age=int(max_age),
        path=COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=is_tls(request),
    )


def clear_cookie(response: web.StreamResponse, name: str) -> None:
    response.del_cookie(name, path=COOKIE_PATH)


async def current_session(request: web.Request) -> Session | None:
    """The browser's live session (looked up once per request), or None."""
    if _SESSION in request:
        return request[_SESSION]
    token = request.cookies.get(SESSION_COOKIE)
    session = None
    if token:
        session = await asyncio.to_thread(request.app[SESSION_STORE].get, token, now=time.time())
    request[_SESSION] = session
    return session


async def sent_csrf(request: web.Request) -> str | None:
    """The CSRF token a request carries: the header, else a urlencoded/multipart form field."""
    header = request.headers.get(CSRF_HEADER)
    if header:
        return header
    if request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        field = (await request.post()).get(CSRF_FIELD)
        return field if isinstance(field, str) else None
    return None


async def check_csrf(request: web.Request, session: Session) -> None:
    if request.method in SAFE_METHODS:
        return
    if not session.csrf_ok(await sent_csrf(request)):
        raise Forbidden(
            "this change needs the page's CSRF token (reload the page and try again); nothing was changed",
            code="csrf_failed",
        )


async def check_admin(request: web.Request) -> None:
    """The gate for ``/admin/...`` (called by the gateway's middleware). The UI's pages check their own
    session (they redirect to the sign-in form rather than answer 401)."""
    if is_ui_path(request.path):
        return
    header = request.headers.get("Authorization")
    if header is None and SESSION_COOKIE in request.cookies:
        session = await current_session(request)
        if session is None:
            raise Unauthorized(
                f"the browser session has ended (idle for {int(IDLE_S // 60)} min, or signed out): sign in at /admin",
                code="session_expired",
            )
        await check_csrf(request, session)
        request[AUDIT_ACTOR] = UI_ACTOR
        return
    app = request.app
    try:
        app[ADMIN_AUTH].check(header)
    except TurnoutError:
        await app[SIGNINS].note(request, ok=False)
        raise
    actor = request.headers.get(ACTOR_HEADER, "")
    if actor.startswith("cli:") and len(actor) <= MAX_ACTOR and actor.isprintable():
        request[AUDIT_ACTOR] = actor
    await app[SIGNINS].note(request, ok=True)


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: the browser headers on every UI response (not on the JSON API)."""
    if not is_ui_path(request.path):
        return
    headers: Any = response.headers
    headers.setdefault("Content-Security-Policy", CSP)
    headers["X-Frame-Options"] = "DENY"
    headers["Referrer-Policy"] = "no-referrer"
    headers["X-Content-Type-Options"] = "nosniff"
    if not request.path.startswith(STATIC_PREFIX):
        headers["Cache-Control"] = "no-store"
