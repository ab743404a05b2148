"""External endpoints end to end: register, test, health states, SSRF opt-in, credentials, fallback."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson
import pytest
from sqlalchemy import update

from tests.conftest import ADMIN_TOKEN, EmulatorFactory, Engine, Gateway, GatewayFactory, worker
from turnout.core.endpoint_health import EndpointState
from turnout.gateway.keys import ACCOUNTANT, DATABASE, ENDPOINTS, USAGE
from turnout.store.schema import endpoints

PRIVATE_OK = {"APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS": "true"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def admin(gw: Gateway, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.request(method, f"{gw.url}{path}", json=body, headers=ADMIN) as r:
        return r.status, await r.json()


async def chat(
    gw: Gateway, key: str | None, model: str, *, stream: bool = False, path: str = "/api/chat"
) -> tuple[int, bytes, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}{path}", json={"model": model, "messages": [], "stream": stream}, headers=headers) as r,
    ):
        return r.status, await r.read(), r.headers


async def test_register_route_and_scope(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    fleet_worker = await emulator("fleet", ["qwen3:8b"])
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([worker("gpu", fleet_worker.url)], env=PRIVATE_OK, auth={"open": False})
    status, reg = await admin(gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": mac.url, "api": "ollama"})
    assert status == 201, reg
    assert reg["test"]["ok"] is True and reg["test"]["models"] == ["llama3.2:latest"]
    assert reg["endpoint"]["state"] == "online" and reg["endpoint"]["models"] == ["mac/llama3.2:latest"]
    key = reg["key"]
    status, body, _ = await chat(gw, key, "mac/llama3.2")
    assert status == 200 and b"[mac]" in body
    assert mac.calls[-1][1]["model"] == "llama3.2:latest"  # the namespace is stripped upstream
    assert "Authorization" not in mac.headers_seen[-1]  # the gateway key never goes upstream
    status, body, _ = await chat(gw, key, "qwen3:8b")
    assert status == 403  # the endpoint key reaches only mac/*
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http,
        http.get(f"{gw.url}/v1/models") as r,
    ):
        assert [m["id"] for m in (await r.json())["data"]] == ["mac/llama3.2:latest"]
    _, listing = await admin(gw, "GET", "/admin/api/endpoints")
    assert listing["endpoints"][0]["credential"] is False
    _, audit = await admin(gw, "GET", "/admin/api/audit?action=endpoint.register")
    assert len(audit["entries"]) == 1


async def test_private_address_needs_opt_in(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([], auth={"open": True})
    status, reg = await admin(gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": mac.url, "api": "ollama"})
    assert status == 201  # a server that cannot be reached still registers
    assert reg["test"]["ok"] is False and reg["test"]["failure"] == "dial_refused_private"
    assert "APP_MODEL_ENDPOINT_ALLOW_PRIVATE_NETWORKS=true" in reg["test"]["hint"]
    assert reg["endpoint"]["state"] == "unreachable" and mac.served() == 0  # nothing was dialed
    assert (await chat(gw, None, "mac/llama3.2"))[0] == 503


@pytest.mark.parametrize(
    ("declared", "host", "failure", "url_private", "error"),
    [
        # no NAT64 prefix declared: a local-use NAT64 address cannot be read, and the error says so
        (None, "64:ff9b:1::a00:1", "dial_refused", False, "in no declared NAT64 prefix, so the IPv4 address"),
        (None, "64:ff9b:1:808:8:800::", "dial_refused", False, "network.nat64_prefixes"),
        # declared: judged as the IPv4 address it carries there (never dialed: each of these is refused)
        ("64:ff9b:1:2a::/96", "64:ff9b:1:2a::a00:1", "dial_refused_private", True, "carries 10.0.0.1 (NAT64"),
        ("64:ff9b:1:2a::/96", "64:ff9b:1:2a::a9fe:a9fe", "dial_refused", False, "is a cloud metadata address"),
        ("64:ff9b:1::/48", "64:ff9b:1:a9fe:a9:fe00::", "dial_refused", False, "carries 169.254.169.254"),
        ("64:ff9b:1::/48", "64:ff9b:1:7f00:0:100::", "dial_refused_private", True, "carries 127.0.0.1"),
        ("64:ff9b:1::/48", "64:ff9b:1:808:ff08:800::", "dial_refused", False, '"u" octet is not zero'),
    ],
)
async def test_the_ssrf_guard_reads_the_declared_nat64_prefix(
    gateway: GatewayFactory, declared: str | None, host: str, failure: str, url_private: bool, error: str
) -> None:
    network = {"nat64_prefixes": [declared]} if declared else {}
    gw = await gateway([], network=network)
    status, body = await admin(
        gw, "POST", "/admin/api/endpoints/test", {"url": f"http://[{host}]:11434", "api": "ollama"}
    )
    assert status == 200, body
    assert body["test"]["failure"] == failure and error in body["test"]["error"], body["test"]
    assert body["url_private"] is url_private
    if failure == "dial_refused":
        assert "NAT64" in body["test"]["hint"]


async def test_credential_is_encrypted_forwarded_and_never_shown(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    cloud = await emulator("cloud", ["gpt-x"], require_key="s3cret-upstream")
    gw = await gateway([], env=PRIVATE_OK)
    status, reg = await admin(
        gw,
        "POST",
        "/admin/api/endpoints",
        {"name": "cloud", "url": cloud.url, "api": "openai", "credential": "s3cret-upstream"},
    )
    assert status == 201 and reg["test"]["ok"] is True
    assert (await chat(gw, None, "cloud/gpt-x", path="/v1/chat/completions"))[0] == 200
    assert cloud.headers_seen[-1]["Authorization"] == "Bearer s3cret-upstream"
    _, listing = await admin(gw, "GET", "/admin/api/endpoints")
    assert listing["endpoints"][0]["credential"] is True and "s3cret" not in str(listing)
    with gw.app[DATABASE].engine.connect() as conn:
        stored = str(conn.exec_driver_sql("SELECT credential FROM endpoints").all())
    assert "s3cret" not in stored
    # a wrong credential is reported with what to change
    status, _ = await admin(gw, "PATCH", "/admin/api/endpoints/cloud", {"credential": "wrong"})
    status, tested = await admin(gw, "POST", "/admin/api/endpoints/cloud/test")
    assert tested["test"]["failure"] == "auth" and "credential" in tested["test"]["hint"]
    assert tested["endpoint"]["state"] == "degraded"


def _rejections(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "rejected its credential" in r.getMessage()]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
@pytest.mark.parametrize("api", ["ollama", "openai"])  # an ollama endpoint is passed through; openai: /api translated
async def test_a_rejected_endpoint_credential_is_a_502_for_the_operator(
    emulator: EmulatorFactory,
    gateway: GatewayFactory,
    caplog: pytest.LogCaptureFixture,
    api: str,
    path: str,
    stream: bool,
) -> None:
    """The upstream's 401 (OpenAI's says invalid_api_key) is about the gateway's credential for the endpoint,
    never the client's key: the client gets 502 upstream_auth_failed in its dialect; the operator a log line."""
    cloud = await emulator("cloud", ["gpt-x"], require_key="s3cret-upstream")
    gw = await gateway([], env=PRIVATE_OK)
    body = {"name": "cloud", "url": cloud.url, "api": api, "credential": "wrong-credential-1234"}
    status, reg = await admin(gw, "POST", "/admin/api/endpoints", body)
    assert status == 201 and reg["test"]["failure"] == "auth"
    with caplog.at_level(logging.INFO, logger="turnout"):
        for _ in range(2):
            status, raw, headers = await chat(gw, None, "cloud/gpt-x", stream=stream, path=path)
            assert status == 502 and headers["Content-Type"].startswith("application/json"), raw
            answer = orjson.loads(raw)
            if path.startswith("/v1"):
                assert answer["error"]["code"] == "upstream_auth_failed" and answer["error"]["type"] == "server_error"
                message = answer["error"]["message"]
            else:
                message = answer["error"]
            assert message.startswith('the endpoint "cloud" rejected its credential (HTTP 401)'), message
            assert "not your API key" in message and "1234" not in message and "Incorrect" not in message
        assert (
            len(cloud.headers_seen) >= 3 and cloud.headers_seen[-1]["Authorization"] == "Bearer wrong-credential-1234"
        )
        logged = _rejections(caplog)
        assert len(logged) == 1, logged  # once per change, not once per request
        assert 'endpoint "cloud" rejected its credential (HTTP 401' in logged[0]
        assert "turnout endpoint set cloud --credential-from-env" in logged[0]
        # the operator fixes it: served again, and the log says so
        status, _ = await admin(gw, "PATCH", "/admin/api/endpoints/cloud", {"credential": "s3cret-upstream"})
        assert status == 200
        status, raw, _ = await chat(gw, None, "cloud/gpt-x", stream=stream, path=path)
        assert status == 200, raw
    assert 'endpoint "cloud" is online again (was degraded)' in caplog.messages


async def test_a_rejected_worker_credential_is_a_502_naming_the_config(
    emulator: EmulatorFactory, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    vllm = await emulator("vllm", ["gpt-x"], require_key="s3cret-upstream")
    gw = await gateway([worker("gpu", vllm.url, type="openai", api_key="stale-key")])
    with caplog.at_level(logging.INFO, logger="turnout"):
        status, raw, _ = await chat(gw, None, "gpt-x", path="/v1/chat/completions")
        assert status == 502 and orjson.loads(raw)["error"]["code"] == "upstream_auth_failed"
        assert orjson.loads(raw)["error"]["message"].startswith('the worker "gpu" rejected its credential (HTTP 401)')
        vllm.behaviour.require_key = "stale-key"  # the key is right again (changed on the server's side)
        status, raw, _ = await chat(gw, None, "gpt-x", path="/v1/chat/completions")
        assert status == 200, raw
    logged = _rejections(caplog)
    assert len(logged) == 1 and 'fix "api_key" of worker "gpu" in the config' in logged[0]
    assert 'worker "gpu" accepts its credential again' in caplog.messages


async def test_health_states(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([], env=PRIVATE_OK, health={"interval_s": 3600, "timeout_s": 0.3})
    await admin(gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": mac.url, "api": "ollama"})
    manager = gw.app[ENDPOINTS]
    state = lambda: gw.app[ENDPOINTS].fleet.workers["mac"].external.state  # noqa: E731
    assert state() is EndpointState.ONLINE
    mac.behaviour.tags_hang_s = 2  # the laptop went to sleep
    await manager.check("mac")
    assert state() is EndpointState.ASLEEP
    mac.behaviour.tags_hang_s = 0
    await manager.check("mac")
    assert state() is EndpointState.ONLINE
    port = mac.port
    await mac.stop()
    probe = await manager.check("mac")
    assert state() is EndpointState.UNREACHABLE and probe is not None and "OLLAMA_HOST" in (probe.hint or "")
    await mac.start(port)
    await manager.check("mac")
    assert state() is EndpointState.ONLINE


async def test_wrong_api_type_says_so(llama_engine: Engine, gateway: GatewayFactory) -> None:
    gw = await gateway([], env=PRIVATE_OK)
    _, reg = await admin(gw, "POST", "/admin/api/endpoints", {"name": "lc", "url": llama_engine.url, "api": "ollama"})
    assert reg["test"]["failure"] == "wrong_api" and "--api openai" in reg["test"]["hint"]
    _, fixed = await admin(gw, "PATCH", "/admin/api/endpoints/lc", {"api": "openai"})
    assert fixed["endpoint"]["state"] == "online" and fixed["endpoint"]["models"] == ["lc/tiny"]


@pytest.mark.parametrize("failure", ["down", "http_500", "slow"])
async def test_fallback(emulator: EmulatorFactory, gateway: GatewayFactory, failure: str) -> None:
    fleet_worker = await emulator("fleet", ["llama3.2:latest"])
    mac = await emulator("mac", ["llama3.2:latest"])
    gw = await gateway([worker("gpu", fleet_worker.url)], env=PRIVATE_OK)
    await admin(
        gw,
        "POST",
        "/admin/api/endpoints",
        {"name": "mac", "url": mac.url, "api": "ollama", "fallback_model": "llama3.2:latest", "latency_budget_ms": 300},
    )
    if failure == "down":
        await mac.stop()
    elif failure == "http_500":
        mac.behaviour.fail_status = 500
    else:
        mac.behaviour.hang_s = 3
    status, body, headers = await chat(gw, None, "mac/llama3.2:latest")
    assert status == 200 and b"[fleet]" in body
    assert headers["X-Fallback-From"] == "mac/llama3.2:latest"
    await gw.app[ACCOUNTANT].usage.flush()
    [row] = gw.app[USAGE].summary(since=0)
    assert row["worker"] == "gpu" and row["fallback_from"] == "mac/llama3.2:latest"
    if failure == "down":  # health now says down: straight to the fallback, the primary is not dialed
        served_before = mac.served()
        assert (await chat(gw, None, "mac/llama3.2:latest"))[0] == 200
        assert mac.served() == served_before
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/metrics") as r:
        assert 'turnout_endpoint_fallbacks_total{endpoint="mac"' in await r.text()


async def test_stalled_stream_is_not_retried(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    fleet_worker = await emulator("fleet", ["llama3.2:latest"])
    mac = await emulator("mac", ["llama3.2:latest"], stall_after_chunks=2)
    gw = await gateway([worker("gpu", fleet_worker.url)], env=PRIVATE_OK, limits={"upstream_timeout_s": 1})
    await admin(
        gw,
        "POST",
        "/admin/api/endpoints",
        {"name": "mac", "url": mac.url, "api": "ollama", "fallback_model": "llama3.2:latest", "latency_budget_ms": 300},
    )
    status, body, headers = await chat(gw, None, "mac/llama3.2:latest", stream=True)
    lines = body.splitlines()
    assert status == 200 and "X-Fallback-From" not in headers
    assert len(lines) == 3 and b'"error"' in lines[-1] and fleet_worker.served("/api/chat") == 0


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/pull"),
        ("DELETE", "/api/delete"),
        ("POST", "/api/create"),
        ("POST", "/slots/0"),
        ("POST", "/sleep"),
        ("POST", "/v1/models/load"),
        ("GET", "/api/v0/models"),
    ],
)
async def test_engine_admin_routes_are_refused(gateway: GatewayFactory, method: str, path: str) -> None:
    gw = await gateway([])
    async with aiohttp.ClientSession() as http, http.request(method, f"{gw.url}{path}", json={}) as r:
        assert r.status == 403
        assert "engine administration route" in str(await r.json())


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"name": "bad name", "url": "http://x"}, "endpoint name"),
        ({"name": "x", "url": "ftp://x"}, "must start with http"),
        ({"name": "x", "url": "http://x", "api": "grpc"}, '"api" must be'),
        ({"name": "x"}, '"url" is required'),
        ({"name": "x", "url": "http://x", "color": 1}, "unknown field"),
        ({"name": "gpu", "url": "http://x"}, "configured worker"),
    ],
)
async def test_bad_registrations(
    emulator: EmulatorFactory, gateway: GatewayFactory, body: dict[str, Any], fragment: str
) -> None:
    w = await emulator("gpu")
    gw = await gateway([worker("gpu", w.url)])
    status, reply = await admin(gw, "POST", "/admin/api/endpoints", body)
    assert status == 422 and fragment in reply["error"]["message"]
    assert (await admin(gw, "GET", "/admin/api/endpoints"))[1]["endpoints"] == []


async def test_unknown_endpoint_404(gateway: GatewayFactory) -> None:
    gw = await gateway([])
    for method, path in (("POST", "/admin/api/endpoints/nope/test"), ("DELETE", "/admin/api/endpoints/nope")):
        status, body = await admin(gw, method, path)
        assert status == 404 and 'no endpoint "nope"' in body["error"]["message"]


async def test_background_checks_leave_a_busy_single_request_endpoint_alone(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """mlx_lm.server and LM Studio may answer one request at a time: a check queued behind a long answer
    times out. While requests to the endpoint are in flight (or just answered) it is not probed, and a
    timeout while it makes progress does not put it to sleep."""
    mac = await emulator("mac", ["m:1"], tokens=25, token_delay_s=0.1)
    env = {**PRIVATE_OK, "APP_MODEL_ENDPOINT_HEALTH_INTERVAL": "0.2"}
    gw = await gateway([], env=env, auth={"open": True}, health={"interval_s": 3600, "timeout_s": 0.5})
    status, reg = await admin(gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": mac.url, "api": "openai"})
    assert status == 201 and reg["endpoint"]["state"] == "online", reg
    mac.behaviour.tags_hang_s = 2.0  # from now on its model list waits behind "the running generation"
    listed = len(mac.listings)
    status, body, _ = await chat(gw, None, "mac/m:1", stream=True, path="/v1/chat/completions")
    assert status == 200 and body.rstrip().endswith(b"data: [DONE]")
    state = gw.app[ENDPOINTS].fleet.workers["mac"]
    assert state.external is not None and state.external.state is EndpointState.ONLINE
    assert len(mac.listings) == listed  # not probed while it was busy, nor right after its answer


async def test_a_stored_fallback_name_that_breaks_the_name_rule_is_never_used(gateway: GatewayFactory) -> None:
    """A record written before names were checked (the store refuses such a name now) goes live without it."""
    gw = await gateway([], env=PRIVATE_OK)
    manager = gw.app[ENDPOINTS]
    manager.store.add(
        name="old",
        url="http://127.0.0.1:9",
        api="ollama",
        credential=None,
        fallback_model="qwen3:8b",
        latency_budget_ms=None,
        now=0.0,
    )
    with gw.app[DATABASE].begin() as conn:  # as an older version could have stored it
        conn.execute(update(endpoints).where(endpoints.c.name == "old").values(fallback_model="qwen3\r\nX-A: 1"))
    await manager.sync()
    state = manager.fleet.workers["old"]
    assert state.external is not None and state.external.fallback_model is None
