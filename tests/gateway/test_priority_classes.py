"""Priority classes on the request path: each request is served at its key's class (the key's own, its tenant's
default from config.json or the store, else standard), lowered and never raised by X-Turnout-Priority (a value
that is not a class is a 400 in the API's own shape), said in the answer's header, the access line and the
metrics; the dispatcher's queue serves interactive before standard before batch; an engine that schedules by
priority itself (vLLM with --scheduling-policy priority, the emulator in tests/support/engine_emulator.py) gets the
class as its per-request priority, and no other engine does."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import EmulatorFactory, Gateway, GatewayFactory, create_key, eventually, serve_app, worker
from tests.support.engine_emulator import VLLM, Engine, build_app
from turnout.config import load_settings
from turnout.config_base import ConfigError
from turnout.core.admission import Priority
from turnout.core.reconcile import ANNOTATION_PREFIX
from turnout.gateway.keys import DISPATCHER, FLEET, KEYS, PROXY

HEADER = "X-Turnout-Priority"
VllmFactory = Callable[..., Awaitable[tuple[str, Engine]]]


@pytest.fixture
async def vllm() -> AsyncIterator[VllmFactory]:
    """vLLM emulators served in this loop; every request they still hold is let go at the end."""
    started: list[tuple[Engine, web.AppRunner]] = []

    async def make(policy: str = "fcfs", max_num_seqs: int = 128, hold: bool = True) -> tuple[str, Engine]:
        engine = Engine(VLLM, "m", False, True, policy=policy, max_num_seqs=max_num_seqs, hold=hold)
        url, runner = await serve_app(build_app(engine, dev_mode=False))
        started.append((engine, runner))
        return url, engine

    try:
        yield make
    finally:
        for engine, runner in started:
            engine.hold = False
            for request in [*engine.running, *engine.waiting]:
                request.started.set()
                request.ended.set()
            await runner.cleanup()


async def chat(
    http: aiohttp.ClientSession, gw: Gateway, key: str | None, label: str, header: str | None = None, **more: Any
) -> tuple[int, dict[str, str], Any]:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    if header is not None:
        headers[HEADER] = header
    body = {"model": "m", "messages": [{"role": "user", "content": label}], "max_tokens": 4, **more}
    async with http.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as resp:
        return resp.status, dict(resp.headers), await resp.json()


async def drain(engine: Engine, tasks: list[asyncio.Task[Any]]) -> list[Any]:
    """End the engine's requests one at a time, oldest first, until every request answered."""
    while not all(t.done() for t in tasks):
        if engine.running:
            engine.step()
        await asyncio.sleep(0.01)  # (the gateway answers, then sends the next one it queued)
    return [t.result() for t in tasks]


def labels(engine: Engine) -> list[str]:
    return [entry["label"] for entry in engine.started_log]


async def test_the_queue_serves_interactive_then_standard_then_batch(
    gateway: GatewayFactory, vllm: VllmFactory
) -> None:
    """One slot (the worker's max_concurrent): while it is held, requests of every class wait in the gateway's
    queue; they go in class order whatever order they came in, each at its key's class or the lower one its
    header asks for."""
    url, engine = await vllm()
    gw = await gateway(
        [worker("v", url, type="openai", max_concurrent=1)],
        auth={"open": False},
        tenants={"research": {"priority": "batch"}},
    )
    _, nightly = create_key(gw, app="nightly", tenant="research")  # batch: its tenant's default (config.json)
    _, web_key = create_key(gw, app="web")  # standard: neither says
    _, agent = create_key(gw, app="agent", priority=Priority.INTERACTIVE)
    async with aiohttp.ClientSession() as http:
        first = asyncio.create_task(chat(http, gw, web_key, "first"))
        await eventually(lambda: _true(len(engine.running) == 1), "the first request running")
        plan = [
            ("b1", nightly, None),
            ("b2", nightly, "interactive"),  # above its key's class: served as batch
            ("s1", web_key, None),
            ("s-low", web_key, "batch"),  # lowered
            ("i1", agent, None),
        ]
        tasks = [first]
        for label, key, header in plan:
            tasks.append(asyncio.create_task(chat(http, gw, key, label, header)))
            waiting = len(tasks) - 1
            await eventually(lambda n=waiting: _true(gw.app[DISPATCHER].waiting == n), f"{waiting} in the queue")
        async with http.get(f"{gw.url}/metrics") as resp:  # what waits and runs, by class
            exposition = await resp.text()
        answers = await drain(engine, tasks)
        async with http.get(f"{gw.url}/metrics") as resp:
            after = await resp.text()
    gauges = _gauges(exposition)
    assert gauges == {
        ("waiting", "interactive"): 1.0,
        ("waiting", "standard"): 1.0,
        ("waiting", "batch"): 3.0,
        ("running", "interactive"): 0.0,
        ("running", "standard"): 1.0,
        ("running", "batch"): 0.0,
    }, exposition
    assert set(_gauges(after).values()) == {0.0}
    assert all(status == 200 for status, _, _ in answers), answers
    order = labels(engine)
    assert order[:4] == ["first", "i1", "s1", order[3]] and set(order[3:]) == {"b1", "b2", "s-low"}, order
    said = {label: answer[1].get(HEADER) for (label, _, _), answer in zip(plan, answers[1:], strict=True)}
    assert said == {"b1": None, "b2": "batch", "s1": None, "s-low": "batch", "i1": None}


async def _true(value: bool) -> bool:
    return value


def _gauges(exposition: str) -> dict[tuple[str, str], float]:
    """turnout_priority_{waiting,running}_requests by class, parsed from a Prometheus exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(exposition):
        for kind in ("waiting", "running"):
            if family.name == f"turnout_priority_{kind}_requests":
                out.update({(kind, s.labels["priority"]): s.value for s in family.samples})
    return out


async def test_an_engine_that_schedules_by_priority_is_sent_the_class(
    gateway: GatewayFactory, vllm: VllmFactory
) -> None:
    """The engine runs one request at a time and orders its own queue (vLLM's priority policy); the gateway sends
    each request at once (no cap of its own), with the class as vLLM's priority in the body and the header
    vLLM reads first. The client's own body priority is replaced."""
    url, engine = await vllm(policy="priority", max_num_seqs=1)
    gw = await gateway(
        [worker("v", url, type="openai", priority_scheduling=True)],
        auth={"open": False},
        tenants={"research": {"priority": "batch"}},
    )
    _, nightly = create_key(gw, app="nightly", tenant="research")
    _, web_key = create_key(gw, app="web")
    _, agent = create_key(gw, app="agent", priority=Priority.INTERACTIVE)
    async with aiohttp.ClientSession() as http:
        tasks = [asyncio.create_task(chat(http, gw, web_key, "first"))]
        await eventually(lambda: _true(len(engine.running) == 1), "the first request running")
        for label, key, more in [
            ("b1", nightly, {"priority": -100}),  # a client's own priority does not jump the engine's queue
            ("s1", web_key, {}),
            ("i1", agent, {}),
        ]:
            tasks.append(asyncio.create_task(chat(http, gw, key, label, **more)))
            waiting = len(tasks) - 1
            await eventually(lambda n=waiting: _true(len(engine.waiting) == n), f"{waiting} in the engine's queue")
        await drain(engine, tasks)
    assert labels(engine) == ["first", "i1", "s1", "b1"]
    sent = {entry["label"]: (entry["header"], entry["body"], entry["priority"]) for entry in engine.started_log}
    assert sent == {"first": ("0", 0, 0), "i1": ("-1", -1, -1), "s1": ("0", 0, 0), "b1": ("1", 1, 1)}


async def test_an_engine_that_serves_higher_values_first_is_sent_the_classes_with_their_signs_turned(
    gateway: GatewayFactory, vllm: VllmFactory
) -> None:
    """SGLang started with --enable-priority-scheduling alone serves higher priority values first (its server_args.py):
    with priority_high_first an interactive request is sent 1 and a batch request -1, standard still 0. (The engine
    here is the vLLM emulator, which only records what it is sent.)"""
    url, engine = await vllm(policy="priority", max_num_seqs=4)
    gw = await gateway(
        [worker("s", url, type="openai", priority_scheduling=True, priority_high_first=True)],
        auth={"open": False},
    )
    _, nightly = create_key(gw, app="nightly", priority=Priority.BATCH)
    _, web_key = create_key(gw, app="web")
    _, agent = create_key(gw, app="agent", priority=Priority.INTERACTIVE)
    async with aiohttp.ClientSession() as http:
        for label, key in [("b1", nightly), ("s1", web_key), ("i1", agent)]:
            task = asyncio.create_task(chat(http, gw, key, label))
            await drain(engine, [task])
    sent = {entry["label"]: (entry["header"], entry["body"]) for entry in engine.started_log}
    assert sent == {"b1": ("-1", -1), "s1": ("0", 0), "i1": ("1", 1)}


def test_priority_high_first_without_priority_scheduling_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    entry = {"name": "s", "url": "http://127.0.0.1:30000", "type": "openai", "priority_high_first": True}
    path.write_text(json.dumps({"workers": [entry]}))
    with pytest.raises(ConfigError, match='set "priority_scheduling": true as well'):
        load_settings(path)


async def test_an_engine_not_said_to_schedule_by_priority_is_sent_nothing(
    gateway: GatewayFactory, vllm: VllmFactory
) -> None:
    """Without priority_scheduling the body goes as the client sent it and the engine's queue is first come,
    first served whatever the classes (vLLM's fcfs; an old vLLM refuses a priority it does not schedule by); so the
    gateway keeps a batch request out of that queue while the engine's one sequence is taken (it waits in the
    gateway's, behind the interactive request that came after it)."""
    url, engine = await vllm(policy="priority", max_num_seqs=1)
    gw = await gateway([worker("v", url, type="openai")], auth={"open": False})
    _, web_key = create_key(gw, app="web")
    _, agent = create_key(gw, app="agent", priority=Priority.INTERACTIVE)
    async with aiohttp.ClientSession() as http:
        tasks = [asyncio.create_task(chat(http, gw, web_key, "first"))]
        await eventually(lambda: _true(len(engine.running) == 1), "the first request running")
        tasks.append(asyncio.create_task(chat(http, gw, web_key, "b1", "batch")))
        await eventually(lambda: _true(gw.app[DISPATCHER].waiting == 1), "the batch request in the gateway's queue")
        tasks.append(asyncio.create_task(chat(http, gw, agent, "i1")))
        await eventually(lambda: _true(len(engine.waiting) == 1), "the interactive request in the engine's queue")
        assert gw.app[DISPATCHER].waiting == 1  # (the batch request still in the gateway's)
        await drain(engine, tasks)
    assert labels(engine) == ["first", "i1", "b1"]
    assert all((e["header"], e["body"]) == (None, None) for e in engine.started_log), engine.started_log


async def test_translated_calls_carry_the_class_too(gateway: GatewayFactory, vllm: VllmFactory) -> None:
    """An Ollama or Anthropic client's call is translated onto the engine's chat route, with the class."""
    url, engine = await vllm(hold=False)
    gw = await gateway([worker("v", url, type="openai", priority_scheduling=True)], auth={"open": False})
    _, key = create_key(gw, app="agent", priority=Priority.INTERACTIVE)
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        ollama = {"model": "m", "messages": [{"role": "user", "content": "from ollama"}], "stream": False}
        async with http.post(f"{gw.url}/api/chat", json=ollama, headers={**headers, HEADER: "batch"}) as resp:
            assert resp.status == 200 and resp.headers[HEADER] == "batch", await resp.text()
        anthropic = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "from anthropic"}]}
        async with http.post(f"{gw.url}/v1/messages", json=anthropic, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
    sent = {e["label"]: (e["header"], e["body"]) for e in engine.started_log}
    assert sent == {"from ollama": ("1", 1), "from anthropic": ("-1", -1)}


@pytest.mark.parametrize(
    ("path", "body", "error_of"),
    [
        (  # OpenAI's error object, with the code
            "/v1/chat/completions",
            {"model": "m:1", "messages": []},
            lambda b: (b["error"]["code"], b["error"]["message"]),
        ),
        ("/api/chat", {"model": "m:1", "messages": []}, lambda b: ("invalid_priority", b["error"])),  # Ollama's
        (  # Anthropic's: {"type": "error", "error": {"type", "message"}}
            "/v1/messages",
            {"model": "m:1", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
            lambda b: (
                "invalid_priority" if b["error"]["type"] == "invalid_request_error" else b,
                b["error"]["message"],
            ),
        ),
    ],
    ids=["openai", "ollama", "anthropic"],
)
async def test_a_value_that_is_not_a_class_is_a_400_in_the_apis_own_shape(
    emulator: EmulatorFactory, gateway: GatewayFactory, path: str, body: dict[str, Any], error_of: Any
) -> None:
    emu = await emulator("a", ["m:1"])
    gw = await gateway([worker("a", emu.url)], auth={"open": False})
    _, key = create_key(gw)
    async with (
        aiohttp.ClientSession() as http,
        http.post(gw.url + path, json=body, headers={"Authorization": f"Bearer {key}", HEADER: "urgent"}) as resp,
    ):
        assert resp.status == 400
        kind, message = error_of(await resp.json())
    assert kind == "invalid_priority"
    assert message == 'X-Turnout-Priority must be one of interactive, standard, batch (got "urgent")'
    assert emu.calls == []  # nothing reached the worker


async def test_a_models_metadata_takes_no_class(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """/api/show asks for no worker's slot: the header is ignored there."""
    emu = await emulator("a", ["m:1"])
    gw = await gateway([worker("a", emu.url)], auth={"open": False})
    _, key = create_key(gw)
    headers = {"Authorization": f"Bearer {key}", HEADER: "urgent"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/api/show", json={"model": "m:1"}, headers=headers) as resp,
    ):
        assert resp.status == 200 and HEADER not in resp.headers, await resp.text()


async def test_the_answer_says_the_class_when_the_request_named_one(
    emulator: EmulatorFactory, gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A one-piece answer, a stream and an error answer all carry the class served at when the request named
    one; the access line always names it; open access is standard."""
    emu = await emulator("a", ["m:1"])
    gw = await gateway([worker("a", emu.url)], auth={"open": True})
    _, key = create_key(gw, app="web")
    auth = {"Authorization": f"Bearer {key}"}
    chat_body = {"model": "m:1", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    caplog.set_level(logging.INFO, logger="aiohttp.access")  # (`turnout serve` names it turnout.access)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/v1/chat/completions", json=chat_body, headers=auth) as resp:
            assert resp.status == 200 and HEADER not in resp.headers  # named none: says none
        ask = {**auth, HEADER: "interactive"}
        async with http.post(f"{gw.url}/v1/chat/completions", json=chat_body, headers=ask) as resp:
            assert resp.status == 200 and resp.headers[HEADER] == "standard"  # capped at the key's
        stream = {**chat_body, "stream": True}
        async with http.post(f"{gw.url}/v1/chat/completions", json=stream, headers={**auth, HEADER: "Batch"}) as resp:
            assert resp.status == 200 and resp.headers[HEADER] == "batch"
            await resp.read()
        missing = {**chat_body, "model": "nope"}
        async with http.post(f"{gw.url}/v1/chat/completions", json=missing, headers={**auth, HEADER: "batch"}) as resp:
            assert resp.status == 404 and resp.headers[HEADER] == "batch"
        async with http.post(f"{gw.url}/v1/chat/completions", json=chat_body, headers={HEADER: "interactive"}) as resp:
            assert resp.status == 200 and resp.headers[HEADER] == "standard"  # open access: standard
        await gw.stop()  # the access lines are all written
    records = [r for r in caplog.records if r.name == "aiohttp.access" and "/v1/chat/completions" in r.getMessage()]
    lines = [r.getMessage() for r in records]
    classes = [line.split(" priority=")[1].split()[0] for line in lines]
    assert classes == ["standard", "standard", "batch", "batch", "standard"], lines
    assert [getattr(r, "priority", None) for r in records] == classes  # the JSON format's field


async def test_a_class_set_through_the_admin_api_applies_to_the_next_request(
    gateway: GatewayFactory, vllm: VllmFactory
) -> None:
    """A key's class and its tenant's default (the store's) take effect at once, as other key changes do."""
    url, engine = await vllm(hold=False)
    gw = await gateway([worker("v", url, type="openai", priority_scheduling=True)], auth={"open": False})
    record, key = create_key(gw, app="web", tenant="team")
    async with aiohttp.ClientSession() as http:

        async def admin(method: str, path: str, body: Any) -> int:
            async with http.request(method, gw.url + path, json=body, headers=gw.admin_headers) as resp:
                return resp.status

        await chat(http, gw, key, "before")
        assert await admin("PATCH", "/admin/api/tenants/team", {"priority": "batch"}) == 200
        await chat(http, gw, key, "tenant batch")
        assert await admin("PATCH", f"/admin/api/keys/{record.prefix}", {"priority": "interactive"}) == 200
        await chat(http, gw, key, "key interactive")
    assert [e["priority"] for e in engine.started_log] == [0, 1, -1]
    assert gw.app[KEYS].get(record.prefix).tenant_priority is Priority.BATCH


async def test_a_claim_whose_vllm_args_schedule_by_priority_is_sent_the_class(
    gateway: GatewayFactory, vllm: VllmFactory
) -> None:
    """Two vLLM claims and an SGLang one on a pool, routed (the controller's status and routing annotation written as
    a tick would leave them): the one whose engineConfig.args hold --scheduling_policy=priority (vLLM's own spelling
    rules) gets each call's class; the SGLang one started with --enable-priority-scheduling alone (higher values
    first) gets it with its sign turned; the other gets nothing. The gateway learns it from the claim as the local
    controller reads it, when the claims change. (Every engine here is the vLLM emulator, recording what it is
    sent.)"""
    ranked_url, ranked = await vllm(hold=False)
    plain_url, plain = await vllm(hold=False)
    high_url, high = await vllm(hold=False)
    labels = {"pool": "gpu", "pool.aibrix.ai/enabled": "true"}
    gw = await gateway(
        [],
        auth={"open": False},
        pools={"agents": [{"name": "pod-0", "agent_url": "http://127.0.0.1:9", "labels": labels}]},
    )
    claims = gw.app[PROXY].claims
    assert claims is not None
    await claims.stop()  # the test writes what a tick would
    controller = claims.source.controller  # type: ignore[attr-defined]
    for name, url, engine, args in (
        ("ranked", ranked_url, "vllm", {"--scheduling_policy=priority": "", "--max-num-seqs": "8"}),
        ("plain", plain_url, "vllm", {"--max-num-seqs": "8"}),
        ("high", high_url, "sglang", {"--enable-priority-scheduling": ""}),
    ):
        spec = {
            "modelName": name,
            "podSelector": {"matchLabels": {"pool": "gpu"}},
            "artifactURL": "hf://org/tiny",
            "engine": engine,
            "engineConfig": {"args": args},
        }
        controller.files.apply({"metadata": {"name": name}, "spec": spec})
        controller.statuses[name] = {"phase": "Active", "pod": "pod-0", "model": name}
        port = int(url.rsplit(":", 1)[1])
        route = json.dumps({"model": name, "port": port, "state": "active"})
        controller.annotations["pod-0"][ANNOTATION_PREFIX + name] = route
    claims.sync()
    _, key = create_key(gw, app="nightly", priority=Priority.BATCH)
    async with aiohttp.ClientSession() as http:
        for model in ("ranked", "plain", "high"):
            body = {"model": model, "messages": [{"role": "user", "content": model}]}
            headers = {"Authorization": f"Bearer {key}"}
            async with http.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
    assert [(e["header"], e["body"]) for e in ranked.started_log] == [("1", 1)]
    assert [(e["header"], e["body"]) for e in plain.started_log] == [(None, None)]
    assert [(e["header"], e["body"]) for e in high.started_log] == [("-1", -1)]


async def test_a_held_request_counts_as_waiting_in_its_class(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """A request held while its worker restarts (routing.hold_s) is one of its class's waiting requests."""
    emu = await emulator("a", ["m:1"])
    gw = await gateway(
        [worker("a", emu.url)], auth={"open": False}, routing={"hold_s": 30}, health={"interval_s": 0.2, "timeout_s": 1}
    )
    _, key = create_key(gw, app="nightly", priority=Priority.BATCH)
    state = gw.app[FLEET].workers["a"]
    port = emu.port
    await emu.stop()
    await eventually(lambda: _true(not state.healthy), "the worker seen down", limit_s=10)
    body = {"model": "m:1", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    async with aiohttp.ClientSession() as http:
        asked = asyncio.ensure_future(
            http.post(f"{gw.url}/api/chat", json=body, headers={"Authorization": f"Bearer {key}"})
        )
        await eventually(lambda: _true(gw.app[DISPATCHER].waiting == 1), "the request held")
        async with http.get(f"{gw.url}/metrics") as resp:
            held = _gauges(await resp.text())
        await emu.start(port)
        async with await asked as resp:
            assert resp.status == 200, await resp.text()
    assert held[("waiting", "batch")] == 1.0 and held[("running", "batch")] == 0.0
