"""Sign-in, sessions, CSRF and the browser security headers, in a real browser (and with plain HTTP where the
point is what a browser would never send)."""

from __future__ import annotations

import time

import aiohttp
from playwright.async_api import Error as PlaywrightError
from sqlalchemy import select, update

from tests.conftest import ADMIN_TOKEN, worker
from tests.ui.conftest import sign_in
from turnout.admin.ui.sessions import IDLE_S
from turnout.gateway.keys import AUDIT, DATABASE, FLEET
from turnout.store.schema import admin_sessions


async def test_sign_in_out_and_security_headers(page, gateway, emulator) -> None:
    emu = await emulator("w1", models=["llama3.2:latest"])
    gw = await gateway([worker("w1", emu.url)])
    response = await page.goto(f"{gw.url}/admin/overview")
    assert page.url.startswith(f"{gw.url}/admin?next=")  # not signed in: the sign-in form, then back here
    headers = response.headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "unsafe-inline" not in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    assert headers["cache-control"] == "no-store"

    await page.fill("#token", "wrong")
    await page.press("#token", "Enter")
    await page.wait_for_selector("#signin-error")
    assert await page.get_attribute("#token", "aria-invalid") == "true"

    await sign_in(page, gw)
    cookies = {c["name"]: c for c in await page.context.cookies()}
    session = cookies["turnout_session"]
    assert session["httpOnly"] and session["sameSite"] == "Strict" and not session["secure"]  # plain HTTP here
    assert await page.inner_text("#workers tr[data-worker=w1]")

    actions = {(e.action, e.actor) for e in gw.app[AUDIT].entries(limit=50)}
    assert {("admin.signin", "token"), ("admin.signin_failed", "token")} <= actions  # the admin token's actor

    await page.click("text=Sign out")
    await page.wait_for_url(f"{gw.url}/admin")
    await page.goto(f"{gw.url}/admin/overview")
    assert page.url.startswith(f"{gw.url}/admin?next=")  # the session is gone on the server, not only the cookie
    assert "admin.signout" in [e.action for e in gw.app[AUDIT].entries(limit=50)]


async def test_post_without_csrf_is_refused_and_changes_nothing(page, gateway, emulator) -> None:
    emu = await emulator("w1", models=["llama3.2:latest"])
    gw = await gateway([worker("w1", emu.url)])
    await sign_in(page, gw)
    before = gw.app[FLEET].rules("w1")
    cookie = {c["name"]: c["value"] for c in await page.context.cookies()}["turnout_session"]
    async with aiohttp.ClientSession(cookies={"turnout_session": cookie}) as http:
        api = f"{gw.url}/admin/api/placement/workers/w1/toggle"
        async with http.post(api, json={"model": "llama3.2:latest"}) as r:
            assert r.status == 403
            assert (await r.json())["error"]["code"] == "csrf_failed"
        async with http.post(api, json={"model": "llama3.2:latest"}, headers={"X-CSRF-Token": "forged"}) as r:
            assert r.status == 403
        async with http.post(f"{gw.url}/admin/signout", data={"csrf_token": "forged"}) as r:
            assert r.status == 403
        async with http.get(f"{gw.url}/admin/api/inventory") as r:  # reads need no token
            assert r.status == 200
    assert gw.app[FLEET].rules("w1") == before
    assert not gw.settings.placement_file.exists()
    # the browser itself, same origin, with its cookie but without the token: refused too
    status = await page.evaluate(
        "async () => (await fetch('/admin/api/placement/workers/w1/toggle', {method: 'POST',"
        " headers: {'Content-Type': 'application/json'}, body: JSON.stringify({model: 'llama3.2:latest'})})).status"
    )
    assert status == 403
    assert gw.app[FLEET].rules("w1") == before
    # from the page's own script (it sends the token) the same call works; the session survived the forged ones
    status = await page.evaluate(
        "async () => (await turnout.api('POST', '/admin/api/placement/workers/w1/toggle',"
        " {model: 'llama3.2:latest'})).status"
    )
    assert status == 200
    assert gw.app[FLEET].rules("w1")[0].to_json() != before[0].to_json()


async def test_bearer_api_is_unchanged(gateway, emulator) -> None:
    emu = await emulator("w1")
    gw = await gateway([worker("w1", emu.url)])
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.url}/admin/api/inventory") as r:
            assert r.status == 401
        async with http.get(f"{gw.url}/admin/api/inventory", headers={"Authorization": "Bearer nope"}) as r:
            assert r.status == 401
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with http.post(
            f"{gw.url}/admin/api/placement/workers/w1/toggle", json={"model": "llama3.2:latest"}, headers=headers
        ) as r:
            assert r.status == 200  # scripts need no CSRF token: no browser, no ambient cookie
        async with http.get(f"{gw.url}/admin/api/nope", headers=headers) as r:  # the API's 404 stays JSON
            assert r.status == 404 and (await r.json())["error"]["code"] == "unknown_route"
        async with http.get(f"{gw.url}/admin/nope", allow_redirects=False) as r:  # a page: sign in first
            assert (r.status, r.headers["Location"]) == (303, "/admin?next=%2Fadmin%2Fnope")
        async with http.get(f"{gw.url}/admin/", allow_redirects=False) as r:
            assert (r.status, r.headers["Location"]) == (303, "/admin")
        async with http.get(f"{gw.url}/admin/api/inventory", cookies={"turnout_session": "made-up"}) as r:
            assert r.status == 401
            assert (await r.json())["error"]["code"] == "session_expired"


async def test_an_idle_session_ends(page, gateway, emulator) -> None:
    emu = await emulator("w1")
    gw = await gateway([worker("w1", emu.url)])
    await sign_in(page, gw)
    with gw.app[DATABASE].begin() as conn:  # as if the browser had been idle for longer than IDLE_S
        conn.execute(update(admin_sessions).values(last_seen=time.time() - IDLE_S - 1))
    # the Overview's own refresh (an htmx request) is told to go to the sign-in, not shown a 401
    # The page's own polling may get there first and navigate while evaluate runs: the navigation is the
    # outcome under test, so the statement does not wait on htmx's promise and a destroyed context is fine.
    try:
        await page.evaluate(
            "() => { if (window.htmx) htmx.ajax('GET', '/admin/overview/fragment',"
            " {target: '#overview-body', swap: 'outerHTML'}); }"
        )
    except PlaywrightError as e:
        assert "context was destroyed" in str(e), e
    await page.wait_for_url(f"{gw.url}/admin?next=%2Fadmin%2Foverview")  # back to the page after signing in
    await page.goto(f"{gw.url}/admin/overview")
    assert page.url == f"{gw.url}/admin?next=%2Fadmin%2Foverview"
    assert await page.is_visible("#token")
    with gw.app[DATABASE].begin() as conn:
        assert conn.execute(select(admin_sessions)).first() is None  # the expired row is gone, not only ignored


async def test_any_replica_serves_a_session(page, gateway, emulator, tmp_path) -> None:
    emu = await emulator("w1")
    shared = f"sqlite:///{tmp_path / 'shared.db'}"
    a = await gateway([worker("w1", emu.url)], storage={"data_dir": str(tmp_path / "a"), "database_url": shared})
    b = await gateway([worker("w1", emu.url)], storage={"data_dir": str(tmp_path / "b"), "database_url": shared})
    await sign_in(page, a)
    await page.goto(f"{b.url}/admin/placement")  # cookies are per host, not per port: the same browser session
    assert page.url == f"{b.url}/admin/placement"
    await page.click("text=Sign out")  # signed out on b: a no longer knows the session either
    await page.goto(f"{a.url}/admin/overview")
    assert page.url.startswith(f"{a.url}/admin?next=")
