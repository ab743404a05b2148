"""Browser sessions in the store: idle expiry, the absolute limit, sign-out, and the Secure cookie flag."""

from __future__ import annotations

import re

import aiohttp
import pytest

from tests.conftest import ADMIN_TOKEN, worker
from turnout.admin.ui.sessions import IDLE_S, MAX_AGE_S, TOUCH_EVERY_S, SessionStore
from turnout.admin.ui.signin import safe_next
from turnout.store.db import Database


def test_idle_expiry_and_touch(database_url: str) -> None:
    """On SQLite and PostgreSQL: any replica sharing the store serves the same sessions."""
    db = Database(database_url)
    db.migrate()
    store = SessionStore(db)
    token, session = store.create(remote="127.0.0.1", now=1000.0)
    assert session.csrf and session.id != token  # the store holds a digest, never the cookie
    assert store.get(token, now=1000.0 + IDLE_S - 1) is not None  # used: the idle clock restarts
    assert store.get(token, now=1000.0 + 2 * IDLE_S - 2) is not None
    assert store.get(token, now=1000.0 + 3 * IDLE_S) is None  # idle too long
    assert store.get(token, now=1000.0 + 3 * IDLE_S) is None

    token, _ = store.create(remote=None, now=0.0)
    now = 0.0
    while now + TOUCH_EVERY_S < MAX_AGE_S:
        now += IDLE_S / 2
        if now > MAX_AGE_S:
            break
        assert store.get(token, now=now) is not None
    assert store.get(token, now=MAX_AGE_S + 1) is None  # however busy, no session outlives MAX_AGE_S

    token, _ = store.create(remote=None, now=0.0)
    assert store.delete(token) and store.get(token, now=1.0) is None
    assert store.get("", now=1.0) is None and store.get("x" * 500, now=1.0) is None
    db.close()


async def _sign_in(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> aiohttp.ClientResponse:
    """The form's two requests; the form's token cookie is sent by hand (a Secure one would not travel over
    this plain-HTTP test connection, as it should not)."""
    async with http.get(f"{url}/admin", headers=headers) as r:
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', await r.text())
        form_cookie = r.cookies["turnout_signin"].value
    assert csrf is not None
    data = {"token": ADMIN_TOKEN, "csrf_token": csrf.group(1), "next": "/admin/overview"}
    cookie = {"Cookie": f"turnout_signin={form_cookie}"}
    async with http.post(f"{url}/admin/signin", data=data, headers=headers | cookie, allow_redirects=False) as r:
        return r


async def test_secure_cookie_behind_a_tls_proxy(gateway, emulator) -> None:
    emu = await emulator("w1")
    gw = await gateway([worker("w1", emu.url)])
    async with aiohttp.ClientSession() as http:
        r = await _sign_in(http, gw.url, {"X-Forwarded-Proto": "https"})
        assert r.status == 303
        cookie = r.cookies["turnout_session"]
        assert cookie["secure"] and cookie["httponly"] and cookie["samesite"] == "Strict"
    async with aiohttp.ClientSession() as http:
        r = await _sign_in(http, gw.url, {})
        assert not r.cookies["turnout_session"]["secure"]


async def test_sign_in_without_the_form_token_is_refused(gateway, emulator) -> None:
    emu = await emulator("w1")
    gw = await gateway([worker("w1", emu.url)])
    async with aiohttp.ClientSession() as http:
        data = {"token": ADMIN_TOKEN, "next": "/admin/overview"}
        async with http.post(f"{gw.url}/admin/signin", data=data, allow_redirects=False) as r:
            assert r.status == 403
            assert "turnout_session" not in r.cookies
        # and no open redirect after a good sign-in
        r = await _sign_in(http, gw.url, {})
        assert r.headers["Location"] == "/admin/overview"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/admin/placement", "/admin/placement"),
        ("/admin/placement/workers/a?x=1", "/admin/placement/workers/a?x=1"),
        ("//evil.example/admin/", "/admin/overview"),
        ("https://evil.example/admin/x", "/admin/overview"),
        ("/admin//evil.example", "/admin/overview"),
        ("/admin/\\evil", "/admin/overview"),
        ("/admin/api/keys", "/admin/overview"),
        ("/admin/x\r\nSet-Cookie: a=b", "/admin/overview"),
        (None, "/admin/overview"),
    ],
)
def test_sign_in_never_redirects_out_of_the_ui(target: str | None, expected: str) -> None:
    assert safe_next(target) == expected
