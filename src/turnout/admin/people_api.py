"""Admin JSON API for people and personal admin tokens.

- ``GET /admin/api/me``: who is asking (actor, label, role, teams) and which sign-ins are enabled.
- ``GET /admin/api/me/tokens``, ``POST /admin/api/me/tokens`` (``{"name", "days", "role"}``: the token is shown
  once; its role no higher than the person's own, its expiry at most ``auth.token_max_days``),
  ``POST /admin/api/me/tokens/{id}/revoke``: a person's own personal tokens (the admin token has none: 409).
- ``GET /admin/api/people``: everyone who signed in, with their tokens (never a token's secret).
- ``POST /admin/api/people/{id}/disable`` (their tokens revoked; their sessions end at their next request:
  :func:`turnout.admin.ui.security.current_session` checks the person) and ``.../enable``;
  ``POST /admin/api/people/{id}/tokens/{token}/revoke``: an admin's.
- ``GET /admin/api/auth``: which sign-ins are enabled.

Every change is audited (``token.create``, ``token.revoke``, ``person.disable``, ``person.enable``).
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from turnout.admin.changes import PRINCIPAL, audit_change, read_object, store_call
from turnout.admin.inputs import parse_input
from turnout.admin.keys import PEOPLE
from turnout.core.roles import Principal, Role, grantable, parse_role, role_label
from turnout.errors import Conflict, Forbidden, NotFound, Unprocessable
from turnout.gateway.keys import SETTINGS
from turnout.responses import json_response

__all__ = ["add_people_routes", "sign_ins"]

DAY_S = 86_400


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")
    days: int = Field(30, ge=1, le=3650)
    role: str | None = Field(None, description="viewer, operator, admin or team-admin:<tenant>; default: your own")


def _principal(request: web.Request) -> Principal:
    return request[PRINCIPAL]


def _person_id(request: web.Request) -> int:
    person = _principal(request).person
    if person is None:
        raise Conflict(
            "the admin token is no person and has no personal tokens: sign in with single sign-on to make one",
            code="no_person",
        )
    return person


def sign_ins(request: web.Request) -> dict[str, Any]:
    auth = request.app[SETTINGS].auth
    return {
        "oidc": None if auth.oidc is None else {"issuer": auth.oidc.issuer, "label": auth.oidc.label},
        "admin_token": auth.break_glass,
    }


def _int(request: web.Request, name: str) -> int:
    try:
        return int(request.match_info[name])
    except ValueError:
        raise NotFound(f"no such {name}: {request.match_info[name]!r}", code="not_found") from None


async def me(request: web.Request) -> web.Response:
    p = _principal(request)
    return json_response(
        {
            "actor": p.actor,
            "label": p.label,
            "role": None if p.role is None else p.role.value,
            "teams": sorted(p.teams),
            "role_label": p.describe(),
            "person": p.person,
            "sign_ins": sign_ins(request),
        }
    )


async def auth_info(request: web.Request) -> web.Response:
    return json_response(sign_ins(request))


async def my_tokens(request: web.Request) -> web.Response:
    tokens = await store_call(request.app[PEOPLE].tokens_of, _person_id(request))
    now = time.time()
    return json_response({"tokens": [t.to_json(now) for t in tokens]})


async def create_token(request: web.Request) -> web.Response:
    person_id = _person_id(request)
    spec = parse_input(TokenCreate, await read_object(request))
    principal = _principal(request)
    max_days = request.app[SETTINGS].auth.token_max_days
    if spec.days > max_days:
        raise Forbidden(f"a personal token may live at most {max_days} days (auth.token_max_days)", code="too_long")
    if spec.role is None:
        role, teams = principal.role, principal.teams
    else:
        try:
            parsed, tenant = parse_role(spec.role)
        except ValueError as exc:
            raise Unprocessable(str(exc), field="role") from None
        role = None if parsed is Role.TEAM_ADMIN else parsed
        teams = frozenset({tenant}) if tenant is not None else frozenset()
    if not grantable(principal.role, principal.teams, role, teams):
        raise Forbidden(
            f"a personal token's role may be no higher than your own ({principal.describe()}); "
            f"{role_label(role, teams)} is",
            code="forbidden_role",
        )
    now = time.time()
    record, plaintext = await store_call(
        request.app[PEOPLE].create_token,
        person_id,
        name=spec.name,
        role=None if role is None else role.value,
        teams=sorted(teams),
        expires_at=now + spec.days * DAY_S,
        now=now,
    )
    await audit_change(request, "token.create", f"token:{record.prefix}", after=record.to_json(now))
    return json_response(
        {"token": plaintext, "record": record.to_json(now), "note": "the token is shown only once"}, 201
    )


async def revoke_my_token(request: web.Request) -> web.Response:
    return await _revoke(request, _person_id(request), _int(request, "id"))


async def _revoke(request: web.Request, person_id: int, token_id: int) -> web.Response:
    now = time.time()
    before, after = await store_call(request.app[PEOPLE].revoke_token, person_id, token_id, now=now)
    if before.revoked_at is None:
        await audit_change(
            request, "token.revoke", f"token:{after.prefix}", before=before.to_json(now), after=after.to_json(now)
        )
    return json_response(after.to_json(now))


async def list_people(request: web.Request) -> web.Response:
    store = request.app[PEOPLE]
    now = time.time()
    everyone = await store_call(store.all)
    out = []
    for person in everyone:
        tokens = await store_call(store.tokens_of, person.id)
        roles = role_label(Role(person.role) if person.role else None, person.teams)
        out.append({**person.to_json(), "role_label": roles, "tokens": [t.to_json(now) for t in tokens]})
    return json_response({"people": out})


async def _set_disabled(request: web.Request, disabled: bool) -> web.Response:
    person_id = _int(request, "id")
    if disabled and _principal(request).person == person_id:
        raise Conflict("you cannot disable yourself; ask another admin", code="self")
    now = time.time()
    before, after = await store_call(request.app[PEOPLE].set_disabled, person_id, disabled=disabled, now=now)
    if (before.disabled_at is None) == disabled:
        await audit_change(
            request,
            "person.disable" if disabled else "person.enable",
            f"person:{after.label}",
            before=before.to_json(),
            after=after.to_json(),
        )
    return json_response(after.to_json())


async def disable_person(request: web.Request) -> web.Response:
    return await _set_disabled(request, True)


async def enable_person(request: web.Request) -> web.Response:
    return await _set_disabled(request, False)


async def revoke_person_token(request: web.Request) -> web.Response:
    return await _revoke(request, _int(request, "id"), _int(request, "token"))


def add_people_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/api/me", me)
    r.add_get("/admin/api/auth", auth_info)
    r.add_get("/admin/api/me/tokens", my_tokens)
    r.add_post("/admin/api/me/tokens", create_token)
    r.add_post("/admin/api/me/tokens/{id}/revoke", revoke_my_token)
    r.add_get("/admin/api/people", list_people)
    r.add_post("/admin/api/people/{id}/disable", disable_person)
    r.add_post("/admin/api/people/{id}/enable", enable_person)
    r.add_post("/admin/api/people/{id}/tokens/{token}/revoke", revoke_person_token)
