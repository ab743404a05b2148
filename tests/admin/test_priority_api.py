"""Priority classes in the admin API: a key's class set, shown and changed (422 naming the field for a value that is
not a class), its tenant's default through PATCH /admin/api/tenants/{name} (404 for no such tenant, 409 where
config.json sets one, audited), and a team-admin kept to the tenant's ceiling."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, worker
from turnout.admin.keys import PEOPLE


async def call(gw: Gateway, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else gw.admin_headers
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{gw.url}{path}", json=body, headers=headers) as resp,
    ):
        return resp.status, await resp.json()


@pytest.fixture
async def gw(emulator: EmulatorFactory, gateway: GatewayFactory) -> Gateway:
    emu = await emulator("a", ["m:1"])
    return await gateway(
        [worker("a", emu.url)],
        env={"TURNOUT_OIDC_CLIENT_SECRET": "unused-secret"},
        tenants={
            "research": {"priority": "batch"},
            "a": {},
            "b": {"team_ceiling": {"priority": "interactive"}},
        },
        auth={
            "open": False,
            "oidc": {"issuer": "http://127.0.0.1:9/realm", "client_id": "turnout", "roles": {"g": "viewer"}},
        },
    )


async def test_a_keys_class_is_created_shown_and_changed(gw: Gateway) -> None:
    status, created = await call(gw, "POST", "/admin/api/keys", {"app": "agent", "priority": "interactive"})
    assert status == 201
    record = created["record"]
    assert (record["priority"], record["effective_priority"]) == ("interactive", "interactive")
    prefix = record["prefix"]
    status, plain = await call(gw, "POST", "/admin/api/keys", {"app": "nightly", "tenant": "research"})
    assert (plain["record"]["priority"], plain["record"]["effective_priority"]) == (None, "batch")  # config.json's

    status, changed = await call(gw, "PATCH", f"/admin/api/keys/{prefix}", {"priority": "batch"})
    assert status == 200 and changed["effective_priority"] == "batch" and changed["etag"] != record["etag"]
    status, changed = await call(gw, "PATCH", f"/admin/api/keys/{prefix}", {"priority": None})
    assert status == 200 and (changed["priority"], changed["effective_priority"]) == (None, "standard")
    status, listed = await call(gw, "GET", "/admin/api/keys")
    assert {k["app"]: k["effective_priority"] for k in listed["keys"]} == {"agent": "standard", "nightly": "batch"}
    status, audit = await call(gw, "GET", "/admin/api/audit?action=key.change")
    assert [(e["before"]["priority"], e["after"]["priority"]) for e in audit["entries"]] == [
        ("batch", None),
        ("interactive", "batch"),
    ]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/admin/api/keys", {"app": "x", "priority": "urgent"}),
        ("POST", "/admin/api/keys", {"app": "x", "priority": "Interactive"}),  # the API takes the exact names
        ("POST", "/admin/api/keys", {"app": "x", "priority": 1}),
        ("PATCH", "/admin/api/keys/1", {"priority": ""}),
        ("PATCH", "/admin/api/keys/1", {"priority": ["batch"]}),
    ],
)
async def test_a_class_that_is_not_one_is_a_422_naming_the_field(
    gw: Gateway, method: str, path: str, body: dict[str, Any]
) -> None:
    await call(gw, "POST", "/admin/api/keys", {"app": "first"})
    status, answer = await call(gw, method, path, body)
    assert status == 422, answer
    error = answer["error"]
    assert (error["code"], error["field"]) == ("invalid_field", "priority")
    assert error["message"] == "\"priority\" must be 'interactive', 'standard' or 'batch'"
    status, listed = await call(gw, "GET", "/admin/api/keys")
    assert [k["app"] for k in listed["keys"]] == ["first"] and listed["keys"][0]["priority"] is None


async def test_a_tenants_default_class(gw: Gateway) -> None:
    await call(gw, "POST", "/admin/api/keys", {"app": "web", "tenant": "team"})
    await call(gw, "POST", "/admin/api/keys", {"app": "nightly", "tenant": "research"})
    status, tenants = await call(gw, "GET", "/admin/api/tenants")
    views = {t["name"]: (t["priority"], t["config_priority"], t["default_priority"]) for t in tenants["tenants"]}
    assert views == {"team": (None, None, "standard"), "research": (None, "batch", "batch")}

    status, team = await call(gw, "PATCH", "/admin/api/tenants/team", {"priority": "batch"})
    assert status == 200 and (team["priority"], team["default_priority"]) == ("batch", "batch")
    status, keys = await call(gw, "GET", "/admin/api/keys?tenant=team")
    assert [k["effective_priority"] for k in keys["keys"]] == ["batch"]  # at once

    status, refused = await call(gw, "PATCH", "/admin/api/tenants/research", {"priority": "interactive"})
    assert status == 409 and refused["error"]["code"] == "set_in_config"
    assert "tenants.research.priority: batch" in refused["error"]["message"]
    status, missing = await call(gw, "PATCH", "/admin/api/tenants/nobody", {"priority": "batch"})
    assert status == 404 and missing["error"]["code"] == "tenant_not_found"
    status, bad = await call(gw, "PATCH", "/admin/api/tenants/team", {})
    assert status == 422 and bad["error"]["field"] == "priority" and "is required" in bad["error"]["message"]
    status, bad = await call(gw, "PATCH", "/admin/api/tenants/team", {"priority": "low"})
    assert status == 422 and bad["error"]["field"] == "priority"

    status, cleared = await call(gw, "PATCH", "/admin/api/tenants/team", {"priority": None})
    assert status == 200 and (cleared["priority"], cleared["default_priority"]) == (None, "standard")
    status, audit = await call(gw, "GET", "/admin/api/audit?action=tenant.change")
    assert [(e["target"], e["before"], e["after"]) for e in audit["entries"]] == [
        ("tenant:team", {"priority": "batch"}, {"priority": None}),
        ("tenant:team", {"priority": None}, {"priority": "batch"}),
    ]


async def test_a_team_admin_gives_a_key_no_class_above_the_tenants_ceiling(gw: Gateway) -> None:
    """The ceiling is tenants.<t>.team_ceiling.priority, else the tenant's default class: a team-admin may lower a
    key's class and never raise it above what an admin set."""
    now = time.time()
    store = gw.app[PEOPLE]
    person = store.sign_in(subject="tom", email="t@example.com", name=None, role=None, teams=["a", "b"], now=now)
    _, token = store.create_token(person.person.id, name="t", role=None, teams=["a", "b"], expires_at=now + 60, now=now)

    status, refused = await call(
        gw, "POST", "/admin/api/keys", {"app": "x", "tenant": "a", "priority": "interactive"}, token
    )
    assert status == 403 and refused["error"]["code"] == "over_ceiling"
    assert refused["error"]["message"].startswith("priority must be at most standard for a key of tenant 'a'")
    status, made = await call(gw, "POST", "/admin/api/keys", {"app": "x", "tenant": "a", "priority": "batch"}, token)
    assert status == 201
    prefix = made["record"]["prefix"]
    status, refused = await call(gw, "PATCH", f"/admin/api/keys/{prefix}", {"priority": "interactive"}, token)
    assert status == 403 and refused["error"]["code"] == "over_ceiling"
    status, _ = await call(gw, "PATCH", f"/admin/api/keys/{prefix}", {"priority": "standard"}, token)
    assert status == 200

    # tenant b's ceiling (set by an admin in config.json) lets its team-admin give interactive
    body = {"app": "y", "tenant": "b", "priority": "interactive"}
    assert (await call(gw, "POST", "/admin/api/keys", body, token))[0] == 201
    # a tenant's default changed by an operator moves the ceiling where config.json sets none
    await call(gw, "PATCH", "/admin/api/tenants/a", {"priority": "interactive"})
    body = {"app": "x", "tenant": "a", "priority": "interactive"}
    assert (await call(gw, "POST", "/admin/api/keys", body, token))[0] == 201
    status, refused = await call(gw, "PATCH", "/admin/api/tenants/a", {"priority": "batch"}, token)
    assert status == 403  # a team-admin cannot change the tenant's default
