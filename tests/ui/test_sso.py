"""Single sign-on through a real, certified OpenID Provider (npm oidc-provider, tests/support/oidc.py) and its real
login page in Chromium: a viewer, an operator, a team-admin and an admin each see and may do exactly their part, in
the UI and through the API with the same session; a personal token made in the UI acts as its person; refused
sign-ins (wrong state, a replayed code, a groups claim of the wrong type, no role) end on an error page and in the
audit log, never in a session."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp

from tests.conftest import create_key, free_port, worker
from tests.support.oidc import CLIENT_ID, CLIENT_SECRET, ROLES, oidc_provider
from turnout.admin.keys import SIGNINS
from turnout.gateway.keys import AUDIT, FLEET


async def sso_gateway(gateway, emulator, provider_port: int, **auth: Any) -> Any:
    emu = await emulator("w1", models=["llama3.2:latest", "qwen3:8b"])
    return await gateway(
        [worker("w1", emu.url)],
        env={"TURNOUT_OIDC_CLIENT_SECRET": CLIENT_SECRET},
        tenants={"a": {"team_ceiling": {"rpm": 100, "daily_tokens": 100_000}}, "b": {}},
        auth={
            "open": True,
            "oidc": {
                "issuer": f"http://127.0.0.1:{provider_port}",
                "client_id": CLIENT_ID,
                "scopes": ["openid", "email", "profile", "groups"],
                "roles": ROLES,
                "label": "Test IdP",
            },
            **auth,
        },
    )


async def loopback_only(page: Any) -> None:
    """The provider's page asks a web font from the internet: nothing leaves this machine."""

    async def route(r: Any) -> None:
        host = urlsplit(r.request.url).hostname
        await (r.continue_() if host in ("127.0.0.1", "localhost") else r.abort())

    await page.route("**/*", route)


async def provider_login(page: Any, login: str) -> None:
    """On the provider's own pages: its login form, then its consent page."""
    await page.wait_for_selector("input[name=login]")
    await page.fill("input[name=login]", login)
    await page.fill("input[name=password]", "any password")
    await page.click("button[type=submit]")
    await page.click("button:has-text('Continue')")


async def sso_sign_in(page: Any, gw: Any, login: str, lands: str = "/admin/overview") -> None:
    await page.context.clear_cookies()  # the provider's own session too: the next person logs in on its page
    await page.goto(f"{gw.url}/admin")
    await page.click("#sso")
    await provider_login(page, login)
    await page.wait_for_url(f"{gw.url}{lands}")


async def api(page: Any, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A call from the page's own script (its session cookie and CSRF token)."""
    return await page.evaluate(
        """async ([method, path, body]) => {
            try { const r = await turnout.api(method, path, body === null ? undefined : body);
                  return [r.status, r.body]; }
            catch (e) { return [e.status, e.body]; } }""",
        [method, path, body],
    )


async def test_each_role_signs_in_through_the_providers_login_page_and_gets_its_part(page, gateway, emulator) -> None:
    port = free_port()
    gw = await sso_gateway(gateway, emulator, port)
    key_a, _ = create_key(gw, app="app-a", tenant="a")
    key_b, _ = create_key(gw, app="app-b", tenant="b")
    await loopback_only(page)
    with oidc_provider(port, [f"{gw.url}/admin/oidc/callback"]):
        # the sign-in page says which sign-ins are enabled
        await page.goto(f"{gw.url}/admin")
        assert "Test IdP" in await page.inner_text("#sso")
        assert await page.is_visible("#token")  # the admin token (break-glass) is still on

        # a viewer: sees every page, changes nothing
        await sso_sign_in(page, gw, "vera")
        assert "vera@example.com" in await page.inner_text("#whoami")
        assert "viewer" in await page.inner_text("#whoami")
        nav = await page.inner_text("header nav")
        assert "Model Placement" in nav and "Audit" in nav and "Keys" in nav
        status, body = await api(page, "POST", "/admin/api/placement/workers/w1/toggle", {"model": "qwen3:8b"})
        assert status == 403 and body["error"]["code"] == "forbidden_role"
        assert "needs the operator role" in body["error"]["message"]
        assert (await api(page, "GET", "/admin/api/backup"))[0] == 403
        assert (await api(page, "GET", "/admin/api/keys"))[0] == 200
        assert gw.app[FLEET].placement.get("w1") is None
        await page.click("text=Sign out")
        await page.wait_for_url(f"{gw.url}/admin")

        # an operator: changes placement and keys, no backups or people
        await sso_sign_in(page, gw, "otto")
        assert "operator" in await page.inner_text("#whoami")
        status, _ = await api(page, "POST", "/admin/api/placement/workers/w1/toggle", {"model": "qwen3:8b"})
        assert status == 200
        assert (await api(page, "POST", "/admin/api/keys", {"app": "x", "tenant": "b", "models": ["*"]}))[0] == 201
        status, body = await api(page, "GET", "/admin/api/backup")
        assert status == 403 and "needs the admin role" in body["error"]["message"]
        toggles = gw.app[AUDIT].entries(action="placement.toggle")
        assert toggles[0].actor.startswith("oidc:otto") or toggles[0].actor == "oidc:otto"
        assert "otto@example.com" in (toggles[0].detail or "")
        await page.click("text=Sign out")

        # a team-admin of tenant a: that tenant's keys and usage only, within its ceiling
        await sso_sign_in(page, gw, "tom", lands="/admin/keys")
        assert "team-admin of a" in await page.inner_text("#whoami")
        nav = await page.inner_text("header nav")
        assert "Keys" in nav and "Usage" in nav and "Model Placement" not in nav and "Audit" not in nav
        rows = await page.locator("#keys-table tbody tr, table tbody tr[data-key]").all_inner_texts()
        assert any(key_a.prefix in r for r in rows) and not any(key_b.prefix in r for r in rows)
        keys = (await api(page, "GET", "/admin/api/keys"))[1]["keys"]
        assert {k["prefix"] for k in keys} == {key_a.prefix}
        status, body = await api(page, "POST", f"/admin/api/keys/{key_b.prefix}/revoke")
        assert status == 403 and body["error"]["code"] == "forbidden_tenant"
        status, body = await api(page, "POST", "/admin/api/keys", {"app": "app-a", "tenant": "a", "rpm": 500})
        assert status == 403 and body["error"]["code"] == "over_ceiling"
        created = await api(
            page, "POST", "/admin/api/keys", {"app": "app-a", "tenant": "a", "rpm": 50, "daily_tokens": 1000}
        )
        assert created[0] == 201
        status, body = await api(page, "POST", "/admin/api/keys", {"app": "app-b", "tenant": "b", "rpm": 1})
        assert status == 403 and body["error"]["code"] == "forbidden_tenant"
        assert (await api(page, "GET", "/admin/api/placement"))[0] == 403
        response = await page.goto(f"{gw.url}/admin/placement")
        assert response.status == 403 and "needs the viewer role" in await page.inner_text("main")
        await page.goto(f"{gw.url}/admin/keys")
        await page.click("text=Sign out")

        # an admin: backups and people too; makes a personal token for the CLI, shown once
        await sso_sign_in(page, gw, "ada")
        assert "admin" in await page.inner_text("#whoami")
        async with aiohttp.ClientSession() as http:
            cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
            async with http.get(f"{gw.url}/admin/api/backup", cookies=cookies) as r:
                assert r.status == 200 and r.content_type == "application/zip"
        await page.goto(f"{gw.url}/admin/people")
        people = await page.locator("#people tbody tr").all_inner_texts()
        assert len(people) == 4 and any("tom@example.com" in p and "team-admin of a" in p for p in people)
        await page.goto(f"{gw.url}/admin/account")
        await page.fill("#token-name", "laptop")
        await page.select_option("#token-role", "operator")
        await page.click("#token-form button[type=submit]")
        await page.wait_for_selector("#secret-reveal:not([hidden])")
        token = await page.input_value("#secret-value")
        assert token.startswith("tpat_")
        async with aiohttp.ClientSession() as http:
            auth = {"Authorization": f"Bearer {token}"}
            async with http.get(f"{gw.url}/admin/api/me", headers=auth) as r:
                me = await r.json()
                assert me["role"] == "operator" and me["label"].startswith("ada@example.com")  # no higher than asked
            async with http.get(f"{gw.url}/admin/api/backup", headers=auth) as r:
                assert r.status == 403
        created_entries = gw.app[AUDIT].entries(action="token.create")
        assert created_entries and created_entries[0].actor == "oidc:ada"
        assert token not in str([e.to_json() for e in gw.app[AUDIT].entries(limit=500)])

        # disabling a person revokes their tokens and ends their sessions
        async with aiohttp.ClientSession() as http:
            cookies = {c["name"]: c["value"] for c in await page.context.cookies()}
            csrf = await page.get_attribute('meta[name="csrf-token"]', "content")
            people_list = await (await http.get(f"{gw.url}/admin/api/people", cookies=cookies)).json()
            tom = next(p for p in people_list["people"] if p["email"] == "tom@example.com")
            async with http.post(
                f"{gw.url}/admin/api/people/{tom['id']}/disable", cookies=cookies, headers={"X-CSRF-Token": csrf}
            ) as r:
                assert r.status == 200 and r.headers
        actions = [(e.action, e.actor) for e in gw.app[AUDIT].entries(limit=500)]
        assert ("person.disable", "oidc:ada") in actions
        assert {"oidc:vera", "oidc:otto", "oidc:tom", "oidc:ada"} <= {a for x, a in actions if x == "admin.signin"}
        assert ("person.role", "oidc:tom") in actions  # the first sign-in records the role given


async def test_refused_sign_ins_get_an_error_page_an_audit_entry_and_no_session(page, gateway, emulator) -> None:
    port = free_port()
    gw = await sso_gateway(gateway, emulator, port)
    await loopback_only(page)
    callbacks: list[str] = []

    def failures() -> list[Any]:
        return [e for e in gw.app[AUDIT].entries(action="admin.signin_failed", limit=100)]

    with oidc_provider(port, [f"{gw.url}/admin/oidc/callback"]):
        # a groups claim that is a string, not a list: refused
        await page.context.clear_cookies()
        await page.goto(f"{gw.url}/admin")
        await page.click("#sso")
        await provider_login(page, "gus")
        await page.wait_for_selector("main h1")
        assert "failed" in await page.inner_text("main")
        assert "turnout_session" not in {c["name"] for c in await page.context.cookies()}
        assert failures()[0].after == {"reason": "groups_claim"} and failures()[0].actor == "oidc:gus"

        # somebody whose groups have no role
        gw.app[SIGNINS]._failed.clear()  # failures are audited once a minute per address
        await page.context.clear_cookies()
        await page.goto(f"{gw.url}/admin")
        await page.click("#sso")
        await provider_login(page, "nina")
        await page.wait_for_selector("main h1")
        assert "none of your groups has a role" in await page.inner_text("main")
        assert failures()[0].after == {"reason": "no_role"}

        # the provider's answer as the browser follows it (signing in), then again from elsewhere: refused
        page.on("request", lambda r: callbacks.append(r.url) if "/admin/oidc/callback" in r.url else None)
        await page.context.clear_cookies()
        await page.goto(f"{gw.url}/admin")
        await page.click("#sso")
        await page.wait_for_selector("input[name=login]")
        pending = {c["name"]: c["value"] for c in await page.context.cookies(gw.url + "/admin/oidc/")}["turnout_oidc"]
        await provider_login(page, "otto")
        await page.wait_for_url(f"{gw.url}/admin/overview")
        answer = callbacks[-1]
        query = parse_qs(urlsplit(answer).query)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            gw.app[SIGNINS]._failed.clear()
            wrong = answer.replace(query["state"][0], "not-the-state")
            async with http.get(wrong, headers={"Cookie": f"turnout_oidc={pending}"}) as r:
                assert r.status == 401 and "turnout_session" not in r.cookies
                assert "Sign-in with single sign-on failed" in await r.text()
            assert failures()[0].after == {"reason": "state"}
            gw.app[SIGNINS]._failed.clear()
            async with http.get(answer, headers={"Cookie": f"turnout_oidc={pending}"}) as r:
                assert r.status == 401 and "turnout_session" not in r.cookies  # the same code again: refused
            assert failures()[0].after == {"reason": "code_refused"}
            async with http.get(answer) as r:  # no sign-in started in this browser
                assert r.status == 401 and "turnout_session" not in r.cookies
