"""Sign-in, sign-out and the language switch of the admin UI.

``GET /admin`` shows the sign-in choices that are enabled: single sign-on (``auth.oidc``: a button to
``/admin/oidc/start``, :mod:`.sso`) and the admin token form (break-glass, unless ``auth.break_glass`` is
false); or goes to the Overview when already signed in. ``POST /admin/signin`` compares the admin token in
constant time (:class:`turnout.admin.auth.AdminAuth`), starts a server-side session (an admin, actor ``token``)
and audits ``admin.signin``; a wrong token is audited as ``admin.signin_failed`` (at most once a minute per
address, as for the Bearer API). The form itself is protected against login CSRF by a double-submit token (a
``turnout_signin`` cookie that must match the form's hidden field). ``POST /admin/signout`` ends the session on
every replica, and a person's other sessions too.
"""

from __future__ import annotations

import asyncio
import secrets
import time

from aiohttp import web

from turnout.admin.changes import ADMIN_ACTOR, AUDIT_ACTOR, audit_change
from turnout.admin.keys import ADMIN_AUTH, SIGNINS
from turnout.admin.ui.i18n import COOKIE as LANG_COOKIE
from turnout.admin.ui.i18n import LANGUAGES
from turnout.admin.ui.render import page, redirect, render, session_of
from turnout.admin.ui.security import (
    CSRF_FIELD,
    SESSION_COOKIE,
    SESSION_STORE,
    clear_cookie,
    current_session,
    set_cookie,
)
from turnout.errors import TurnoutError
from turnout.gateway.keys import SETTINGS

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
    auth = request.app[SETTINGS].auth
    response = render(
        request,
        "signin.html",
        status=status,
        signin_csrf=token,
        error=error,
        next=nxt,
        sso_label=None if auth.oidc is None else auth.oidc.label,
        break_glass=auth.break_glass,
    )
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
    request[AUDIT_ACTOR] = ADMIN_ACTOR
    if not request.app[ADMIN_AUTH].enabled:
        return _form(request, status=403, error="signin.error.disabled", nxt=nxt)
    try:
        request.app[ADMIN_AUTH].check(f"Bearer {token}")
    except TurnoutError:
        await request.app[SIGNINS].note(request, ok=False)
        return _form(request, status=401, error="signin.error.token", nxt=nxt)
    cookie, _ = await asyncio.to_thread(request.app[SESSION_STORE].create, remote=request.remote, now=time.time())
    await audit_change(request, "admin.signin", f"admin:{request.remote or 'unknown'}", after={"via": "browser"})
    response = redirect(nxt)
    set_cookie(request, response, SESSION_COOKIE, cookie, request.app[SETTINGS].auth.session_max_s)
    clear_cookie(response, SIGNIN_COOKIE)
    return response


@page
async def signout(request: web.Request) -> web.StreamResponse:
    """End this session on every replica (the store forgets it), and every other session of the same person."""
    cookie = request.cookies.get(SESSION_COOKIE, "")
    store = request.app[SESSION_STORE]
    await asyncio.to_thread(store.delete, cookie)
    person = session_of(request).identity.person_id
    if person is not None:
        await asyncio.to_thread(store.delete_person, person)
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
