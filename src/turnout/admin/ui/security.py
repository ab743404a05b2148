"""Browser security of the admin UI: session cookies, CSRF, security headers, and the admin API's gate.

- **Who is asking** (:func:`principal_of`): a script with ``Authorization: Bearer <token>``: a personal token
  (``tpat_...``, acting as its person with the token's role, never above the person's role now) or the admin
  token (break-glass: an admin, unless ``auth.break_glass`` is false); or a signed-in browser with its session
  cookie (a person, or the admin token's session). Bearer sign-ins are audited by
  :class:`turnout.admin.changes.AdminSignIns`. What each may do is decided by :mod:`turnout.admin.ui.gate`. A
  browser's state-changing call (anything but GET/HEAD/OPTIONS) must also send its session's CSRF token in
  ``X-CSRF-Token``; without it the answer is 403 ``csrf_failed`` and nothing changes. The UI's pages check the
  same token (header, or a ``csrf_token`` form field) through :func:`check_csrf`.
- **Who is audited**: a person as ``oidc:<sub>`` (their e-mail in the entry's detail), by browser or personal
  token; the admin token as ``token``, or as the ``cli:<user>`` that ``turnout`` commands name in
  ``X-Turnout-Actor`` (only ``cli:`` names are taken, and only with the admin token: its holder may do anything
  anyway, so the header only labels its own changes).
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

from turnout.admin.changes import PRINCIPAL
from turnout.admin.keys import ADMIN_AUTH, PEOPLE, SIGNINS
from turnout.admin.ui.sessions import BREAK_GLASS_ACTOR, Session, SessionStore
from turnout.core.roles import Principal, Role
from turnout.errors import Forbidden, TurnoutError, Unauthorized
from turnout.store.people import TOKEN_PREFIX, Person, PersonalToken

__all__ = [
    "ACTOR_HEADER",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "SAFE_METHODS",
    "SESSION_COOKIE",
    "SESSION_STORE",
    "add_security_headers",
    "cached_session",
    "check_csrf",
    "clear_cookie",
    "current_session",
    "is_ui_path",
    "principal_of",
    "session_principal",
    "set_cookie",
    "token_principal",
]

SESSION_COOKIE = "turnout_session"
CSRF_HEADER = "X-CSRF-Token"
ACTOR_HEADER = "X-Turnout-Actor"  # the CLI's cli:<user>, recorded as the audit actor of its changes
MAX_ACTOR = 128
CSRF_FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
COOKIE_PATH = "/admin"

SESSION_STORE: web.AppKey[SessionStore] = web.AppKey("ui_sessions")
_LADDER = (Role.VIEWER.value, Role.OPERATOR.value, Role.ADMIN.value)
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


def cached_session(request: web.Request) -> Session | None:
    """The session :func:`current_session` found for this request already (None when not looked up)."""
    return request.get(_SESSION)


async def current_session(request: web.Request) -> Session | None:
    """The browser's live session (looked up once per request), or None."""
    if _SESSION in request:
        return request[_SESSION]
    token = request.cookies.get(SESSION_COOKIE)
    session = None
    if token:
        session = await asyncio.to_thread(request.app[SESSION_STORE].get, token, now=time.time())
        if session is not None and session.identity.person_id is not None:
            person = await asyncio.to_thread(_person_or_none, request, session.identity.person_id)
            if person is None or person.disabled_at is not None:  # disabled since: the session is over
                await asyncio.to_thread(request.app[SESSION_STORE].delete, token)
                session = None
    request[_SESSION] = session
    return session


def _person_or_none(request: web.Request, person_id: int) -> Person | None:
    try:
        return request.app[PEOPLE].get(person_id)
    except KeyError:
        return None


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


def session_principal(session: Session) -> Principal:
    """Who a browser session belongs to."""
    identity = session.identity
    role = Role(identity.role) if identity.role in _LADDER else None
    return Principal(identity.actor, role, frozenset(identity.teams), identity.label, identity.person_id)


async def principal_of(request: web.Request) -> Principal | None:
    """Who an admin request is from: a Bearer token (a personal ``tpat_`` token, or the admin token), else the
    browser session of its cookie, else None. A Bearer token that opens nothing is 401 (audited, rate limited:
    :class:`turnout.admin.changes.AdminSignIns`); so is a cookie whose session has ended, on the JSON API."""
    if PRINCIPAL in request:
        return request[PRINCIPAL]
    app = request.app
    header = request.headers.get("Authorization")
    principal: Principal | None = None
    if header is None:
        if SESSION_COOKIE not in request.cookies:
            return None
        session = await current_session(request)
        if session is None:
            if is_ui_path(request.path):
                return None
            raise Unauthorized(
                "the browser session has ended (idle too long, or signed out): sign in at /admin",
                code="session_expired",
            )
        if not is_ui_path(request.path):  # the UI's pages check it in their @page (a form field may carry it)
            await check_csrf(request, session)
        principal = session_principal(session)
    else:
        try:
            principal = await _bearer(request, header)
        except TurnoutError:
            await app[SIGNINS].note(request, ok=False)
            raise
        request[PRINCIPAL] = principal
        await app[SIGNINS].note(request, ok=True, actor=principal.actor)
    request[PRINCIPAL] = principal
    return principal


async def _bearer(request: web.Request, header: str) -> Principal:
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value.startswith(TOKEN_PREFIX):
        found = await asyncio.to_thread(request.app[PEOPLE].authenticate, value, now=time.time())
        if found is None:
            raise Unauthorized(
                "this personal token opens nothing (unknown, revoked or expired, or its person is disabled): "
                "make a new one on the UI's Account page and run `turnout login` again"
            )
        token, person = found
        return token_principal(token, person)
    request.app[ADMIN_AUTH].check(header)
    actor = request.headers.get(ACTOR_HEADER, "")
    if not (actor.startswith("cli:") and len(actor) <= MAX_ACTOR and actor.isprintable()):
        actor = BREAK_GLASS_ACTOR
    return Principal(actor, Role.ADMIN, frozenset(), "admin token")


def token_principal(token: PersonalToken, person: Person) -> Principal:
    """A personal token acts as its person, with the token's role capped by the person's role now (a person whose
    groups lost a role since the token was made loses it on their tokens too)."""
    role = Role(token.role) if token.role in _LADDER else None
    current = Role(person.role) if person.role in _LADDER else None
    if role is not None and (current is None or _LADDER.index(role) > _LADDER.index(current)):
        role = current
    teams = frozenset(token.teams) & frozenset(person.teams)
    return Principal(person.actor, role, teams, f"{person.label} (token {token.prefix})", person.id)


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
