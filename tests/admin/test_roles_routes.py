"""Every admin route against every role, through the real gateway: the JSON API with personal tokens (and the admin
token), the UI's pages with browser sessions. The routes are enumerated from the app's router, so a route added
without a line in the role table (turnout.core.roles.RULES) and in EXPECTED below fails here.

EXPECTED is written out by hand (not computed from RULES): who may call each route. Letters: V viewer, O operator,
A admin (the admin token is an admin too), T team-admin of tenant "a"; "*" is public (no sign-in).
"""

from __future__ import annotations

import re
import time
from typing import Any

import aiohttp
import pytest

from tests.conftest import ADMIN_TOKEN
from turnout.admin.keys import PEOPLE
from turnout.admin.ui.security import SESSION_COOKIE, SESSION_STORE
from turnout.admin.ui.sessions import Identity
from turnout.core.roles import RULES

EXPECTED: dict[tuple[str, str], str] = {
    # the UI
    ("GET", "/admin"): "*",
    ("GET", "/admin/"): "*",
    ("POST", "/admin/signin"): "*",
    ("POST", "/admin/lang"): "*",
    ("GET", "/admin/static/{filename}"): "*",
    ("GET", "/admin/oidc/start"): "*",
    ("GET", "/admin/oidc/callback"): "*",
    ("POST", "/admin/signout"): "VOAT",
    ("GET", "/admin/account"): "VOAT",
    ("GET", "/admin/{tail}"): "VOAT",
    ("GET", "/admin/overview"): "VOA",
    ("GET", "/admin/overview/fragment"): "VOA",
    ("GET", "/admin/placement"): "VOA",
    ("GET", "/admin/placement/cell"): "VOA",
    ("GET", "/admin/placement/workers/{name}"): "VOA",
    ("POST", "/admin/placement/check"): "VOA",
    ("GET", "/admin/endpoints"): "VOA",
    ("GET", "/admin/endpoints/fragment"): "VOA",
    ("GET", "/admin/models"): "VOA",
    ("GET", "/admin/models/fragment"): "VOA",
    ("GET", "/admin/keys"): "VOAT",
    ("GET", "/admin/keys/fragment"): "VOAT",
    ("GET", "/admin/usage"): "VOAT",
    ("GET", "/admin/batches"): "VOAT",
    ("GET", "/admin/batches/fragment"): "VOAT",
    ("GET", "/admin/audit"): "VOA",
    ("GET", "/admin/pools"): "VOA",
    ("GET", "/admin/pools/fragment"): "VOA",
    ("GET", "/admin/persistence"): "VOA",
    ("GET", "/admin/people"): "VOA",
    # the JSON API
    ("GET", "/admin/api/placement"): "VOA",
    ("GET", "/admin/api/placement/workers/{name}"): "VOA",
    ("PUT", "/admin/api/placement/workers/{name}"): "OA",
    ("DELETE", "/admin/api/placement/workers/{name}"): "OA",
    ("POST", "/admin/api/placement/workers/{name}/only-installed"): "OA",
    ("POST", "/admin/api/placement/workers/{name}/toggle"): "OA",
    ("GET", "/admin/api/inventory"): "VOA",
    ("GET", "/admin/api/claims"): "VOA",
    ("GET", "/admin/api/keys"): "VOAT",
    ("POST", "/admin/api/keys"): "OAT",
    ("GET", "/admin/api/keys/{ref}"): "VOAT",
    ("PATCH", "/admin/api/keys/{ref}"): "OAT",
    ("POST", "/admin/api/keys/{ref}/revoke"): "OAT",
    ("POST", "/admin/api/keys/{ref}/rotate"): "OAT",
    ("GET", "/admin/api/tenants"): "VOAT",
    ("PATCH", "/admin/api/tenants/{name}"): "OA",
    ("GET", "/admin/api/apps"): "VOAT",
    ("GET", "/admin/api/usage"): "VOAT",
    ("GET", "/admin/api/usage/series"): "VOAT",
    ("GET", "/admin/api/batches"): "VOAT",
    ("GET", "/admin/api/batches/{batch_id}"): "VOAT",
    ("POST", "/admin/api/batches/{batch_id}/cancel"): "OAT",
    ("GET", "/admin/api/audit"): "VOA",
    ("GET", "/admin/api/audit/facets"): "VOA",
    ("GET", "/admin/api/endpoints"): "VOA",
    ("POST", "/admin/api/endpoints"): "OA",
    ("POST", "/admin/api/endpoints/test"): "OA",
    ("GET", "/admin/api/endpoints/{name}"): "VOA",
    ("PATCH", "/admin/api/endpoints/{name}"): "OA",
    ("DELETE", "/admin/api/endpoints/{name}"): "OA",
    ("POST", "/admin/api/endpoints/{name}/test"): "OA",
    ("GET", "/admin/api/aliases"): "VOA",
    ("GET", "/admin/api/aliases/{name}"): "VOA",
    ("PUT", "/admin/api/aliases/{name}"): "OA",
    ("DELETE", "/admin/api/aliases/{name}"): "OA",
    ("GET", "/admin/api/models"): "VOA",
    ("GET", "/admin/api/persistence"): "VOA",
    ("GET", "/admin/api/backup"): "A",
    ("POST", "/admin/api/backup/restore"): "A",
    ("GET", "/admin/api/auth"): "VOA",
    ("GET", "/admin/api/me"): "VOAT",
    ("GET", "/admin/api/me/tokens"): "VOAT",
    ("POST", "/admin/api/me/tokens"): "VOAT",
    ("POST", "/admin/api/me/tokens/{id}/revoke"): "VOAT",
    ("GET", "/admin/api/people"): "VOA",
    ("POST", "/admin/api/people/{id}/disable"): "A",
    ("POST", "/admin/api/people/{id}/enable"): "A",
    ("POST", "/admin/api/people/{id}/tokens/{token}/revoke"): "A",
}

PEOPLE_ROLES = {"V": ("viewer", []), "O": ("operator", []), "A": ("admin", []), "T": (None, ["a"])}
VALUES = {
    "name": "w1",
    "ref": "tk_nosuchkey",
    "id": "999999",
    "token": "999999",
    "tail": "no-such-page",
    "batch_id": "batch_none",
    "filename": "ui.css",
}


def admin_routes(app: Any) -> set[tuple[str, str]]:
    routes = set()
    for route in app.router.routes():
        resource = route.resource
        if resource is None or not resource.canonical.startswith("/admin"):
            continue
        if route.method == "HEAD":
            continue
        routes.add((route.method, resource.canonical))
    return routes


def concrete(template: str) -> str:
    path = template
    for name, value in VALUES.items():
        path = path.replace("{" + name + "}", value)
    return path


@pytest.fixture
async def gw(gateway, emulator):
    emu = await emulator("w1", models=["llama3.2:latest"])
    return await gateway(
        [{"name": "w1", "url": emu.url, "type": "ollama"}],
        env={"TURNOUT_OIDC_CLIENT_SECRET": "unused-secret"},
        tenants={"a": {}, "b": {}},
        auth={
            "open": True,
            "oidc": {"issuer": "http://127.0.0.1:9/realm", "client_id": "turnout", "roles": {"g": "viewer"}},
        },
    )


def test_every_rule_names_a_route_that_exists_and_the_table_matches_them(gw) -> None:
    routes = admin_routes(gw.app)
    missing = sorted(routes - EXPECTED.keys())
    assert not missing, f"admin routes without a line in EXPECTED (and a rule in core.roles.RULES): {missing}"
    assert set(RULES) == set(EXPECTED), sorted(set(RULES) ^ set(EXPECTED))
    assert routes == set(EXPECTED), sorted(set(EXPECTED) - routes)


async def test_every_admin_route_against_every_role(gw) -> None:
    store = gw.app[PEOPLE]
    now = time.time()
    tokens: dict[str, str] = {}
    identities: dict[str, Identity] = {}
    for letter, (role, teams) in PEOPLE_ROLES.items():
        person = store.sign_in(
            subject=f"sub-{letter}", email=f"{letter}@example.com", name=None, role=role, teams=teams, now=now
        ).person
        _, tokens[letter] = store.create_token(
            person.id, name="t", role=role, teams=teams, expires_at=now + 3600, now=now
        )
        identities[letter] = Identity(person.actor, person.id, role, tuple(teams), person.label)
    failures = []
    async with aiohttp.ClientSession() as http:
        for (method, template), allowed in sorted(EXPECTED.items()):
            path = concrete(template)
            ui = not template.startswith("/admin/api")
            for who in ["-", "V", "O", "A", "T", "token"]:
                letter = "A" if who == "token" else who
                may = allowed == "*" or letter in allowed
                headers: dict[str, str] = {}
                cookies: dict[str, str] = {}
                if who == "token" and not ui:
                    headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
                elif who != "-" and not ui:
                    headers["Authorization"] = f"Bearer {tokens[who]}"
                elif who != "-":
                    identity = identities[who] if who != "token" else Identity()
                    cookie, session = gw.app[SESSION_STORE].create(
                        remote="127.0.0.1", now=time.time(), identity=identity
                    )
                    cookies[SESSION_COOKIE] = cookie
                    headers["X-CSRF-Token"] = session.csrf
                async with http.request(
                    method, gw.url + path, headers=headers, cookies=cookies, allow_redirects=False, data=b""
                ) as r:
                    body = await r.read()
                    code = None
                    if r.content_type == "application/json":
                        try:
                            code = (await r.json()).get("error", {}).get("code")
                        except (ValueError, AttributeError):
                            code = None
                # the gate's refusal: 403 naming the role it needs (a JSON error, or the UI's error page)
                named = re.search(rb"needs the (viewer|operator|admin) role", body) is not None
                refused = r.status == 403 and named and (ui or code == "forbidden_role")
                if who == "-" and not may:  # nobody signed in: 401 from the API, the sign-in form for a page
                    ok = r.status == 401 if not ui else r.status in (303, 401)
                elif may:
                    ok = not refused and (r.status != 401 or allowed == "*")
                else:
                    ok = refused
                if not ok:
                    failures.append(f"{who} {method} {path}: HTTP {r.status} {code} {body[:160]!r}")
    assert not failures, "\n".join(failures)
