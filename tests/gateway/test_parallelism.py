"""What each engine runs at once, with nothing declared: learned from the answers that ran together, shown in the
inventory, the metrics and the Overview, and used so that no engine idles while requests queue in another.

The workers are Ollama emulators on their OpenAI-compatible routes with ``num_parallel`` (Ollama's
``OLLAMA_NUM_PARALLEL``: requests beyond it wait for a slot before any byte of their answer), listed as Ollama
lists them (``owned_by: library``, which names no engine): what a gateway meets in front of Ollama boxes or a Mac
with LM Studio.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.conftest import ADMIN_TOKEN, EmulatorFactory, GatewayFactory, worker
from turnout.gateway.keys import FLEET

MODEL = "m:1"
SYSTEM = "You are the assistant of group zero. " + "Rule: answer in the voice of group zero. " * 100  # 4 KiB


def chat(session: str, turns: int = 2, stream: bool = True) -> dict[str, Any]:
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{session}: question {turn} " * 3})
        if turn < turns - 1:
            messages.append({"role": "assistant", "content": f"answer {turn}"})
    return {"model": MODEL, "messages": messages, "max_tokens": 8, "stream": stream}


async def ask(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> str:
    """The worker that answered (its emulator names itself in the first token)."""
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        text = await resp.text()
        return resp.headers["X-Turnout-Route"].split(";")[0] if "X-Turnout-Route" in resp.headers else text


async def inventory(http: aiohttp.ClientSession, url: str) -> dict[str, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with http.get(f"{url}/admin/api/inventory", headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return {w["name"]: w for w in (await resp.json())["workers"]}


async def test_one_at_a_time_engines_are_never_left_idle(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """Three engines that run one request at a time, nothing declared, one hot system prompt and three requests in
    flight, answers that take longer than a cold prefill of the prompt: every engine serves, and none had a queue
    while another idled (with batching assumed, the held prefix kept them on the holder while the others idled)."""
    workers, emus = [], []
    for name in ("a", "b", "c"):
        emu = await emulator(name, [MODEL], num_parallel=1, tokens=16, token_delay_s=0.04, prefill_s_per_kib=0.08)
        emus.append(emu)
        workers.append(worker(name, emu.url, type="openai"))
    gw = await gateway(workers, routing={"explain_header": True})
    served: dict[str, int] = {}
    async with aiohttp.ClientSession() as http:
        await ask(http, gw.url, chat("warm"))  # one engine holds the prefix now

        async def client(n: int) -> None:
            for turn in range(4):
                name = await ask(http, gw.url, chat(f"s{n}", turn + 1))
                served[name] = served.get(name, 0) + 1

        await asyncio.gather(*(client(n) for n in range(3)))
        figures = await inventory(http, gw.url)
    assert set(served) == {"a", "b", "c"}, served
    assert max(served.values()) <= 6, served  # no engine took most of them
    # one request in flight per client, as many engines as clients, a cold prefill (0.3 s) shorter than an answer
    # (0.6 s): queueing behind the holder never pays, so none waited in an engine's queue (one may, while nothing
    # is learned of the engines' speeds yet)
    assert sum(emu.waited for emu in emus) <= 1, [emu.waited for emu in emus]
    for name in ("a", "b", "c"):
        parallelism = figures[name]["parallelism"]
        assert all(p["slots"] == 1 and p["source"] in ("assumed", "learned") for p in parallelism.values()), figures


async def test_what_an_engine_runs_at_once_is_learned(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """An engine that runs three at once, and one that runs one: after answers ran together on the first, the
    gateway knows it (learned, how many), and still takes the second for one at a time."""
    wide = await emulator("wide", [MODEL], num_parallel=3, tokens=12, token_delay_s=0.05)
    narrow = await emulator("narrow", [MODEL], num_parallel=1, tokens=12, token_delay_s=0.05)
    gw = await gateway([worker("wide", wide.url, type="openai"), worker("narrow", narrow.url, type="openai")])
    fleet = gw.app[FLEET]
    async with aiohttp.ClientSession() as http:
        before = await inventory(http, gw.url)
        assert before["wide"]["parallelism"] == {
            "*": {"slots": 1, "source": "assumed", "why": before["wide"]["parallelism"]["*"]["why"]}
        }
        for _ in range(3):  # rounds of six at once: each engine gets some of them together
            await asyncio.gather(*(ask(http, gw.url, chat(f"r{n}")) for n in range(6)))
            if fleet.workers["wide"].parallelism(MODEL, 0.0).slots == 3:
                break
        after = await inventory(http, gw.url)
        async with http.get(f"{gw.url}/metrics") as resp:
            metrics = await resp.text()
    wide_figure = after["wide"]["parallelism"][MODEL]
    assert wide_figure["source"] == "learned" and wide_figure["slots"] >= 2, after["wide"]
    assert wide_figure["why"].startswith("seen running")
    narrow_figure = after["narrow"]["parallelism"][MODEL]
    assert narrow_figure["slots"] == 1 and narrow_figure["source"] in ("assumed", "learned"), after["narrow"]
    assert wide.peak_active >= wide_figure["slots"]  # never more than it really ran
    assert narrow.peak_active == 1
    line = f'turnout_worker_parallelism{{model="{MODEL}",source="learned",worker="wide"}} {float(wide_figure["slots"])}'
    assert line in metrics, metrics


async def test_a_batching_engine_is_known_by_its_listing(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """A worker whose listing names vLLM (``owned_by: vllm``, vLLM's ModelCard) is a batching engine from the first
    poll: no learning needed, no queue assumed."""
    emu = await emulator("v", [MODEL], owned_by="vllm")
    gw = await gateway([worker("v", emu.url, type="openai")])
    async with aiohttp.ClientSession() as http:
        figures = await inventory(http, gw.url)
    assert figures["v"]["engine"] == "vLLM"
    assert figures["v"]["parallelism"]["*"]["slots"] is None
    assert figures["v"]["parallelism"]["*"]["source"] == "engine"


async def test_declared_slots_win(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    emu = await emulator("d", [MODEL], num_parallel=4)
    gw = await gateway([worker("d", emu.url, type="openai", slots=2)])
    async with aiohttp.ClientSession() as http:
        figures = await inventory(http, gw.url)
    assert figures["d"]["parallelism"]["*"] == {
        "slots": 2,
        "source": "declared",
        "why": "workers[].slots in the config",
    }


async def test_how_much_an_engines_requests_slow_each_other_is_learned(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """Engines of four slots that run each request as fast together as alone (an emulator's answers take their
    tokens' time whatever else runs): the decode rates of answers alone and of answers beside others say the
    sharing, about 0 here (shown in the inventory); before it is learned the engines were taken to share their
    speed."""
    a = await emulator("a", [MODEL], num_parallel=4, tokens=10, token_delay_s=0.03)
    b = await emulator("b", [MODEL], num_parallel=4, tokens=10, token_delay_s=0.03)
    gw = await gateway([worker("a", a.url, slots=4), worker("b", b.url, slots=4)])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False}

    async def one(http: aiohttp.ClientSession) -> None:
        async with http.post(f"{gw.url}/api/chat", json=body) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()

    async with aiohttp.ClientSession() as http:
        for _ in range(4):  # one at a time: each alone on its engine
            await one(http)
        assert not (await inventory(http, gw.url))["a"]["sharing"]
        for _ in range(6):  # six at once: three beside each other on each engine (shared until learned: spread)
            await asyncio.gather(*(one(http) for _ in range(6)))
        figures = await inventory(http, gw.url)
    learned = {name: figures[name]["sharing"].get(MODEL) for name in ("a", "b")}
    assert any(value is not None for value in learned.values()), figures
    assert all(value is None or value < 0.5 for value in learned.values()), learned
