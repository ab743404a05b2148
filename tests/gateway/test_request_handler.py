"""The gateway's request handler (:func:`turnout.gateway.frame.request_handler`): a request for a fixed path is
taken to its route without aiohttp's router, and is answered exactly as the router's way answers it."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from tests.conftest import ADMIN_TOKEN, EmulatorFactory, Gateway, GatewayFactory, create_key, worker
from turnout.gateway.frame import fixed_routes

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


@pytest.fixture
async def gw(emulator: EmulatorFactory, gateway: GatewayFactory) -> Gateway:
    emu = await emulator("a", ["llama3.2:latest"])
    return await gateway([worker("a", emu.url)], auth={"open": False})


async def test_every_fixed_route_is_the_one_the_router_picks(gw: Gateway) -> None:
    """For every plain path of the app and every method: the table's route is the router's, or the table has
    none and the router decides (a "*" route, a method the path does not take)."""
    fixed = fixed_routes(gw.app)
    assert ("POST", "/v1/chat/completions") in fixed and ("GET", "/admin/api/keys") in fixed
    assert ("POST", "/sleep") not in fixed  # a "*" route (engine administration): the router's
    paths = {path for _, path in fixed} | {"/sleep", "/slots", "/v1/models/load"}
    taken = 0
    for path in paths:
        for method in METHODS:
            match = await gw.app.router.resolve(make_mocked_request(method, path, app=gw.app))
            found = fixed.get((method, path))
            if found is not None:
                taken += 1
                assert found[0] is match.route, (method, path)
                assert found[2] == match.route.resource.canonical  # type: ignore[union-attr]
    assert taken > 40


async def _call(gw: Gateway, method: str, path: str, **kw: Any) -> tuple[int, dict[str, Any], str]:
    async with aiohttp.ClientSession() as s, s.request(method, gw.url + path, **kw) as r:
        return r.status, dict(r.headers), await r.text()


def _shape(text: str) -> str:
    """An answer without what differs between two calls (ids, times)."""
    return re.sub(r'"(id|created|created_at|total_duration|load_duration|eval_duration)":\s*("[^"]*"|\d+)', "", text)


async def test_a_fixed_path_is_answered_as_the_routers_way_answers_it(gw: Gateway) -> None:
    """The same requests with and without a query string (which sends them through the router): the same
    status, answer and headers, admin auth included, and both counted under the route's label."""
    key = create_key(gw, scopes=["llama3.2"])[1]
    bearer = {"Authorization": f"Bearer {key}"}
    chat = {"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/v1/chat/completions", {"json": chat, "headers": bearer}),
        ("POST", "/api/chat", {"json": chat, "headers": bearer}),
        ("POST", "/v1/chat/completions", {"json": {**chat, "model": "qwen3"}, "headers": bearer}),  # 403
        ("POST", "/v1/chat/completions", {"json": chat}),  # 401, no key
        ("POST", "/v1/chat/completions", {"data": b"{", "headers": bearer}),  # 400
        ("GET", "/v1/models", {"headers": bearer}),
        ("GET", "/api/tags", {"headers": bearer}),
        ("GET", "/admin/api/keys", {}),  # 401: the admin check holds on the fast way too
        ("GET", "/admin/api/keys", {"headers": {"Authorization": f"Bearer {ADMIN_TOKEN}"}}),
        ("PUT", "/v1/chat/completions", {"headers": bearer}),  # 405 from the router either way
    ]
    for method, path, kw in cases:
        fast = await _call(gw, method, path, **kw)
        routed = await _call(gw, method, path + "?via=router", **kw)
        assert fast[0] == routed[0], (method, path, fast, routed)
        assert _shape(fast[2]) == _shape(routed[2]), (method, path)
        for header in ("Content-Type", "X-Turnout-Version"):
            assert fast[1].get(header) == routed[1].get(header), (method, path, header)
    status, _, text = await _call(gw, "GET", "/admin/api/keys")
    assert status == 401 and "admin" in text.lower()
    status, _, metrics = await _call(gw, "GET", "/metrics")
    assert status == 200
    sample = r'turnout_requests_total\{api="openai",endpoint="/v1/chat/completions",status="200"\} (\S+)'
    line = re.search(sample, metrics)
    assert line is not None and float(line[1]) == 2  # once each way
    assert "\nturnout_in_flight_requests 1.0\n" in metrics  # the scrape itself, counted on the fast way


async def test_expect_continue_is_left_to_the_router(gw: Gateway) -> None:
    """``Expect: 100-continue`` is answered by the router's expect handler first (aiohttp's way), then the
    request is served as usual."""
    key = create_key(gw, scopes=["*"])[1]
    body = b'{"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": false}'
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            gw.url + "/v1/chat/completions",
            data=body,
            expect100=True,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        ) as r,
    ):
        assert r.status == 200
        assert (await r.json())["choices"][0]["message"]["role"] == "assistant"


async def test_an_app_with_another_middleware_keeps_the_routers_way() -> None:
    """A middleware added to the app would be skipped by the fast way: then every request takes the router."""
    from turnout.gateway.frame import request_handler

    app = web.Application()
    assert request_handler(app) == app._handle
