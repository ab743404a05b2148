"""Prefix-cache-aware routing end to end: a gateway in front of several emulated workers (their answers name
them), asked the way multi-turn chats ask: conversations in groups that share system prompts, session hints, a
hot prefix, and a worker that was slow once."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp

from tests.conftest import EmulatorFactory, GatewayFactory, worker
from turnout.gateway.keys import FLEET

MODEL = "m:1"
SYSTEMS = [f"You are assistant number {g}. " + f"Rule {g}: answer in the voice of group {g}. " * 20 for g in range(3)]


def chat(system: str | None, turns: int, session: str = "s", **extra: Any) -> dict[str, Any]:
    """A conversation after ``turns`` turns: every earlier question and answer resent, as chat clients do."""
    messages: list[dict[str, str]] = [] if system is None else [{"role": "system", "content": system}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{session}: question {turn} " * 3})
        if turn < turns - 1:
            messages.append({"role": "assistant", "content": f"answer {turn}"})
    return {"model": MODEL, "messages": messages, "max_tokens": 8, **extra}


async def ask(http: aiohttp.ClientSession, url: str, body: dict[str, Any], **headers: str) -> tuple[str, str]:
    """(the worker that answered, why it was chosen)."""
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        text = (await resp.json())["choices"][0]["message"]["content"]
        match = re.match(r"\[(\w+)\]", text)
        assert match is not None, text
        explained = resp.headers["X-Turnout-Route"]
        assert explained.startswith(match.group(1) + "; "), explained
        return match.group(1), explained.split("; ", 1)[1]


BATCHING = "batching"  # fleet(slots=BATCHING): workers whose listing says vLLM's (a batching engine, a shared cache)


async def fleet(
    emulator: EmulatorFactory, names: list[str], slots: int | str | None = 1, **behaviour: Any
) -> list[dict[str, Any]]:
    """Emulated OpenAI-style workers; ``slots``: declared in the config (1: an engine that keeps one prompt, as
    llama-cpp-python's server), :data:`BATCHING` (undeclared, and their listing names vLLM: a batching engine with
    a shared cache), None (nothing declared or named: routing assumes one at a time until it learns)."""
    workers = []
    for name in names:
        if slots == BATCHING:
            behaviour = {**behaviour, "owned_by": "vllm"}
        emu = await emulator(name, [MODEL], **behaviour)
        declared = {"slots": slots} if isinstance(slots, int) else {}
        workers.append(worker(name, emu.url, type="openai", **declared))
    return workers


async def test_conversations_stay_where_their_prefix_is(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    gw = await gateway(await fleet(emulator, ["a", "b", "c"]), routing={"explain_header": True})
    where: dict[int, set[str]] = {0: set(), 1: set(), 2: set()}
    reasons: list[str] = []
    async with aiohttp.ClientSession() as http:
        for turn in range(1, 4):
            for group in range(3):
                for session in ("x", "y"):
                    name, why = await ask(http, gw.url, chat(SYSTEMS[group], turn, f"{group}{session}"))
                    where[group].add(name)
                    reasons.append(why)
    assert all(len(names) == 1 for names in where.values()), where  # each group on one worker, every turn
    assert len(set().union(*where.values())) == 3, where  # and a worker each: none pushed out of another's slot
    firsts = reasons[0:6:2]  # the first question of each group: nothing held anywhere yet
    assert firsts == ["least expected time"] * 3, reasons
    rest = [why for n, why in enumerate(reasons) if n not in (0, 2, 4)]
    held = [float(why.split()[1]) for why in rest if why.startswith("prefix ")]
    assert len(held) == len(rest) and min(held) > 0.5, reasons  # the rest: what the worker held of it


async def test_the_load_guard_spreads_a_hot_prefix(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    """Eight at once, one prefix: the guard sends requests to the other worker once the holder has more in flight
    than the threshold above it (by expected time alone, more of them queue on the holder first). Unset, the
    threshold is the holder's slots (one for a one-slot engine), 32 for a batching engine."""
    body = chat(SYSTEMS[0], 3)
    cases: tuple[tuple[int | str | None, dict[str, int], bool | None], ...] = (
        (BATCHING, {"load_guard_absolute": 1000}, False),
        (BATCHING, {}, False),  # a batching engine: 8 in flight is not 32 more
        (BATCHING, {"load_guard_absolute": 2}, True),
        (1, {}, None),  # one-slot engines: more than one more in flight (the wait may spread them first)
        (None, {}, None),  # nothing declared: one at a time until learned, as a one-slot engine
    )
    for slots, guard, on in cases:  # on: the guard fires (None: it or the expected wait spreads them)
        workers = await fleet(emulator, ["a", "b"], slots=slots, tokens=5, token_delay_s=0.05)
        gw = await gateway(workers, routing={"explain_header": True, **guard})
        async with aiohttp.ClientSession() as http:
            holder, _ = await ask(http, gw.url, body)  # one worker holds it now
            answers = await asyncio.gather(*(ask(http, gw.url, body) for _ in range(8)))
        reasons = [why for _, why in answers]
        if on is not False:
            assert on is None or "load guard" in reasons, (slots, guard, answers)
            assert [name for name, _ in answers].count(holder) <= 5, (slots, guard, answers)
        else:
            assert "load guard" not in reasons, (slots, guard, answers)
        await gw.stop()


async def test_session_hints_keep_a_conversation_on_its_worker(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """Prompts too short for the prefix index: the client's own session name (OpenAI's ``user`` or
    ``prompt_cache_key``, or the operator's header) keeps each conversation where it went first."""
    workers = await fleet(emulator, ["a", "b", "c"], slots=BATCHING)  # a shared cache: every session stays held
    gw = await gateway(workers, routing={"explain_header": True, "session_header": "X-Session-Id"})
    async with aiohttp.ClientSession() as http:
        for hint in ("user", "prompt_cache_key", "header"):
            where: dict[str, set[str]] = {}
            for turn in range(1, 4):
                for session in ("alice", "bob", "carol"):
                    body = chat(None, turn, session)
                    headers = {}
                    if hint == "header":
                        headers["X-Session-Id"] = f"{hint}-{session}"
                    else:
                        body[hint] = f"{hint}-{session}"
                    name, why = await ask(http, gw.url, body, **headers)
                    where.setdefault(session, set()).add(name)
                    if turn > 1:
                        assert why == "session", (hint, session, turn, why)
            assert all(len(names) == 1 for names in where.values()), (hint, where)


async def test_a_worker_slow_once_gets_traffic_again_when_it_is_fast(
    emulator: EmulatorFactory, gateway: GatewayFactory
) -> None:
    """Its figure is forgotten after routing.speed_ttl_s, it counts as average and gets its turn, and what it
    then does (fast) is what it is judged by: it is not starved by one slow answer. (Which of two equally fast
    workers then gets an idle fleet's next request is a coin toss of their measured rates.)"""
    fast = await emulator("fast", [MODEL], tokens=6, token_delay_s=0.001)
    slow = await emulator("slow", [MODEL], tokens=6, token_delay_s=0.08)
    ttl_s = 1.5
    gw = await gateway(
        [worker("fast", fast.url, type="openai"), worker("slow", slow.url, type="openai")],
        routing={"explain_header": True, "speed_ttl_s": ttl_s},
    )
    body = {**chat(None, 1), "stream": True}

    async def served() -> str:
        async with http.post(f"{gw.url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()
            return resp.headers["X-Turnout-Route"].split(";")[0]

    async with aiohttp.ClientSession() as http:
        first = [await served() for _ in range(4)]
        assert "slow" in first  # no figure yet: each gets its turn, and "slow" is measured slow
        learned = gw.app[FLEET].workers
        assert learned["slow"].learned[MODEL].decode < learned["fast"].learned[MODEL].decode / 5
        while_slow = [await served() for _ in range(6)]
        assert set(while_slow) == {"fast"}  # judged by what it did
        slow.behaviour.token_delay_s = 0.001  # it is fast now; nothing tells the gateway yet
        await asyncio.sleep(ttl_s + 0.2)  # its old figure goes stale (the fast one keeps being renewed below)
        after = [await served() for _ in range(6)]
        figures = {name: state.learned[MODEL].decode for name, state in learned.items()}
    assert "slow" in after[:3], after  # forgotten: average again, it gets its turn at once
    assert figures["slow"] > figures["fast"] / 3, figures  # and is judged by what it does now: as fast


def test_the_access_line_says_why() -> None:
    from aiohttp import web
    from aiohttp.test_utils import make_mocked_request

    from tests.gateway.test_access_line import _access_log, _row
    from turnout.gateway.access import ROUTE, USAGE_ROW

    log, capture = _access_log()
    for why, written in (("prefix 0.83", 'route="prefix 0.83"'), ("session", "route=session")):
        request = make_mocked_request("POST", "/v1/chat/completions")
        request[USAGE_ROW] = _row("m")
        request[ROUTE] = why
        log.log(request, web.Response(status=200), 0.25)
        assert capture.records[-1].getMessage().endswith(f"tokens=5+4 {written}")
        assert capture.records[-1].route == why  # type: ignore[attr-defined]  # the JSON log's field


async def test_metrics_count_reasons_and_matched_tokens(emulator: EmulatorFactory, gateway: GatewayFactory) -> None:
    gw = await gateway(await fleet(emulator, ["a", "b"]))
    async with aiohttp.ClientSession() as http:
        for turn in range(1, 4):
            async with http.post(f"{gw.url}/v1/chat/completions", json=chat(SYSTEMS[0], turn)) as resp:
                assert resp.status == 200
        async with http.get(f"{gw.url}/metrics") as resp:
            text = await resp.text()
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("turnout_")
    }
    assert samples['turnout_route_reasons_total{reason="least expected time"}'] == 1
    assert samples['turnout_route_reasons_total{reason="prefix"}'] == 2
    prompt = sum(v for k, v in samples.items() if k.startswith("turnout_prefix_prompt_tokens_total"))
    matched = sum(v for k, v in samples.items() if k.startswith("turnout_prefix_matched_tokens_total"))
    assert prompt > 0 and 0.4 < matched / prompt < 1, (prompt, matched)  # two of three turns held most of it
