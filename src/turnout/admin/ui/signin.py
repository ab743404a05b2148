"""Sign-in, sign-out and the language switch of the admin UI.

``GET /admin`` shows the sign-in form (or goes to the Overview when already signed in). ``POST /admin/signin``
compares the admin token in constant time (:class:`turnout.admin.auth.AdminAuth`), starts a server-side
session and audits ``admin.signin``; a wrong token is audited as ``admin.signin_failed`` (at most once a
minute per address, as for the Bearer API). The form itself is protected against login CSRF by a
double-submit token (a ``turnout_signin`` cookie that must match the form's hidden field).
"""

from __future__ import annotations

import asyncio
import secrets
import time

from aiohttp import web

from turnout.admin.changes import AUDIT_ACTOR, audit_change
from turnout.admin.keys import ADMIN_AUTH, SIGNINS
from turnout.admin.ui.i18n import COOKIE as LANG_COOKIE
from turnout.admin.ui.i18n import LANGUAGES
from turnout.admin.ui.render import page, redirect, render
from turnout.admin.ui.security import (
    CSRF_FIELD,
    SESSION_COOKIE,
    SESSION_STORE,
    UI_ACTOR,
    clear_cookie,
    current_session,
    set_cookie,
)
from turnout.admin.ui.sessions import MAX_AGE_S
from turnout.errors import TurnoutError

__all__ = ["add_signin_routes", "safe_next"]

SIGNIN_COOKIE = "turnout_signin"
HOME = "/admin/overview"


def safe_next(target: object) -> str:
    """Only a path inside the UI (no scheme, no other host): never an open redirect."""
    if not isinstance(target, str) or not target.startswith("/admin/") or target.startswith("/admin/api/"):
        return HOME
    if "//" in target or "\\" in target or any(c < " " for c in target):
        return HOME
    return target


def _form(request: web.Request, *, status: int = 200, error: str | None = None, nxt: str = HOME) -> web.Response:
    token = request.cookies.get(SIGNIN_COOKIE) or secrets.token_urlsafe(24)
    response = render(request, "signin.html", status=status, signin_csrf=token, error=error, next=nxt)
    set_cookie(request, response, SIGNIN_COOKIE, token, 3600)
    return response


async def signin_form(request: web.Request) -> web.StreamResponse:
    nxt = safe_next(request.query.get("next"))
    if await current_session(request) is not None:
        return redirect(nxt)
    return _form(request, nxt=nxt)


async def signin(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    nxt = safe_next(form.get("next"))
    expected = request.cookies.get(SIGNIN_COOKIE, "")
    sent = form.get(CSRF_FIELD)
    if not expected or not isinstance(sent, str) or not secrets.compare_digest(sent, expected):
        return _form(request, status=403, error="signin.error.csrf", nxt=nxt)
    token = form.get("token")
    token = token.strip() if isinstance(token, str) else ""
    request[AUDIT_ACTOR] = UI_ACTOR
    try:
        request.app[ADMIN_AUTH].check(f"Bearer {token}")
    except TurnoutError:
        await request.app[SIGNINS].note(request, ok=False)
        return _form(request, status=401, error="signin.error.token", nxt=nxt)
    cookie, _ = await asyncio.to_thread(request.app[SESSION_STORE].create, remote=request.remote, now=time.time())
    await audit_change(request, "admin.signin", f"admin:{request.remote or 'unknown'}", after={"via": "browser"})
    response = redirect(nxt)
    set_cookie(request, response, SESSION_COOKIE, cookie, MAX_AGE_S)
    clear_cookie(response, SIGNIN_COOKIE)
    return response


@page
async def signout(request: web.Request) -> web.StreamResponse:
    cookie = request.cookies.get(SESSION_COOKIE, "")
    await asyncio.to_thread(request.app[SESSION_STORE].delete, cookie)
    await audit_change(request, "admin.signout", f"admin:{request.remote or 'unknown'}", after={"via": "browser"})
    response = redirect("/admin")
    clear_cookie(response, SESSION_COOKIE)
    return response


async def set_language(request: web.Request) -> web.StreamResponse:
    """Remember the chosen language in a cookie. Signed in: needs the session's CSRF token; on the sign-in
    form: the form's own token. Nothing on the server changes either way."""
    form = await request.post()
    sent = form.get(CSRF_FIELD)
    session = await current_session(request)
    expected = session.csrf if session is not None else request.cookies.get(SIGNIN_COOKIE, "")
    if not expected or not isinstance(sent, str) or not secrets.compare_digest(sent, expected):
        return render(request, "error.html", status=403, message_key="error.csrf", message="")
    lang = form.get("lang")
    nxt = form.get("next")
    target = safe_next(nxt) if nxt != "/admin" else "/admin"
    response = redirect(target)
    if lang in LANGUAGES:
        set_cookie(request, response, LANG_COOKIE, str(lang), 365 * 86_400)
    return response


async def _to_signin(request: web.Request) -> web.StreamResponse:
    return redirect("/admin")


def add_signin_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin", signin_form, name="ui.signin")
    r.add_get("/admin/", _to_signin, name="ui.signin.slash")
    r.add_post("/admin/signin", signin)
    r.add_post("/admin/signout", signout, name="ui.signout")
    r.add_post("/admin/lang", set_language, name="ui.lang")
