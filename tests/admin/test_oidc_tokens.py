"""ID tokens that must never sign anyone in: forged, expired, for another audience, from another issuer, with
another nonce, unsigned or signed with a shared secret, with a groups claim of the wrong type; and keys the
provider rotated, which must be fetched again. The provider here is a small stand-in (discovery, JWKS, token
endpoint) whose token endpoint answers what each case crafts with joserfc; the real provider's flow is
tests/ui/test_sso.py. Each refusal is a 401 page, an audit entry with its reason, and no session."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from aiohttp import web
from joserfc import jwt
from joserfc.jwk import KeySet, OctKey

from tests.conftest import serve_app, worker
from turnout.admin.keys import SIGNINS
from turnout.admin.oidc import JWKS_REFRESH_S
from turnout.gateway.keys import AUDIT

CLIENT = "turnout"


class StandIn:
    """Discovery, JWKS and a token endpoint answering ``self.claims`` signed as ``self.sign`` says."""

    def __init__(self) -> None:
        self.keys = KeySet.generate_key_set("RSA", 2048, count=1)
        self.issuer = ""
        self.claims: dict[str, Any] = {}
        self.sign: Any = None  # None: with self.keys; else a callable(claims) -> token
        self.jwks_fetches = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", self.discovery)
        app.router.add_get("/jwks", self.jwks)
        app.router.add_post("/token", self.token)
        return app

    async def discovery(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": self.issuer,
                "authorization_endpoint": f"{self.issuer}/auth",
                "token_endpoint": f"{self.issuer}/token",
                "jwks_uri": f"{self.issuer}/jwks",
                "id_token_signing_alg_values_supported": ["RS256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic"],
            }
        )

    async def jwks(self, request: web.Request) -> web.Response:
        self.jwks_fetches += 1
        return web.json_response(self.keys.as_dict())

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        assert form["grant_type"] == "authorization_code" and form["code_verifier"]
        assert request.headers["Authorization"].startswith("Basic ")
        claims = dict(self.claims)
        if self.sign is not None:
            id_token = self.sign(claims)
        else:
            key = self.keys.keys[0]
            id_token = jwt.encode({"alg": "RS256", "kid": key.kid}, claims, key)
        return web.json_response({"access_token": "at", "token_type": "Bearer", "id_token": id_token})


@pytest.fixture
async def stand_in():
    provider = StandIn()
    url, runner = await serve_app(provider.app())
    provider.issuer = url
    yield provider
    await runner.cleanup()


async def attempt(gw: Any, provider: StandIn, craft: Any) -> tuple[int, bool, Any]:
    """One sign-in: start it, craft the ID token from what the gateway sent, come back. (status, session?, entry)"""
    gw.app[SIGNINS]._failed.clear()
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        async with http.get(f"{gw.url}/admin/oidc/start", allow_redirects=False) as r:
            assert r.status == 303
            sent = parse_qs(urlsplit(r.headers["Location"]).query)
            pending = r.cookies["turnout_oidc"].value
            assert r.cookies["turnout_oidc"]["samesite"] == "Lax"
            assert sent["code_challenge_method"] == ["S256"] and sent["code_challenge"][0]
        now = int(time.time())
        provider.claims = {
            "iss": provider.issuer,
            "sub": "person-1",
            "aud": CLIENT,
            "iat": now,
            "exp": now + 300,
            "nonce": sent["nonce"][0],
            "email": "p@example.com",
            "groups": ["ops"],
        }
        craft(provider)
        state = sent["state"][0]
        async with http.get(
            f"{gw.url}/admin/oidc/callback?code=abc&state={state}", headers={"Cookie": f"turnout_oidc={pending}"}
        ) as r:
            status, session = r.status, "turnout_session" in r.cookies
            if status == 200:
                assert r.cookies["turnout_session"]["samesite"] == "Strict"
    entries = gw.app[AUDIT].entries(limit=5)
    return status, session, entries[0]


def other_key_same_kid(provider: StandIn) -> None:
    forger = KeySet.generate_key_set("RSA", 2048, count=1).keys[0]
    kid = provider.keys.keys[0].kid
    provider.sign = lambda claims: jwt.encode({"alg": "RS256", "kid": kid}, claims, forger)


def shared_secret(provider: StandIn) -> None:
    provider.sign = lambda claims: jwt.encode({"alg": "HS256"}, claims, OctKey.import_key("s" * 32))


def unsigned(provider: StandIn) -> None:
    import base64
    import json

    def none(claims: dict[str, Any]) -> str:
        part = [
            base64.urlsafe_b64encode(json.dumps(x).encode()).decode().rstrip("=") for x in ({"alg": "none"}, claims)
        ]
        return f"{part[0]}.{part[1]}."

    provider.sign = none


CASES = {
    "forged signature": (other_key_same_kid, "signature"),
    "shared-secret HMAC": (shared_secret, "malformed"),
    "unsigned (alg none)": (unsigned, "malformed"),
    "expired": (lambda p: p.claims.update(exp=int(time.time()) - 3600, iat=int(time.time()) - 7200), "expired"),
    "another audience": (lambda p: p.claims.update(aud="someone-else"), "audience"),
    "several audiences, azp not us": (lambda p: p.claims.update(aud=[CLIENT, "other"], azp="other"), "audience"),
    "unknown issuer": (lambda p: p.claims.update(iss="https://evil.example"), "issuer"),
    "another nonce": (lambda p: p.claims.update(nonce="replayed-nonce"), "nonce"),
    "no sub": (lambda p: p.claims.pop("sub"), "missing_claim"),
    "groups as a string": (lambda p: p.claims.update(groups="ops"), "groups_claim"),
    "groups as an object": (lambda p: p.claims.update(groups={"ops": True}), "groups_claim"),
    "groups with a number": (lambda p: p.claims.update(groups=["ops", 7]), "groups_claim"),
}


@pytest.fixture
async def gw(gateway, emulator, stand_in):
    emu = await emulator("w1")
    return await gateway(
        [worker("w1", emu.url)],
        env={"TURNOUT_OIDC_CLIENT_SECRET": "client-secret"},
        auth={"open": True, "oidc": {"issuer": stand_in.issuer, "client_id": CLIENT, "roles": {"ops": "operator"}}},
    )


@pytest.mark.parametrize("case", list(CASES))
async def test_a_bad_id_token_is_refused_with_an_error_page_and_an_audit_entry(gw, stand_in, case) -> None:
    craft, reason = CASES[case]
    status, session, entry = await attempt(gw, stand_in, craft)
    assert (status, session) == (401, False)
    assert (entry.action, entry.after) == ("admin.signin_failed", {"reason": reason})


async def test_a_good_token_signs_in_and_rotated_keys_are_fetched_again(gw, stand_in) -> None:
    status, session, entry = await attempt(gw, stand_in, lambda p: None)
    assert (status, session, entry.action, entry.actor) == (200, True, "admin.signin", "oidc:person-1")
    fetched = stand_in.jwks_fetches
    stand_in.keys = KeySet.generate_key_set("RSA", 2048, count=1)  # the provider rotated its signing key
    await asyncio.sleep(JWKS_REFRESH_S)  # keys are fetched again at most this often (a flood of unknown kids)
    status, session, entry = await attempt(gw, stand_in, lambda p: None)
    assert (status, session, entry.action) == (200, True, "admin.signin")
    assert stand_in.jwks_fetches == fetched + 1


async def test_the_discovery_document_must_name_the_configured_issuer(gw, stand_in) -> None:
    configured = stand_in.issuer
    stand_in.issuer = "https://somewhere.else"
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/admin/oidc/start", allow_redirects=False) as r:
        assert r.status == 502 and "turnout_oidc" not in r.cookies
    stand_in.issuer = configured
