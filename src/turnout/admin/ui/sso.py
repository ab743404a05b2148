"""Single sign-on pages: ``GET /admin/oidc/start`` sends the browser to the provider, ``GET /admin/oidc/callback``
takes it back (:mod:`turnout.admin.oidc` does the protocol).

- **Start**: what the sign-in sent (``state``, ``nonce``, the PKCE verifier, where to go after) is kept in a
  short-lived ``turnout_oidc`` cookie, ``HttpOnly; SameSite=Lax; Path=/admin/oidc``: Lax because the provider
  sends the browser back by a cross-site redirect, which would not carry a Strict cookie.
- **Callback**: the answer is checked, the code exchanged and the ID token checked; the person's groups (the
  ``groups_claim``) and verified e-mail map to a role (``auth.oidc.roles``, ``email_roles``; several: the highest
  role, every team). The person is recorded (a role that differs from their last sign-in is audited as
  ``person.role``), a session is made, ``admin.signin`` is audited with actor ``oidc:<sub>``, and the answer is a
  page that moves on to where the sign-in started: the Strict session cookie set on this cross-site-initiated
  answer would not be sent on a redirect that follows at once, but is on the page's own navigation.
- **Refused** (a wrong or missing ``state``, a code the provider refuses (replayed), an ID token that does not
  verify, has expired, names another issuer or audience, a groups claim of the wrong type, no role, a disabled
  person): a 401 page that says the sign-in failed without saying which part was wrong, and an
  ``admin.signin_failed`` entry with the reason (at most one a minute per address); never a session.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from turnout.admin.changes import AUDIT_ACTOR, audit_change
from turnout.admin.keys import PEOPLE, SIGNINS
from turnout.admin.oidc import OidcClient, Pending, SignInRefused
from turnout.admin.ui.render import redirect, render
from turnout.admin.ui.security import SESSION_COOKIE, SESSION_STORE, is_tls
from turnout.admin.ui.sessions import Identity
from turnout.admin.ui.signin import HOME, safe_next
from turnout.core.roles import role_label, strongest
from turnout.errors import TurnoutError
from turnout.gateway.keys import SETTINGS

__all__ = ["OIDC", "OIDC_COOKIE", "add_sso_routes", "redirect_uri"]

log = logging.getLogger("turnout.admin")

OIDC: web.AppKey[OidcClient] = web.AppKey("oidc_client")
OIDC_COOKIE = "turnout_oidc"
OIDC_PATH = "/admin/oidc"
PENDING_S = 600  # a sign-in must come back within this


def redirect_uri(request: web.Request) -> str:
    """The callback URL: ``auth.oidc.redirect_url``, else this gateway's as the browser reached it."""
    configured = request.app[OIDC].config.redirect_url
    if configured is not None:
        return str(configured)
    scheme = "https" if is_tls(request) else "http"
    return f"{scheme}://{request.host}{OIDC_PATH}/callback"


def _pending_cookie(request: web.Request, response: web.StreamResponse, value: str) -> None:
    response.set_cookie(
        OIDC_COOKIE, value, max_age=PENDING_S, path=OIDC_PATH, httponly=True, samesite="Lax", secure=is_tls(request)
    )


async def start(request: web.Request) -> web.StreamResponse:
    nxt = safe_next(request.query.get("next"))
    try:
        url, pending = await request.app[OIDC].begin(redirect_uri(request), nxt, time.time())
    except SignInRefused as exc:
        log.warning("single sign-on cannot start: %s", exc)
        return render(request, "error.html", status=502, message_key="sso.error.provider", message="")
    response = redirect(url)
    _pending_cookie(request, response, pending.encode())
    return response


async def _refused(request: web.Request, exc: SignInRefused) -> web.StreamResponse:
    log.warning("single sign-on refused from %s: %s", request.remote or "unknown", exc)
    signins = request.app[SIGNINS]
    if signins.may_note_failure(request, time.time()):
        request[AUDIT_ACTOR] = f"oidc:{exc.subject}" if exc.subject else "oidc:unknown"
        try:
            await audit_change(
                request, "admin.signin_failed", f"admin:{request.remote or 'unknown'}", after={"reason": exc.reason}
            )
        except TurnoutError as err:
            log.warning("%s", err.message)
    key = {"no_role": "sso.error.no_role", "disabled": "sso.error.disabled"}.get(exc.reason, "sso.error.failed")
    response = render(request, "error.html", status=401, message_key=key, message="")
    response.del_cookie(OIDC_COOKIE, path=OIDC_PATH)
    return response


async def callback(request: web.Request) -> web.StreamResponse:
    app = request.app
    client = app[OIDC]
    pending = Pending.decode(request.cookies.get(OIDC_COOKIE))
    now = time.time()
    if pending is not None and now - pending.started > PENDING_S:
        pending = None
    try:
        claims = await client.finish(dict(request.query), pending, redirect_uri(request), now)
        config = client.config
        granted = [config.roles[g] for g in claims.groups if g in config.roles]
        if claims.email is not None and claims.email_verified and claims.email in config.email_roles:
            granted.append(config.email_roles[claims.email])
        role, teams = strongest(granted)
        if role is None and not teams:
            raise SignInRefused("no_role", "none of the person's groups has a role", claims.subject)
        signin = await asyncio.to_thread(
            app[PEOPLE].sign_in,
            subject=claims.subject,
            email=claims.email,
            name=claims.name,
            role=None if role is None else role.value,
            teams=sorted(teams),
            now=now,
        )
        if signin.person.disabled_at is not None:
            raise SignInRefused("disabled", "an admin disabled this person", claims.subject)
    except SignInRefused as exc:
        return await _refused(request, exc)
    person = signin.person
    request[AUDIT_ACTOR] = person.actor
    if signin.before is None or signin.role_changed:
        before = signin.before
        await audit_change(
            request,
            "person.role",
            f"person:{person.label}",
            before=None if before is None else {"role": before.role, "teams": list(before.teams)},
            after={"role": person.role, "teams": list(person.teams), "email": person.email},
        )
    identity = Identity(person.actor, person.id, person.role, person.teams, person.label)
    cookie, _ = await asyncio.to_thread(app[SESSION_STORE].create, remote=request.remote, now=now, identity=identity)
    await audit_change(
        request,
        "admin.signin",
        f"admin:{request.remote or 'unknown'}",
        after={"via": "oidc", "email": person.email, "role": role_label(role, teams)},
    )
    target = pending.next if pending is not None else HOME
    if role is None and target == HOME:  # a team-admin only: the Overview is not theirs, their keys are
        target = "/admin/keys"
    response = render(request, "moving_on.html", next=target)
    settings = app[SETTINGS]
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        max_age=int(settings.auth.session_max_s),
        path="/admin",
        httponly=True,
        samesite="Strict",
        secure=is_tls(request),
    )
    response.del_cookie(OIDC_COOKIE, path=OIDC_PATH)
    return response


def add_sso_routes(app: web.Application, client: OidcClient) -> None:
    app[OIDC] = client
    app.router.add_get(f"{OIDC_PATH}/start", start, name="ui.oidc.start")
    app.router.add_get(f"{OIDC_PATH}/callback", callback, name="ui.oidc.callback")
