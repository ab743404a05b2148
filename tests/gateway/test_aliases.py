"""Model aliases end to end, through real gateways and Ollama emulators: every client route of every dialect in the
registry, both worker kinds, listings, scopes, usage rows, endpoints' own URLs, the admin API and its audit."""

from __future__ import annotations

from typing import Any

import aiohttp
import ollama
import openai
import orjson
import pytest

from tests.conftest import ADMIN_TOKEN, EmulatorFactory, Gateway, GatewayFactory, create_key, eventually, worker
from tests.gateway.test_endpoints import PRIVATE_OK
from turnout.core.aliases import Alias
from turnout.dialects.base import Endpoint
from turnout.gateway import aliases as gateway_aliases
from turnout.gateway.keys import ACCOUNTANT, ALIASES, AUDIT, USAGE
from turnout.gateway.routes import proxied_routes
from turnout.store.aliases import AliasStore

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TARGET = "qwen3-coder:30b"
ALIAS = "claude-sonnet-4-5"


async def call(
    gw: Gateway, method: str, path: str, body: Any = None, *, key: str | None = None, headers: Any = None
) -> tuple[int, Any, Any]:
    sent = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"{gw.url}{path}", json=body, headers=sent) as r,
    ):
        raw = await r.read()
        try:
            return r.status, orjson.loads(raw), r.headers
        except orjson.JSONDecodeError:
            return r.status, raw, r.headers


async def admin(gw: Gateway, method: str, path: str, body: Any = None, **headers: str) -> tuple[int, Any, Any]:
    return await call(gw, method, path, body, headers={**ADMIN, **headers})


def _body(model: str) -> dict[str, Any]:
    """One body every route of every client API takes (each reads the fields it knows)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "prompt": "hi",
        "input": "hi",
        "max_tokens": 4,
        "stream": False,
    }


def _routes() -> list[tuple[str, str]]:
    """Every POST route of every client API in the registry that names a model in its body."""
    return sorted({(str(d), r.path) for d, r in proxied_routes() if r.method == "POST" and "{" not in r.path})


async def usage_rows(gw: Gateway) -> list[dict[str, Any]]:
    await gw.app[ACCOUNTANT].usage.flush()
    return list(gw.app[USAGE].summary(since=0, bucket="day"))


@pytest.mark.parametrize("kind", ["ollama", "openai"])
async def test_an_alias_reaches_every_route_of_every_client_api(
    emulator: EmulatorFactory, gateway: GatewayFactory, kind: str
) -> None:
    """On the shared URL and through both worker kinds (pass-through and translated), a request naming the alias
    is a request for its model: the worker sees only the model's name, the usage row says both."""
    gpu = await emulator("gpu", [TARGET])
    gw = await gateway([worker("gpu", gpu.url, type=kind)], aliases={ALIAS: TARGET})
    routes = _routes()
    assert ("ollama", "/api/show") in routes and ("openai", "/v1/chat/completions") in routes
    for _, path in routes:
        status, answer, _ = await call(gw, "POST", path, _body(ALIAS))
        assert status == 200, (path, answer)
    sent = [body.get("model") or body.get("name") for _, body in gpu.calls]
    assert sent and set(sent) == {TARGET}, gpu.calls  # the alias never reaches a worker
    rows = await usage_rows(gw)
    assert {(r["model"], r["alias"]) for r in rows} == {(TARGET, ALIAS)}, rows
    served = {r["endpoint"] for r in rows}
    assert {f"{d}:{e}" for d, e in (("openai", "chat"), ("ollama", "generate"), ("ollama", "embed"))} <= served
    # the same request naming the model itself: no alias in its row
    assert (await call(gw, "POST", "/v1/chat/completions", _body(TARGET)))[0] == 200
    assert (TARGET, None) in {(r["model"], r["alias"]) for r in await usage_rows(gw)}


async def test_streams_and_the_other_spelling(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    gpu = await emulator("gpu", [TARGET])
    gw = await gateway([worker("gpu", gpu.url)], aliases={ALIAS: TARGET})
    status, raw, _ = await call(gw, "POST", "/api/chat", {**_body(f"{ALIAS}:latest"), "stream": True})
    assert status == 200 and b'"done":true' in raw.replace(b" ", b"")  # ":latest" is the same alias
    status, raw, _ = await call(gw, "POST", "/v1/chat/completions", {**_body(ALIAS), "stream": True})
    assert status == 200 and raw.rstrip().endswith(b"data: [DONE]")
    assert {b["model"] for _, b in gpu.calls} == {TARGET}
    status, answer, _ = await call(gw, "POST", "/v1/chat/completions", _body(f"{ALIAS}:2"))
    assert status == 404 and TARGET not in str(answer)  # another tag is another name


async def test_listings_show_aliases_of_listed_models(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    gpu = await emulator("gpu", [TARGET, "llama3.2:latest"])
    gw = await gateway(
        [worker("gpu", gpu.url)],
        aliases={ALIAS: TARGET, "gpt-5-codex": TARGET, "missing": "not-installed:1b"},
    )
    _, models, _ = await call(gw, "GET", "/v1/models")
    ids = [m["id"] for m in models["data"]]
    assert ids == ["claude-sonnet-4-5", "gpt-5-codex", "llama3.2:latest", TARGET]  # not "missing": no model
    by_id = {m["id"]: m for m in models["data"]}
    assert by_id[ALIAS]["owned_by"] == by_id[TARGET]["owned_by"] and by_id[ALIAS]["created"] == by_id[TARGET]["created"]
    status, one, _ = await call(gw, "GET", f"/v1/models/{ALIAS}")
    assert status == 200 and one["id"] == ALIAS
    _, tags, _ = await call(gw, "GET", "/api/tags")
    digests = {m["name"]: m["digest"] for m in tags["models"]}
    assert digests[ALIAS] == digests[TARGET] == digests["gpt-5-codex"]  # one model, several names (llm-ollama)
    assert digests["llama3.2:latest"] != digests[TARGET]
    _, ps, _ = await call(gw, "GET", "/api/ps")
    assert ALIAS not in str(ps)  # running models by their own names
    status, shown, _ = await call(gw, "POST", "/api/show", {"model": ALIAS})
    assert status == 200 and shown["modelfile"] == f"FROM {TARGET}\n"


async def test_an_alias_hides_a_model_of_its_own_name(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """Shadowing: the alias decides what the name means, whatever the workers install."""
    gpu = await emulator("gpu", [TARGET, "gpt-4o:latest"])
    gw = await gateway([worker("gpu", gpu.url)], aliases={"gpt-4o": TARGET})
    _, models, _ = await call(gw, "GET", "/v1/models")
    assert [m["id"] for m in models["data"]] == ["gpt-4o", TARGET]
    assert (await call(gw, "POST", "/api/chat", _body("gpt-4o")))[0] == 200
    assert gpu.calls[-1][1]["model"] == TARGET
    _, tags, _ = await call(gw, "GET", "/api/tags")
    assert [m["name"] for m in tags["models"]] == ["gpt-4o", TARGET]


async def test_scopes_are_the_models(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """A key is checked against the model an alias stands for: scopes name models, never aliases."""
    gpu = await emulator("gpu", [TARGET, "llama3.2:latest"])
    gw = await gateway([worker("gpu", gpu.url)], aliases={ALIAS: TARGET, "small": "llama3.2"}, auth={"open": False})
    _, coder = create_key(gw, app="coder", scopes=["qwen3-coder:*"])
    _, claude_only = create_key(gw, app="claude-only", scopes=["claude-*"])
    assert (await call(gw, "POST", "/v1/chat/completions", _body(ALIAS), key=coder))[0] == 200
    status, answer, _ = await call(gw, "POST", "/v1/chat/completions", _body(ALIAS), key=claude_only)
    assert status == 403 and answer["error"]["code"] == "model_not_allowed"
    assert f'model "{TARGET}" (asked for as alias "{ALIAS}") is not allowed' in answer["error"]["message"]
    status, answer, _ = await call(gw, "POST", "/api/show", {"model": "small"}, key=coder)
    assert status == 403  # /api/show is checked the same way
    # listings: an alias is visible exactly where its model is
    _, listed, _ = await call(gw, "GET", "/v1/models", key=coder)
    assert [m["id"] for m in listed["data"]] == [ALIAS, TARGET]
    _, listed, _ = await call(gw, "GET", "/v1/models", key=claude_only)
    assert listed["data"] == []
    assert (await call(gw, "GET", f"/v1/models/{ALIAS}", key=claude_only))[0] == 404
    _, tags, _ = await call(gw, "GET", "/api/tags", key=coder)
    assert [m["name"] for m in tags["models"]] == [ALIAS, TARGET]
    # the refusal is the key's error, under the model and the alias it asked for
    refused = [r for r in await usage_rows(gw) if r["statuses"].get("403")]
    assert refused and {(r["model"], r["alias"], r["key"]) for r in refused} >= {(TARGET, ALIAS, claude_only[:10])}


async def test_the_official_clients_ask_for_an_alias(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    gpu = await emulator("gpu", [TARGET])
    gw = await gateway([worker("gpu", gpu.url)], aliases={ALIAS: TARGET}, auth={"open": False})
    _, key = create_key(gw, app="sdk", scopes=[TARGET])
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0) as client:
        answer = await client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hi"}])
        assert "[gpu]" in (answer.choices[0].message.content or "")
        stream = await client.chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert "[gpu]" in text
        assert ALIAS in [m.id async for m in client.models.list()]
        assert (await client.models.retrieve(ALIAS)).id == ALIAS
        vectors = await client.embeddings.create(model=ALIAS, input="hi")
        assert vectors.data and vectors.data[0].embedding
    sdk = ollama.AsyncClient(host=gw.url, headers={"Authorization": f"Bearer {key}"})
    try:
        reply = await sdk.chat(model=ALIAS, messages=[{"role": "user", "content": "hi"}])
        assert "[gpu]" in (reply.message.content or "")
        assert ALIAS in [m.model for m in (await sdk.list()).models]
        assert (await sdk.show(ALIAS)).modelfile == f"FROM {TARGET}\n"
        assert (await sdk.embed(model=ALIAS, input="hi")).embeddings
    finally:
        await sdk.close()
    assert {b.get("model") for _, b in gpu.calls} == {TARGET}


async def test_endpoints_own_urls(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """On /endpoints/mac/...: an alias leading to one of mac's models works by its name there; one leading to
    the fleet does not (that URL reaches only mac's models)."""
    fleet = await emulator("fleet", [TARGET])
    mac = await emulator("mac", ["qwen2.5:7b", "llama3.2:latest"])
    gw = await gateway(
        [worker("gpu", fleet.url)],
        env=PRIVATE_OK,
        aliases={ALIAS: TARGET, "gpt-5-codex": "mac/qwen2.5:7b", "mac/haiku": "mac/llama3.2"},
    )
    status, reg, _ = await admin(gw, "POST", "/admin/api/endpoints", {"name": "mac", "url": mac.url, "api": "ollama"})
    assert status == 201, reg
    for path in ("/endpoints/mac/v1/chat/completions", "/v1/chat/completions"):
        status, answer, _ = await call(gw, "POST", path, _body("gpt-5-codex"))
        assert status == 200 and "[mac]" in answer["choices"][0]["message"]["content"], (path, answer)
        assert mac.calls[-1][1]["model"] == "qwen2.5:7b"  # its own name upstream
    status, answer, _ = await call(gw, "POST", "/endpoints/mac/api/chat", _body("haiku"))  # "mac/haiku" there
    assert status == 200 and mac.calls[-1][1]["model"] == "llama3.2:latest", answer
    assert (await call(gw, "POST", "/api/chat", _body("mac/haiku")))[0] == 200
    status, answer, _ = await call(gw, "POST", "/endpoints/mac/api/chat", _body(ALIAS))
    assert status == 404, answer  # leads to the fleet: not an alias on mac's URL
    assert all(body["model"] != TARGET for _, body in mac.calls) and not fleet.calls
    _, own, _ = await call(gw, "GET", "/endpoints/mac/v1/models")
    assert [m["id"] for m in own["data"]] == ["gpt-5-codex", "haiku", "llama3.2:latest", "qwen2.5:7b"]
    _, shared, _ = await call(gw, "GET", "/v1/models")
    assert [m["id"] for m in shared["data"]] == [
        ALIAS,
        "gpt-5-codex",
        "mac/haiku",
        "mac/llama3.2:latest",
        "mac/qwen2.5:7b",
        TARGET,
    ]
    rows = {(r["model"], r["alias"]) for r in await usage_rows(gw)}
    assert {("mac/qwen2.5:7b", "gpt-5-codex"), ("mac/llama3.2", "haiku"), ("mac/llama3.2", "mac/haiku")} <= rows


async def test_admin_api_sets_and_removes_aliases(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    gpu = await emulator("gpu", [TARGET, "llama3.2:latest", "gpt-4o:latest"])
    gw = await gateway([worker("gpu", gpu.url)], aliases={"gpt-5-codex": TARGET})
    assert (await call(gw, "POST", "/v1/chat/completions", _body(ALIAS)))[0] == 404
    status, answer, headers = await admin(gw, "PUT", f"/admin/api/aliases/{ALIAS}", {"model": TARGET})
    assert status == 201, answer
    view = answer["alias"]
    assert (view["name"], view["model"], view["source"], view["workers"]) == (ALIAS, TARGET, "runtime", ["gpu"])
    assert headers["ETag"] == view["etag"]
    assert (await call(gw, "POST", "/v1/chat/completions", _body(ALIAS)))[0] == 200  # in force at once
    # a stale ETag changes nothing; the current one does
    status, answer, _ = await admin(
        gw, "PUT", f"/admin/api/aliases/{ALIAS}", {"model": "llama3.2"}, **{"If-Match": '"0000"'}
    )
    assert status == 412 and answer["error"]["code"] == "stale_write"
    status, answer, _ = await admin(
        gw, "PUT", f"/admin/api/aliases/{ALIAS}", {"model": "llama3.2"}, **{"If-Match": view["etag"]}
    )
    assert status == 200 and answer["alias"]["model"] == "llama3.2" and answer["alias"]["etag"] != view["etag"]
    assert (await call(gw, "POST", "/api/chat", _body(ALIAS)))[0] == 200
    assert gpu.calls[-1][1]["model"] == "llama3.2:latest"  # the worker's spelling, as for the model itself
    # chains, cycles and bad names are refused with the field to change
    for name, body, field, fragment in [
        ("next", {"model": ALIAS}, "model", 'point "next" at "llama3.2" instead'),
        ("llama3.2", {"model": TARGET}, "name", f'alias "{ALIAS}" stands for "llama3.2"'),
        ("qwen*", {"model": TARGET}, "name", "not a pattern"),
        ("x", {"model": ""}, "model", "empty"),
        ("x", {}, "model", '"model" is required'),
        ("x", {"model": TARGET, "extra": 1}, "extra", "extra"),
    ]:
        status, answer, _ = await admin(gw, "PUT", f"/admin/api/aliases/{name}", body)
        assert status == 422 and answer["error"]["field"] == field and fragment in answer["error"]["message"], answer
    # the list: the config's and the runtime ones, with where they are served and what they hide
    assert (await admin(gw, "PUT", "/admin/api/aliases/gpt-4o", {"model": TARGET}))[0] == 201
    status, listing, _ = await admin(gw, "GET", "/admin/api/aliases")
    assert status == 200 and listing["problems"] == []
    rows = {a["name"]: a for a in listing["aliases"]}
    assert {n: (a["model"], a["source"]) for n, a in rows.items()} == {
        ALIAS: ("llama3.2", "runtime"),
        "gpt-4o": (TARGET, "runtime"),
        "gpt-5-codex": (TARGET, "config"),
    }
    assert rows["gpt-4o"]["shadows"] == ["gpu"] and rows[ALIAS]["shadows"] == []
    # a runtime alias over a config one; removing it brings the config one back
    status, answer, _ = await admin(gw, "PUT", "/admin/api/aliases/gpt-5-codex", {"model": "llama3.2"})
    assert status == 200 and answer["alias"]["config_model"] == TARGET
    status, answer, _ = await admin(gw, "DELETE", "/admin/api/aliases/gpt-5-codex")
    assert status == 200 and answer["alias"]["model"] == TARGET and answer["alias"]["source"] == "config"
    status, answer, _ = await admin(gw, "DELETE", "/admin/api/aliases/gpt-5-codex")
    assert status == 409 and answer["error"]["code"] == "alias_in_config", answer
    status, answer, _ = await admin(gw, "DELETE", "/admin/api/aliases/nothing")
    assert status == 404
    status, answer, _ = await admin(gw, "DELETE", f"/admin/api/aliases/{ALIAS}", **{"If-Match": '"0000"'})
    assert status == 412
    status, one, headers = await admin(gw, "GET", f"/admin/api/aliases/{ALIAS}")
    assert status == 200 and one["model"] == "llama3.2" and headers["ETag"] == one["etag"]
    status, answer, _ = await admin(gw, "DELETE", f"/admin/api/aliases/{ALIAS}", **{"If-Match": headers["ETag"]})
    assert status == 200 and answer == {"removed": ALIAS, "alias": None}
    assert (await call(gw, "POST", "/v1/chat/completions", _body(ALIAS)))[0] == 404
    # every change is audited with its actor
    entries = gw.app[AUDIT].entries(limit=100)
    changes = [(e.action, e.target, e.actor) for e in entries if e.action.startswith("alias.")]
    assert changes.count(("alias.set", f"alias:{ALIAS}", "token")) == 2
    assert ("alias.remove", f"alias:{ALIAS}", "token") in changes
    assert ("alias.remove", "alias:gpt-5-codex", "token") in changes
    # the models clients can ask for, with where each is served
    status, models, _ = await admin(gw, "GET", "/admin/api/models")
    assert {m["name"]: (m["alias_of"], m["workers"]) for m in models["models"]}["gpt-4o"] == (TARGET, ["gpu"])


async def test_removing_an_override_that_would_chain_is_refused(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """config a -> b; runtime a -> c over it, then b -> d: removing the runtime a would make a -> b -> d."""
    gpu = await emulator("gpu", [TARGET])
    gw = await gateway([worker("gpu", gpu.url)], aliases={"a": "b"})
    assert (await admin(gw, "PUT", "/admin/api/aliases/a", {"model": "c"}))[0] == 200
    assert (await admin(gw, "PUT", "/admin/api/aliases/b", {"model": "d"}))[0] == 201
    status, answer, _ = await admin(gw, "DELETE", "/admin/api/aliases/a")
    assert status == 409 and answer["error"]["code"] == "alias_chain", answer
    assert gw.app[ALIASES].table.get("a") == Alias("a", "c")


async def test_names_in_paths_with_slashes_and_tags(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    gpu = await emulator("gpu", [TARGET])
    gw = await gateway([worker("gpu", gpu.url)])
    for name in ("org/claude-x", "vendor/m:2025"):
        status, answer, _ = await admin(gw, "PUT", f"/admin/api/aliases/{name}", {"model": TARGET})
        assert status == 201 and answer["alias"]["name"] == name, answer
        assert (await call(gw, "POST", "/v1/chat/completions", _body(name)))[0] == 200
        status, answer, _ = await admin(gw, "DELETE", f"/admin/api/aliases/{name}")
        assert status == 200 and answer["removed"] == name


async def test_an_alias_written_to_the_store_elsewhere_is_picked_up(
    emulator: EmulatorFactory, gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another replica (or `turnout alias set` with no gateway answering) writes the store: the gateway reads it
    at its next refresh."""
    monkeypatch.setattr(gateway_aliases, "SYNC_S", 0.1)
    gpu = await emulator("gpu", [TARGET])
    gw = await gateway([worker("gpu", gpu.url)])
    AliasStore(gw.app[ALIASES].store.db).put(ALIAS, TARGET, now=1.0)

    async def served() -> bool:
        return (await call(gw, "POST", "/v1/chat/completions", _body(ALIAS)))[0] == 200

    await eventually(served, "the alias written to the store", limit_s=10)


async def test_every_endpoint_kind_has_a_route_here() -> None:
    """The routes above come from the registry: a dialect added later is covered by the first test."""
    assert {r.endpoint for _, r in proxied_routes()} >= {Endpoint.CHAT, Endpoint.EMBED, Endpoint.SHOW}
